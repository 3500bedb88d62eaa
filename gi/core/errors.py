"""Errors of the toolkit: one base class, one subclass per kind of mistake (docs/architecture.md, "Conventions").

Messages are one line: what was wrong and how to fix it.
"""

from __future__ import annotations


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
