"""Runs that cannot produce a trustworthy number fail loudly: non-zero exit, run.json ``failed`` with the
reason, the checkpoint of the last good round intact (reliability issue, item 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedray.algorithms import build_server_optimizer
from fedray.config import from_dict
from fedray.engine.coordinator import Coordinator
from fedray.engine.dispatch import RoundAborted, RunAborted
from fedray.engine.round_report import RoundReport, RoundResult
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config

BAD = [int(c) for c in np.random.default_rng([0, 2]).choice(100, size=6, replace=False)][1]  # sampled in round 2


def _run_dir(tmp_path):
    (d,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("_")]
    return RunDir(d)


def _assert_failed_at_round_2(rd: RunDir, reason: str):
    info = json.loads((rd.path / "run.json").read_text())
    assert info["status"] == "failed" and reason in info["error"]
    assert [r["round"] for r in rd.read_metrics()] == [1]  # the failed round left no row
    assert rd.load_checkpoint()["round"] == 1  # the last good round's checkpoint
    assert not (rd.path / "summary.json").exists() and not (rd.path / "final_weights.npy").exists()


def test_a_dropped_client_fails_the_run_by_default(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, engine__max_client_retries=1,
                       engine__fault_injection={"kind": "raise", "round": 2, "client": BAD, "times": 5})
    with pytest.raises(RunAborted, match=r"round 2: 1 of 6 clients failed more than engine.max_client_retries=1"):
        run_experiment(from_dict(cfg), log=lambda *a: None)
    _assert_failed_at_round_2(_run_dir(tmp_path), "engine.max_dropped_fraction=0")


def test_a_round_in_which_every_client_is_dropped_fails_whatever_the_tolerance(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, train__clients_per_round=1, engine__max_client_retries=0,
                       engine__max_dropped_fraction=1.0,
                       engine__fault_injection={"kind": "raise", "round": 2,
                                                "client": int(np.random.default_rng([0, 2]).choice(100, 1)[0]),
                                                "times": 5})
    with pytest.raises(RunAborted, match=r"1 of 1 clients"):
        run_experiment(from_dict(cfg), log=lambda *a: None)
    _assert_failed_at_round_2(_run_dir(tmp_path), "injected fault")


def test_a_configuration_error_inside_a_client_stops_at_once(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, model__name="cnn_taps", algorithm__name="fedpcl",
                       algorithm__params={"tap": "nope"}, train__rounds=2)
    with pytest.raises(RunAborted, match=r"round 1: client \d+: ConfigError: .*tap.*no retry can fix it"):
        run_experiment(from_dict(cfg), log=lambda *a: None)
    rd = _run_dir(tmp_path)
    info = json.loads((rd.path / "run.json").read_text())
    assert info["status"] == "failed" and "ConfigError" in info["error"] and rd.read_metrics() == []
    assert len(rd.read_ledger() or []) == 0  # stopped at the first client: no retry of a config error


def test_a_diverging_model_fails_at_the_first_non_finite_round(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, server={"name": "fedavgm", "lr": 1e38})
    with pytest.raises(RunAborted, match=r"non-finite values|training loss is"):
        run_experiment(from_dict(cfg), log=lambda *a: None)
    rd = _run_dir(tmp_path)
    info = json.loads((rd.path / "run.json").read_text())
    assert info["status"] == "failed"
    for r in rd.read_metrics():  # every recorded round is finite
        assert np.isfinite(r["loss"]) and np.isfinite(r["accuracy"])


def test_split_client_failing_past_its_retries_fails_the_run_the_same_way(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, model__name="cnn_taps", algorithm__name="scala",
                       algorithm__params={"local_iters": 2, "batch_size": 60}, engine__max_client_retries=1,
                       engine__fault_injection={"kind": "raise", "round": 2, "client": BAD, "times": 5})
    with pytest.raises(RoundAborted, match=r"round 2: client %d failed 2 times" % BAD):
        run_experiment(from_dict(cfg), log=lambda *a: None)
    _assert_failed_at_round_2(_run_dir(tmp_path), "cannot drop")


def test_the_round_state_change_is_atomic():
    """An interruption (or failure) after the server optimizer stepped leaves every part of the server
    state at the previous round, so a checkpoint written then is consistent."""
    opt = build_server_optimizer("fedavgm", 1.0, {"momentum": 0.9})
    w0 = np.ones(4, np.float32)
    opt.step(w0, w0 * 0.5)
    before = opt.state_dict()

    class Program:
        def run_round(self, rnd, weights, state):
            opt.step(weights, weights * 0.25)  # mutates the momentum in place ...
            raise KeyboardInterrupt  # ... then Ctrl-C arrives (e.g. during after_aggregate)

    c = Coordinator.__new__(Coordinator)
    c.server_opt, c.program, c.weights, c.algo_state, c.round, c.ema = opt, Program(), w0, {"a": 1}, 1, 0.5
    with pytest.raises(KeyboardInterrupt):
        c.run_round(2)
    assert c.round == 1 and c.weights is w0 and c.algo_state == {"a": 1}
    assert np.array_equal(opt.state_dict()["m"], before["m"])

    class Nan:
        def run_round(self, rnd, weights, state):
            opt.step(weights, weights * 0.25)
            return RoundResult(weights=np.full(4, np.nan, np.float32), algo_state={}, report=RoundReport(rnd, 1, 1, 0.1, 0.01))

    c.program = Nan()
    with pytest.raises(RunAborted, match="4 non-finite values"):
        c.run_round(2)
    assert c.round == 1 and np.array_equal(opt.state_dict()["m"], before["m"])

    class Fine:
        def run_round(self, rnd, weights, state):
            opt.step(weights, weights * 0.25)
            return RoundResult(weights=np.full(4, 2.0, np.float32), algo_state={"b": 2}, report=RoundReport(rnd, 1, 1, 0.1, 0.01))

    def evaluation_fails(rnd):  # the sharded evaluation runs on the workers and can fail like a task
        c.ema = 0.9
        raise RoundAborted("round 2: item 0 (an evaluation shard) failed 3 times")

    c.program, c._evaluate_round = Fine(), evaluation_fails
    with pytest.raises(RoundAborted):
        c.run_round(2)
    assert c.round == 1 and c.weights is w0 and c.algo_state == {"a": 1} and c.ema == 0.5
    assert np.array_equal(opt.state_dict()["m"], before["m"])


def test_an_evaluation_number_never_replaces_a_key_of_the_round_report():
    """A metric of eval.metrics named like a key of the algorithm's round_metrics stops the run at that round,
    with the previous round's state kept, instead of one number silently replacing the other."""
    opt = build_server_optimizer("none", 1.0, {})
    w0 = np.ones(4, np.float32)

    class Program:
        def run_round(self, rnd, weights, state):
            return RoundResult(weights=weights * 2, algo_state={"b": 2}, report=RoundReport(rnd, 1, 1, 0.1, 0.01, extra={"margin": 3.0}))

    c = Coordinator.__new__(Coordinator)
    c.server_opt, c.program, c.weights, c.algo_state, c.round, c.ema = opt, Program(), w0, {"a": 1}, 1, 0.5
    c._evaluate_round = lambda rnd: {"accuracy": 0.5, "margin": 0.2}
    with pytest.raises(RunAborted, match=r"round 2: the evaluation's 'margin' has the name of a key of the round's "
                                         r"report"):
        c.run_round(2)
    assert c.round == 1 and c.weights is w0 and c.algo_state == {"a": 1}


def test_fedray_run_exits_non_zero_with_the_reason(tmp_path, partition_cache, capsys):
    import yaml

    from fedray.cli import main

    cfg = small_config(tmp_path, partition_cache, model__name="cnn_taps", algorithm__name="fedpcl",
                       algorithm__params={"tap": "nope"}, train__rounds=1)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "fedray run: run failed: round 1: client" in err and "tap" in err
