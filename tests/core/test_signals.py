"""Signals in the driver wait until the main thread is out of the import system (fedray/core/signals.py)."""

import signal
import sys
import threading
import time

import pytest

from fedray.core import signals


class Stop(Exception):
    pass


def _stop(signum, frame):
    raise Stop(signum)


@pytest.fixture
def module_that_signals_itself(tmp_path, monkeypatch):
    """A module whose import sends SIGTERM to this process and then goes on importing for 0.2 s."""
    name = f"fedray_signal_probe_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text("import os, signal, time\n"
                                          "os.kill(os.getpid(), signal.SIGTERM)\n"
                                          "time.sleep(0.2)\n"
                                          "DONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _import_under(handler, name: str) -> None:
    """Import ``name`` with ``handler`` as SIGTERM's handler; the handler's ``Stop`` must come (then restored)."""
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(Stop):
            _import_then_wait(name)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _import_then_wait(name: str) -> float:
    """Import ``name``, then wait up to 5 s for the handler to raise; the seconds from the import's end."""
    __import__(name)
    t = time.monotonic()
    while time.monotonic() - t < 5:
        time.sleep(0.005)
    raise AssertionError("the signal was never handled")


def test_a_sigterm_during_an_import_is_handled_once_the_import_is_done(module_that_signals_itself):
    _import_under(signals.outside_imports(_stop), module_that_signals_itself)
    module = sys.modules[module_that_signals_itself]
    assert module.DONE  # the import ran to its end: the handler raised after it, not inside it
    # and no import lock is left behind: another thread imports the module at once
    done = threading.Event()
    threading.Thread(target=lambda: (__import__(module_that_signals_itself), done.set()), daemon=True).start()
    assert done.wait(5)


def test_without_the_wrapper_the_handler_raises_inside_the_import(module_that_signals_itself):
    """What the wrapper prevents: the plain handler interrupts the module half imported."""
    _import_under(_stop, module_that_signals_itself)
    assert module_that_signals_itself not in sys.modules


def test_outside_an_import_the_handler_runs_at_once():
    previous = signal.signal(signal.SIGTERM, signals.outside_imports(_stop))
    try:
        with pytest.raises(Stop):
            signal.raise_signal(signal.SIGTERM)
            raise AssertionError("not raised at once")
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_driver_handlers_wrap_only_pythons_defaults():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signals.install_driver_handlers()
        assert signal.getsignal(signal.SIGINT).__wrapped__ is signal.default_int_handler
        with pytest.raises(SystemExit) as exit_:
            signal.raise_signal(signal.SIGTERM)
        assert exit_.value.code == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        # handlers someone else set stay theirs
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        signals.install_driver_handlers()
        assert signal.getsignal(signal.SIGTERM) is _stop and signal.getsignal(signal.SIGINT) is _stop
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_an_import_that_does_not_end_gets_the_signal_after_the_patience(module_that_signals_itself, monkeypatch):
    """The deferral is bounded: an import still running after PATIENCE_S (here 0.05 s of its 0.2 s) is interrupted,
    so a process whose main thread waits in an import for ever can still be stopped."""
    monkeypatch.setattr(signals, "PATIENCE_S", 0.05)
    _import_under(signals.outside_imports(_stop), module_that_signals_itself)
    assert module_that_signals_itself not in sys.modules  # interrupted inside the import, as a plain handler would
