"""The tracker back-ends against the real libraries: an MLflow run in a SQLite store read back with
MlflowClient, a W&B offline run read back from its transaction log; what each receives (scalar_metrics,
flat_params); a missing library refused before any work with the extra to install."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from fedray.config import ConfigError, MlflowConfig, WandbConfig, from_dict
from fedray.reporting.trackers import MlflowTracker, WandbTracker, check_trackers, flat_params, scalar_metrics
from tests.helpers import wandb_run

ROW = {"round": 2, "loss": 2.03, "accuracy": 0.1, "ema_accuracy": None, "dropped": [3], "lr": 0.05,
       "bytes": {"broadcast": 19960440, "upload": 19960440}, "seconds": {"train": 0.71, "eval": 1.96},
       "domain_accuracy": {"photo": 0.5, "art": float("nan")}, "analysis": {"erank": {"l1": 3.5}},
       "flag": True, "name": "x", "failures": 0}


def test_scalar_metrics_keeps_every_number_and_nothing_else():
    assert scalar_metrics(ROW) == {
        "loss": 2.03, "accuracy": 0.1, "lr": 0.05, "bytes/broadcast": 19960440.0, "bytes/upload": 19960440.0,
        "seconds/train": 0.71, "seconds/eval": 1.96, "domain_accuracy/photo": 0.5, "analysis/erank/l1": 3.5,
        "failures": 0.0}


def test_flat_params_dotted_text():
    p = flat_params({"train": {"lr": 0.05, "augment": ["crop", "flip"], "grad_clip": None},
                     "algorithm": {"name": "fedavg", "params": {}}, "seed": 0, "output": {"tensorboard": True}})
    assert p == {"train.lr": "0.05", "train.augment": '["crop", "flip"]', "train.grad_clip": "null",
                 "algorithm.name": "fedavg", "algorithm.params": "{}", "seed": "0", "output.tensorboard": "true"}


@pytest.mark.parametrize("name,field", [("mlflow", "output.mlflow"), ("wandb", "output.wandb")])
def test_missing_library_names_the_extra(monkeypatch, name, field):
    cfg = from_dict({"output": {name: {"enabled": True}}})
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    with pytest.raises(ConfigError, match=rf"{field}\.enabled: .*pip install 'fedray\[{name}\]'"):
        check_trackers(cfg)
    check_trackers(from_dict({}))  # nothing turned on: nothing imported


def test_missing_library_fails_fedray_run_before_any_work(monkeypatch, tmp_path, capsys):
    from fedray.cli import main

    monkeypatch.setitem(sys.modules, "mlflow", None)
    (tmp_path / "c.yaml").write_text("train: {rounds: 1}\n")
    code = main(["run", str(tmp_path / "c.yaml"), "--output-dir", str(tmp_path / "runs"), "output.mlflow.enabled=true",
                 f"data.cache_dir={tmp_path / 'parts'}"])
    assert code == 2
    assert "pip install 'fedray[mlflow]'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "parts").exists()


def test_bad_tracker_config_fields():
    with pytest.raises(ConfigError, match="output.wandb.mode"):
        from_dict({"output": {"wandb": {"mode": "cloud"}}})
    with pytest.raises(ConfigError, match="output.mlflow.experiment"):
        from_dict({"output": {"mlflow": {"experiment": " "}}})
    with pytest.raises(ConfigError, match="output.mlflow.tracking_ur"):
        from_dict({"output": {"mlflow": {"tracking_ur": "x"}}})


def _mlflow(uri, tmp_path, experiment, name="run-a"):
    return MlflowTracker(MlflowConfig(enabled=True, tracking_uri=uri, experiment=experiment), tmp_path / name, name)


def test_mlflow_run_holds_params_metrics_tags_artifacts_and_status(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = from_dict({"train": {"lr": 0.07}, "algorithm": {"name": "fedprox", "params": {"mu": 0.01}},
                     "data": {"params": {"long": "v" * 7000}}}).to_dict()
    t = _mlflow(mlflow_store, tmp_path, "params")
    st = t.start({}, cfg, {"algorithm": "fedprox", "config_hash": "abc"}, print)
    assert st["new"] and st["tracking_uri"] == mlflow_store
    for rnd in (1, 2):
        t.log(rnd, scalar_metrics({**ROW, "round": rnd, "loss": 1.0 / rnd}))
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-a" / "run.json").write_text('{"status": "finished"}')
    t.finish("finished", {"round": 2, "accuracy": 0.1, "weights_hash": "h"}, [tmp_path / "run-a" / "run.json",
                                                                          tmp_path / "run-a" / "summary.json"],
             {"status": "finished", "config_hash": "abc"})
    c = MlflowClient(tracking_uri=mlflow_store)
    run = c.get_run(st["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    p = run.data.params
    assert p["train.lr"] == "0.07" and p["algorithm.name"] == "fedprox" and p["algorithm.params.mu"] == "0.01"
    assert len(p["data.params.long"]) <= 6000 and p["data.params.long"].endswith("(cut; see config.yaml artifact)")
    assert len(p) == len(flat_params({k: v for k, v in cfg.items()}))
    assert [(m.step, m.value) for m in c.get_metric_history(st["run_id"], "loss")] == [(1, 1.0), (2, 0.5)]
    assert [m.value for m in c.get_metric_history(st["run_id"], "seconds/train")] == [0.71, 0.71]
    assert run.data.metrics["final/accuracy"] == 0.1
    assert run.data.tags["config_hash"] == "abc" and run.data.tags["status"] == "finished"
    assert [a.path for a in c.list_artifacts(st["run_id"])] == ["run.json"]  # summary.json absent: skipped
    # artifacts beside the SQLite store, never in MLflow's default ./mlruns of the current directory
    store_dir = Path(mlflow_store[len("sqlite:///"):]).parent
    assert run.info.artifact_uri.startswith((store_dir / "artifacts").as_uri())
    assert list((store_dir / "artifacts").rglob("run.json")) and not list(Path("mlruns").glob(f"*/{st['run_id']}"))


def test_mlflow_resume_continues_the_same_run_or_starts_anew_when_it_is_gone(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    t = _mlflow(mlflow_store, tmp_path, "resume")
    st = t.start({}, {"seed": 0}, {}, print)
    t.log(1, {"loss": 1.0})
    t.finish("interrupted", {}, [], {})
    c = MlflowClient(tracking_uri=mlflow_store)
    assert c.get_run(st["run_id"]).info.status == "KILLED"
    again = _mlflow(mlflow_store, tmp_path, "resume")
    st2 = again.start(st, {"seed": 0}, {}, print)
    assert st2 == {"run_id": st["run_id"], "tracking_uri": mlflow_store, "new": False}
    assert c.get_run(st["run_id"]).info.status == "RUNNING"
    again.log(2, {"loss": 0.5})
    again.finish("failed", {}, [], {})
    assert c.get_run(st["run_id"]).info.status == "FAILED"
    assert [m.step for m in c.get_metric_history(st["run_id"], "loss")] == [1, 2]
    lines = []
    st3 = _mlflow(mlflow_store, tmp_path, "resume").start({**st, "run_id": "0" * 32}, {"seed": 0}, {}, lines.append)
    assert st3["new"] and st3["run_id"] != st["run_id"] and "not in" in lines[0]


def test_wandb_offline_run_and_resume_read_back(tmp_path):
    cfg = from_dict({"train": {"lr": 0.07}}).to_dict()
    spec = WandbConfig(enabled=True, project="p")
    t = WandbTracker(spec, tmp_path / "run-w", "run-w")
    st = t.start({}, cfg, {"algorithm": "fedavg"}, print)
    assert st["new"] and st["mode"] == "offline"
    for rnd in (1, 2):
        t.log(rnd, scalar_metrics({**ROW, "round": rnd, "loss": 1.0 / rnd}))
    t.finish("interrupted", {}, [], {})
    again = WandbTracker(spec, tmp_path / "run-w", "run-w")
    st2 = again.start(st, cfg, {"algorithm": "fedavg"}, print)
    assert st2["run_id"] == st["run_id"] and not st2["new"]
    again.log(3, {"loss": 1 / 3})
    again.finish("finished", {"round": 3, "accuracy": 0.25}, [], {"status": "finished"})
    # one folder per session: offline-run-<start second>-<id>, and W&B adds "-1" to the second's name when
    # both sessions started within the same second (a fast resume)
    first, second = sorted((tmp_path / "run-w" / "wandb").glob(f"offline-run-*-{st['run_id']}*"))
    a, b = wandb_run(first), wandb_run(second)
    deadline = time.monotonic() + 60  # W&B's service process writes the log: on a loaded machine a little later
    while b["id"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        b = wandb_run(second)
    assert a["id"] == b["id"] == st["run_id"]
    assert a["config"]["train"]["lr"] == 0.07 and a["config"]["fedray_run"] == {"algorithm": "fedavg"}
    assert sorted(a["history"]) == [1, 2] and sorted(b["history"]) == [3]
    assert a["history"][2] == {**scalar_metrics(ROW), "loss": 0.5}
    assert a["preempting"] and a["exit_code"] == 130 and b["exit_code"] == 0
    assert b["summary"]["final/accuracy"] == 0.25 and b["summary"]["fedray/status"] == "finished"
    assert math.isclose(b["history"][3]["loss"], 1 / 3, rel_tol=0, abs_tol=0)
