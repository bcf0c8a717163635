"""fedray.driver.handle and rounds: which Ray errors mean "the coordinator (or an actor it was starting with) is lost"
and the restart loop's bound, on fake Ray handles (whole runs losing nodes are in tests/integration/)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray import exceptions as rex

from fedray.engine.dispatch import RunAborted
from fedray.driver.handle import CoordinatorLost, RayCoordinator
from fedray.driver.rounds import RoundLoop
from fedray.driver.setup import RunResult


class _FakeRay:
    """``get`` returns each ref's value or raises it."""

    def get(self, ref):
        values = [self.get(r) for r in ref] if isinstance(ref, list) else None
        if values is not None:
            return values
        if isinstance(ref, BaseException):
            raise ref
        return ref


def _engine(coord_setup, *worker_setups) -> RayCoordinator:
    e = RayCoordinator.__new__(RayCoordinator)
    e.ray = _FakeRay()
    e._setups = [coord_setup, *worker_setups]
    e.in_flight = {}
    e.coord = SimpleNamespace(ready=SimpleNamespace(remote=lambda: {"workers": len(worker_setups)}),
                              workers=SimpleNamespace(remote=lambda: []))  # the pool retired no worker
    return e


def _task_error(cause: BaseException):
    return rex.RayTaskError("setup", "traceback", cause).as_instanceof_cause()


def test_ready_when_every_actor_started():
    e = _engine(True, True, True)
    assert e.ready() == {"workers": 2} and e._setups == []


@pytest.mark.parametrize("coord, worker, says", [
    # a new worker on a node being lost: the driver sees it die ...
    (True, rex.ActorDiedError(), "an actor died while starting: ActorDiedError"),
    (True, rex.ActorUnavailableError("Socket closed", b"a" * 16), "an actor died while starting: ActorUnavailable"),
    # ... or the coordinator's setup, waiting for its workers, does
    (_task_error(rex.ActorDiedError()), True, "a client worker died while the coordinator started: ActorDiedError"),
    # the new coordinator itself
    (rex.ActorDiedError(), True, "ActorDiedError"),
])
def test_an_actor_dying_while_starting_is_a_lost_coordinator(coord, worker, says):
    with pytest.raises(CoordinatorLost, match=says):
        _engine(coord, worker).ready()


def test_a_worker_the_pool_retired_while_it_started_is_no_lost_start():
    """A worker stopped in its constructor past engine.start_timeout_s is killed and replaced by the coordinator's
    pool; the driver's setup call to it then fails with the killed actor. Before the fix that failure counted as a
    lost start and restarted the coordinator; a worker that died and was not retired still does."""
    e = _engine(True, True, rex.ActorDiedError())
    e.coord.workers = SimpleNamespace(remote=lambda: [{"name": "w0", "state": "live"},
                                                      {"name": "w1", "state": "retired"},
                                                      {"name": "w1.1", "state": "starting"}])
    assert e.ready() == {"workers": 2} and e._setups == []
    e = _engine(True, rex.ActorDiedError(), True)
    e.coord.workers = SimpleNamespace(remote=lambda: [{"name": "w0", "state": "live"}, {"name": "w1", "state": "retired"}])
    with pytest.raises(CoordinatorLost, match="an actor died while starting"):
        e.ready()


def test_an_error_in_the_coordinators_setup_is_not_a_lost_coordinator():
    """A bug or bad input raised inside setup must fail the run, not be retried as a lost actor."""
    with pytest.raises(rex.RayTaskError) as err:
        _engine(_task_error(ValueError("bad partition")), True).ready()
    assert not isinstance(err.value, CoordinatorLost) and str(err.value.cause) == "bad partition"


def test_restarts_that_keep_failing_end_at_the_limit(tmp_path):
    """Every restart loses an actor while starting: the loop tries ``max_coordinator_restarts`` times, then
    fails the run naming the limit and the last reason."""
    tries = []

    class Lossy:
        restarts = 0

        def restart(self):
            self.restarts += 1
            tries.append(self.restarts)
            raise CoordinatorLost(f"an actor died while starting: try {self.restarts}")

    run = SimpleNamespace(cfg=SimpleNamespace(engine=SimpleNamespace(max_coordinator_restarts=3)))
    loop = RoundLoop(run, Lossy(), [], RunResult(tmp_path), log=lambda *a: None)
    with pytest.raises(RunAborted, match=r"round 2: the coordinator died after 3 restart\(s\) "
                                         r"\(engine.max_coordinator_restarts=3\): an actor died while starting: try 3"):
        loop._restart(2, CoordinatorLost("node lost"))
    assert tries == [1, 2, 3]
