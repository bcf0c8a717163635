"""fedray.apps.launcher: the one launcher of sweep, tune and scale. Typed outcomes (finished, stopped by the
application's hook, failed with the error's first line and the traceback in the run's log), SIGTERM stopping the
batch after the round in flight (checkpointed, nothing more started), the error line of a wrapped cause, the output
lock. In-process runs of the tiny digits experiment."""

from __future__ import annotations

import os
import signal

import pytest

from fedray.apps.launcher import Job, Launcher, error_line, output_lock
from fedray.config import ConfigError, from_dict
from fedray.reporting.rundir import RunDir
from tests.apps.sweeps import tiny_base


def _cfg(tmp_path, partition_cache, **over):
    base = tiny_base(partition_cache, backend="local")
    base["output"]["root"] = str(tmp_path / "runs")
    for key, value in over.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update(value)
        else:
            base[key] = value
    return from_dict(base)


def _run(launcher: Launcher, jobs: list[Job]) -> tuple[bool, dict]:
    pending, outcomes = iter(jobs), {}
    interrupted = launcher.run(lambda: next(pending, None), lambda o: outcomes.__setitem__(o.key, o))
    return interrupted, outcomes


def test_outcomes_say_what_became_of_each_run(tmp_path, partition_cache):
    bad = _cfg(tmp_path, partition_cache, seed=1, engine={"max_client_retries": 0, "fault_injection": {
        "kind": "raise", "round": 1, "client": 0, "times": 9}}, train={"clients_per_round": 8})
    jobs = [Job("ok", config=_cfg(tmp_path, partition_cache), log_path=tmp_path / "ok.log"),
            Job("pruned", config=_cfg(tmp_path, partition_cache, seed=2), on_round=lambda r: r["round"] == 1),
            Job("bad", config=bad, log_path=tmp_path / "bad.log")]
    interrupted, out = _run(Launcher(2, tag="test", total=3, unit="run", log=lambda m: None), jobs)
    assert not interrupted and set(out) == {"ok", "pruned", "bad"}
    ok, pruned, failed = out["ok"], out["pruned"], out["bad"]
    assert (ok.status, ok.rounds, ok.error) == ("finished", 3, None) and ok.config is jobs[0].config
    assert ok.run_dir == ok.result.run_dir and RunDir(ok.run_dir).read_json("run.json")["status"] == "finished"
    assert "[fedray] run" in (tmp_path / "ok.log").read_text()
    assert (pruned.status, pruned.rounds) == ("stopped", 1)
    assert failed.status == "failed" and failed.result is None and failed.run_dir is not None
    assert failed.error.startswith("RunAborted: round 1: 1 of 8 clients failed") and failed.error.endswith(
        "client 0: TransientError: injected fault in round 1, client 0")
    assert "\n" not in failed.error and "injected fault in round 1, client 0" in (tmp_path / "bad.log").read_text()
    assert "Traceback" in (tmp_path / "bad.log").read_text()


def test_sigterm_stops_the_batch_after_the_round_in_flight(tmp_path, partition_cache):
    """The first run sends SIGTERM to this process after its round 1 (as `ray job stop` does): it stops there with a
    checkpoint, its outcome is interrupted, the second run never starts and run() says the batch was stopped."""
    def term(report):
        if report["round"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    lines: list[str] = []
    asked = []
    jobs = iter([Job(0, config=_cfg(tmp_path, partition_cache), on_round=term),
                 Job(1, config=_cfg(tmp_path, partition_cache, seed=5))])
    out = {}
    launcher = Launcher(1, tag="test", total=2, unit="run", log=lines.append)
    previous = signal.getsignal(signal.SIGTERM)
    interrupted = launcher.run(lambda: asked.append(1) or next(jobs, None), lambda o: out.__setitem__(o.key, o),
                               stopping="; resume them")
    assert interrupted and list(out) == [0] and len(asked) == 1
    assert out[0].status == "interrupted" and out[0].rounds < 3
    assert RunDir(out[0].run_dir).latest_checkpoint() is not None
    assert lines == ["[test] interrupted: 1 running run(s) stop after their round in flight; resume them"]
    assert signal.getsignal(signal.SIGTERM) == previous  # the launcher's handler is gone again


def test_error_line_is_the_first_line_of_the_cause():
    class Wrapped(RuntimeError):
        pass

    e = Wrapped("a long Ray traceback\nwith lines")
    e.cause = ValueError("\x1b[31mbad value\x1b[0m\nmore detail")
    assert error_line(e) == "ValueError: bad value"
    assert error_line(KeyError("k")) == "KeyError: 'k'" and len(error_line(OSError("x" * 900))) == 500


def test_output_lock_admits_one_driver(tmp_path):
    with output_lock(tmp_path / "x.lock", "batch x"):
        with pytest.raises(ConfigError, match=r"batch x: another driver is running it \(pid \d+ on "):
            with output_lock(tmp_path / "x.lock", "batch x"):
                pass
    with output_lock(tmp_path / "x.lock", "batch x"):
        pass
