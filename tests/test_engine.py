"""Engine integration tests: training, bit-exact determinism, faults, resume, checkpoints."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedray.config import ConfigError, from_dict
from fedray.engine.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.conftest import ROOT, small_config


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


# ------------------------------------------------------------------------------------ training
@pytest.mark.ray
def test_fedavg_trains_on_ray(tmp_path, partition_cache, ray_session):
    cfg = small_config(tmp_path, partition_cache, engine__backend="ray", engine__num_workers=2,
                       train__rounds=5, train__clients_per_round=10,
                       data__partition={"name": "iid", "num_clients": 40, "params": {}})
    res = _run(cfg)
    assert res.accuracy > 0.4, res.rounds[-1]  # chance is 0.1 (5 rounds of FedAvg reach ~0.57)
    assert res.rounds[-1]["accuracy"] > res.rounds[0]["accuracy"]
    rows = RunDir(res.run_dir).read_metrics()
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    for key in ("accuracy", "ema_accuracy", "loss", "seconds"):
        assert key in rows[-1]
    assert set(rows[-1]["seconds"]) == {"sample", "broadcast", "train", "aggregate", "eval"}
    ledger = RunDir(res.run_dir).read_ledger()
    assert ledger.num_rows == 50
    assert set(ledger.column_names) >= {"client", "round", "samples", "loss", "seconds", "worker", "failure"}
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["weights_hash"] == res.weights_hash


# ------------------------------------------------------------------------------------ determinism
def test_matches_plain_pytorch_reference_bit_for_bit(tmp_path, partition_cache):
    """fedray's FedAvg reproduces the plain-PyTorch loop of shared/bench/WORKLOAD.md (W1, 3 rounds)."""
    cfg = small_config(tmp_path, partition_cache, train__clients_per_round=10, eval__every=3)
    res = _run(cfg)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "workload_floor.py"), "--workload", "W1",
                          "--rounds", "3", "--threads", "1"], capture_output=True, text=True, check=True)
    floor = json.loads(out.stdout.strip().splitlines()[-1])
    assert res.weights_hash == floor["weights_hash"]
    assert res.accuracy == pytest.approx(floor["accuracy"])


@pytest.mark.ray
def test_bit_identical_across_workers_and_backends(tmp_path, partition_cache, ray_session):
    hashes = {}
    base = dict(train__rounds=2, train__clients_per_round=8, engine__chunk_size=1)
    hashes["local"] = _run(small_config(tmp_path / "l", partition_cache, **base)).weights_hash
    for n in (1, 2, 4):
        cfg = small_config(tmp_path / f"r{n}", partition_cache, engine__backend="ray", engine__num_workers=n, **base)
        hashes[f"ray{n}"] = _run(cfg).weights_hash
    # a different chunking (several clients per worker task) must not change anything either
    cfg = small_config(tmp_path / "c3", partition_cache, engine__backend="ray", engine__num_workers=2,
                       **{**base, "engine__chunk_size": 3, "engine__reorder_window": 3})
    hashes["ray2-chunk3"] = _run(cfg).weights_hash
    assert len(set(hashes.values())) == 1, hashes


# ------------------------------------------------------------------------------------ faults
@pytest.mark.ray
def test_worker_killed_mid_round_is_replaced_and_result_identical(tmp_path, partition_cache, ray_session):
    base = dict(train__rounds=2, train__clients_per_round=6, engine__backend="ray", engine__num_workers=2)
    clean = _run(small_config(tmp_path / "clean", partition_cache, **base))
    sampled_r2 = [int(c) for c in np.random.default_rng([0, 2]).choice(100, size=6, replace=False)]
    faulty = _run(small_config(tmp_path / "faulty", partition_cache, **base,
                               engine__fault_injection={"kind": "exit", "round": 2, "client": sampled_r2[3],
                                                        "times": 1}))
    assert faulty.weights_hash == clean.weights_hash
    r2 = faulty.rounds[1]
    assert r2["worker_restarts"] >= 1 and r2["dropped"] == []
    ledger = RunDir(faulty.run_dir).read_ledger().to_pylist()
    lost = [r for r in ledger if r["failure"] and "worker lost" in r["failure"]]
    assert lost and all(r["round"] == 2 for r in lost)


