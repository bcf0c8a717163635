"""The coordinator survives: it runs on the driver's node, and a coordinator that dies mid-run (exits,
is killed, loses its node) is replaced from the last checkpoint with the uninterrupted run's weights."""

from __future__ import annotations

import json
import os
import signal

import pytest

from fedray.config import from_dict
from fedray.driver import launch
from fedray.engine.dispatch import RunAborted
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config

BASE = dict(train__rounds=5, engine__backend="ray", engine__num_workers=2)


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


@pytest.fixture(scope="module")
def clean_hash(tmp_path_factory, partition_cache):
    """The uninterrupted run's weights (in-process: equal to Ray's bit for bit, docs/engine.md)."""
    tmp = tmp_path_factory.mktemp("clean")
    return _run(small_config(tmp, partition_cache, **{**BASE, "engine__backend": "local"})).weights_hash


def _check_complete(res, restarts: int) -> None:
    rd = RunDir(res.run_dir)
    assert [r["round"] for r in rd.read_metrics()] == [1, 2, 3, 4, 5]  # no round missing, none twice
    assert sorted(p.name for p in (rd.path / "ledger").iterdir()) == [f"round-{r:06d}.parquet" for r in range(1, 6)]
    assert rd.read_json("summary.json")["coordinator_restarts"] == restarts
    assert rd.read_json("run.json")["status"] == "finished"


@pytest.mark.ray
@pytest.mark.parametrize("every", [2, 1])
def test_coordinator_exit_mid_round_restarts_from_checkpoint(tmp_path, partition_cache, ray_session, clean_hash,
                                                             every):
    logs = []
    cfg = small_config(tmp_path, partition_cache, **BASE, output__checkpoint_every=every,
                       engine__fault_injection={"kind": "coordinator_exit", "round": 3})
    res = run_experiment(from_dict(cfg), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash
    _check_complete(res, restarts=1)
    assert any("coordinator lost in round 3" in line for line in logs), logs
    assert any("coordinator restarts 1" in line for line in logs), logs


@pytest.mark.ray
def test_a_hung_coordinator_is_found_by_its_heartbeat_and_restarted_from_checkpoint(tmp_path, partition_cache,
                                                                                    ray_session, clean_hash):
    """The coordinator stops itself (SIGSTOP) in the middle of round 3: alive but silent. The driver's heartbeat
    goes unanswered for engine.heartbeat_s, the actor is killed and a new one goes on from the last checkpoint:
    the uninterrupted run's weights, every round once."""
    logs = []
    cfg = small_config(tmp_path, partition_cache, **BASE, output__checkpoint_every=2, engine__heartbeat_s=3.0,
                       engine__fault_injection={"kind": "coordinator_stop", "round": 3})
    res = run_experiment(from_dict(cfg), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash
    _check_complete(res, restarts=1)
    assert any("coordinator hung" in line and "engine.heartbeat_s" in line for line in logs), logs


@pytest.mark.ray
def test_coordinator_sigkilled_between_rounds_restarts(tmp_path, partition_cache, ray_session, clean_hash, engines):
    """A real SIGKILL of the coordinator's process after round 2: the driver's next call to it (the round-2
    checkpoint's or round 3's) finds it dead; a new one goes on from the last checkpoint."""
    killed, last = [], []

    def on_round(report):
        if report["round"] == 2 and not killed:
            pid = engines[0].pid()
            assert pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        elif report["round"] == 5:
            last.append(engines[0].pid())

    res = _run(small_config(tmp_path, partition_cache, **BASE, output__checkpoint_every=1), on_round=on_round)
    assert killed and res.weights_hash == clean_hash
    _check_complete(res, restarts=1)
    assert last and last[0] != killed[0]  # a new coordinator process finished the run


@pytest.mark.ray
def test_more_coordinator_deaths_than_allowed_fail_the_run(tmp_path, partition_cache, ray_session):
    cfg = small_config(tmp_path, partition_cache, **BASE, output__checkpoint_every=1,
                       engine__max_coordinator_restarts=0,
                       engine__fault_injection={"kind": "coordinator_exit", "round": 2})
    with pytest.raises(RunAborted, match="max_coordinator_restarts=0"):
        _run(cfg)
    run_dir = next((tmp_path / "runs").iterdir())
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "the coordinator died after 0 restart(s)" in info["error"]
    assert not (run_dir / "summary.json").exists()
    assert [r["round"] for r in RunDir(run_dir).read_metrics()] == [1]


@pytest.mark.ray
def test_coordinator_runs_on_the_drivers_node(tmp_path, partition_cache, ray_session, engines):
    seen = []
    _run(small_config(tmp_path, partition_cache, **{**BASE, "train__rounds": 1}),
         on_round=lambda report: seen.append(engines[0].node_id()))
    assert seen == [ray_session.get_runtime_context().get_node_id()]


@pytest.mark.ray
def test_coordinator_placement_options(tmp_path, partition_cache, ray_session):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cfg = from_dict(small_config(tmp_path, partition_cache, **BASE))
    strategy = launch.coordinator_options(cfg, ray_session)["scheduling_strategy"]
    assert isinstance(strategy, NodeAffinitySchedulingStrategy) and strategy.soft is False
    assert strategy.node_id == ray_session.get_runtime_context().get_node_id()
    cfg = from_dict(small_config(tmp_path, partition_cache, **BASE, engine__coordinator_placement="any"))
    assert "scheduling_strategy" not in launch.coordinator_options(cfg, ray_session)
