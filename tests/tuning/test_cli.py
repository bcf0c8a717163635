"""tuning.cli: `fedray tune` in the shape of every batch command, its a.b=c overrides of the base config (anywhere on
the line; a searched path is refused) and --dry-run (the search space, the trials known in advance, the study
directory; nothing run or written); `python -m jobs.tune` the same with --study."""

from __future__ import annotations

import json

import pytest
import yaml

from fedray.config import load_config
from fedray.cli import main as cli
from tests.tuning.studies import study_dict, write_study

optuna = pytest.importorskip("optuna")

from tuning.study import load_study  # noqa: E402


def test_overrides_edit_the_base_config_after_base_overrides(tmp_path, partition_cache):
    d = study_dict(tmp_path, partition_cache, base_overrides=["train.rounds=3"])
    spec = load_study(write_study(tmp_path / "s.yaml", d), overrides=["train.rounds=1", "train.batch_size=20"])
    assert spec.base_config["train"]["rounds"] == 1 and spec.base_config["train"]["batch_size"] == 20
    assert spec.overrides == ["train.rounds=1", "train.batch_size=20"] and spec.max_rounds() == 1
    assert spec.identity_hash() == load_study(tmp_path / "s.yaml").identity_hash()  # resumable with other overrides


@pytest.mark.parametrize("override, message", [
    ("train.lr=0.1", r"override 'train.lr=0.1': train.lr is searched by the study \(params:\)"),
    ("algorithm.params={}", r"override 'algorithm.params=\{\}': algorithm.params.mu is searched"),
    ("train.rounds=0", r"base_config: train.rounds: must be > 0"),
    ("train.lrr=0.1", r"train.lrr"),
])
def test_bad_overrides_exit_2_naming_the_field(tmp_path, partition_cache, capsys, override, message):
    import re

    study = write_study(tmp_path / "s.yaml", study_dict(tmp_path, partition_cache))
    assert cli(["tune", str(study), override, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_the_study_and_writes_nothing(tmp_path, partition_cache, capsys):
    d = study_dict(tmp_path, partition_cache, enqueue=[{"train.lr": 0.05, "algorithm.params.mu": 0.001}],
                   trial_resources={"workers": 2}, concurrency=2)
    study = write_study(tmp_path / "s.yaml", d)
    out = tmp_path / "out"
    # options before and after the overrides, as every batch command takes them
    assert cli(["tune", "--dry-run", str(study), "train.rounds=1", "--output-dir", str(out), "seed=3"]) == 0
    text, err = capsys.readouterr()
    assert "nothing was run or written" in err
    lines = text.splitlines()
    assert lines[0] == "study t"
    assert "+ train.rounds=1 seed=3 -> fedprox on mnist5k, 1 rounds at most per trial" in lines[1]
    assert any(ln.split() == ["algorithm.params.mu", "float", "in", "[0.0001,", "0.1]", "(log)"] for ln in lines)
    assert any(ln.split() == ["train.lr", "float", "in", "[0.02,", "0.08]"] for ln in lines)
    assert "objective: accuracy (maximize) | sampler random (seed 0) | pruner none | budget 3 trials" in text
    assert "enqueued first (1):" in text and json.dumps(d["enqueue"][0], sort_keys=True) in text
    assert "trials at once: up to 2, 2 worker(s) each (local backend" in text
    study_dir = (out / "t").resolve()
    assert f"study directory: {study_dir} (trials in {study_dir / 'trials'}/trial-NNNN/)" in text
    assert f"storage {study_dir / 'journal.log'}" in text
    assert not out.exists()


def test_dry_run_of_a_grid_lists_its_points(tmp_path, partition_cache, capsys):
    d = study_dict(tmp_path, partition_cache, sampler="grid", budget={"n_trials": 10},
                   params={"train.lr": {"type": "categorical", "choices": [0.02, 0.05]},
                           "train.local_epochs": {"type": "int", "low": 1, "high": 2}})
    study = write_study(tmp_path / "g.yaml", d)
    assert cli(["tune", str(study), "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "budget 4 trials" in text and "grid of 4 point(s)" in text
    points = [json.loads(ln) for ln in text.splitlines() if ln.startswith("  {")]
    assert points == [{"train.local_epochs": e, "train.lr": lr} for lr in (0.02, 0.05) for e in (1, 2)]


def test_overrides_reach_every_trial_and_the_session_record(tmp_path, partition_cache, capsys, monkeypatch):
    """Two in-process trials of one round each (the base config says two), through `fedray tune`."""
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    study = write_study(tmp_path / "s.yaml", study_dict(tmp_path, partition_cache, name="ov", budget={"n_trials": 2}))
    out = tmp_path / "out"
    assert cli(["tune", str(study), "train.rounds=1", "--output-dir", str(out)]) == 0
    assert "study ov: 2 complete" in capsys.readouterr().out
    for n in (0, 1):
        rd = out / "ov" / "trials" / f"trial-{n:04d}"
        assert load_config(rd / "config.yaml").train.rounds == 1 and (rd / "trial.log").is_file()
        assert len((rd / "metrics.jsonl").read_text().splitlines()) == 1
    info = json.loads((out / "ov" / "study.json").read_text())
    assert info["sessions"][0]["overrides"] == ["train.rounds=1"] and info["sessions"][0]["status"] == "finished"
    assert yaml.safe_load((out / "ov" / "best_config.yaml").read_text())["train"]["rounds"] == 1


def test_jobs_tune_takes_the_same_line_with_study(tmp_path, partition_cache, capsys):
    from jobs.tune import main

    study = write_study(tmp_path / "s.yaml", study_dict(tmp_path, partition_cache))
    assert main(["--study", str(study), "train.rounds=1", "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    assert "1 rounds at most per trial" in capsys.readouterr().out
    assert main(["--study", str(study), "train.lr=0.1"]) == 2
    assert "jobs.tune: error: override 'train.lr=0.1'" in capsys.readouterr().err


def test_a_trial_failed_by_a_full_disk_exits_1_and_the_resume_runs_it(tmp_path, partition_cache, capsys, monkeypatch):
    """A trial whose run fails for the machine (here its summary.json meets a full disk) used to count toward the
    budget like any failed trial: the grid study ended ``finished`` with exit 0 and one of its two points never run
    (found by the chaos harness, issue 34). The session now exits 1 naming the trial, and ``--resume`` runs it once
    more: every grid point has a value, exit 0."""
    import fedray.core.io
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    d = study_dict(tmp_path, partition_cache, name="grid", sampler={"name": "grid", "seed": 0},
                   params={"train.lr": {"choices": [0.03, 0.05]}}, budget={"n_trials": 2})
    d["base_config"]["train"]["rounds"] = 1
    study = write_study(tmp_path / "grid.yaml", d)
    out = tmp_path / "out"
    monkeypatch.setattr(fedray.core.io, "_counts", {})  # the N-th write counts from here
    monkeypatch.setenv(fedray.core.io.FAULT_ENV, "summary.json@1=enospc")  # the first trial's run fails at its end
    assert cli(["tune", str(study), "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert "1 trial(s) failed and are left out of the study's outputs; --resume runs each once more" in err, err
    assert "trial 0 {\"train.lr\": " in err and "disk" in err.lower(), err
    monkeypatch.delenv(fedray.core.io.FAULT_ENV)
    assert cli(["tune", str(study), "--output-dir", str(out), "--resume"]) == 0
    capsys.readouterr()
    trials = optuna.load_study(study_name="grid", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "grid" / "journal.log")))).get_trials()
    assert sorted(t.params["train.lr"] for t in trials if t.state.name == "COMPLETE") == [0.03, 0.05]
    assert [t.number for t in trials if t.state.name == "FAIL"] == [0]
    assert [t.user_attrs.get("retry_of") for t in trials if t.user_attrs.get("retry_reason") == "failed"] == [0]
