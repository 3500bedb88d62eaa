"""Writing a run's output directory: staged in a hidden folder and renamed into place at the end, so an
interrupted or failed run never leaves a half-written directory (docs/architecture.md), and two commands never clobber
each other's output.

Guarantees of :func:`staged_output`:

- one writer per output directory: an exclusive ``flock`` on ``.<out>.lock`` (next to it) is held for the whole
  run, so a second command with the same ``out=`` fails at its start, before any work;
- the final rename is no-clobber (``renameat2(RENAME_NOREPLACE)`` on Linux): a directory that appears meanwhile
  (even an empty one) is never replaced; the run's results are then kept in ``<out>.unsaved-<pid>``;
- ``overwrite=true`` moves the old result aside (``.<out>.old-<pid>@<host>``), moves the new one in, then deletes
  the old one; if killed in between, the next command in that folder puts the old result back;
- staging folders are named ``.<out>.partial-<pid>@<host>-<random>``; every command removes those of dead
  processes of this host in its output folder;
- a write that fails (a full disk, a quota, a place that turned read-only) is a one-line :class:`OutputError`
  naming the path, and the staging folder is removed: nothing is published (:func:`write_error`).

A run without ``out=`` writes ``runs/<name>-<YYYYmmdd-HHMMSS>`` (:func:`stamped_out`; never an existing folder), and
``runs/<name>-latest`` is a link to the newest of them (:func:`link_latest`: replaced atomically, never a real
folder or file of that name; skipped where the filesystem has no symlinks), so ``gi attack runs/demo-latest`` names
the last ``gi run configs/demo.yaml`` (docs/usage.md, "Configs and outputs").
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import datetime as _dt
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gi.analysis.report import jsonable
from gi.core.errors import ConfigError, OutputError
from gi.core.owners import gone, owner_tag

if TYPE_CHECKING:
    pass

log = logging.getLogger("gi.outdir")
_OWNED = (re.compile(r"^\.(?P<name>.+)\.(?P<kind>partial)-(?P<pid>\d+)@(?P<host>.+)-[A-Za-z0-9_]+$"),  # + mkdtemp's
           re.compile(r"^\.(?P<name>.+)\.(?P<kind>old)-(?P<pid>\d+)@(?P<host>.+)$"))  # random part has no "-"
_LOCK = re.compile(r"^\.(?P<name>.+)\.lock$")


def _libc_renameat2() -> Any:
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return func


_RENAMEAT2 = _libc_renameat2()
_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (also an empty directory, which a plain
    ``os.rename`` would silently replace)."""
    if _RENAMEAT2 is not None:
        if _RENAMEAT2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):  # fallback (no renameat2): still checked, but not atomically
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    os.rename(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _try_lock(lock: Path) -> int | None:
    """An exclusive ``flock`` on ``lock`` (created if missing): its fd, or None when another writer holds it."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{owner_tag()}\n".encode())
            return fd
        os.close(fd)  # the previous holder removed the file between our open and our lock: take the new one


def _unlock(lock: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()
    os.close(fd)


def _lock_path(final: Path) -> Path:
    return final.parent / f".{final.name}.lock"


def _holder(lock: Path) -> str:
    try:
        return lock.read_text().strip() or "another process"
    except OSError:
        return "another process"


def _restore_aside(parent: Path, name: str, aside: Path) -> None:
    """A dead writer's old result moved aside for an overwrite: put it back if nothing replaced it."""
    final = parent / name
    if os.path.lexists(final):
        _remove(aside)
        return
    with contextlib.suppress(FileExistsError):
        _rename_noreplace(aside, final)


def remove_stale_staging(parent: Path, held: Path | None = None) -> None:
    """Remove staging folders of dead processes of this host in ``parent``; put back old results that a killed
    ``overwrite`` had moved aside; remove lock files nobody holds. ``held``: an output directory whose lock the
    caller holds."""
    try:
        entries = sorted(Path(parent).iterdir())
    except OSError:
        return
    for entry in entries:
        m = _OWNED[0].match(entry.name) or _OWNED[1].match(entry.name)
        if m is None or not gone(int(m["pid"]), m["host"]):
            continue
        if m["kind"] == "partial":
            _remove(entry)
            continue
        final = Path(parent) / m["name"]
        if held is not None and final == held:
            _restore_aside(Path(parent), m["name"], entry)
            continue
        fd = _try_lock(_lock_path(final))
        if fd is not None:
            try:
                _restore_aside(Path(parent), m["name"], entry)
            finally:
                _unlock(_lock_path(final), fd)
    for entry in entries:
        m = _LOCK.match(entry.name)
        if m is not None and (held is None or m["name"] != held.name) and entry.exists():
            fd = _try_lock(entry)
            if fd is not None:
                _unlock(entry, fd)


def check_run_name(name: str) -> None:
    """A run's ``name`` becomes a folder under ``runs/``: it must not be empty or leave that folder."""
    if not name or "/" in name or "\\" in name or ".." in name or os.sep in name:
        raise ConfigError(f"name={name!r} must be a plain folder name (no '/', '\\' or '..'): it names the output "
                          "folder under runs/; use out= to write elsewhere")


def file_slug(text: str) -> str:
    """``text`` as part of a file name: every character but letters, digits, ``-``, ``_`` and ``.`` becomes ``-``
    (the grid and plot files of gi ablate and gi defend)."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)


def _check_parent(final: Path) -> None:
    ancestor = final.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"out={final}: {ancestor} is a file, not a directory; pass another out=")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"out={final}: cannot create {final.parent} ({exc.strerror}); pass another out=") from None
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"out={final}: {final.parent} is not writable; pass another out=")


def check_output_dir(final: str | Path, overwrite: bool = False) -> Path:
    """Refuse an output directory that cannot be written or would clobber a result (before any work starts);
    creates its parent folder. Returns ``final`` as a Path."""
    final = Path(final)
    if os.path.lexists(final) and not final.is_dir():
        raise ConfigError(f"out={final} is a file, not a directory; pass another out=")
    if final.is_dir() and not overwrite:
        raise ConfigError(f"output directory {final} exists; pass overwrite=true or another out=")
    _check_parent(final)
    return final


def check_output_file(path: str | Path, overwrite: bool = False) -> Path:
    """:func:`check_output_dir` for a single output file (e.g. ``gi bench``'s JSON report)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"out={path} is a directory; this command writes one file: pass out=<file>.json")
    if os.path.lexists(path) and not overwrite:
        raise ConfigError(f"{path} exists; pass overwrite=true or another out=")
    _check_parent(path)
    return path


def publish_file(path: Path, write: Callable[[Path], None], overwrite: bool = False) -> None:
    """Write a file through ``write(tmp)`` into a staging file next to ``path`` and move it into place:
    no-clobber (a file that appeared meanwhile is kept, ours goes to ``<path>.unsaved-<pid>``), or an atomic
    replace with ``overwrite``."""
    remove_stale_staging(path.parent)
    with _writing(path, path.parent):
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.partial-{owner_tag()}-")
    os.close(fd)
    tmp = Path(name)
    try:
        with _writing(path, tmp):
            write(tmp)
            if overwrite:
                os.replace(tmp, path)
                return
            try:
                os.link(tmp, path)  # fails if path exists: no-clobber for files
            except FileExistsError:
                keep = path.with_name(f"{path.name}.unsaved-{os.getpid()}")
                os.replace(tmp, keep)
                raise ConfigError(f"{path} appeared while this command was writing it and was left as it is; kept "
                                  f"this run's results in {keep}; pass overwrite=true or another out=") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # disk full, quota, file too large
_DENIED = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})  # read-only place, no permission


