"""RayPool's start deadline (engine.start_timeout_s) for a replacement that is still starting, on a fake Ray: one Ray
started that has not answered by its deadline (stopped or deadlocked in its constructor) is killed and started again
in a new slot, within the scheduler's restart budget; one Ray could not place keeps waiting in the background, and
ends the wait for a worker when no worker is left, naming why. The first workers' deadline and a real Ray are in
tests/integration/test_coordinator_start.py."""

from __future__ import annotations

import itertools

import pytest

from fedray.engine import pool as pool_mod
from fedray.engine.pool import RayPool


class _Ref:
    _ids = itertools.count()

    def __init__(self):
        self.id = next(self._ids)


class _Actor:
    def __init__(self, name):
        self.name = name
        self.node_id = type("M", (), {"remote": staticmethod(lambda: _Ref())})()


class _FakeRay:
    """Nothing is ever ready; ``kill`` records the actor."""

    def __init__(self):
        self.killed = []

    def wait(self, refs, num_returns=1, timeout=None):
        return [], list(refs)

    def kill(self, actor, no_restart=True):
        self.killed.append(actor.name)


class _ActorCls:
    @staticmethod
    def remote(spec, name):
        return _Actor(name)


def _pool(monkeypatch, started: bool) -> RayPool:
    """A pool whose only worker w0 was lost; its replacement w0.1 is starting, past its start deadline."""
    p = RayPool.__new__(RayPool)
    p.ray, p.spec, p.actor_cls = _FakeRay(), None, _ActorCls()
    p.num_cpus, p.num_gpus, p.start_timeout_s = 1.0, 0.0, 30.0
    p.workers, p.names, p.nodes, p.live = [_Actor("w0"), _Actor("w0.1")], ["w0", "w0.1"], ["n0", None], [False, False]
    p.lost, p._respawn, p.unplaced, p.restarts = ["w0 (node n0)"], [], None, 1
    p._pending, p._due = {_Ref(): 1}, {1: 0.0}  # due long ago
    p._pings, p.hung = {}, {}
    why = "did not answer within 30 s of its start (engine.start_timeout_s): " + (
        "Ray started it (pid 7 on node n0) but it did not answer" if started else "Ray has not placed it")
    monkeypatch.setattr(pool_mod, "start_silence", lambda ray, actor, timeout: (started, why))
    monkeypatch.setattr(RayPool, "_capacity", lambda self: True)
    return p


def test_a_replacement_silent_past_its_start_deadline_is_killed_and_started_again(monkeypatch):
    p = _pool(monkeypatch, started=True)
    p.poll(respawn=True)
    assert p.ray.killed == ["w0.1"] and p.names == ["w0", "w0.1", "w0.2"] and p.restarts == 2
    assert list(p._pending.values()) == [2] and p._due[2] > 0.0  # the new one has a deadline of its own
    assert "w0.1 (hung while starting: did not answer within 30 s of its start (engine.start_timeout_s): Ray " \
           "started it (pid 7" in p.lost[-1]


def test_past_the_restart_budget_a_silent_replacement_is_not_started_again(monkeypatch):
    p = _pool(monkeypatch, started=True)
    assert p.await_worker(respawn=False) is False  # nothing left starting: no worker can come
    assert p.ray.killed == ["w0.1"] and p.names == ["w0", "w0.1"] and p._respawn == [1]
    assert "hung while starting" in p.lost_summary()


def test_a_replacement_ray_cannot_place_waits_then_ends_the_wait_naming_why(monkeypatch):
    p = _pool(monkeypatch, started=False)
    p.poll(respawn=True)  # in the background: it keeps waiting for a node with room
    assert p.ray.killed == [] and list(p._pending.values()) == [1] and p._due[1] > 0.0
    p._due[1] = 0.0
    assert p.await_worker(respawn=True) is False  # no worker left: the wait ends at the deadline
    assert p.lost_summary() == ("workers lost: w0 (node n0); the replacement w0.1 did not answer within 30 s of its "
                                "start (engine.start_timeout_s): Ray has not placed it (num_cpus=1, num_gpus=0 per "
                                "worker)")


