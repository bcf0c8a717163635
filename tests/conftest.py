"""Shared fixtures: one local Ray instance for the whole test run (ray.init costs ~3 s).

The instance has 4 logical CPUs (so 1, 2 and 4 client workers can be compared on a 2-core machine)
and 1 fake logical GPU (so fractional-GPU actors schedule on CPU-only CI). Token authentication is
disabled consistently for tests (scripts/env.sh sets RAY_AUTH_MODE=disabled too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, object_store_memory=1 << 30,
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def partition_cache(tmp_path_factory):
    """One partition cache shared by the whole run, so identical partitions are built once."""
    return tmp_path_factory.mktemp("partitions")


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
