#!/usr/bin/env bash
# The whole test suite once per kernel profile: the vectorised code paths (torch's ATen, oneDNN's convolutions,
# MKL, numpy's OpenBLAS) and BLAS thread counts that another x86 CPU would pick, forced on this one. A test that
# passes here only on the machine's own kernels depends on the exact residuals of one CPU (docs/guarantees.md,
# "Tests that hold on any CPU").
#
#   scripts/test_kernels.sh                      # every profile
#   scripts/test_kernels.sh avx2 compatible      # some of them
#   JOBS=1 scripts/test_kernels.sh intel-avx512  # pytest workers (default 2)
#   make test-kernels                            # every profile, after make install
#
# MKL's own AVX-512 and AVX2 branches (MKL_CBWR=AVX512 / AVX2) are chosen by MKL only on Intel CPUs; elsewhere
# MKL ignores them, so the probe line shows what each profile really ran.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

declare -A PROFILES=(
  # what an Intel AVX-512 box runs for torch and numpy, numpy's BLAS on up to 4 threads (OpenBLAS caps it at the cores)
  [intel-avx512]="ATEN_CPU_CAPABILITY=avx512 OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=4 MKL_CBWR=AVX512"
  # an AVX2 CPU (older Intel and AMD): 256-bit kernels throughout, numpy's BLAS on one thread
  [avx2]="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 MKL_CBWR=AVX2"
  # the lowest common paths: torch's scalar kernels, SSE4.1 convolutions, MKL's conditional-reproducibility
  # branch, OpenBLAS's generic x86-64 kernels
  [compatible]="ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MKL_CBWR=COMPATIBLE OPENBLAS_CORETYPE=Prescott OPENBLAS_NUM_THREADS=1"
)
ORDER=(intel-avx512 avx2 compatible)

PROBE="
import torch
from threadpoolctl import threadpool_info
blas = [(i['architecture'], i['num_threads']) for i in threadpool_info() if i['internal_api'] == 'openblas']
print('torch', torch.backends.cpu.get_cpu_capability(), '| numpy OpenBLAS (kernels, threads)', blas)"

profiles=("$@")
[ ${#profiles[@]} -eq 0 ] && profiles=("${ORDER[@]}")
for p in "${profiles[@]}"; do
  [ -n "${PROFILES[$p]+x}" ] || { echo "unknown profile '$p'; profiles: ${ORDER[*]}" >&2; exit 2; }
done

status=0
for p in "${profiles[@]}"; do
  echo "== $p: ${PROFILES[$p]}"
  # shellcheck disable=SC2086
  env ${PROFILES[$p]} "$PY" -c "$PROBE" 2>/dev/null | sed 's/^/   kernels: /'
  start=$SECONDS
  # shellcheck disable=SC2086
  if env ${PROFILES[$p]} "$PY" -m pytest -n "${JOBS:-2}" -p no:cacheprovider tests > "/tmp/gi-kernels-$p.log" 2>&1; then
    echo "   passed ($((SECONDS - start)) s): $(tail -1 "/tmp/gi-kernels-$p.log")"
  else
    status=1
    echo "   FAILED ($((SECONDS - start)) s), log /tmp/gi-kernels-$p.log:"
    grep -E "^(FAILED|ERROR)" "/tmp/gi-kernels-$p.log" | sed 's/^/   /'
  fi
done
exit $status
