#!/usr/bin/env bash
# The GPU smoke check of a lent machine (run there through scripts/gpu/run.sh's environment):
#   bash scripts/gpu/check.sh            (carry [".whl"]; metrics.json of each run land in $OUT, or /tmp/gi-gpu)
# FedSGD LeNet, a FedAvg update unrolled by the attack, a ResNet-18 with the BatchNorm prior, all on the GPU,
# then the quick speed benchmark. Every step runs even when an earlier one fails; the exit code counts failures.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gi-gpu}; mkdir -p "$out"; runs=/tmp/gi-gpu-runs; rm -rf "$runs"; failed=0
step() {  # step NAME ARGS...: one gi command, its metrics.json copied to $out/NAME.json
  local name=$1; shift
  echo "== $name: gi $*"
  if bash scripts/gpu/run.sh gi "$@" out="$runs/$name"; then cp "$runs/$name/metrics.json" "$out/$name.json"
  else echo "== $name FAILED"; failed=$((failed + 1)); fi
}
common=(attack.device=gpu metrics.lpips_vgg=false)
step fedsgd-lenet run configs/demo.yaml "${common[@]}" attack.iterations=1000
step fedavg-unrolled run configs/demo.yaml "${common[@]}" protocol.scheme=fedavg protocol.batch_size=2 "data.indices=[3,5]" \
  protocol.local_epochs=2 labels.mode=truth attack.iterations=300
step resnet18-bn run configs/demo.yaml "${common[@]}" model.name=resnet18 protocol.share_bn_stats=true \
  "attack.regularizers={tv: 1.0e-3, bn: 1.0e-3}" attack.iterations=100
echo "== bench quick (gpu)"
bash scripts/gpu/run.sh gi bench configs/bench/quick.yaml "devices=[gpu]" out="$out/bench-quick.json" \
  || { echo "== bench FAILED"; failed=$((failed + 1)); }
echo "== $failed step(s) failed"
exit "$failed"
