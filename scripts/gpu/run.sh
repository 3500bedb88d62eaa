#!/usr/bin/env bash
# Run THERE (the lent GPU machine), in the repository root, with .whl carried (scripts/gpu/prepare.sh fills it):
#   bash scripts/gpu/run.sh gi bench configs/bench/default.yaml "devices=[gpu]"
#   bash scripts/gpu/run.sh python -m pytest -q tests/attack/test_recon.py
# Installs the carried wheels into /tmp/site (no registry there), puts the project and them on PYTHONPATH,
# points the offline assets at the carried folders, and runs the command with the image's python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
# .whl/site-data: foolbox's sample images and the LPIPS AlexNet weights, found by gi.world.assets as packages
export PYTHONPATH="$PWD:/tmp/site:$PWD/.whl/site-data${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if [ "$1" = gi ]; then shift; exec python3 -m gi.cli "$@"; fi
exec "$@"