@pytest.mark.ray
def test_client_failing_repeatedly_is_dropped_and_recorded(tmp_path, partition_cache, ray_session):
    sampled_r1 = [int(c) for c in np.random.default_rng([0, 1]).choice(100, size=6, replace=False)]
    bad = sampled_r1[2]
    cfg = small_config(tmp_path, partition_cache, train__rounds=2, engine__backend="ray", engine__num_workers=2,
                       engine__max_client_retries=1,
                       engine__fault_injection={"kind": "raise", "round": 1, "client": bad, "times": 5})
    res = _run(cfg)
    assert res.rounds[0]["dropped"] == [bad]
    assert res.rounds[0]["num_clients"] == 5
    assert len(res.rounds) == 2
    ledger = RunDir(res.run_dir).read_ledger().to_pylist()
    fails = [r for r in ledger if r["client"] == bad and r["round"] == 1]
    assert len(fails) == 2 and all("injected fault" in r["failure"] for r in fails)


@pytest.mark.ray
def test_fractional_gpu_workers_schedule_on_fake_gpu(tmp_path, partition_cache, ray_session):
    cfg = small_config(tmp_path, partition_cache, train__rounds=1, train__clients_per_round=4,
                       engine__backend="ray", engine__num_workers=4, engine__worker_num_gpus=0.25,
                       engine__worker_num_cpus=0.5)
    held = []  # the session has 1 fake GPU: 4 workers x 0.25 GPU hold all of it (and 2 of its 4 CPUs) while running
    res = _run(cfg, on_round=lambda report: held.append(ray_session.available_resources()) and False)
    assert res.rounds[0]["num_clients"] == 4
    assert held and held[0].get("GPU", 0.0) == 0.0 and held[0].get("CPU", 0.0) <= 2.0, held
    import time

    deadline = time.time() + 60  # the workers are killed at the end of the run; Ray frees their share soon after
    while ray_session.available_resources().get("GPU", 0.0) < 1.0 and time.time() < deadline:
        time.sleep(0.2)
    assert ray_session.available_resources().get("GPU", 0.0) == 1.0
    workers = {r["worker"] for r in RunDir(res.run_dir).read_ledger().to_pylist()}
    assert len(workers) >= 2


