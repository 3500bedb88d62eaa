"""Errors of the toolkit: one base class, one subclass per kind of mistake (docs/architecture.md, "Conventions").

Messages are one line: what was wrong and how to fix it.
"""

from __future__ import annotations

import os
import re

# how a Rust library (safetensors) reports an OS error in its message: "… (os error 28)" or "Os { code: 28, … }"
_OS_CODE = re.compile(r"(?:\(os error |Os \{ code: )(\d+)")


class GIError(Exception):
    """Base class of every error the toolkit raises on purpose."""


class CaptureError(GIError):
    """A capture does not fit its model: wrong names or shapes, NaN/Inf, missing fields."""


class ConfigError(GIError):
    """A configuration key is unknown or a value is not allowed; the message lists the valid ones."""


class AssetError(GIError):
    """An offline asset (dataset files, backbone weights) is missing; the message names the install command."""


class CacheError(GIError):
    """An entry of the on-disk cache (``$GI_CACHE_DIR``) holds other bytes than its recorded digest: the message
    names the path and how to rebuild it (docs/guarantees.md, "The cache")."""


class OutputError(GIError):
    """An output could not be written while a command wrote it (disk full, a place turned read-only): the message
    names the path; nothing half-written is left (docs/guarantees.md, "Nothing is lost or overwritten")."""


class Stopped(BaseException):
    """The process was asked to stop (SIGTERM, SIGINT). A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` of a job loop records it as a failed job and goes on: every command unwinds, keeps what
    is complete, removes what is half-written, and ``gi`` exits with 128 + the signal's number."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(f"stopped by {name}")
        self.signum, self.name = signum, name


def as_os_error(exc: BaseException, path: str | os.PathLike) -> BaseException:
    """A storage failure that a library reports in its own type (safetensors' ``SafetensorError`` says
    ``Error while serializing: I/O error: No space left on device (os error 28)`` for a full disk) as the
    ``OSError`` it is, naming ``path``,
    so that the output and cache writers treat it like any other failed write; ``exc`` itself otherwise."""
    if isinstance(exc, OSError):
        return exc
    found = _OS_CODE.search(str(exc))
    if found is None:
        return exc
    code = int(found.group(1))
    return OSError(code, os.strerror(code), os.fspath(path))
