"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file fedray writes into a run directory, a partition cache or a sweep table goes through
:func:`atomic_writer`: the content is written to a temporary file in the same directory, flushed and
fsynced, then renamed over the target (``os.replace``); on any error the temporary file is removed and
the target is untouched.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

__all__ = ["LockHeld", "atomic_writer", "atomic_write_bytes", "atomic_write_text", "exclusive_lock"]


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
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


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
