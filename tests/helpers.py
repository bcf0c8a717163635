"""Helpers imported by test files in several directories (fixtures are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root


def small_config(tmp_path, partition_cache, **over) -> dict:
    """A small, fast FedAvg experiment on the embedded MNIST subset (as a config dict)."""
    cfg = {
        "seed": 0,
        "data": {"source": "mnist5k", "normalize": False, "cache_dir": str(partition_cache),
                 "partition": {"name": "dirichlet", "num_clients": 100, "params": {"alpha": 0.3}}},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 3, "clients_per_round": 6, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 1},
        "engine": {"backend": "local", "num_workers": 1},
        "output": {"root": str(tmp_path / "runs"), "checkpoint_every": 1, "tensorboard": False, "progress": False},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg
