#!/usr/bin/env bash
# Issue 15's two GPU acceptance lines in one device call (~6 min on an H100 after the machine starts):
#   here, once:  BREACHING=1 bash scripts/gpu/prepare.sh          (.whl/ plus .whl/breaching/ for step 1)
#   there:       bash scripts/gpu/throughput.sh                    (carry [".whl"]; JSON and logs land in $OUT)
# 1. single-restart ResNet-18 ms per iteration (ITS iterations, setup included), ours vs breaching 0.1.2 in one
#    process, alternating rounds, with ours' per-layer objective (the GPU path before 2026-11-27) as a third
#    contender (scripts/compare_breaching.py --device cuda --layered); acceptance: ours <= breaching's.
# 2. 20 LeNet captures packed into one problem vs one at a time, alternated in one process
#    (gi bench configs/bench/packed.yaml on the GPU); acceptance: >= 10x the images per second, same PSNR.
#    COMPILE=MODE also times the packed problem under torch.compile (attack.compile: true, or a mode such as
#    reduce-overhead = CUDA graphs), in the same rounds: the row's compiled_speedup_over_packed.
# 3. the packed step under torch.cuda.set_sync_debug_mode: counts host synchronisations inside training steps.
# 4. (RESNET=1, ~4 more minutes) the trained ResNet-18 with BatchNorm, batches of 8: recovered counts vs oracle vs
#    joint labels with the BN prior, and recovered counts without it (configs/ablate/resnet18-bn.yaml on the GPU,
#    RESNET_ITS iterations, TRIALS batches; NOBN=0 skips the BN-off run); acceptance (CPU line, measured here for
#    want of CPU time): recovered within 0.5 dB of the oracle and >= 3 dB above joint. RESNET_OVERRIDES adds
#    `gi ablate` overrides to both runs, e.g. RESNET_OVERRIDES="attack.lr=0.025 attack.regularizers.tv=4e-3"
#    (space-separated, none with spaces): the recipe is the open question there (docs/results/realistic-networks.md).
# STEPS picks the steps (default 123, plus 4 with RESNET=1; e.g. STEPS=4 for the ResNet ablation alone, a second
# call on the warm machine). Every step runs even when an earlier one fails; the exit code counts failures. Record
# the card's name (printed first) with the numbers in docs/results/throughput-gpu.md.
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gi-gpu}; mkdir -p "$out"; failed=0
ITS=${ITS:-200}; PACKED_ITS=${PACKED_ITS:-300}
if [ -d .whl/breaching ] && [ ! -d /tmp/br ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/br .whl/breaching/*.whl
fi
STEPS=${STEPS:-123$([ "${RESNET:-0}" = 1 ] && echo 4)}
want() { [[ "$STEPS" == *"$1"* ]]; }
if want 1; then
echo "== 1. ResNet-18, one restart: ours vs breaching (ms/iteration, $ITS iterations, 2 rounds)"
PYTHONPATH=/tmp/br bash scripts/gpu/run.sh python3 scripts/compare_breaching.py --device cuda --model resnet18 \
  --restarts 1 --iterations "$ITS" --rounds 2 --layered --out "$out/compare-resnet18.json" 2>&1 | tee "$out/compare.log" \
  | grep -v Warning; [ "${PIPESTATUS[0]}" = 0 ] || { echo "== 1 FAILED"; failed=$((failed + 1)); }
fi
if want 2; then
echo "== 2. 20 packed LeNet captures vs one at a time ($PACKED_ITS iterations, 2 rounds${COMPILE:+, compiled: $COMPILE})"
bash scripts/gpu/run.sh gi bench configs/bench/packed.yaml "devices=[gpu]" packed.iterations="$PACKED_ITS" \
  ${COMPILE:+packed.compile="$COMPILE"} out="$out/packed-gpu.json" 2>&1 | tee "$out/packed.log" | grep -v Warning \
  ; [ "${PIPESTATUS[0]}" = 0 ] || { echo "== 2 FAILED"; failed=$((failed + 1)); }
fi
if want 3; then
echo "== 3. host synchronisations inside the packed training step"
bash scripts/gpu/run.sh python3 scripts/gpu/sync_check.py 2>&1 | tee "$out/sync.log" | grep -v Warning \
  ; [ "${PIPESTATUS[0]}" = 0 ] || { echo "== 3 FAILED"; failed=$((failed + 1)); }
fi
resnet() {  # resnet NAME OVERRIDES...: one gi ablate of configs/ablate/resnet18-bn.yaml on the GPU
  local name=$1; shift
  local extra; read -ra extra <<< "${RESNET_OVERRIDES:-}"
  GI_CACHE_DIR=/tmp/gi-cache bash scripts/gpu/run.sh gi ablate configs/ablate/resnet18-bn.yaml attack.device=gpu \
    attack.threads=null attack.iterations="$RESNET_ITS" name="$name" out="/tmp/gi-gpu-runs/$name" "$@" "${extra[@]}" 2>&1 \
    | grep -v Warning | tail -12; [ "${PIPESTATUS[0]}" = 0 ] || { echo "== 4 ($name) FAILED"; failed=$((failed + 1)); }
  cp "/tmp/gi-gpu-runs/$name/table.md" "$out/$name-table.md" 2>/dev/null || true
}
if want 4; then
  RESNET_ITS=${RESNET_ITS:-500}; TRIALS=${TRIALS:-2}
  echo "== 4. trained ResNet-18 + BN prior, $TRIALS batches of 8 ($RESNET_ITS iterations): truth / recovered / joint"
  resnet resnet18-bn trials="$TRIALS"
  if [ "${NOBN:-1}" = 1 ]; then resnet resnet18-nobn trials="$TRIALS" "modes=[recovered]" attack.regularizers.bn=0.0; fi
fi
echo "== $failed step(s) failed"
exit "$failed"
