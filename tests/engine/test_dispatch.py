"""The task scheduler and its failure policy (fedray.engine.dispatch) on a fake pool."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pytest

from fedray.engine.dispatch import FailureDecision, FailurePolicy, RoundAborted, RunAborted, Task, TaskScheduler
from fedray.engine.outcomes import ClientOutcome, WorkerLost


@dataclass(eq=False)
class Handle:
    n: int
    widx: int
    items: tuple
    what: object


class FakePool:
    """Runs tasks synchronously; ``behaviour(widx, items, attempt) -> 'ok' | 'lost' | 'never' | {cid: 'raise'}``
    scripts what happens (attempt counts submissions of the same first position)."""

    kind = "local"

    def __init__(self, size=2, behaviour=None):
        self.size, self.restarts = size, 0
        self.behaviour = behaviour or (lambda widx, items, attempt: "ok")
        self.submitted: list[tuple] = []  # (worker, items, replay flag)
        self.replaced: list[int] = []
        self.cancelled = 0
        self._tries: dict = {}

    def submit(self, widx, items, replay=False):
        key = items[0][0]
        self._tries[key] = self._tries.get(key, 0) + 1
        self.submitted.append((widx, tuple(items), replay))
        return Handle(len(self.submitted), widx, tuple(items), self.behaviour(widx, items, self._tries[key]))

    def wait(self, handles, timeout=None):
        ready = [h for h in handles if not (isinstance(h.what, str) and h.what == "never")]
        return ready[:1]

    def result(self, h):
        widx, items, what = h.widx, h.items, h.what
        if isinstance(what, str) and what == "lost":
            raise WorkerLost(f"w{widx} killed")
        bad = what if isinstance(what, dict) else {}
        return [ClientOutcome(cid=c, pos=p, weights=None if c in bad else np.full(2, float(c), np.float32),
                              num_samples=0 if c in bad else 1, loss=math.nan if c in bad else 0.5, seconds=0.0,
                              worker=f"w{widx}", error=f"ValueError: client {c} broke\ntrace" if c in bad else None)
                for p, c in items]

    def replace(self, widx):
        self.restarts += 1
        self.replaced.append(widx)

    def cancel(self, handles):
        self.cancelled += len(handles)


def _run(pool, tasks, policy=None, **kw):
    policy = policy or FailurePolicy(max_client_retries=1, max_worker_restarts=5)
    sched = TaskScheduler(pool, policy, rnd=7, **{k: kw.pop(k) for k in ("atomic", "record_success") if k in kw})
    got, dropped = [], []
    sched.run(tasks, lambda widx, task: pool.submit(widx, task.items, task.replay), got.append,
              on_drop=lambda pos, cid: dropped.append((pos, cid)), **kw)
    return sched, got, dropped


def _tasks(cids, chunk=1):
    return [Task(tuple((p, c) for p, c in list(enumerate(cids))[i : i + chunk])) for i in range(0, len(cids), chunk)]


def test_policy_decisions():
    p = FailurePolicy(max_client_retries=2, max_worker_restarts=1)
    assert [p.client_failed(n) for n in (1, 2, 3)] == [FailureDecision.RETRY] * 2 + [FailureDecision.DROP]
    assert FailurePolicy(2, 1, can_drop=False).client_failed(3) is FailureDecision.ABORT_ROUND
    assert p.worker_lost(0) is FailureDecision.RETRY and p.worker_lost(1) is FailureDecision.ABORT_RUN


def test_every_client_runs_once_and_succeeds():
    pool = FakePool()
    sched, got, dropped = _run(pool, _tasks([10, 11, 12, 13], chunk=2))
    assert sorted(o.cid for o in got) == [10, 11, 12, 13] and dropped == []
    assert [(r.client, r.failure, r.attempt) for r in sched.ledger] == [(c, None, 1) for c in (10, 11, 12, 13)]
    assert sched.retries == 0 and sched.worker_restarts == 0


def test_worker_lost_mid_task_is_replaced_and_its_clients_rerun():
    pool = FakePool(behaviour=lambda widx, items, attempt: "lost" if items[0][1] == 11 and attempt == 1 else "ok")
    sched, got, dropped = _run(pool, _tasks([10, 11, 12]))
    assert sorted(o.cid for o in got) == [10, 11, 12] and dropped == []
    assert sched.worker_restarts == 1 and len(pool.replaced) == 1
    lost = [r for r in sched.ledger if r.failure]
    assert len(lost) == 1 and lost[0].client == 11 and lost[0].failure.startswith("worker lost: ")
    assert [r.attempt for r in sched.ledger if r.client == 11] == [1, 2]


def test_lost_multi_client_task_is_resubmitted_whole():
    pool = FakePool(behaviour=lambda widx, items, attempt: "lost" if attempt == 1 and items[0][0] == 2 else "ok")
    sched, got, _ = _run(pool, _tasks([10, 11, 12, 13], chunk=2))
    again = [items for _, items, _ in pool.submitted if items[0][0] == 2]
    assert again == [((2, 12), (3, 13))] * 2  # the group keeps its members
    assert sorted(o.cid for o in got) == [10, 11, 12, 13]


def test_client_raising_is_retried_alone():
    pool = FakePool(behaviour=lambda widx, items, attempt: {11: "raise"} if attempt == 1 and items[0][0] == 0 else "ok")
    sched, got, dropped = _run(pool, _tasks([10, 11], chunk=2))
    assert sorted(o.cid for o in got) == [10, 11] and dropped == []
    rows = [(r.client, r.failure, r.attempt) for r in sched.ledger]
    assert (11, "ValueError: client 11 broke", 1) in rows and (11, None, 2) in rows
    assert pool.submitted[-1][1] == ((1, 11),) and sched.retries == 1 and sched.worker_restarts == 0


def test_client_failing_past_its_retries_is_dropped():
    pool = FakePool(behaviour=lambda widx, items, attempt: {c: "raise" for _, c in items if c == 12} or "ok")
    sched, got, dropped = _run(pool, _tasks([10, 11, 12]))
    assert dropped == [(2, 12)] and sched.dropped == [12]
    assert sorted(o.cid for o in got) == [10, 11]
    assert [r.attempt for r in sched.ledger if r.client == 12] == [1, 2]


def test_every_client_failing_drops_them_all():
    pool = FakePool(behaviour=lambda widx, items, attempt: {c: "raise" for _, c in items})
    sched, got, dropped = _run(pool, _tasks([10, 11, 12]), FailurePolicy(0, 5))
    assert got == [] and sorted(dropped) == [(0, 10), (1, 11), (2, 12)]
    assert all(r.failure for r in sched.ledger)


def test_deadline_returns_and_cancels_what_is_left():
    pool = FakePool(behaviour=lambda widx, items, attempt: "never" if items[0][1] != 10 else "ok")
    sched = TaskScheduler(pool, FailurePolicy(1, 5), rnd=1)
    got = []
    t0 = time.perf_counter()
    sched.run(_tasks([10, 11, 12]), lambda widx, task: pool.submit(widx, task.items), got.append,
              deadline=time.perf_counter() + 0.05)
    assert time.perf_counter() - t0 < 5
    assert [o.cid for o in got] == [10]
    assert sched.cancel_rest() == 2  # 11 and 12 were still running on the two workers
    assert pool.cancelled == 2


def test_reorder_window_holds_the_queue_back():
    pool = FakePool(size=4)
    started, done, ahead = [], [], []

    def call(widx, task):
        started.append(task.first)
        ahead.append(len(started) - len(done))
        return pool.submit(widx, task.items)

    sched = TaskScheduler(pool, FailurePolicy(1, 5), rnd=1)
    sched.run(_tasks([10, 11, 12, 13]), call, done.append, may_start=lambda task: task.first < len(done) + 1)
    assert started == [0, 1, 2, 3] and max(ahead) == 1  # four idle workers, yet one task ahead at most


def test_too_many_worker_losses_abort_the_run():
    pool = FakePool(behaviour=lambda widx, items, attempt: "lost")
    with pytest.raises(RunAborted, match=r"round 7: more than engine.max_worker_restarts=2"):
        _run(pool, _tasks([10]), FailurePolicy(max_client_retries=10, max_worker_restarts=2))
    assert pool.restarts == 2


def test_atomic_task_failure_replays_the_whole_task_on_its_worker():
    pool = FakePool(behaviour=lambda widx, items, attempt: {11: "raise"} if attempt == 1 and widx == 1 else "ok")
    tasks = [Task(((0, 10), (1, 11)), worker=1), Task(((2, 12),), worker=0)]
    sched, got, _ = _run(pool, tasks, atomic=True, record_success=False, label=" in split iteration 3")
    assert sorted(o.cid for o in got) == [10, 11, 12]
    assert pool.submitted[-1] == (1, ((0, 10), (1, 11)), True)  # pinned, whole, replayed
    assert [(r.client, r.attempt) for r in sched.ledger] == [(11, 1)]  # failures only
    assert sched.retries == 1


def test_atomic_worker_loss_does_not_charge_the_clients():
    pool = FakePool(behaviour=lambda widx, items, attempt: "lost" if attempt == 1 else "ok")
    sched, got, _ = _run(pool, [Task(((0, 10),), worker=0)], FailurePolicy(0, 5), atomic=True,
                         record_success=False, label=" in split iteration 1")
    assert [o.cid for o in got] == [10] and sched.attempts[10] == 0
    assert sched.ledger[0].failure.startswith("worker lost in split iteration 1: ")


def test_atomic_client_failing_past_its_retries_aborts_the_round():
    pool = FakePool(behaviour=lambda widx, items, attempt: {10: "raise"})
    with pytest.raises(RoundAborted, match=r"client 10 failed 2 times in split iteration 0 .*cannot drop"):
        _run(pool, [Task(((0, 10),), worker=0)], FailurePolicy(1, 5, can_drop=False), atomic=True,
             record_success=False, label=" in split iteration 0")


def test_dropped_fraction_over_the_tolerance_aborts_the_run():
    pool = FakePool(behaviour=lambda widx, items, attempt: {c: "raise" for _, c in items if c == 12} or "ok")
    sched, _, _ = _run(pool, _tasks([10, 11, 12]), FailurePolicy(0, 5, max_dropped_fraction=0.5))
    sched.check_drops(3)  # 1 of 3 <= 0.5: the round stands
    with pytest.raises(RunAborted, match=r"round 7: 1 of 3 clients .*max_dropped_fraction=0.2\); client 12: ValueError"):
        _run(FakePool(behaviour=pool.behaviour), _tasks([10, 11, 12]),
             FailurePolicy(0, 5, max_dropped_fraction=0.2))[0].check_drops(3)
    everyone = FakePool(behaviour=lambda widx, items, attempt: {c: "raise" for _, c in items})
    sched, _, _ = _run(everyone, _tasks([10, 11]), FailurePolicy(0, 5, max_dropped_fraction=1.0))
    with pytest.raises(RunAborted, match="2 of 2 clients"):
        sched.check_drops(2)  # nothing left to average: never a result


def test_a_configuration_error_is_fatal_at_once():
    class Fatal(FakePool):
        def result(self, h):
            outs = super().result(h)
            for o in outs:
                if o.cid == 11:
                    o.error, o.fatal, o.weights = "ConfigError: model has no feature tap 'nope'\n", True, None
            return outs

    pool = Fatal()
    with pytest.raises(RunAborted, match=r"client 11: ConfigError: model has no feature tap 'nope'"):
        _run(pool, _tasks([10, 11, 12]), FailurePolicy(max_client_retries=5, max_worker_restarts=5))
    assert sum(items == ((1, 11),) for _, items, _ in pool.submitted) == 1  # never retried
