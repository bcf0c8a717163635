"""Study helpers shared by the tuning tests (not a test file): a tiny FedProx base config, a study dict
around it and a study file on disk."""

from __future__ import annotations

from pathlib import Path

import yaml


def base_config(tmp_path, partition_cache, backend="local", rounds=2) -> dict:
    return {
        "seed": 0,
        "data": {"source": "mnist5k", "normalize": False, "cache_dir": str(partition_cache),
                 "partition": {"name": "iid", "num_clients": 20}},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedprox", "params": {"mu": 1e-3}},
        "train": {"rounds": rounds, "clients_per_round": 2, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 1},
        "engine": {"backend": backend},
        "output": {"root": str(tmp_path / "unused"), "checkpoint_every": 1, "tensorboard": False},
    }


def study_dict(tmp_path, partition_cache, **over) -> dict:
    d = {
        "name": "t",
        "base_config": base_config(tmp_path, partition_cache),
        "params": {"algorithm.params.mu": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
                   "train.lr": {"type": "float", "low": 0.02, "high": 0.08}},
        "objective": {"metric": "accuracy", "direction": "maximize"},
        "budget": {"n_trials": 3},
        "sampler": {"name": "random", "seed": 0},
        "pruner": "none",
        "concurrency": 1,
    }
    d.update(over)
    return d


def write_study(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
