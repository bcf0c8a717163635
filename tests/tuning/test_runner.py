"""tuning.driver, tuning.objective and tuning.trial: the metric tracker, concurrent trials on Ray, pruning,
SIGKILL + resume, RDB storage.

Everything uses real Optuna storages (journal files) and real FL runs of FedProx on the embedded MNIST
subset, kept tiny (20 IID clients, 2 per round, 1-2 rounds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedray.config import ConfigError, load_config
from tests.helpers import ROOT
from tests.tuning.studies import base_config, study_dict, write_study

optuna = pytest.importorskip("optuna")

from tuning.driver import StudyRunner, tune  # noqa: E402
from tuning.objective import MetricTracker  # noqa: E402
from tuning.study import load_study, parse_study  # noqa: E402


def test_metric_tracker():
    tr = MetricTracker(["mean_last5", "bytes_total", "seconds.train"])
    for r, acc in enumerate([0.1, None, 0.3, 0.5, 0.6, 0.7, 0.8], start=1):
        row = {"round": r, "bytes": {"broadcast": 10, "upload": 5}, "seconds": {"train": float(r)}}
        if acc is not None:
            row["accuracy"] = acc
        tr.update(row)
        if acc is None:
            assert tr.intermediate() is None
    assert tr.final() == [pytest.approx((0.3 + 0.5 + 0.6 + 0.7 + 0.8) / 5), 7 * 15.0, 7.0]


# ------------------------------------------------------------------- real studies: Ray concurrency
@pytest.mark.ray
def test_concurrent_trials_on_ray_with_pruning(tmp_path, partition_cache, ray_session, monkeypatch):
    """Two trials at once on the shared local Ray, each on its own 1-worker slice; the rigged trial
    (lr = 0: accuracy stays at chance) is pruned after round 1 by the median pruner."""
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    base = base_config(tmp_path, partition_cache, backend="ray")
    good = [{"train.lr": 0.05, "algorithm.params.mu": 1e-3}, {"train.lr": 0.05, "algorithm.params.mu": 1e-2}]
    bad = [{"train.lr": 0.0, "algorithm.params.mu": 1e-3}]
    d = study_dict(tmp_path, partition_cache, name="ray_study", base_config=base,
                   params={"train.lr": {"type": "categorical", "choices": [0.0, 0.05]},
                           "algorithm.params.mu": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
                   budget={"n_trials": 3}, pruner={"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
                   concurrency=2, trial_resources={"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
                   enqueue=good + bad)
    spec = load_study(write_study(tmp_path / "ray_study.yaml", d))
    logs = []
    res = StudyRunner(spec, output_dir=tmp_path / "studies", log=logs.append).run()
    assert res.concurrency == 2
    trials = sorted(res.trials, key=lambda t: t.number)
    assert [t.params["train.lr"] for t in trials] == [0.05, 0.05, 0.0]
    # concurrency: the wall-clock intervals of the first two trials overlap
    (a0, a1), (b0, b1) = [(t.user_attrs["started_at"], t.user_attrs["finished_at"]) for t in trials[:2]]
    assert a0 < b1 and b0 < a1, (a0, a1, b0, b1)
    # pruning: the rigged trial (started once a good one finished) stops after round 1 of 2
    pruned = [t for t in trials if t.state.name == "PRUNED"]
    assert 2 in {t.number for t in pruned}, [(t.number, t.state.name, t.intermediate_values) for t in trials]
    for t in pruned:
        assert t.user_attrs["pruned_at_round"] == 1 and t.user_attrs["rounds"] == 1
        run = json.loads((Path(t.user_attrs["run_dir"]) / "run.json").read_text())
        assert run["status"] == "stopped"
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert complete and all(t.params["train.lr"] == 0.05 for t in complete)
    # each trial's run directory is kept, linked and named by the trial number
    for t in trials:
        rd = Path(t.user_attrs["run_dir"])
        assert rd.name == f"trial-{t.number:04d}" and (rd / "metrics.jsonl").is_file()
        cfg = load_config(rd / "config.yaml")
        assert cfg.engine.num_workers == 1 and cfg.engine.worker_num_gpus == 0.0 and cfg.train.lr == t.params["train.lr"]
    # outputs
    sd = res.study_dir
    rows = (sd / "trials.csv").read_text().splitlines()
    assert len(rows) == 4 and rows[0].startswith("number,state,accuracy,train.lr,algorithm.params.mu")
    best = load_config(sd / "best_config.yaml")
    assert best.train.lr == 0.05 and best.engine.backend == "ray"
    for png in ("history.png", "intermediate.png", "slice.png"):
        assert (sd / "plots" / png).stat().st_size > 0
    info = json.loads((sd / "study.json").read_text())
    assert info["storage"] == str(sd / "journal.log") and info["sessions"][0]["resources"]["concurrency"] == 2
    # running the same study again without --resume is refused
    with pytest.raises(ConfigError, match="already exists"):
        StudyRunner(spec, output_dir=tmp_path / "studies", log=logs.append).run()


@pytest.mark.ray
def test_concurrency_capped_by_cluster_resources(tmp_path, partition_cache, ray_session):
    base = base_config(tmp_path, partition_cache, backend="ray")
    d = study_dict(tmp_path, partition_cache, base_config=base, concurrency=8,
                   trial_resources={"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0.5})
    runner = StudyRunner(parse_study(d, source_path=tmp_path / "s.yaml"), output_dir=tmp_path)
    from fedray.config import from_dict

    cap, res = runner._resources(from_dict(runner.spec.config_with({})))
    assert cap == 2 and res["gpus_per_trial"] == 0.5  # 1 GPU / 0.5 per trial (4 CPUs would allow 4)
    # without trial_resources a trial takes the base config's engine settings
    d.pop("trial_resources")
    runner = StudyRunner(parse_study({**d, "base_config": {**base, "engine": {"backend": "ray", "num_workers": 2,
                                                                             "worker_num_gpus": 0.0}}},
                                     source_path=tmp_path / "s.yaml"), output_dir=tmp_path)
    cap, res = runner._resources(from_dict(runner.spec.config_with({})))
    assert (res["workers"], res["cpus_per_trial"], res["gpus_per_trial"], cap) == (2, 2.0, 0.0, 2)
    d["trial_resources"] = {"workers": 5, "cpus_per_worker": 1, "gpus_per_worker": 0}
    runner = StudyRunner(parse_study(d, source_path=tmp_path / "s.yaml"), output_dir=tmp_path)
    with pytest.raises(ConfigError, match="trial_resources: one trial needs 5 CPUs"):
        runner._resources(from_dict(runner.spec.config_with({})))


# ------------------------------------------------------------------------- SIGKILL mid-study + resume
def _load(storage_path: Path, name: str):
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(storage_path)))
    return optuna.load_study(study_name=name, storage=storage)


@pytest.mark.ray
def test_resume_after_sigkill(tmp_path, partition_cache, monkeypatch, ray_session):
    """`python -m jobs.tune`, its trials running on the session's local Ray (engine.backend ray, the driver
    connecting through RAY_ADDRESS like a job), is SIGKILLed while a trial runs, then resumed to the end."""
    d = study_dict(tmp_path, partition_cache, name="crash", budget={"n_trials": 3})
    d["base_config"]["train"]["rounds"] = 1
    d["base_config"]["engine"] = {"backend": "ray", "num_workers": 1}
    study_file = write_study(tmp_path / "crash.yaml", d)
    out = tmp_path / "studies"
    journal = out / "crash" / "journal.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1",
           "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    cmd = [sys.executable, "-m", "jobs.tune", "--study", str(study_file), "--output-dir", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    def ready_to_kill() -> bool:
        """A trial has completed and another one is running (its run has started: run.json written)."""
        if not journal.exists():
            return False
        try:
            ts = _load(journal, "crash").get_trials(deepcopy=False)
        except KeyError:  # the study is not created yet
            return False
        return (any(t.state.name == "COMPLETE" for t in ts)
                and any(t.state.name == "RUNNING" and "run_dir" in t.user_attrs
                        and (Path(t.user_attrs["run_dir"]) / "run.json").is_file() for t in ts))

    try:
        deadline = time.time() + 150
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.time() < deadline, "no trial completed in time"
            if ready_to_kill():
                proc.send_signal(signal.SIGSTOP)  # freeze the driver, check again, then kill it for good
                if ready_to_kill():
                    break
                proc.send_signal(signal.SIGCONT)
            time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = {t.number: t for t in _load(journal, "crash").get_trials(deepcopy=False)}
    orphans = [t for t in before.values() if t.state.name == "RUNNING"]
    done_before = {n: t for n, t in before.items() if t.state.name == "COMPLETE"}
    assert len(orphans) == 1 and done_before

    # without --resume the existing study is refused
    with pytest.raises(ConfigError, match="pass --resume"):
        StudyRunner(load_study(study_file), output_dir=out).run()
    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"trial {orphans[0].number} was left running by a dead driver" in r.stdout

    after = {t.number: t for t in _load(journal, "crash").get_trials(deepcopy=False)}
    for n, t in done_before.items():  # finished trials kept as they were
        assert after[n].state.name == "COMPLETE" and after[n].values == t.values and after[n].params == t.params
    orphan = after[orphans[0].number]
    assert orphan.state.name == "FAIL" and orphan.user_attrs["orphaned"] is True
    retries = [t for t in after.values() if t.user_attrs.get("retry_of") == orphan.number]
    assert len(retries) == 1 and retries[0].params == orphan.params and retries[0].state.name == "COMPLETE"
    ran = [t for t in after.values() if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(ran) == 3  # the budget counts finished trials over both sessions
    keys = [json.dumps(t.params, sort_keys=True) for t in ran]
    assert len(set(keys)) == len(keys), keys  # no parameters ran twice
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in after.values())
    info = json.loads((out / "crash" / "study.json").read_text())
    assert [s["resume"] for s in info["sessions"]] == [False, True]
    # the killed driver's session and its orphaned trial's run say so (they said "running" forever before)
    assert info["sessions"][0]["status"] == "killed" and info["sessions"][1]["status"] == "finished"
    assert f"its driver (pid {proc.pid} on " in info["sessions"][0]["reason"]
    assert info["sessions"][0]["found_by"] == info["sessions"][1]["id"]
    orphan_run = json.loads((Path(orphan.user_attrs["run_dir"]) / "run.json").read_text())
    assert orphan_run["status"] == "killed" and f"pid {proc.pid} on " in orphan_run["error"]
    assert f"its run {orphan.user_attrs['run_dir']} marked killed" in r.stdout
    assert info["sessions"][1]["sampler_seed"] != info["sessions"][0]["sampler_seed"]
    assert (out / "crash" / "best_config.yaml").is_file()

    # resuming again is idempotent: nothing is re-enqueued or re-run
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    res = tune(study_file, resume=True, output_dir=out, log=lambda m: None)
    assert len(res.trials) == len(after)


def test_rdb_storage_url_runs_and_resumes(tmp_path, partition_cache, monkeypatch):
    """The RDB storage path that PostgreSQL / MySQL URLs take, exercised with a SQLite URL: the study is stored
    under its name, readable by any process with the URL, and --resume with the budget spent runs nothing."""
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    d = study_dict(tmp_path, partition_cache, name="rdb", budget={"n_trials": 2})
    d["base_config"]["train"]["rounds"] = 1
    study_file = write_study(tmp_path / "rdb.yaml", d)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    res = tune(study_file, storage=url, output_dir=tmp_path / "out", log=lambda m: None)
    stored = optuna.load_study(study_name="rdb", storage=url).get_trials(deepcopy=False)
    assert [t.state.name for t in stored] == ["COMPLETE", "COMPLETE"] and len(res.trials) == 2
    assert all(Path(t.user_attrs["run_dir"]).is_dir() for t in stored)
    again = tune(study_file, storage=url, resume=True, output_dir=tmp_path / "out", log=lambda m: None)
    assert len(again.trials) == 2 and len(optuna.load_study(study_name="rdb", storage=url).trials) == 2


def test_a_second_driver_of_the_same_study_is_refused(tmp_path, partition_cache):
    d = study_dict(tmp_path, partition_cache)
    first = StudyRunner(parse_study(d, source_path=tmp_path / "s.yaml"), output_dir=tmp_path)
    second = StudyRunner(parse_study(d, source_path=tmp_path / "s.yaml"), output_dir=tmp_path)
    with first._driver_lock():
        with pytest.raises(ConfigError, match="another driver is running it"):
            with second._driver_lock():
                pass
    with second._driver_lock():
        pass


def test_a_grid_study_runs_to_the_end_of_its_grid(tmp_path, partition_cache, monkeypatch):
    """Optuna's grid sampler calls ``study.stop()`` once its grid is covered, which Optuna allows only inside
    ``study.optimize``; fedray asks and tells itself, so the last trial's ``tell`` raised and ``fedray tune`` of a
    grid study failed at its end (found by the chaos harness, issue 34). The budget is the grid's points, so the
    study ends there, every trial COMPLETE."""
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    d = study_dict(tmp_path, partition_cache, name="grid", sampler={"name": "grid", "seed": 0},
                   params={"train.lr": {"choices": [0.03, 0.05]}}, budget={"n_trials": 5})
    d["base_config"]["train"]["rounds"] = 1
    res = tune(write_study(tmp_path / "grid.yaml", d), output_dir=tmp_path / "out", log=lambda m: None)
    assert sorted(t.params["train.lr"] for t in res.trials) == [0.03, 0.05]
    assert all(t.state.name == "COMPLETE" for t in res.trials)


def test_a_resumed_grid_study_runs_the_grid_points_it_has_not_run():
    """A grid sampler numbers its points in an order shuffled by its seed, and records a trial's point by that
    number (``grid_id``). Each resumed session used to get a seed of its own (``session_seed``), so a point number
    recorded by a killed session named another value in the next: the resumed study ran one value twice and never
    the other, then ended as finished (found by the chaos harness, issue 34). Every session of a grid study numbers
    the points alike, so the points a dead session left visited are the ones it ran."""
    from optuna.trial import TrialState

    from tuning.backend import make_sampler, session_seed

    values = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    spec = parse_study({"name": "g", "base_config": base_config(Path("/tmp"), Path("/tmp")),
                        "params": {"train.lr": {"choices": values}}, "objective": {"metric": "accuracy"},
                        "budget": {"n_trials": len(values)}, "sampler": {"name": "grid", "seed": 0}},
                       source_path=Path("/tmp/g.yaml"))
    storage = optuna.storages.InMemoryStorage()
    seen = []
    for n_existing in range(len(values)):  # one session per trial, each killed after its trial ended
        study = optuna.create_study(study_name="g", storage=storage, load_if_exists=True,
                                    sampler=make_sampler(spec, session_seed(spec.sampler.seed, n_existing)))
        trial = study.ask(spec.distributions())
        seen.append(trial.params["train.lr"])
        study.tell(trial, state=TrialState.FAIL if n_existing % 2 else TrialState.COMPLETE,
                   values=None if n_existing % 2 else 0.5)
    assert sorted(seen) == values


@pytest.mark.parametrize("err, reason", [
    (KeyboardInterrupt(), "KeyboardInterrupt: a second Ctrl-C or SIGTERM while it stopped"),
    (RuntimeError("boom\nmore"), "RuntimeError: boom"),
])
def test_a_crashed_session_records_why(tmp_path, partition_cache, monkeypatch, err, reason):
    """A session that its loop leaves by an exception is recorded ``crashed`` with the reason in study.json (chaos
    seed 22 schedule 19: a second SIGTERM while a resumed study stopped left ``crashed`` and no reason)."""
    def loop(self, study, cap, n_trials):
        raise err

    monkeypatch.setattr(StudyRunner, "_loop", loop)
    runner = StudyRunner(parse_study(study_dict(tmp_path, partition_cache), source_path=tmp_path / "s.yaml"),
                         output_dir=tmp_path, log=lambda m: None)
    with pytest.raises(type(err)):
        runner.run()
    last = json.loads((runner.study_dir / "study.json").read_text())["sessions"][-1]
    assert last["status"] == "crashed" and last["reason"] == reason
