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
    """The Engine objects run_experiment makes (to reach the coordinator actor from a test's on_round)."""
    from fedray.engine import runner

    made = []

    class Recording(runner.Engine):
        def __init__(self, run):
            super().__init__(run)
            made.append(self)

    monkeypatch.setattr(runner, "Engine", Recording)
    return made
