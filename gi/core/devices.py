"""Threads and devices: ``$GI_THREADS`` (:func:`env_threads`), and device names in configs (``attack.device``)
→ Lightning's ``(accelerator, devices)`` (:func:`resolve_device`).

Checked when a config is loaded, so asking for a GPU on a machine without one is a one-line :class:`ConfigError`
before any work; torch is imported only when a name needs it (``auto`` and ``cpu`` need nothing).
"""

from __future__ import annotations

from gi.core.errors import ConfigError

DEVICES = ("auto", "cpu", "gpu", "cuda", "cuda:N", "mps")


def resolve_device(name: str, where: str = "attack.device", auto_ok: bool = True) -> tuple[str, int | list[int]]:
    """``auto`` (a GPU when one is visible, else the CPU), ``cpu``, ``gpu``/``cuda``, ``cuda:N``, ``mps``.

    Raises :class:`ConfigError` for an unknown name or an accelerator this machine does not have; its advice names
    ``auto`` as an alternative only where the caller accepts it (``auto_ok``).
    """
    instead = f"{where}=cpu or {where}=auto" if auto_ok else f"{where}=cpu"
    if name == "cpu":
        return "cpu", 1
    if not isinstance(name, str) or not (name in DEVICES or (name.startswith("cuda:") and name[5:].isdigit())):
        raise ConfigError(f"{where}={name!r} is not allowed; valid: {', '.join(DEVICES)}")
    if name != "auto" and name != "mps" and not _gpu_device_nodes():  # no torch import: answers in milliseconds
        raise ConfigError(f"{where}={name} but torch sees no GPU on this machine (no GPU device under /dev); use "
                          f"{instead}")
    import torch

    if name == "auto":
        return ("gpu" if torch.cuda.is_available() else "cpu"), 1
    if name == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"{where}=mps but this machine has no MPS device; use {instead}")
        return "mps", 1
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ConfigError(f"{where}={name} but torch sees no GPU on this machine (torch.cuda.is_available() is "
                          f"False); use {instead}")
    if name.startswith("cuda:"):
        index = int(name[5:])
        if index >= count:
            raise ConfigError(f"{where}={name} but this machine has {count} GPU(s): cuda:0 to cuda:{count - 1}")
        return "gpu", [index]
    return "gpu", 1


def _gpu_device_nodes() -> bool:
    """Whether this machine could have a GPU torch can use: on Linux, NVIDIA (``/dev/nvidia0``…), ROCm
    (``/dev/kfd``) or WSL (``/dev/dxg``) device nodes; elsewhere we cannot tell without torch (True)."""
    import glob
    import os
    import sys

    if not sys.platform.startswith("linux"):
        return True
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd") or os.path.exists("/dev/dxg")


def env_threads() -> int | None:
    """torch's CPU threads asked for by ``$GI_THREADS`` (None when unset), for the whole job: the command line
    (``gi --threads N`` sets it) and the Python API (:func:`gi.reconstruct`) read it the same way."""
    import os

    text = os.environ.get("GI_THREADS", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"GI_THREADS={text!r} must be a positive integer (torch CPU threads), e.g. GI_THREADS=1")
    return int(text)


def torch_device(name: str | None, where: str = "device") -> str:
    """A config device name (:data:`DEVICES`) as a torch device string, checked like :func:`resolve_device`:
    ``auto`` → ``cuda`` when a GPU is visible else ``cpu``; ``gpu``/``cuda`` → ``cuda``; ``cuda:N``; ``mps``.
    ``None`` is ``cpu``. Asking for an accelerator this machine lacks is a one-line :class:`ConfigError`."""
    if name is None or name == "cpu":
        return "cpu"
    if not isinstance(name, str):
        name = str(name)  # a torch.device
    accelerator, devices = resolve_device(name, where)
    if accelerator == "cpu":
        return "cpu"
    if accelerator == "mps":
        return "mps"
    return f"cuda:{devices[0]}" if isinstance(devices, list) else "cuda"
