"""Shared fixtures (found by pytest for every subdirectory): one local Ray instance for the whole test run (ray.init costs ~3 s).

The instance has 4 logical CPUs (so 1, 2 and 4 client workers can be compared on a 2-core machine)
and 1 fake logical GPU (so fractional-GPU actors schedule on CPU-only CI). It is started by
``fedray.core.ray_env.ensure_ray``, like every local run: bound to 127.0.0.1 only, token authentication on
(fedray's token file; subprocesses of the tests inherit RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH from it).

Helpers that test files import (ROOT, small_config, ...) are in tests/helpers.py, or in a helper module of a
subdirectory (tests/tuning/studies.py, ...): no test file imports conftest or another test file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from fedray.core.ray_env import ensure_ray

    # "local": the tests' own instance, even when the shell has RAY_ADDRESS set
    ensure_ray(1 << 30, address="local", num_cpus=4, num_gpus=1, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def partition_cache(tmp_path_factory):
    """One partition cache shared by the whole run, so identical partitions are built once."""
    return tmp_path_factory.mktemp("partitions")


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """One MLflow SQLite store (a tracking URI) for the tests that talk to MLflow directly: creating a
    store's tables takes seconds, so they share one and keep apart by experiment name."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def _cached_sources():
    """Parse each data source once for the module that uses this fixture (its runs differ only in algorithm,
    model and options); modules opt in with ``pytestmark = pytest.mark.usefixtures("_cached_sources")``."""
    import fedray.data.sources as sources

    original, cache = sources.load_source, {}

    def cached(name, root=None, **params):
        key = (name, root, repr(sorted(params.items())))
        if key not in cache:
            cache[key] = original(name, root, **params)
        return cache[key]

    sources.load_source = cached
    yield
    sources.load_source = original