def write_error(exc: BaseException, final: Path, staging: Path) -> OutputError | None:
    """The one-line :class:`OutputError` for an ``OSError`` met while writing ``final`` through its ``staging``
    folder or file: a full disk or quota wherever it was met (writes to a full disk are this command's writes),
    a read-only place or a refused permission when it names a path under ``staging`` or ``final``'s folder. None
    for anything else (a dataset that cannot be read is not an output problem)."""
    if not isinstance(exc, OSError) or exc.errno not in _FULL | _DENIED:
        return None
    path = exc.filename
    inside = path is not None and any(Path(os.path.abspath(os.fsdecode(path))).is_relative_to(os.path.abspath(p))
                                      for p in (staging, final.parent))
    if exc.errno in _DENIED and not inside:
        return None
    where = os.fsdecode(path) if path is not None else str(staging)
    fix = "free some space or pass another out=" if exc.errno in _FULL else "pass another out= (a writable place)"
    return OutputError(f"out={final}: cannot write {where} ({exc.strerror or os.strerror(exc.errno)}); nothing was "
                       f"published and the partial output was removed; {fix}")


@contextlib.contextmanager
def _writing(final: Path, staging: Path, remove: bool = False) -> Iterator[None]:
    """An ``OSError`` of the block that :func:`write_error` recognises becomes its :class:`OutputError` (with
    ``remove``, ``staging`` is removed first); any other error passes through unchanged."""
    try:
        yield
    except BaseException as exc:
        if remove:
            shutil.rmtree(staging, ignore_errors=True)
        error = write_error(exc, final, staging)
        if error is None:
            raise
        raise error from None


