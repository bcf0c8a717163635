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
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ["FEDRAY_NO_WARM"] = "1"  # no test's `fedray run` joins a `fedray up` Ray (tests/core/test_ray_up.py starts its own)

# A shell without job control starts a background command (`cmd &`) with SIGINT ignored, and Python then leaves
# it ignored, in this process and in every process it starts: the Ctrl-C tests (tests/driver/test_interrupts.py,
# tests/integration/test_resume.py) failed that way under `nohup bash -c '... .ci/run' &`. They test fedray's
# handling of a Ctrl-C that arrives, so Ctrl-C gets its default handler back here (children then start with it).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from tests.helpers import start_test_ray

    start_test_ray()
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
