"""Ending a command-line process without the interpreter's teardown.

When a Python process ends normally, the interpreter frees every module it imported, one object at a time.
With torch, pyarrow, pandas and Ray loaded (as in every ``fedray run``) that takes 0.3-0.8 s on this
project's 2-core machines, after the run's last result is written, and nothing the user sees depends on
it. :func:`leave` does what finalization does that matters, in the interpreter's own order, and then ends
the process at once:

1. the threading module's shutdown: its exit callbacks (``concurrent.futures`` stops its executors) and a
   join of every non-daemon thread, as ``Py_FinalizeEx`` does first;
2. the ``atexit`` handlers (Ray's disconnect, ``fedray up``'s idle-worker refill, trackers' flushes, the
   logging module's flush);
3. a flush of ``sys.stdout`` and ``sys.stderr``;
4. ``os._exit(code)``.

What it skips: object destructors (``__del__``) run by the final garbage collection and C++ static
destructors. fedray writes every file with explicit closes (atomic writes, append-and-close logs), so
no output depends on them. Only the command line's entry point (:func:`fedray.cli.console`) calls it:
never a library function (a test or a notebook calling :func:`fedray.cli.main` keeps its interpreter).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

__all__ = ["leave"]


def leave(code: int = 0) -> NoReturn:
    """End this process with exit status ``code`` after the threading shutdown, the ``atexit`` handlers and a
    flush of the standard streams, without freeing the interpreter's modules (module docstring)."""
    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx calls first
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    else:
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken stream: nothing left to save
            pass
    os._exit(int(code))
