"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file fedray writes into a run directory, a partition cache or a sweep table goes through
:func:`atomic_writer`: the content is written to a temporary file in the same directory, flushed and
fsynced, then renamed over the target (``os.replace``); on any error the temporary file is removed and
the target is untouched. The one append-only file of a run (``metrics.jsonl``) goes through
:func:`append_bytes`, which cuts the file back to its length before the append when the append fails, so a
full disk never leaves a torn line behind.

A full disk (``ENOSPC``, or a quota's ``EDQUOT``) in either is raised as :class:`~fedray.core.errors.DiskFull`
naming the file that could not be written.

Testing aid (the chaos harness, ``bench/chaos.py``, and the tests): ``FEDRAY_FAULT_WRITE=GLOB@N=ACTION`` (several
separated by ``,``) acts on the N-th write (1-based, counted per process from its start) of a file whose name
matches ``GLOB`` (``fnmatch``: ``ckpt-*.npz``, ``metrics.jsonl``, ``round-*.parquet``, ``run.json``), in the
middle of that write (the temporary file holds its content, or half of the appended bytes are written):
``enospc`` raises the disk-full error a full disk gives there; ``sigterm``, ``sigint`` and ``sigkill`` send this
process that signal. With ``FEDRAY_FAULT_WRITE_LOG=FILE`` each fault that strikes first appends its entry
(``GLOB@N=ACTION``) to FILE, so the harness knows which of several planned faults struck.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from fedray.core.errors import DiskFull

__all__ = ["FAULT_ENV", "FAULT_LOG_ENV", "LockHeld", "append_bytes", "atomic_writer", "atomic_write_bytes",
           "atomic_write_text", "exclusive_lock", "is_temp_name"]

FAULT_ENV = "FEDRAY_FAULT_WRITE"
FAULT_LOG_ENV = "FEDRAY_FAULT_WRITE_LOG"
_FAULT_ACTIONS = ("enospc", "sigterm", "sigint", "sigkill")
_FULL = (errno.ENOSPC, errno.EDQUOT)
_counts: dict[str, int] = {}
_counts_lock = threading.Lock()


def _fault_spec() -> list[tuple[str, int, str]]:
    """The entries of :data:`FAULT_ENV`: (glob, n, action); a malformed one raises ValueError naming it."""
    out = []
    for entry in filter(None, (e.strip() for e in os.environ.get(FAULT_ENV, "").split(","))):
        try:
            where, action = entry.rsplit("=", 1)
            glob, n = where.rsplit("@", 1)
            if action not in _FAULT_ACTIONS or int(n) < 1 or not glob:
                raise ValueError
        except ValueError:
            raise ValueError(f"{FAULT_ENV}: {entry!r} is not GLOB@N=ACTION with N >= 1 and ACTION one of "
                             f"{', '.join(_FAULT_ACTIONS)} (a testing aid)") from None
        out.append((glob, int(n), action))
    return out


def _injected_fault(path: Path) -> None:
    """The fault :data:`FAULT_ENV` asks for at this write of ``path``, if any (see the module docstring)."""
    if FAULT_ENV not in os.environ:
        return
    spec = _fault_spec()
    with _counts_lock:  # this write counted once for each GLOB it matches
        seen = {glob: _counts.get(glob, 0) + 1 for glob in {g for g, _, _ in spec} if fnmatch.fnmatch(path.name, glob)}
        _counts.update(seen)
    for glob, n, action in spec:
        if seen.get(glob) != n:
            continue
        if os.environ.get(FAULT_LOG_ENV):
            fd = os.open(os.environ[FAULT_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{glob}@{n}={action}\n".encode())
            finally:
                os.close(fd)
        if action == "enospc":
            raise OSError(errno.ENOSPC, f"No space left on device (injected by {FAULT_ENV})", str(path))
        os.kill(os.getpid(), getattr(signal, action.upper()))


def _disk_full(path: Path, err: OSError) -> DiskFull:
    return DiskFull(err.errno, f"no space left on device writing {path} ({err.strerror}); the file is as it was "
                               f"before this write")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a temporary file of :func:`atomic_writer` (``.<target>.<random>.tmp[...]``): one that a
    process killed in the middle of a write leaves behind, and that no reader ever opens."""
    return name.startswith(".") and ".tmp" in name and name.count(".") >= 3


@contextmanager
def atomic_writer(path: str | Path, suffix: str = ".tmp") -> Iterator[BinaryIO]:
    """``with atomic_writer(p) as f: f.write(...)``: ``p`` is replaced when the block ends without error.

    ``suffix`` ends the temporary file's name (some writers pick a format from it, e.g. ``.tmp.npz``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            _injected_fault(path)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno in _FULL and not isinstance(e, DiskFull):
            raise _disk_full(path, e) from e
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_bytes(path: str | Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created) and fsync it. On any error, a full disk or a signal's exception, the
    file is cut back to its length before the append: a reader never sees a torn last line."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            if FAULT_ENV in os.environ:  # an injected fault strikes with half of the bytes written
                _write_all(fd, data[:len(data) // 2])
                _injected_fault(path)
                data = data[len(data) // 2:]
            _write_all(fd, data)
            os.fsync(fd)
        except BaseException as e:
            os.ftruncate(fd, size)  # frees space: works on a full disk too
            if isinstance(e, OSError) and e.errno in _FULL:
                raise _disk_full(path, e) from e
            raise
    finally:
        os.close(fd)


class LockHeld(RuntimeError):
    """Another live process holds an :func:`exclusive_lock`."""


@contextmanager
def exclusive_lock(path: str | Path, holder: str, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) for the block, writing ``holder`` into it; a second
    holder on this host gets :class:`LockHeld` naming the first. The OS releases the lock when its process
    dies, so a driver that finds it free knows that no other driver of ``what`` is alive."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        first = f.read().strip()
        f.close()
        raise LockHeld(f"{what}: another driver is running it ({first or 'unknown'}; lock {path})") from None
    try:
        f.seek(0)
        f.truncate()
        f.write(holder + "\n")
        f.flush()
        yield
    finally:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        finally:
            f.close()
