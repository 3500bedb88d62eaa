"""Entries of the on-disk cache under ``$GI_CACHE_DIR`` (trained checkpoints), written atomically and checked on load.

The cache is an input like any file we read (docs/guarantees.md, "The cache"). An entry is two files:
``<name>.safetensors`` (the tensors) and ``<name>.json`` (``{"record", "sha256", "bytes"}``: the caller's record
and the digest of the tensor file's bytes). :func:`write_entry` writes both under temporary names and renames them
into place, the record last, so a kill or a full disk mid-write leaves no entry (only a temporary file named by
its writer, :mod:`gi.core.owners`, which the next :func:`read_entry` removes with a warning once that writer is
gone). :func:`read_entry` answers:

- no entry: ``None`` (the caller builds it);
- a damaged entry (its tensor file unreadable or truncated, its record missing or unreadable): a warning, the
  entry removed, ``None`` (rebuilt);
- a readable tensor file whose bytes do not match the recorded digest (replaced by other weights): a
  :class:`gi.core.errors.CacheError` naming the path, unless ``$GI_CACHE_REBUILD`` is set (then a warning and
  ``None``).

No torch at import (``gi.core``); safetensors loads inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.core.errors import CacheError, as_os_error
from gi.core.owners import gone, owner_tag

if TYPE_CHECKING:
    import torch

log = logging.getLogger("gi.cache")
REBUILD_ENV = "GI_CACHE_REBUILD"  # set (to anything but "" or "0") to rebuild a mismatched entry instead of refusing it
MAX_RECORD_BYTES = 1 << 20  # a record is a few hundred bytes of JSON; a larger one is damaged


def record_path(path: Path) -> Path:
    """The record (digest and caller's record) beside the tensor file ``path``."""
    return path.with_suffix(".json")


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{owner_tag()}.tmp")


def _orphans(path: Path) -> list[Path]:
    """Temporary files that an interrupted :func:`write_entry` of this entry left behind: those of writers known
    to be dead (:func:`gi.core.owners.gone`), never those a live process, or one of another host sharing
    ``$GI_CACHE_DIR``, is still writing."""
    if not path.parent.is_dir():
        return []
    found = []
    for stem in (path.name, record_path(path).name):
        for p in path.parent.glob(f".{stem}.*.tmp"):
            tag = p.name[len(stem) + 2:-len(".tmp")]
            pid, _, host = tag.partition("@")
            if pid.isdigit() and gone(int(pid), host):
                found.append(p)
    return sorted(found)


def remove_entry(path: Path) -> None:
    """Remove an entry's two files and any temporary file of an interrupted write (missing ones are fine)."""
    for p in (path, record_path(path), *_orphans(path)):
        p.unlink(missing_ok=True)


def write_entry(path: Path, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
    """Write an entry atomically: the tensor file and then its record (with the tensor file's SHA-256), each to a
    temporary name first and renamed into place; on any error both temporary files are removed."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, tmp_record = _temporary(path), _temporary(record_path(path))
    try:
        try:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
        except Exception as exc:  # a full disk inside safetensors: the OSError it is
            raise as_os_error(exc, tmp) from None
        text = json.dumps({"record": record, "sha256": file_digest(tmp), "bytes": tmp.stat().st_size},
                          default=str)
        tmp_record.write_text(text)
        os.replace(tmp, path)
        os.replace(tmp_record, record_path(path))  # the record last: an entry without it is incomplete
    finally:
        tmp.unlink(missing_ok=True)
        tmp_record.unlink(missing_ok=True)


def _rebuild_asked() -> bool:
    return os.environ.get(REBUILD_ENV, "") not in ("", "0")


def read_entry(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """``(tensors, record)`` of a complete, intact entry; ``None`` where there is none or it was damaged (removed
    with a warning); a :class:`CacheError` naming the path where its bytes do not match its digest (module
    docstring)."""
    from safetensors.torch import load_file

    orphans = _orphans(path)
    if orphans:
        log.warning("cache: an interrupted write left %s; removed, the entry is rebuilt", [str(p) for p in orphans])
        for p in orphans:
            p.unlink(missing_ok=True)
    if not path.is_file():
        record_path(path).unlink(missing_ok=True)
        return None
    damage = None
    meta = record_path(path)
    try:
        if not meta.is_file():
            damage = "its record (digest) is missing"
        elif meta.stat().st_size > MAX_RECORD_BYTES:
            damage = f"its record is over {MAX_RECORD_BYTES} bytes"
        else:
            info = json.loads(meta.read_text())
            if not (isinstance(info, dict) and isinstance(info.get("sha256"), str)
                    and isinstance(info.get("record"), dict)):
                damage = "its record has no digest"
    except (OSError, ValueError) as exc:
        damage = f"its record cannot be read ({exc})"
    if damage is None:
        try:
            tensors = load_file(str(path))
        except Exception as exc:  # safetensors raises its own types for truncated or corrupt files
            damage = f"its tensors cannot be read ({type(exc).__name__}: {exc})"
    if damage is not None:
        log.warning("cache: %s is damaged (%s); removed, the entry is rebuilt", path, damage)
        remove_entry(path)
        return None
    digest = file_digest(path)
    if digest != info["sha256"]:
        if _rebuild_asked():
            log.warning("cache: %s does not match its digest; rebuilt (%s is set)", path, REBUILD_ENV)
            remove_entry(path)
            return None
        raise CacheError(f"cache entry {path} does not match the digest recorded in {meta.name} (sha256 "
                         f"{digest[:12]}… against {info['sha256'][:12]}…): it was replaced by other weights. Delete "
                         f"it, or set {REBUILD_ENV}=1 to rebuild it")
    return tensors, info["record"]
