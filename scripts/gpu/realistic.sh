#!/usr/bin/env bash
# The realistic benchmark's S5 (ResNet-18, one image, FedSGD, untrained) at a GPU budget, in one device call
# (~7 min on an H200 after the machine starts):
#   here, once:  BREACHING=1 bash scripts/gpu/prepare.sh            (.whl/ plus .whl/breaching/)
#   there:       bash scripts/gpu/realistic.sh                      (carry [".whl"]; outputs land in $OUT)
# 1. time to quality, ours vs breaching on the same captures, one process per PART (select list), both contenders
#    on the GPU, wall clock with the GPU synchronised at every checkpoint (configs/bench/ttq-resnet18.yaml with
#    device=gpu clock=wall; each contender runs its own schedule to its end inside BUDGET seconds: ours the
#    `resnet` preset's 1067 iterations, breaching its step-lr schedule over 1067). Each part's output directory
#    is written to $OUT/s5-<part> as soon as it ends, so a call cut by its time limit keeps the parts done; join
#    them here with gi.experiments.ttq.merge_runs.
# 2. (PACKED=1) images per GPU-hour when our captures are packed into one problem: `gi run` of the same images,
#    the `resnet` preset, all captures in one vmapped problem (attack.pack 0), cut by `timeout PACKED_S`.
# PARTS (default "0,1 2,3") and BUDGET (default 60 s) size the call. Record the card's name (printed first).
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gi-gpu}; mkdir -p "$out"; failed=0
BUDGET=${BUDGET:-60}; PARTS=${PARTS:-"0,1 2,3"}; PACKED_S=${PACKED_S:-120}
if [ -d .whl/breaching ] && [ ! -d /tmp/br ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/br .whl/breaching/*.whl
fi
for part in $PARTS; do
  echo "== 1. S5 ttq on the GPU, captures [$part], budget $BUDGET s wall per contender"
  PYTHONPATH=/tmp/br bash scripts/gpu/run.sh gi bench configs/bench/ttq-resnet18.yaml device=gpu clock=wall \
    budget="$BUDGET" equal_time="$BUDGET" every=50 "select=[$part]" name="s5-gpu-${part//,/-}" \
    out="$out/s5-${part//,/-}" 2>&1 | grep -v Warning | tail -8
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "== 1 [$part] FAILED"; failed=$((failed + 1)); }
done
if [ "${PACKED:-1}" = 1 ]; then
  images=$(echo "$PARTS" | tr ' ' ',')
  echo "== 2. packed: gi run, ResNet-18, images [$images] in one problem on the GPU (timeout $PACKED_S s)"
  start=$SECONDS
  timeout "$PACKED_S" bash scripts/gpu/run.sh gi run configs/default.yaml model.name=resnet18 model.init=null \
    "data.images=[$images]" attack.device=gpu attack.threads=null metrics.lpips_vgg=false out="$out/s5-packed" \
    2>&1 | grep -v Warning | tail -6
  rc=${PIPESTATUS[0]}; echo "== 2 wall s (process, import and set-up included): $((SECONDS - start))"
  [ "$rc" = 0 ] || { echo "== 2 FAILED or cut (rc $rc)"; failed=$((failed + 1)); }
fi
echo "== $failed step(s) failed"
exit "$failed"
