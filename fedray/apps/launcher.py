"""One launcher for the applications that run many whole experiments: ``fedray sweep`` points, ``fedray tune``
trials and ``fedray scale`` points.

A :class:`Launcher` keeps up to ``concurrency`` runs in flight, each one :func:`~fedray.driver.runner.run_experiment`
call in a driver thread. With ``engine.backend: ray`` every run starts its own coordinator and client workers, a
slice of the cluster sized by :mod:`fedray.apps.slices`, so the work happens in the actors, not in the threads.
For every run the launcher

- writes the run's driver log into a file of its own (:attr:`Job.log_path`; a failure's traceback too);
- calls the application's per-round hook (:attr:`Job.on_round`: an Optuna pruner, a probe), which stops the run
  there when it returns True;
- turns what happened into a :class:`RunOutcome` (the config, the run directory, the status, the error's first
  line, the :class:`~fedray.driver.setup.RunResult`) and hands it to the application in the launcher's own
  thread, one at a time, so the applications keep their tables and studies without locks.

Ctrl-C or SIGTERM (``ray job stop``) stop the batch: no run starts any more and the running ones stop after their
round in flight, with a checkpoint (their outcome is ``interrupted``); :meth:`Launcher.run` then returns True.
:func:`output_lock` keeps an application's output directory to one driver at a time.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import re
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from fedray.config import ConfigError, ExperimentConfig
from fedray.core.io import LockHeld, exclusive_lock
from fedray.core.signals import outside_imports
from fedray.reporting.claim import run_dir_of
from fedray.driver.runner import run_experiment
from fedray.driver.setup import RunResult
from fedray.reporting.progress import ProgressBar

__all__ = ["Job", "Launcher", "RunOutcome", "error_line", "log_writer", "output_lock"]

#: what became of a run: ran to its last round | its application's hook stopped it (e.g. pruned) | the batch was
#: stopped (Ctrl-C, SIGTERM), the run has a checkpoint | it raised
STATUSES = ("finished", "stopped", "interrupted", "failed")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Job:
    """One run of a batch: a new run of ``config`` (``overwrite``: over what its run directory holds) or the run
    directory ``resume`` continued from its checkpoint."""

    key: Any  # the application's name for it: a point's index, a trial's number
    config: ExperimentConfig | None = None
    resume: Path | None = None
    overwrite: bool = False
    log_path: Path | None = None  # the run's driver log; None: the log lines are dropped
    on_round: Callable[[dict], bool | None] | None = None  # after every round; True stops the run there
    # called in the run's thread before it starts; a config it returns is the run's. What it raises fails the
    # run like the run's own errors (a trial whose run directory cannot be made)
    prepare: Callable[[], ExperimentConfig | None] | None = None


@dataclass
class RunOutcome:
    """What one run of a batch came to (:data:`STATUSES`)."""

    key: Any
    status: str
    config: ExperimentConfig | None  # None for a run continued from its directory (Job.resume)
    run_dir: Path | None
    error: str | None = None  # a failed run's error, its first line (the traceback is in the run's log)
    result: RunResult | None = None
    seconds: float = 0.0  # wall seconds of the run_experiment call

    @property
    def rounds(self) -> int:
        """Rounds this call ran (of a resumed run: with those recorded before)."""
        return len(self.result.rounds) if self.result is not None else 0


def error_line(e: BaseException, limit: int = 500) -> str:
    """``Type: message`` of ``e`` on one line: the cause a Ray task error carries (the coordinator's exception),
    its first non-empty line, without terminal colour codes."""
    cause = getattr(e, "cause", None) or e
    lines = [ln.strip() for ln in _ANSI.sub("", str(cause)).splitlines() if ln.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:limit]


@contextlib.contextmanager
def output_lock(path: str | Path, what: str, note: str = "") -> Iterator[None]:
    """Hold ``path`` (an application's lock file, e.g. ``sweep.lock``) for one driver on this host; a second driver
    gets a ConfigError naming the first (:func:`fedray.core.io.exclusive_lock`: released by the OS when a driver
    dies, so a driver that holds it knows that whatever its output directory records as running is orphaned)."""
    holder = f"pid {os.getpid()} on {socket.gethostname()}" + (f", {note}" if note else "")
    try:
        with exclusive_lock(path, holder, what):
            yield
    except LockHeld as e:
        raise ConfigError(str(e)) from None


def log_writer(path: Path | None) -> Callable[[str], None]:
    """A log function that appends timestamped lines to ``path`` (a run's driver log; None: drops them)."""
    if path is None:
        return lambda *a, **k: None

    def write(msg: str) -> None:
        try:
            with open(path, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
        except OSError:
            pass

    return write


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (``ray job stop``) raises KeyboardInterrupt in the main thread, as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt()

    prev = signal.signal(signal.SIGTERM, outside_imports(on_sigterm))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)


class Launcher:
    """Runs :class:`Job` s, ``concurrency`` at once, with a progress bar of ``total`` ``unit`` s (a bar on a terminal,
    the application's own line per run otherwise: :class:`~fedray.reporting.progress.ProgressBar`); ``tag`` starts
    the launcher's own lines (``[sweep]``)."""

    def __init__(self, concurrency: int, *, tag: str, total: int, unit: str, initial: int = 0, desc: str | None = None,
                 log=print):
        self.concurrency = max(1, int(concurrency))
        self._stop = threading.Event()  # set by Ctrl-C / SIGTERM: no run starts, the running ones stop
        self.bar = ProgressBar(total, unit, desc=desc, initial=initial, log=log)
        self.tag, self.unit = tag, unit

    def say(self, line: str) -> None:
        """One line of the batch's progress (above the bar when there is one)."""
        self.bar.write(line)

    def advance(self, n: int = 1, **postfix) -> None:
        self.bar.update(n, **postfix)

    def run(self, next_job: Callable[[], Job | None], on_outcome: Callable[[RunOutcome], None],
            stopping: str = "") -> bool:
        """Run until ``next_job()`` (asked whenever a run may start) gives None and no run is left; each outcome goes
        to ``on_outcome`` as the run ends. Returns True when Ctrl-C or SIGTERM stopped the batch (``stopping`` is
        said then, after how many runs are stopping)."""
        running: set[cf.Future] = set()
        interrupted = False
        try:
            with _sigterm_interrupts(), \
                    cf.ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"fedray-{self.unit}") as pool:
                try:
                    while True:
                        while len(running) < self.concurrency and not self._stop.is_set():
                            job = next_job()
                            if job is None:
                                break
                            running.add(pool.submit(self._run, job))
                        if not running:
                            break
                        finished, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                        for fut in finished:
                            running.discard(fut)
                            on_outcome(fut.result())
                except KeyboardInterrupt:
                    interrupted = True
                    self._stop.set()
                    self.say(f"[{self.tag}] interrupted: {len(running)} running {self.unit}(s) stop after their "
                             f"round in flight{stopping}")
                    for fut in cf.as_completed(list(running)):
                        running.discard(fut)
                        on_outcome(fut.result())
        finally:
            self.bar.close()
        return interrupted

    def _run(self, job: Job) -> RunOutcome:
        log = log_writer(job.log_path)
        by_batch = threading.Event()

        def on_round(report: dict) -> bool:
            stop = bool(job.on_round(report)) if job.on_round is not None else False
            if self._stop.is_set():
                by_batch.set()
                return True
            return stop

        cfg = job.config
        t0 = time.perf_counter()
        try:
            if job.prepare is not None:
                cfg = job.prepare() or cfg
            res = run_experiment(cfg, resume=job.resume, overwrite=job.overwrite, progress=False, log=log,
                                 on_round=on_round)
        except Exception as e:  # noqa: BLE001 - one failed run must not stop the others
            err = error_line(e)
            log(f"failed: {err}\n{traceback.format_exc()}")
            run_dir = job.resume or (run_dir_of(cfg) if cfg is not None else None)
            return RunOutcome(job.key, "failed", cfg, run_dir, error=err, seconds=time.perf_counter() - t0)
        status = ("interrupted" if by_batch.is_set() or res.interrupted else
                  "stopped" if res.stopped_early else "finished")
        return RunOutcome(job.key, status, cfg, Path(res.run_dir), result=res, seconds=time.perf_counter() - t0)
