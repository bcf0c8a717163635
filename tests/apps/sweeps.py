"""Sweep files for the tests of fedray sweep (tests/apps/test_sweep.py, tests/integration/test_sweep.py): a tiny
base experiment (scikit-learn digits, 8 clients, an MLP, 3 rounds, a checkpoint every round)."""

from __future__ import annotations

from pathlib import Path

import yaml


def tiny_base(partition_cache, backend: str = "ray") -> dict:
    return {
        "seed": 0,
        "data": {"source": "digits", "normalize": False, "cache_dir": str(partition_cache),
                 "partition": {"name": "dirichlet", "num_clients": 8, "params": {"alpha": 0.3}}},
        "model": {"name": "mlp", "params": {"hidden": [16]}},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 3, "clients_per_round": 3, "batch_size": 16, "lr": 0.05},
        "eval": {"every": 1},
        "engine": {"backend": backend, "num_workers": 1},
        "output": {"checkpoint_every": 1, "tensorboard": False},
    }


def write_sweep(tmp_path: Path, partition_cache, name: str = "sweep", base_file: bool = True, **over) -> Path:
    """A sweep file (and its base config file) in ``tmp_path``: fedavg over α ∈ {0.1, 1} x seeds {0, 1}, a
    table of final and EMA accuracy; ``over`` replaces top-level keys (None removes one)."""
    base = tiny_base(partition_cache)
    if base_file:
        (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    data = {"base": "base.yaml" if base_file else base,
            "axes": {"data.partition.params.alpha": [0.1, 1.0], "seed": [0, 1]},
            "parallel": 2, "resources": {"workers": 1, "cpus_per_worker": 1, "gpus_per_worker": 0},
            "table": {"rows": "algorithm.name", "columns": "data.partition.params.alpha",
                      "metric": ["accuracy", "ema_accuracy"]}}
    for k, v in over.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
