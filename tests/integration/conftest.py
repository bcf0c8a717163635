"""Fixtures of the integration tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def multinode():
    """A loopback multi-node Ray cluster for one test module: a 0-CPU head and 3 one-CPU worker nodes
    (tests/integration/multinode.py). This process joins it instead of the session's Ray while the module runs."""
    from tests.integration.multinode import MultiNodeCluster

    mn = MultiNodeCluster()
    try:
        yield mn.start(workers=3)
    finally:
        mn.shutdown()


@pytest.fixture
def engines(monkeypatch):
    """The coordinator handles run_experiment opens (to reach the coordinator from a test's on_round)."""
    from fedray.driver import runner

    made = []
    real = runner.open_coordinator

    def recording(run):
        made.append(real(run))
        return made[-1]

    monkeypatch.setattr(runner, "open_coordinator", recording)
    return made
