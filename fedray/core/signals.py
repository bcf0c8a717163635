"""Ctrl-C and SIGTERM in the driver, never in the middle of an import.

Python runs a signal's handler in the main thread between two bytecodes, wherever that thread is, and a
handler that raises (``KeyboardInterrupt``, ``sys.exit``) raises there. Inside the import system that can
leave a module's import lock held for good (CPython takes and drops those locks in Python code, in
``importlib._bootstrap``). The next thread to import that module waits for ever. fedray's driver imports in
two threads while a run starts (the main thread loads fedray and the data, :class:`~fedray.driver.launch.EarlyStart`
imports Ray and starts it), so a SIGTERM 0.3-0.7 s into ``fedray run`` left the main thread waiting for the
start thread and the start thread waiting for a module lock: a driver that never ended (found by
bench/chaos.py, seed 21 schedule 60).

:func:`outside_imports` wraps a handler: while the main thread is inside the import system the signal is sent
again 20 ms later, until the import is done (at most 5 s); elsewhere the handler runs at once.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable

__all__ = ["in_import", "install_driver_handlers", "outside_imports"]

Handler = Callable[[int, Any], Any]
#: how long a signal that came during an import waits before it is sent again
RETRY_S = 0.02
#: an import still under way this long after the signal came runs the handler anyway: an import that never ends
#: (it waits for a lock another thread holds) must not make the process impossible to stop
PATIENCE_S = 5.0
_BOOTSTRAP = os.path.join("importlib", "_bootstrap")


def in_import(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame that called it runs the import system's own code."""
    while frame is not None:
        name = frame.f_code.co_filename  # "<frozen importlib._bootstrap>", or its file with -X frozen_modules=off
        if name.startswith("<frozen importlib") or _BOOTSTRAP in name:
            return True
        frame = frame.f_back
    return False


def _send_again(signum: int) -> None:
    time.sleep(RETRY_S)
    os.kill(os.getpid(), signum)


def outside_imports(handler: Handler) -> Handler:
    """``handler``, run when the main thread is outside the import system: a signal that comes during an import
    is sent again (to this process, whatever handler it has by then) every :data:`RETRY_S` until the import
    is over, or for at most :data:`PATIENCE_S`, after which the handler runs where the thread is. The sender
    is a bare ``_thread`` thread: starting a ``threading.Thread`` takes the threading module's locks, which
    the interrupted code may hold."""
    since: dict[int, float] = {}  # signal -> when it first came during an import

    def deferred(signum: int, frame: FrameType | None) -> Any:
        if in_import(frame) and time.monotonic() - since.setdefault(signum, time.monotonic()) < PATIENCE_S:
            _thread.start_new_thread(_send_again, (signum,))
            return None
        since.pop(signum, None)
        return handler(signum, frame)

    deferred.__wrapped__ = handler  # type: ignore[attr-defined]
    return deferred


def _exit(signum: int, frame: Any) -> None:
    sys.exit(signum)


def install_driver_handlers() -> None:
    """In the main thread, where the process keeps Python's own behaviour, make it safe for imports: Ctrl-C raises
    ``KeyboardInterrupt`` and SIGTERM exits (``sys.exit(15)``, as ``ray.init`` from the main thread would
    set), both outside the import system (:func:`outside_imports`). Handlers set by others are left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, outside_imports(_exit))
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, outside_imports(signal.default_int_handler))
