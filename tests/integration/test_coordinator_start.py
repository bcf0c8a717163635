"""A coordinator (or a client worker) that dies while a Ray run starts (found by the chaos harness, issue 34): before
the fix the run stopped with Ray's ActorDiedError traceback (exit 1); now it is started again, within
``engine.max_coordinator_restarts``, as one that dies in a round, and the run ends with the undisturbed bits."""

from __future__ import annotations

import pytest

from fedray.config import from_dict
from fedray.engine import launch, runner
from fedray.engine.dispatch import RunAborted
from fedray.engine.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config

pytestmark = pytest.mark.ray

BASE = dict(train__rounds=2, engine__backend="ray", engine__num_workers=1, model__name="mlp")


@pytest.fixture(scope="module")
def clean_hash(tmp_path_factory, partition_cache):
    cfg = small_config(tmp_path_factory.mktemp("clean"), partition_cache, **{**BASE, "engine__backend": "local"})
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None).weights_hash


def _kill(ray, actor) -> None:
    ray.kill(actor, no_restart=True)


def test_a_coordinator_dead_before_its_first_call_is_started_again(tmp_path, partition_cache, ray_session,
                                                                   clean_hash, monkeypatch):
    real = launch.EarlyStart.check
    killed = []

    def kill_first(self, cfg, meta):
        if not killed:
            killed.append(self.result().coord)
            _kill(ray_session, killed[0])
        return real(self, cfg, meta)

    monkeypatch.setattr(launch.EarlyStart, "check", kill_first)
    logs: list[str] = []
    res = run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE)), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash and killed
    assert any("coordinator lost while starting" in line and "(1/" in line for line in logs), logs
    assert [r["round"] for r in RunDir(res.run_dir).read_metrics()] == [1, 2]


@pytest.mark.parametrize("which", ["coordinator", "worker"])
def test_an_actor_dead_while_the_coordinator_sets_up_is_started_again(tmp_path, partition_cache, ray_session,
                                                                      clean_hash, monkeypatch, which):
    real = runner.open_coordinator

    def open_then_kill(run):
        engine = real(run)
        _kill(ray_session, engine.coord if which == "coordinator" else engine.worker_actors[0])
        return engine

    monkeypatch.setattr(runner, "open_coordinator", open_then_kill)
    logs: list[str] = []
    res = run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE)), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash
    assert any("coordinator lost while starting" in line for line in logs), logs
    assert RunDir(res.run_dir).read_json("run.json")["status"] == "finished"


def test_a_coordinator_that_keeps_dying_in_start_up_stops_the_run_clearly(tmp_path, partition_cache, ray_session,
                                                                         monkeypatch):
    real = launch.EarlyStart.check

    def always_kill(self, cfg, meta):
        original = launch.start_actors

        def start_and_kill(c):
            actors = original(c)
            _kill(ray_session, actors.coord)
            return actors

        monkeypatch.setattr(launch, "start_actors", start_and_kill)
        _kill(ray_session, self.result().coord)
        return real(self, cfg, meta)

    monkeypatch.setattr(launch.EarlyStart, "check", always_kill)
    cfg = small_config(tmp_path, partition_cache, **BASE, engine__max_coordinator_restarts=1)
    with pytest.raises(RunAborted, match=r"the coordinator died while starting, 2 time\(s\) \(engine\."
                                         r"max_coordinator_restarts=1\)"):
        run_experiment(from_dict(cfg), progress=False, log=lambda *a: None)
