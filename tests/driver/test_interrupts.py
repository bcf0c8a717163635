"""fedray.driver.runner: Ctrl-C (SIGINT) or `ray job stop` (SIGTERM) arriving while the driver records a round
waits until the round is recorded, so the metrics rows, the loop's result and the interruption's checkpoint
agree (a whole run interrupted on Ray: tests/integration/test_resume.py). Real signals, fake engine."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from fedray.reporting.callbacks import Callback
from fedray.engine.round_report import RoundReport
from fedray.driver.rounds import RoundLoop
from fedray.driver.setup import RunResult


def test_a_signal_in_the_block_is_delivered_after_it():
    from fedray.driver.rounds import _signals_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with _signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("recorded")
        done.append("after")  # not reached: the deferred Ctrl-C is raised as the block ends
    assert done == ["recorded"]


class _Engine:
    in_flight: dict = {}

    def run_round(self, rnd: int) -> RoundReport:
        return RoundReport(rnd, 0, 0, 0.0, 0.0)

    def finish_in_flight(self):
        return None


class _RunDir:
    """Ctrl-C comes just after round 1's metrics row is written (the window CI once hit)."""

    path = "runs/x"

    def __init__(self):
        self.rows = []

    def write_ledger(self, rnd, ledger):
        pass

    def append_metrics(self, report):
        self.rows.append(report["round"])
        if report["round"] == 1:
            os.kill(os.getpid(), signal.SIGINT)


class _AtEnd(Callback):
    def on_run_end(self, loop, interrupted):
        self.seen = (interrupted, [r["round"] for r in loop.result.rounds])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_right_after_a_metrics_row_still_counts_that_round(tmp_path, monkeypatch, sig):
    """The loop stops after round 1 with round 1 in its result, as in metrics.jsonl: the checkpoint written at
    the end (Checkpointer.on_run_end) is the state after round 1, matching the rows."""
    rd = _RunDir()
    if sig == signal.SIGTERM:
        monkeypatch.setattr(rd, "append_metrics", lambda report: (rd.rows.append(report["round"]),
                                                                   report["round"] == 1 and os.kill(os.getpid(), sig)))
    run = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(rounds=3)), rd=rd)
    end = _AtEnd()
    result = RunResult(tmp_path)
    RoundLoop(run, _Engine(), [end], result, log=lambda *a: None).run_rounds(1)
    assert result.interrupted and rd.rows == [1] and end.seen == (True, [1])


def test_abort_waits_for_a_stuck_start_no_longer_than_the_start_deadline():
    """A run that stops while Ray's start never ends (an import deadlocked in the start thread: chaos seed 21 schedule
    60) returns from EarlyStart.abort after engine.start_timeout_s, saying so, instead of waiting for ever."""
    import threading
    import time

    from fedray.driver.launch import EarlyStart

    early = EarlyStart.__new__(EarlyStart)  # no thread: its start is "under way" for ever
    said: list[str] = []
    early.cfg = SimpleNamespace(engine=SimpleNamespace(start_timeout_s=0.2))
    early.done, early.actors, early.log = threading.Event(), None, said.append
    t = time.monotonic()
    early.abort()
    assert 0.2 <= time.monotonic() - t < 5
    assert said and "engine.start_timeout_s=0.2" in said[0]