def _publish(tmp: Path, final: Path, overwrite: bool) -> None:
    aside = None
    if os.path.lexists(final) and overwrite:
        aside = final.parent / f".{final.name}.old-{owner_tag()}"
        _rename_noreplace(final, aside)
    try:
        _rename_noreplace(tmp, final)
    except FileExistsError:
        if aside is not None:
            _restore_aside(final.parent, final.name, aside)
        keep = final.parent / f"{final.name}.unsaved-{os.getpid()}"
        _rename_noreplace(tmp, keep)
        raise ConfigError(f"output directory {final} appeared while this run was writing it and was left as it "
                          f"is; kept this run's results in {keep}; pass overwrite=true or another out=") from None
    except BaseException:
        if aside is not None:
            _restore_aside(final.parent, final.name, aside)
        raise
    if aside is not None:
        _remove(aside)


STAMP = "%Y%m%d-%H%M%S"  # the time stamp of a default output folder's name


def stamped_out(name: str, parent: str | Path = "runs") -> Path:
    """The default output directory of a run named ``name``: ``<parent>/<name>-<YYYYmmdd-HHMMSS>``, or with ``-2``,
    ``-3``, ... appended when that exists (two runs in one second); :func:`staged_output` still refuses a folder
    that appears meanwhile."""
    base = Path(parent) / f"{name}-{_dt.datetime.now().strftime(STAMP)}"
    out, n = base, 1
    while os.path.lexists(out) or os.path.lexists(_lock_path(out)):
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def latest_name(name: str) -> str:
    """The link's name beside a run's stamped folders: ``<name>-latest``."""
    return f"{name}-latest"


def stamped_runs(parent: Path, name: str) -> list[Path]:
    """The stamped output folders of runs named ``name`` in ``parent`` (:func:`stamped_out`), oldest first."""
    pattern = re.compile(rf"^{re.escape(name)}-(\d{{8}}-\d{{6}})(?:-(\d+))?$")
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return []
    found = [(m[1], int(m[2] or 1), e) for e in entries if (m := pattern.match(e.name)) and e.is_dir()
             and not e.is_symlink()]
    return [e for *_, e in sorted(found)]


