"""Whole experiments on the session's local Ray: training, fractional-GPU scheduling, coordinator memory."""

from __future__ import annotations

import json

import pytest

from fedray.config import from_dict
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config, synthetic_experiment as _synthetic_experiment


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


# ------------------------------------------------------------------------------------ memory
@pytest.mark.ray
def test_coordinator_memory_flat_in_clients_per_round(tmp_path, partition_cache, ray_session):
    """Coordinator memory at 10 and 200 clients per round. The updates (1.2 MB each) stay in the object
    store and are folded one by one in sampled order, so the coordinator's private memory does not grow
    with the clients per round; keeping all 200 updates would take 240 MB."""
    peak = {}
    for k in (10, 200):
        cfg = _synthetic_experiment(tmp_path / f"k{k}", partition_cache, train__rounds=2, train__clients_per_round=k,
                                    data__params={"num_clients": 400, "samples_per_client_mean": 12,
                                                  "min_samples": 3, "size_sigma": 0.5},
                                    data__partition={"name": "natural", "num_clients": 400, "params": {}},
                                    model__params={"hidden": [512, 512]}, eval__every=2,
                                    engine__backend="ray", engine__num_workers=2)
        res = _run(cfg)
        assert sum(r["num_clients"] for r in res.rounds) == 2 * k
        mem = [r["memory"] for r in res.rounds]
        peak[k] = (max(m["coordinator_anon_mb"] for m in mem), mem[-1]["coordinator_peak_mb"])
        assert all(m["workers_peak_mb"] > 0 for m in mem)
    update_mb = (60 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10) * 4 / 2**20
    assert update_mb > 1.1
    # private (anonymous) memory: the coordinator's own heap, where Flower-style gathering would hold them
    grown_anon = peak[200][0] - peak[10][0]
    assert grown_anon < 24 * update_mb, peak  # well below the 190 x 1.2 MB of holding every extra update
