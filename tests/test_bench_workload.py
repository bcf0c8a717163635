"""`fedray bench workload`'s definitions and plumbing (bench/workload_def.py, bench/bench_workload.py,
bench/workload_fedray.py): the pfl-shape workload's geometry as fedray and the peers read it, and the pfl-research
virtualenv's install commands. Neither pfl nor Flower is needed; the one test that runs pfl-research skips when
its virtualenv (bench/.pfl-venv, made by `fedray bench workload --pfl`) is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_workload  # noqa: E402
import workload_def as wd  # noqa: E402
import workload_fedray  # noqa: E402


@pytest.fixture(scope="module")
def pfl_shape_data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pfl-shape") / "pfl-shape.npz")
    wd.export_pfl_shape(path)
    return path


def test_pfl_shape_geometry_in_fedray_config(tmp_path):
    """pfl-research's benchmark geometry: 1,000 users, 50 a round, batch 10, 1 local epoch, lr 0.05."""
    w = wd.WORKLOADS["pfl-shape"]
    assert (w.num_clients, w.per_round) == (1000, 50)
    cfg = workload_fedray.config("pfl-shape", "ray", 2, str(tmp_path))
    assert cfg["data"]["source"] == "synthetic"
    assert cfg["data"]["partition"] == {"name": "natural", "num_clients": 1000}
    assert cfg["data"]["params"]["num_clients"] == 1000
    assert cfg["train"] == {"rounds": w.rounds, "clients_per_round": 50, "batch_size": 10, "lr": 0.05,
                            "local_epochs": 1}
    assert cfg["model"] == {"name": "mlp", "params": {"hidden": [64]}}
    # W1 keeps its definition (shared/bench/WORKLOAD.md)
    w1 = workload_fedray.config("W1", "ray", 2, str(tmp_path))
    assert w1["data"]["partition"]["num_clients"] == 100 and w1["train"]["clients_per_round"] == 10
    assert w1["model"] == {"name": "fedavg_cnn"}


def test_pfl_shape_data_is_1000_users_of_50(pfl_shape_data):
    """The data every peer reads: 1,000 users of exactly 50 distinct training samples, 10,000 test samples."""
    X_train, X_test, y_train, y_test, parts = wd.load("pfl-shape", pfl_shape_data)
    assert X_train.shape == (50_000, 60) and X_test.shape == (10_000, 60)
    assert len(parts) == 1000 and {len(p) for p in parts} == {50}
    assert len(np.unique(np.concatenate(parts))) == 50_000  # no sample shared between users
    assert len(np.unique(X_train, axis=0)) == 50_000
    assert set(np.unique(y_train)) <= set(range(10))
    # a round samples 50 distinct users; a user's 50 samples make 5 batches of 10
    sampled = wd.sampled_clients("pfl-shape", 1, parts)
    assert len(sampled) == 50 == len(set(sampled))
    order = wd.batch_order(1, sampled[0], len(parts[sampled[0]]))
    assert len([order[i:i + wd.BATCH_SIZE] for i in range(0, len(order), wd.BATCH_SIZE)]) == 5


def test_pfl_venv_keeps_the_cpu_torch(tmp_path):
    """torch alone first, then pfl under a constraints file holding torch at the pinned (CPU) version."""
    constraints = tmp_path / "c.txt"
    first, second = bench_workload.pfl_install_commands(Path("py"), constraints)
    assert first[-1] == bench_workload.PFL_TORCH == "torch==2.13.0"
    assert second[second.index("-c") + 1] == str(constraints)
    assert "pfl[pytorch]==0.6.0" in second and not any(a.startswith("torch") for a in second)


def test_pfl_venv_is_git_ignored():
    out = subprocess.run(["git", "check-ignore", "bench/.pfl-venv/bin/python"], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0


@pytest.mark.skipif(not bench_workload.pfl_venv_ready(), reason="bench/.pfl-venv missing (`fedray bench workload --pfl`)")
def test_pfl_peer_tracks_the_floor(pfl_shape_data):
    """pfl-research's FedAvg on the same users, order and data as the floor: same accuracy after 3 rounds (its
    weights differ from the floor's by float rounding only: old + averaged difference)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    args = ["--workload", "pfl-shape", "--data", pfl_shape_data, "--rounds", "3"]
    pfl = subprocess.run([str(bench_workload.PFL_VENV / "bin" / "python"), str(ROOT / "bench" / "workload_pfl.py"),
                          *args], capture_output=True, text=True, check=True, env=env)
    floor = subprocess.run([sys.executable, str(ROOT / "bench" / "workload_floor.py"), *args], capture_output=True,
                           text=True, check=True, env=env)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (pfl, floor))
    assert len(a["round_s"]) == len(b["round_s"]) == 3
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.005)
