"""A driver that dies (crash, Ctrl-C) and --resume: no missing round, the uninterrupted run's weights."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedray.config import from_dict
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import ROOT, small_config


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


# ------------------------------------------------------------------------------------ resume
def test_crash_and_resume_gives_identical_weights(tmp_path, partition_cache):
    base = dict(train__rounds=4, output__checkpoint_every=2)
    clean = _run(small_config(tmp_path / "clean", partition_cache, **base))
    cfg = small_config(tmp_path / "crash", partition_cache, **base,
                       engine__fault_injection={"kind": "driver_exit", "round": 4})
    cfg_path = tmp_path / "crash.json"
    cfg_path.write_text(json.dumps(cfg))
    code = ("import json,sys; from fedray.config import from_dict; from fedray.driver.runner import run_experiment;"
            f"run_experiment(from_dict(json.load(open({str(cfg_path)!r}))), progress=False)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 17, proc.stderr[-2000:]  # the driver died hard before round 4
    run_dir = next((tmp_path / "crash" / "runs").iterdir())
    assert [r["round"] for r in RunDir(run_dir).read_metrics()] == [1, 2, 3]
    res = run_experiment(resume=run_dir, progress=False, log=lambda *a: None)
    assert res.weights_hash == clean.weights_hash
    assert [r["round"] for r in RunDir(run_dir).read_metrics()] == [1, 2, 3, 4]


@pytest.mark.ray
def test_ctrl_c_mid_round_on_ray_records_that_round_and_resumes_without_a_gap(tmp_path, partition_cache, ray_session):
    """SIGINT while the coordinator actor runs a round (checkpoints every 3 rounds): the actor finishes the
    round, the driver records it and checkpoints there; --resume continues with no missing metrics row and
    the uninterrupted run's weights."""
    import os
    import signal
    import time

    base = dict(train__rounds=6, train__clients_per_round=10, output__checkpoint_every=3, engine__backend="ray",
                engine__num_workers=1)
    cfg = small_config(tmp_path / "int", partition_cache, **base)
    cfg_path = tmp_path / "int.json"
    cfg_path.write_text(json.dumps(cfg))
    code = ("import json; from fedray.config import from_dict; from fedray.driver.runner import run_experiment;"
            f"r = run_experiment(from_dict(json.load(open({str(cfg_path)!r}))), progress=False);"
            "raise SystemExit(130 if r.interrupted else 0)")
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = None
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        found = list((tmp_path / "int" / "runs").glob("*/metrics.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 1:
            metrics = found[0]
            break
        time.sleep(0.05)
    assert metrics is not None, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGINT)  # round 2 is running on the actor now
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, out[-3000:]
    rows = [r["round"] for r in RunDir(metrics.parent).read_metrics()]
    assert rows == list(range(1, len(rows) + 1)) and len(rows) < 6, rows
    # what the coordinator actor and its worker actor train on (a fake logical GPU would say cpu too)
    assert RunDir(metrics.parent).read_json("run.json")["device"] == {"coordinator": "cpu", "workers": ["cpu"]}
    ckpt = RunDir(metrics.parent).load_checkpoint()
    assert ckpt is not None and ckpt["round"] == rows[-1], out[-3000:]  # the checkpoint and the rows agree
    res = run_experiment(resume=metrics.parent, progress=False, log=lambda *a: None)
    assert [r["round"] for r in RunDir(metrics.parent).read_metrics()] == [1, 2, 3, 4, 5, 6]
    clean = _run(small_config(tmp_path / "clean", partition_cache, **{**base, "engine__backend": "local"}))
    assert res.weights_hash == clean.weights_hash


# ------------------------------------------------------------------------------------ the device a run trains on
def test_a_resume_on_another_kind_of_device_is_refused_and_leaves_the_record(tmp_path, partition_cache):
    """run.json records what the coordinator and workers train on; a resume whose rounds so far ran on another
    kind (here: a record saying cuda, resumed on this CPU) is refused before any round, the record kept, and the
    same resume where the run trained gives the uninterrupted weights."""
    from fedray.config import ConfigError

    base = dict(train__rounds=3, output__checkpoint_every=1)
    clean = _run(small_config(tmp_path / "clean", partition_cache, **base))
    assert RunDir(clean.run_dir).read_json("run.json")["device"] == {"coordinator": "cpu", "workers": ["cpu"]}
    stopped = _run(small_config(tmp_path / "cut", partition_cache, **base), on_round=lambda r: r["round"] == 1)
    rd = RunDir(stopped.run_dir)
    info = rd.read_json("run.json")
    info["device"] = {"coordinator": "cuda (NVIDIA H200)", "workers": ["cuda (NVIDIA H200)"]}
    rd.write_json("run.json", info)
    with pytest.raises(ConfigError, match=r"trained on cuda \(NVIDIA H200\), this session would train on cpu"):
        run_experiment(resume=stopped.run_dir, progress=False, log=lambda *a: None)
    after = rd.read_json("run.json")
    assert after["device"] == info["device"] and after["status"] == "failed"
    assert [r["round"] for r in rd.read_metrics()] == [1]  # no round ran
    after["device"] = {"coordinator": "cpu", "workers": ["cpu"]}
    rd.write_json("run.json", after)
    res = run_experiment(resume=stopped.run_dir, progress=False, log=lambda *a: None)
    assert res.weights_hash == clean.weights_hash
    assert rd.read_json("run.json")["device"] == {"coordinator": "cpu", "workers": ["cpu"]}
