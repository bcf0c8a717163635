"""fedray sweep on a real Ray: `python -m jobs.sweep`, its points running on the session's Ray (RAY_ADDRESS, as
under a job), is SIGKILLed while point 2 runs (FEDRAY_SWEEP_KILL_AT: after point 2 records round 2, before that
round's checkpoint), then resumed: the tables equal those of an uninterrupted sweep, and their numbers are the
runs' own metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from fedray.apps.sweep import run_sweep
from fedray.apps.sweep_spec import load_sweep
from fedray.cli import main as cli
from tests.apps.sweeps import write_sweep
from tests.helpers import ROOT

pytestmark = pytest.mark.ray


def _metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _title(metric: str) -> str:
    from fedray.reporting.seeds import metric_title

    return metric_title(metric)  # the one column's label: the table has no column field


def _tables(out) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "tables").iterdir())}


def test_killed_sweep_resumes_to_the_uninterrupted_tables(tmp_path, partition_cache, ray_session):
    # three seeds, two at a time: point 2 starts when point 0 or 1 has finished
    path = write_sweep(tmp_path, partition_cache, axes={"seed": [0, 1, 2]},
                       table={"rows": "algorithm.name", "metric": ["accuracy", "ema_accuracy"]})
    # the reference: uninterrupted, in this process, on the in-process engine (one point at a time): the
    # same run directories (the backend is not hashed) and, fedray's promise, the same numbers
    ref = run_sweep(load_sweep(path, overrides=["engine.backend=local"], output_dir=tmp_path / "ref"), log=print)
    assert [r["status"] for r in ref.rows] == ["finished"] * 3

    out = tmp_path / "crash"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "FEDRAY_SWEEP_KILL_AT": "2:2",
           "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "jobs.sweep", str(path), "--output-dir", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stdout[-3000:] + r.stderr[-3000:]
    before = {row["point"]: row for row in pq.read_table(out / "sweep.parquet").to_pylist()}
    assert before[2]["status"] == "running"  # when the driver died
    killed = json.loads((out / "runs" / os.path.basename(before[2]["run_dir"]) / "run.json").read_text())
    assert killed["status"] == "running"
    finished = {i: os.stat(os.path.join(row["run_dir"], "metrics.jsonl")).st_mtime_ns
                for i, row in before.items() if row["status"] == "finished"}
    assert finished  # point 2 starts only when one of points 0 and 1 has finished

    # without --resume the sweep directory is refused; with it the sweep goes on in this process
    assert cli(["sweep", str(path), "--output-dir", str(out)]) == 2
    res = run_sweep(load_sweep(path, output_dir=out), resume=True, log=print)

    after = {row["point"]: row for row in res.rows}
    assert [after[i]["status"] for i in range(3)] == ["finished"] * 3 and not res.failed
    assert after[2]["resumed_from"] == 1  # from its round-1 checkpoint, not from scratch
    for i, mtime in finished.items():  # finished points were kept, not run again
        assert os.stat(os.path.join(after[i]["run_dir"], "metrics.jsonl")).st_mtime_ns == mtime
        assert after[i]["resumed_from"] is None

    assert _tables(out) == _tables(tmp_path / "ref")
    for i in range(3):
        assert os.path.basename(after[i]["run_dir"]) == os.path.basename(ref.rows[i]["run_dir"])
        for k in ("accuracy", "ema_accuracy", "best_accuracy", "mean_last5"):
            assert after[i][k] == ref.rows[i][k]

    # the tables' numbers are the runs' own metrics: mean and sample std over the seeds
    for metric in ("accuracy", "ema_accuracy"):
        head, cells = (line.split(",") for line in (out / "tables" / f"table.{metric}.csv").read_text().splitlines())
        cell = dict(zip(head, cells))
        finals = [[m[metric] for m in _metrics(row["run_dir"]) if m.get(metric) is not None][-1] for row in res.rows]
        assert cell["method"] == "fedavg" and int(cell[f"{_title(metric)} n"]) == 3
        assert float(cell[f"{_title(metric)} mean"]) == float(np.mean(finals))
        assert float(cell[f"{_title(metric)} std"]) == float(np.std(finals, ddof=1))
    for row in res.rows:
        rows = _metrics(row["run_dir"])
        assert row["rounds"] == 3 and row["accuracy"] == rows[-1]["accuracy"]
        assert row["ema_accuracy"] == rows[-1]["ema_accuracy"]

    # `fedray report SWEEP_DIR` writes the same tables again
    saved = _tables(out)
    for p in (out / "tables").iterdir():
        p.unlink()
    assert cli(["report", str(out)]) == 0
    assert _tables(out) == saved
