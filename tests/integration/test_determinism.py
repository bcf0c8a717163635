"""Bit identity of whole runs: against the plain-PyTorch floor, across backends, worker counts and chunkings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fedray.config import from_dict
from fedray.driver.runner import run_experiment
from tests.helpers import ROOT, small_config


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


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


@pytest.mark.ray
def test_multi_client_identical_across_worker_counts(tmp_path, partition_cache, ray_session):
    base = dict(train__rounds=2, train__clients_per_round=9, engine__multi_client=2, model__name="mlp",
                model__params={"hidden": [32]})
    hashes = {"local-1w": _run(small_config(tmp_path / "l", partition_cache, **base)).weights_hash}
    cfg = small_config(tmp_path / "r2", partition_cache, engine__backend="ray", engine__num_workers=2, **base)
    hashes["ray-2w"] = _run(cfg).weights_hash
    # 4 workers, and a task size that is not a multiple of the group size (rounded up: same groups)
    cfg = small_config(tmp_path / "r4", partition_cache, engine__backend="ray", engine__num_workers=4,
                       engine__chunk_size=3, **base)
    hashes["ray-4w-chunk3"] = _run(cfg).weights_hash
    assert len(set(hashes.values())) == 1, hashes


@pytest.mark.ray
def test_fold_group_identical_across_worker_counts_backends_and_resume(tmp_path, partition_cache, ray_session):
    """engine.fold_group: 5 (groups 5 + 5 + 2): the same final weights in-process with 1 worker, on Ray with 2
    and after a driver crash + --resume (fake-pool worker counts: tests/engine/programs/test_fold_group.py);
    the sharded evaluation's numbers agree everywhere too."""
    from fedray.reporting.rundir import RunDir

    base = dict(train__rounds=2, train__clients_per_round=12, engine__fold_group=5, output__checkpoint_every=1)
    runs = {"local-1w": _run(small_config(tmp_path / "l1", partition_cache, **base)),
            "ray-2w": _run(small_config(tmp_path / "r2", partition_cache, engine__backend="ray",
                                        engine__num_workers=2, **base))}
    cfg = small_config(tmp_path / "crash", partition_cache, engine__fault_injection={"kind": "driver_exit", "round": 2},
                       **base)
    cfg_path = tmp_path / "crash.json"
    cfg_path.write_text(json.dumps(cfg))
    code = ("import json; from fedray.config import from_dict; from fedray.driver.runner import run_experiment;"
            f"run_experiment(from_dict(json.load(open({str(cfg_path)!r}))), progress=False)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 17, proc.stderr[-2000:]
    run_dir = next((tmp_path / "crash" / "runs").iterdir())
    runs["resumed"] = run_experiment(resume=run_dir, progress=False, log=lambda *a: None)
    assert len({r.weights_hash for r in runs.values()}) == 1, {k: r.weights_hash for k, r in runs.items()}
    rows = {k: [(m["accuracy"], m["test_loss"], m["bytes"]["upload"]) for m in RunDir(r.run_dir).read_metrics()]
            for k, r in runs.items()}
    assert len({tuple(v) for v in rows.values()}) == 1, rows
    assert rows["local-1w"][0][2] == 3 * 4 * 1_663_370  # one partial sum per group crosses the object store


@pytest.mark.ray
def test_a_model_with_dropout_is_bit_identical_across_workers_and_backends(tmp_path, partition_cache, ray_session):
    """Dropout draws its masks from the global torch RNG. In a Ray worker that RNG starts wherever the process
    left it, so FedAvg or FedProx on ``alexnet_split`` ended with other weights run after run (only FedLogit and
    FedLA seeded it, each in its own way); the client runtime now seeds it per (seed, round, client) for every
    algorithm whose model has dropout."""
    from tests.helpers import split_config

    for name in ("fedavg", "fedprox"):
        hashes = {"local": _run(split_config(tmp_path / f"{name}-l", partition_cache, name)).weights_hash}
        for n in (1, 2):
            cfg = split_config(tmp_path / f"{name}-r{n}", partition_cache, name, engine__backend="ray",
                               engine__num_workers=n)
            hashes[f"ray{n}"] = _run(cfg).weights_hash
        assert len(set(hashes.values())) == 1, (name, hashes)