@pytest.mark.parametrize("started", [True, False])
def test_a_replacement_within_its_deadline_is_left_alone(monkeypatch, started):
    p = _pool(monkeypatch, started)
    p._due[1] = float("inf")
    p.poll(respawn=True)
    assert p.ray.killed == [] and list(p._pending.values()) == [1] and p.unplaced is None


class _DiedStarting(Exception):
    """Ray's ActorDiedError as the pool sees it: ``actor_init_failed`` and the constructor's exception last."""

    def __init__(self, last: str, init_failed: bool = True):
        super().__init__(f"The actor died because of an error raised in its creation task, ray::RayClientWorker"
                         f".__init__() (pid=9)\n  File \"x.py\", line 1, in __init__\n{last}")
        self.actor_init_failed = init_failed


def _pool_whose_replacement_died(monkeypatch, err: Exception) -> RayPool:
    from ray import exceptions as rex

    p = _pool(monkeypatch, started=True)
    (ref,) = p._pending
    monkeypatch.setattr(p.ray, "wait", lambda refs, num_returns=1, timeout=None: ([ref], []), raising=False)

    def get(r):
        raise err

    p.ray.get = get
    monkeypatch.setattr(rex, "RayActorError", _DiedStarting)  # the pool catches Ray's class: ours stands in
    return p


def test_a_replacement_whose_setup_raises_a_data_error_stops_the_run_naming_it(monkeypatch):
    """Chaos cluster seed 31 schedule 37: the partition's client index damaged on disk, then both workers lost;
    each replacement's constructor raised DataError and was started again, up to the restart budget (the
    driver killed at 240 s). Every replacement raises the same: the run stops at the first, with its error."""
    p = _pool_whose_replacement_died(monkeypatch, _DiedStarting(
        "fedray.data.table.DataError: corrupt partition client index /p/clients.arrow: 1114 bytes, CRC-32 0"))
    with pytest.raises(pool_mod.WorkerSetupFailed, match=r"w0\.1\) could not set up the run, and none could: "
                                                         r"fedray\.data\.table\.DataError: corrupt partition client"):
        p.poll(respawn=True)
    assert p.restarts == 1  # nothing started again


@pytest.mark.parametrize("last, init_failed", [("MemoryError: out of memory", True),
                                               ("DataError: corrupt partition client index", False)])
def test_a_replacement_that_died_otherwise_is_started_again(monkeypatch, last, init_failed):
    p = _pool_whose_replacement_died(monkeypatch, _DiedStarting(last, init_failed))
    p.poll(respawn=True)
    assert p.restarts == 2 and p.names[-1] == "w0.2" and "died starting" in p.lost[-1]


def test_asking_every_worker_with_skip_lost_leaves_out_a_dead_and_a_silent_one():
    """``call_all(..., skip_lost=True)`` (the coordinator's question of what the workers train on): the answers of
    the workers that gave one; a worker that died (its call raises) or did not answer in time is left out, not
    raised, and without ``skip_lost`` the error is Ray's as before."""
    refs = {}

    def actor(name):
        a = _Actor(name)
        refs[name] = _Ref()
        a.device = type("M", (), {"remote": staticmethod(lambda: refs[name])})()
        return a

    p = RayPool.__new__(RayPool)
    p.workers = [actor("w0"), actor("w1"), actor("w2")]
    p.live = [True, True, True]

    class Ray:
        def wait(self, got, num_returns=1, timeout=None):
            return [r for r in got if r is not refs["w2"]], [refs["w2"]]  # w2 never answers

        def get(self, ref, timeout=None):
            if isinstance(ref, list):
                return [self.get(r) for r in ref]
            if ref is refs["w1"]:
                raise RuntimeError("w1 died")
            return "cpu"

    p.ray = Ray()
    assert p.call_all("device", timeout=1.0, skip_lost=True) == ["cpu"]
    with pytest.raises(RuntimeError, match="w1 died"):
        p.call_all("device", timeout=1.0)
