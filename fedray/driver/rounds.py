"""The round loop of a run's driver: rounds ``start .. train.rounds`` on the coordinator handle, each recorded
(ledger, ``metrics.jsonl``) with Ctrl-C / SIGTERM deferred while it is, the callbacks of
:mod:`fedray.reporting.callbacks`, a lost coordinator restarted from the last checkpoint, and resume."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import TYPE_CHECKING

from fedray.core.signals import outside_imports
from fedray.engine.dispatch import RunAborted
from fedray.driver.handle import CoordinatorLost, _reason
from fedray.driver.setup import Run, RunResult, check_resumable
from fedray.engine.state import ClientStateStore

if TYPE_CHECKING:
    from fedray.engine.round_report import RoundReport

__all__ = ["RoundLoop", "resume_state"]


class _Interrupted(Exception):
    pass


def _restore(run: Run, engine, st: dict | None) -> int:
    """Put the coordinator at checkpoint ``st`` (None: the initial state, which a new coordinator has) and
    drop what was recorded after it: metrics rows, ledger files, client-state versions. The first round to run."""
    last = 0 if st is None else int(st["round"])
    if st is None:
        ClientStateStore(run.state_path).clear()
    else:
        engine.load_state_dict(st)
        ClientStateStore(run.state_path).prune(keep_from_round=last + 1, drop_after_round=last)
    run.rd.truncate_metrics(last)
    return last + 1


def resume_state(run: Run, engine, log) -> int:
    """Load the newest checkpoint into the coordinator; the first round to run."""
    rd = run.rd
    if not run.resume:
        rd.truncate_metrics(0)
        return 1
    st = rd.load_checkpoint()  # what checkpoints/latest names; a damaged one raises
    if st is None:  # never start over silently: more than one interval of recorded rounds is refused
        again = check_resumable(rd, run.cfg, run.found)
        if again:
            log(f"[fedray] {rd.path}: no checkpoint yet (output.checkpoint_every={run.cfg.output.checkpoint_every}): "
                f"its {again} recorded round(s) run again from the initial state")
    start_round = _restore(run, engine, st)
    log(f"[fedray] resuming {rd.path} at round {start_round}")
    return start_round


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM wait until the block has run (in the main thread; elsewhere Python delivers no
    signal anyway). Without it a Ctrl-C right after a round's metrics row was written, before the loop knew
    the round was recorded, left the interruption's checkpoint unwritten (seen in CI).

    A signal that comes during the block is recorded by a handler of its own and raised again, to the
    handlers of before, as the block ends. Blocking the signals in this thread (``pthread_sigmask``) is not
    enough: the kernel hands a process-directed signal to any thread that has it unblocked (Ray's, an HTTP
    server's, tqdm's), and Python then runs the handler in the main thread mid-block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(pending):  # each signal once, in the order they came
            signal.raise_signal(s)


class RoundLoop:
    """Runs rounds ``start_round .. train.rounds`` on ``engine``, records each (ledger, metrics.jsonl),
    calls the callbacks; Ctrl-C or SIGTERM (``ray job stop``) ends it after recording the round in flight."""

    def __init__(self, run: Run, engine, callbacks: list, result: RunResult, log=print):
        self.run, self.engine, self.callbacks, self.result, self.log = run, engine, callbacks, result, log
        self.stopping = False

    def record(self, rnd: int, report: RoundReport, t_round: float) -> None:
        """Write the round's ledger and its metrics row (:meth:`RoundReport.as_row`); the callbacks get the row."""
        ledger = [row.as_dict() for row in report.ledger]
        with _signals_deferred():  # ledger, metrics row and result agree even when Ctrl-C comes now
            self.run.rd.write_ledger(rnd, ledger)
            report.failures = sum(1 for r in report.ledger if r.failure)
            report.wall_seconds = time.perf_counter() - t_round  # driver view: round trip + ledger write
            row = report.as_row()
            self.run.rd.append_metrics(row)
            self.result.rounds.append(row)
        for cb in self.callbacks:
            if cb.on_round_end(self, row):
                self.stopping = True

    def run_rounds(self, start_round: int) -> None:
        def on_sigterm(signum, frame):  # `ray job stop` sends SIGTERM to the driver: stop after a checkpoint
            raise _Interrupted()

        try:
            previous = signal.signal(signal.SIGTERM, outside_imports(on_sigterm))
        except ValueError:  # not the main thread
            previous = None
        for cb in self.callbacks:
            cb.on_run_start(self, start_round)
        try:
            rnd = start_round
            while rnd <= int(self.run.cfg.train.rounds):
                for cb in self.callbacks:
                    cb.on_round_start(self, rnd)
                t_round = time.perf_counter()
                try:
                    self.record(rnd, self.engine.run_round(rnd), t_round)
                except CoordinatorLost as e:  # in the round or in a callback's call: back to the last checkpoint
                    rnd = self._restart(rnd, e)
                    continue
                if self.stopping:
                    self.result.stopped_early = True
                    break
                rnd += 1
        except (KeyboardInterrupt, _Interrupted):
            self.result.interrupted = True
            self._finish_in_flight()
            done = self.result.rounds[-1]["round"] if self.result.rounds else 0
            self.log(f"[fedray] interrupted after round {done}; resume with: fedray run --resume {self.run.rd.path}")
        except Exception as e:
            self.result.failed = _reason(e)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            for cb in self.callbacks:
                cb.on_run_end(self, self.result.interrupted)

    def _restart(self, rnd: int, err: CoordinatorLost) -> int:
        """The coordinator died during round ``rnd``: a new one, at the last checkpoint (the rows, ledger files
        and client state recorded after it are dropped); the round to go on from. Past
        ``engine.max_coordinator_restarts`` restarts the run fails."""
        limit = int(self.run.cfg.engine.max_coordinator_restarts)
        while True:
            if self.engine.restarts >= limit:
                raise RunAborted(f"round {rnd}: the coordinator died after {self.engine.restarts} restart(s) "
                                 f"(engine.max_coordinator_restarts={limit}): {err}") from err
            self.log(f"[fedray] coordinator lost in round {rnd} ({err}); restarting it from the last checkpoint "
                     f"({self.engine.restarts + 1}/{limit})")
            try:
                self.engine.restart()
                start = _restore(self.run, self.engine, self.run.rd.load_checkpoint())
                break
            except CoordinatorLost as again:
                err = again
        self.result.coordinator_restarts = self.engine.restarts
        self.result.rounds = self.run.rd.read_metrics()
        self.stopping = False  # a stop asked for in a dropped round is asked again when that round is re-run
        for cb in self.callbacks:
            cb.on_restart(self, start)
        self.log(f"[fedray] coordinator restarted; continuing at round {start}")
        return start

    def _finish_in_flight(self) -> None:
        """The actor finishes the round it was running anyway: record it, so checkpoint and rows agree."""
        try:
            flight = self.engine.in_flight.get("round")
            if flight is not None:
                self.log(f"[fedray] interrupted: finishing round {flight} on the coordinator first")
            done = self.engine.finish_in_flight()
            if done is not None:
                self.record(*done)
        except Exception as e:  # noqa: BLE001 - a second Ctrl-C or a failed round: checkpoint what we have
            self.log(f"[fedray] round {self.engine.in_flight.get('round', '?')} not recorded: {type(e).__name__}: {e}")
