"""Who owns a temporary file or folder: a ``<pid>@<host>`` tag in its name, and whether that writer is gone.

Writers that stage their output under a temporary name (the output directories of :mod:`gi.experiments.outdir`, the
cache entries of :mod:`gi.core.cache`) put :func:`owner_tag` in it, so that a later process removes what a dead
writer of this host left (:func:`gone`) and never what a live one, or one on another host sharing the folder, is
still writing. No torch at import (``gi.core``).
"""

from __future__ import annotations

import os
import socket

HOST = socket.gethostname()


def owner_tag() -> str:
    """``<pid>@<host>`` of this process."""
    return f"{os.getpid()}@{HOST}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (one owned by another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gone(pid: int, host: str) -> bool:
    """Whether the writer ``pid`` of ``host`` is known to be dead: only a process of this host can be checked."""
    return host == HOST and not pid_alive(pid)