# ------------------------------------------------------------------------------------ resume
def test_crash_and_resume_gives_identical_weights(tmp_path, partition_cache):
    base = dict(train__rounds=4, output__checkpoint_every=2)
    clean = _run(small_config(tmp_path / "clean", partition_cache, **base))
    cfg = small_config(tmp_path / "crash", partition_cache, **base,
                       engine__fault_injection={"kind": "driver_exit", "round": 4})
    cfg_path = tmp_path / "crash.json"
    cfg_path.write_text(json.dumps(cfg))
    code = ("import json,sys; from fedray.config import from_dict; from fedray.engine.runner import run_experiment;"
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
    code = ("import json; from fedray.config import from_dict; from fedray.engine.runner import run_experiment;"
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
    ckpt = RunDir(metrics.parent).load_checkpoint()
    assert ckpt["round"] == rows[-1]  # the checkpoint and the recorded rows agree
    res = run_experiment(resume=metrics.parent, progress=False, log=lambda *a: None)
    assert [r["round"] for r in RunDir(metrics.parent).read_metrics()] == [1, 2, 3, 4, 5, 6]
    clean = _run(small_config(tmp_path / "clean", partition_cache, **{**base, "engine__backend": "local"}))
    assert res.weights_hash == clean.weights_hash


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    rd = RunDir(tmp_path / "run").create()
    rd.save_checkpoint({"round": 1, "weights": np.arange(4, dtype=np.float32)})
    import fedray.reporting.rundir as rdmod

    real = rdmod.os.replace

    def crash(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(rdmod.os, "replace", crash)
    with pytest.raises(OSError):
        rd.save_checkpoint({"round": 2, "weights": np.ones(4, dtype=np.float32)})
    monkeypatch.setattr(rdmod.os, "replace", real)
    st = rd.load_checkpoint()
    assert st["round"] == 1 and np.array_equal(st["weights"], np.arange(4, dtype=np.float32))
    assert not [p for p in (rd.path / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    # a torn newest checkpoint falls back to the previous one
    (rd.path / "checkpoints" / "ckpt-000003.pkl").write_bytes(pickle.dumps({"round": 3})[:5])
    assert rd.load_checkpoint()["round"] == 1


# ------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("over, field", [
    ({"train__clients_per_round": 200}, "train.clients_per_round"),
    ({"data__partition__params": {"alpha": 0}}, "data.partition.params.alpha"),
    ({"train__lr": "fast"}, "train.lr"),
    ({"train__bogus": 1}, "train.bogus"),
    ({"engine__backend": "spark"}, "engine.backend"),
])
def test_bad_config_fails_before_any_work(tmp_path, partition_cache, over, field):
    cfg = small_config(tmp_path, partition_cache, **over)
    with pytest.raises(ConfigError) as e:
        _run(cfg)
    assert str(e.value).startswith(field), str(e.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("over, field", [
    ({"data__source": "imagenet-1k"}, "data.source"),
    ({"model__name": "gpt5"}, "model.name"),
    ({"algorithm__name": "fedmagic"}, "algorithm.name"),
    ({"algorithm__name": "fedprox", "algorithm__params": {"mu": -1}}, "algorithm.params.mu"),
    ({"server__name": "fedyogi"}, "server.name"),
])
def test_unknown_registry_names_fail_with_field(tmp_path, partition_cache, over, field):
    with pytest.raises(ConfigError) as e:
        _run(small_config(tmp_path, partition_cache, **over))
    assert str(e.value).startswith(field), str(e.value)
    assert not (tmp_path / "runs").exists()


def test_missing_dataset_path_is_a_clear_error(tmp_path, partition_cache):
    from fedray.data.table import DataError

    cfg = small_config(tmp_path, partition_cache, data__source="cifar10", data__root=str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as e:
        _run(cfg)
    assert "nowhere" in str(e.value)


# ------------------------------------------------------------------------------------ CLI
def test_cli_run_and_report(tmp_path, partition_cache):
    from fedray.cli import main

    cfg = small_config(tmp_path, partition_cache, train__rounds=2)
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "train.clients_per_round=4", "-q"]) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    rows = RunDir(run_dir).read_metrics()
    assert len(rows) == 2 and rows[0]["num_clients"] == 4
    assert main(["report", str(run_dir), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 1000
    assert "accuracy" in (tmp_path / "rep" / "summary.md").read_text()
    assert main(["run", str(path), "train.rounds=zero"]) == 2


# ------------------------------------------------------------------------------------ stragglers
def test_over_selection_keeps_the_first_k_finished(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, train__rounds=1, train__clients_per_round=6,
                       engine__over_selection=0.5)
    res = _run(cfg)
    r = res.rounds[0]
    assert r["num_clients"] == 6 and r["stragglers_cancelled"] == 3


@pytest.mark.ray
def test_round_deadline_aggregates_what_finished(tmp_path, partition_cache, ray_session):
    cfg = small_config(tmp_path, partition_cache, train__rounds=2, engine__backend="ray", engine__num_workers=2,
                       engine__round_deadline_s=0.0)
    res = _run(cfg)
    # nothing can finish within a zero deadline: every client is cancelled, the model stays as it was
    assert all(r["num_clients"] == 0 and r["stragglers_cancelled"] == 6 for r in res.rounds)
    assert res.rounds[0]["accuracy"] == res.rounds[1]["accuracy"]


def test_drop_after_worker_losses_folds_the_results_buffered_behind_it():
    """A client whose task keeps losing its worker is dropped after its retries; results of later
    positions that finished meanwhile wait in the reorder buffer behind it and must still be folded, even
    when the drop is the round's last event (a fake pool returns the doomed task last, every time)."""
    import types

    from fedray.engine.outcomes import ClientOutcome, WorkerLost
    from fedray.engine.programs.federated import FederatedProgram

    bad = 3

    class Pool:
        size, restarts, kind = 2, 0, "local"

        def __init__(self):
            self.n = 0

        def submit(self, widx, method, rnd, w, p, items, hints):
            self.n += 1
            return (self.n, widx, tuple(items))

        def wait(self, handles, timeout=None):
            good = [h for h in handles if all(c != bad for _, c in h[2])]
            return good[:1] if good else handles[:1]

        def result(self, h):
            if any(c == bad for _, c in h[2]):
                raise WorkerLost("killed")
            return [ClientOutcome(cid=c, pos=p, weights=np.full(2, float(c), np.float32), num_samples=1, loss=0.0,
                                  seconds=0.0, worker="w") for p, c in h[2]]

        def replace(self, widx):
            self.restarts += 1

        def cancel(self, handles):
            pass

    eng = types.SimpleNamespace(over_selection=0, round_deadline_s=None, reorder_window=None, max_client_retries=1,
                                max_worker_restarts=10, chunk_size=1, multi_client=1)
    cfg = types.SimpleNamespace(engine=eng, train=types.SimpleNamespace(clients_per_round=6))
    prog = FederatedProgram(cfg=cfg, algorithm=types.SimpleNamespace(client_weight=lambda n: float(n)),
                            server_opt=None, pool=Pool(), sizes=np.ones(10, np.int64), num_params=2)
    out = prog.train(1, [0, 1, 2, 3, 4, 5], None, None, None)
    assert out["dropped"] == [bad] and out["num_clients"] == 5 and out["worker_restarts"] == 2
    np.testing.assert_allclose(out["avg"], np.full(2, np.mean([0, 1, 2, 4, 5])), rtol=1e-6)
