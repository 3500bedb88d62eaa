"""Where a result came from: the commit of the code that produced it (docs/architecture.md, "Layout": gi.core)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The repository's commit (``git rev-parse HEAD`` beside this file; None outside a checkout), recorded in
    the benchmarks' reports."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