def link_latest(final: Path, name: str) -> Path | None:
    """Point ``<final's folder>/<name>-latest`` at the newest stamped run of ``name`` there (:func:`stamped_runs`),
    by a relative link: made under a staging name, then ``os.replace``d over the old link (atomic). A real folder
    or file of that name is left as it is (logged), and so is everything where the filesystem has no symlinks.
    Returns the link, or None when none was made."""
    parent = Path(final).parent
    runs = stamped_runs(parent, name)
    if not runs:
        return None
    link = parent / latest_name(name)
    if os.path.lexists(link) and not link.is_symlink():
        log.warning("%s is not a link: left as it is (the newest run of %s is %s)", link, name, runs[-1])
        return None
    tmp = parent / f".{link.name}.partial-{owner_tag()}-link"  # a dead writer's is removed like any staging name
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(runs[-1].name, tmp, target_is_directory=True)
        os.replace(tmp, link)
    except (OSError, NotImplementedError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        log.info("no %s link made (%s)", link, exc)
        return None
    return link


# which staged outputs' log.txt the current log records go to (None: every open one); set by log_scope
_LOG_SCOPE: contextvars.ContextVar[frozenset[Path] | None] = contextvars.ContextVar("gi_log_scope", default=None)


@contextlib.contextmanager
def log_scope(*finals: str | Path) -> Iterator[None]:
    """While open, log records go only to the ``log.txt`` of the staged outputs of ``finals`` (several jobs staged
    at once, e.g. :func:`gi.experiments.run.run_many`: each job's log holds its own lines and its pack's)."""
    token = _LOG_SCOPE.set(frozenset(Path(f).resolve() for f in finals))
    try:
        yield
    finally:
        _LOG_SCOPE.reset(token)


@contextlib.contextmanager
def staged_output(final: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a hidden staging folder next to ``final``; on success it becomes ``final`` (no-clobber, or an atomic
    replace with ``overwrite``); on error it is removed. Holds ``final``'s lock throughout (see module doc)."""
    final = check_output_dir(final, overwrite)
    lock = _lock_path(final)
    try:
        fd = _try_lock(lock)
    except OSError as exc:
        raise ConfigError(f"out={final}: cannot create the lock file {lock} ({exc.strerror}); pass another out=") \
            from None
    if fd is None:
        raise ConfigError(f"output directory {final} is being written by {_holder(lock)}; wait for it to finish or "
                          "pass another out=")
    try:
        remove_stale_staging(final.parent, held=final)
        check_output_dir(final, overwrite)  # again under the lock: a writer may have finished meanwhile
        with _writing(final, final.parent):
            tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.partial-{owner_tag()}-"))
        with _writing(final, tmp, remove=True):
            handler = logging.FileHandler(tmp / "log.txt")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        me = Path(final).resolve()
        handler.addFilter(lambda record: (scope := _LOG_SCOPE.get()) is None or me in scope)
        root = logging.getLogger("gi")
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            with _writing(final, tmp, remove=True):  # on any error the staging folder goes
                yield tmp
        finally:
            root.removeHandler(handler)
            handler.close()
        with _writing(final, tmp, remove=True):
            _publish(tmp, final, overwrite)
    finally:
        _unlock(lock, fd)


# ----------------------------------------------------------------------------- resumable tables
def cells_dir(final: Path) -> Path:
    """Where a resumable table keeps its finished cells: ``.<out>.cells/`` next to the output directory (removed
    by the command once the output directory is complete)."""
    return final.parent / f".{final.name}.cells"


def load_cell(cache: Path | None, key: str) -> dict[str, Any] | None:
    """A finished cell's JSON record kept by :func:`save_cell` (None when absent or ``cache`` is None)."""
    path = None if cache is None else cache / f"{key}.json"
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text())


def save_cell(cache: Path | None, key: str, record: dict[str, Any], files: dict[str, Path] | None = None) -> None:
    """Atomically keep a finished cell: its ``files`` (suffix → path, e.g. ``{"png": grid}``) as ``<key>.<suffix>``,
    then its JSON ``record`` (written last: a record on disk means the cell is complete)."""
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    for suffix, path in (files or {}).items():
        if path.exists():
            shutil.copyfile(path, cache / f".{key}.{suffix}.tmp")
            os.replace(cache / f".{key}.{suffix}.tmp", cache / f"{key}.{suffix}")
    tmp = cache / f".{key}.json.tmp"
    tmp.write_text(json.dumps(jsonable(record)))
    os.replace(tmp, cache / f"{key}.json")


def restore_cell_file(cache: Path | None, key: str, suffix: str, dest: Path) -> None:
    """Copy a kept cell's file (``<key>.<suffix>``) to ``dest``, if it was kept."""
    if cache is not None and (cache / f"{key}.{suffix}").exists():
        shutil.copyfile(cache / f"{key}.{suffix}", dest)


