"""The Trackers callback's bookkeeping against a real MLflow store: a resume after a rollback logs each round
once, a lost tracker run gets every recorded round, a tracker that fails mid-run is stopped with one warning
and recorded while the run goes on; and the Progress callback's lines."""

from __future__ import annotations

import types

from mlflow.tracking import MlflowClient

from fedray.config import MlflowConfig
from fedray.reporting.callbacks import Progress, Trackers
from fedray.driver.setup import RunResult
from fedray.reporting.report import _tracker_lines
from fedray.reporting.rundir import RunDir
from fedray.reporting.trackers import MlflowTracker


def _row(rnd: int, wall: float = 1.0) -> dict:
    return {"round": rnd, "loss": 1.0 / rnd, "accuracy": 0.1 * rnd, "seconds": {"train": wall}, "dropped": []}


def _session(rd: RunDir, uri: str, experiment: str, recorded: list[dict], log):
    """What run_experiment does for a (resumed) run: the callback, started, and its view of the loop."""
    cb = Trackers(rd, [MlflowTracker(MlflowConfig(enabled=True, tracking_uri=uri, experiment=experiment), rd.path,
                                     rd.path.name)], log)
    cb.start(types.SimpleNamespace(to_dict=lambda: {"seed": 0}), {"algorithm": "fedavg", "config_hash": "abc"})
    loop = types.SimpleNamespace(result=RunResult(run_dir=rd.path, rounds=list(recorded)))
    cb.on_run_start(loop, len(recorded) + 1)
    return cb, loop


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)]


def test_resume_after_a_rollback_logs_each_round_once(mlflow_store, tmp_path):
    rd = RunDir(tmp_path / "run").create()
    lines: list[str] = []
    cb, loop = _session(rd, mlflow_store, "rollback", [], lines.append)
    for r in (1, 2, 3):
        cb.on_round_end(loop, _row(r))
    run_id = rd.read_json("trackers.json")["mlflow"]["run_id"]
    # the driver died after round 3; the checkpoint was at round 2: rounds 1-2 recorded, round 3 runs again
    cb2, loop2 = _session(rd, mlflow_store, "rollback", [_row(1), _row(2)], lines.append)
    for r in (3, 4):
        cb2.on_round_end(loop2, _row(r, wall=2.0))
    cb2.finish("finished", {"round": 4, "accuracy": 0.4})
    st = rd.read_json("trackers.json")["mlflow"]
    assert st["run_id"] == run_id and st["last_round"] == 4 and st["status"] == "finished" and st["error"] is None
    assert _history(mlflow_store, run_id, "loss") == [(r, 1.0 / r) for r in (1, 2, 3, 4)]
    assert _history(mlflow_store, run_id, "seconds/train") == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 2.0)]
    assert MlflowClient(tracking_uri=mlflow_store).get_run(run_id).info.status == "FINISHED"
    assert lines == []


def test_a_lost_tracker_run_gets_every_recorded_round(mlflow_store, tmp_path):
    rd = RunDir(tmp_path / "run").create()
    rd.write_json("trackers.json", {"mlflow": {"run_id": "f" * 32, "tracking_uri": mlflow_store, "last_round": 2}})
    lines: list[str] = []
    cb, loop = _session(rd, mlflow_store, "lost", [_row(1), _row(2)], lines.append)
    cb.on_round_end(loop, _row(3))
    st = rd.read_json("trackers.json")["mlflow"]
    assert st["run_id"] != "f" * 32 and st["last_round"] == 3 and "not in" in lines[0]
    assert [s for s, _ in _history(mlflow_store, st["run_id"], "accuracy")] == [1, 2, 3]


def test_a_failing_tracker_warns_once_and_the_run_goes_on(mlflow_store, tmp_path):
    rd = RunDir(tmp_path / "run").create()
    lines: list[str] = []
    cb, loop = _session(rd, mlflow_store, "failing", [], lines.append)
    cb.on_round_end(loop, _row(1))
    run_id = rd.read_json("trackers.json")["mlflow"]["run_id"]
    MlflowClient(tracking_uri=mlflow_store).delete_run(run_id)  # someone deletes the run: logging is refused
    for r in (2, 3):
        assert not cb.on_round_end(loop, _row(r))
    assert len(lines) == 1 and "could not log round 2" in lines[0] and "holds rounds 1-1" in lines[0]
    cb.finish("finished", {})
    st = rd.read_json("trackers.json")["mlflow"]
    assert st["last_round"] == 1 and st["error"].startswith("round 2: ") and "status" not in st
    assert "incomplete, holds rounds 1-1" in lines[-1]
    (shown,) = _tracker_lines(rd)
    assert shown.startswith("mlflow:") and f"run {run_id}" in shown and "rounds 1-1, FAILED at round 2" in shown


def test_progress_lines_without_a_terminal():
    lines: list[str] = []
    p = Progress(True, 3, lines.append)
    p.on_run_start(None, 2)
    p.on_round_end(None, {"round": 2, "accuracy": None, "loss": 0.5, "seconds_total": 1.25})
    p.on_round_end(None, {"round": 3, "accuracy": 0.875, "loss": 0.25, "seconds_total": 1.0})
    p.on_run_end(None, False)
    assert lines == ["[fedray] round    2/3  acc None  loss 0.5000  1.25 s",
                     "[fedray] round    3/3  acc 0.8750  loss 0.2500  1.00 s"]
    quiet: list[str] = []
    Progress(False, 3, quiet.append).on_round_end(None, {"round": 1, "loss": 0.5, "seconds_total": 1.0})
    assert quiet == []
