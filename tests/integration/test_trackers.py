"""A run with both trackers on (their default stores: MLflow's SQLite database and W&B's offline folders in the
run directory), stopped by Ctrl-C after round 2 and resumed: MLflow and W&B each hold ONE run whose every
per-round number equals metrics.jsonl step by step, the resolved config, the final metrics and the status."""

from __future__ import annotations

import re

import pytest

from fedray.config import from_dict, load_config
from fedray.driver.runner import run_experiment
from fedray.reporting.report import describe_run
from fedray.reporting.rundir import RunDir
from fedray.reporting.trackers import flat_params, scalar_metrics
from tests.helpers import synthetic_experiment, wandb_run


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, partition_cache):
    tmp = tmp_path_factory.mktemp("tracked")
    cfg = from_dict(synthetic_experiment(tmp, partition_cache, train__rounds=3, output__name="tracked",
                                         output__mlflow={"enabled": True, "experiment": "it"},
                                         output__wandb={"enabled": True, "project": "it"}))

    def ctrl_c_after_round_2(report):
        if report["round"] == 2:
            raise KeyboardInterrupt

    first = run_experiment(cfg, progress=False, log=lambda *a: None, on_round=ctrl_c_after_round_2)
    assert first.interrupted
    ids = RunDir(first.run_dir).read_json("trackers.json")
    res = run_experiment(resume=first.run_dir, progress=False, log=lambda *a: None)
    return res, ids


def test_mlflow_holds_the_runs_numbers_step_by_step(tracked_run):
    from mlflow.tracking import MlflowClient

    res, first_ids = tracked_run
    rd = RunDir(res.run_dir)
    st = rd.read_json("trackers.json")["mlflow"]
    assert st["run_id"] == first_ids["mlflow"]["run_id"]  # the resume continued the same MLflow run
    assert st["tracking_uri"] == f"sqlite:///{rd.path.resolve() / 'mlflow' / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=st["tracking_uri"])
    assert [r.info.run_id for r in c.search_runs([c.get_experiment_by_name("it").experiment_id])] == [st["run_id"]]
    run = c.get_run(st["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    rows = rd.read_metrics()
    assert [r["round"] for r in rows] == [1, 2, 3]
    keys = set().union(*(scalar_metrics(r) for r in rows))
    assert {"accuracy", "loss", "ema_accuracy", "seconds/train", "bytes/upload"} <= keys
    for key in keys:
        want = [(r["round"], scalar_metrics(r)[key]) for r in rows if key in scalar_metrics(r)]
        assert [(m.step, m.value) for m in c.get_metric_history(st["run_id"], key)] == want, key
    config = load_config(rd.path / "config.yaml").to_dict()
    config.pop("source_path")
    assert run.data.params == flat_params(config)
    summary = rd.read_json("summary.json")
    assert run.data.metrics["final/accuracy"] == summary["accuracy"]
    assert run.data.tags["config_hash"] == rd.read_json("run.json")["config_hash"]
    assert sorted(a.path for a in c.list_artifacts(st["run_id"])) == ["config.yaml", "run.json", "summary.json"]


def test_wandb_offline_run_holds_the_runs_numbers_step_by_step(tracked_run):
    res, first_ids = tracked_run
    rd = RunDir(res.run_dir)
    st = rd.read_json("trackers.json")["wandb"]
    assert st["run_id"] == first_ids["wandb"]["run_id"] and st["mode"] == "offline"
    folders = sorted((rd.path / "wandb").glob("offline-run-*"))
    # one per process, one run id; wandb names a folder offline-run-<date>_<time>-<run id>, with "-1" added when a
    # second process of the same run starts within the same second
    assert [re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(?:-\d+)?", f.name).group(1) for f in folders] == \
        [st["run_id"]] * 2
    first, second = (wandb_run(f) for f in folders)
    assert first["preempting"] and first["exit_code"] == 130 and second["exit_code"] == 0
    history = {**first["history"], **second["history"]}
    assert sorted(first["history"]) == [1, 2] and sorted(second["history"]) == [3]
    assert history == {r["round"]: scalar_metrics(r) for r in rd.read_metrics()}
    assert second["config"]["train"] == load_config(rd.path / "config.yaml").to_dict()["train"]
    summary = rd.read_json("summary.json")
    assert second["summary"]["final/accuracy"] == summary["accuracy"]
    assert second["summary"]["fedray/status"] == "finished"


def test_show_lists_the_tracker_runs(tracked_run):
    res, _ = tracked_run
    text = describe_run(res.run_dir)
    st = RunDir(res.run_dir).read_json("trackers.json")
    assert f"mlflow:          run {st['mlflow']['run_id']} (sqlite:///" in text
    assert f"wandb:           run {st['wandb']['run_id']} (offline it in " in text and "rounds 1-3" in text


def test_a_tracker_that_cannot_start_fails_before_the_run_claims_its_directory(tmp_path, partition_cache):
    from fedray.config import ConfigError

    cfg = from_dict(synthetic_experiment(tmp_path, partition_cache, train__rounds=1, output__name="bad",
                                         output__mlflow={"enabled": True, "tracking_uri": "bogus://nowhere"}))
    with pytest.raises(ConfigError, match=r"^output\.mlflow: cannot start the mlflow run: .*bogus"):
        run_experiment(cfg, progress=False, log=lambda *a: None)
    assert not RunDir(tmp_path / "runs" / "bad").holds_run()  # fix the URI and run again: no --overwrite needed
