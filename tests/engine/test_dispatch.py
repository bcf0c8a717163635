"""The task scheduler and its failure policy (fedray.engine.dispatch) on a fake pool."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pytest

from fedray.engine.dispatch import (
    FailureDecision,
    FailurePolicy,
    RoundAborted,
    RunAborted,
    Task,
    TaskScheduler,
    live_workers,
)
from fedray.engine.outcomes import ClientOutcome, WorkerLost
from fedray.engine.pool import PoolBase


@dataclass(eq=False)
class Handle:
    n: int
    widx: int
    items: tuple
    what: object


class FakePool(PoolBase):
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
        return True  # in place, like the in-process pool

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


def test_the_largest_admitted_task_starts_first():
    """Longest first: with every task admitted, idle workers take them by decreasing cost (ties: sampled
    order); the outcomes still reach the program, whatever the order, with their sampled positions."""
    pool = FakePool(size=2)
    costs = [5, 40, 5, 90, 12]
    tasks = [Task(((p, 10 + p),), cost=c) for p, c in enumerate(costs)]
    got = []
    TaskScheduler(pool, FailurePolicy(1, 5), rnd=1).run(tasks, lambda widx, task: pool.submit(widx, task.items),
                                                       got.append)
    assert [items[0][0] for _, items, _ in pool.submitted] == [3, 1, 4, 0, 2]
    assert sorted(o.pos for o in got) == [0, 1, 2, 3, 4]


def test_longest_first_never_reaches_past_the_reorder_window():
    """The window admits tasks in sampled order; the largest task outside it waits (it does not block the
    admitted ones), and it starts first once the fold lets it in."""
    pool = FakePool(size=1)
    done = []
    costs = [1, 2, 3, 100, 4]
    tasks = [Task(((p, 10 + p),), cost=c) for p, c in enumerate(costs)]
    TaskScheduler(pool, FailurePolicy(1, 5), rnd=1).run(
        tasks, lambda widx, task: pool.submit(widx, task.items), done.append,
        may_start=lambda task: task.first < min({0, 1, 2, 3, 4, 5} - {o.pos for o in done}) + 2)  # fold.next + 2
    assert [items[0][0] for _, items, _ in pool.submitted] == [1, 0, 3, 2, 4]


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


# ------------------------------------------------------------------ a pool that shrinks and grows (like RayPool)
class ShrinkingPool(FakePool):
    """Like the Ray pool: a lost worker's slot is retired for good; its replacement gets a new slot and is ready
    after ``start_polls`` polls (None: never, as with no spare capacity in the cluster)."""

    def __init__(self, size=2, behaviour=None, start_polls=None):
        super().__init__(size, behaviour)
        self.live, self.pending, self.next, self.start_polls, self.lost = list(range(size)), {}, size, start_polls, []

    @property
    def size(self):
        return len(self.live)

    @size.setter
    def size(self, n):  # FakePool.__init__ sets it
        pass

    @property
    def slots(self):
        return sorted(self.live)

    def replace(self, widx):
        assert widx in self.live, f"a retired slot {widx} was reported lost again"
        self.restarts += 1
        self.replaced.append(widx)
        self.live.remove(widx)
        self.lost.append(f"w{widx}")
        if self.start_polls is not None:
            self.pending[self.next] = self.start_polls
        self.next += 1
        return False

    def submit(self, widx, items, replay=False):
        assert widx in self.live, f"submitted to slot {widx}, which is not live ({self.live})"
        return super().submit(widx, items, replay)

    def poll(self, respawn=True):
        for s in list(self.pending):
            self.pending[s] -= 1
            if self.pending[s] <= 0:
                del self.pending[s]
                self.live.append(s)

    def await_worker(self, respawn=True, timeout=None):
        while self.pending and not self.live:
            self.poll(respawn)
        return bool(self.live)

    def lost_summary(self):
        return "workers lost: " + ", ".join(self.lost)


def _lost_once(slot):
    return lambda widx, items, attempt: "lost" if widx == slot and attempt == 1 else "ok"


def test_a_lost_worker_without_spare_capacity_shrinks_the_pool_and_the_round_finishes():
    pool = ShrinkingPool(size=3, behaviour=_lost_once(1))
    sched, got, dropped = _run(pool, _tasks([10, 11, 12, 13, 14, 15]))
    assert sorted(o.cid for o in got) == [10, 11, 12, 13, 14, 15] and dropped == []
    assert pool.slots == [0, 2] and sched.worker_restarts == 1
    lost_at = next(i for i, (w, _, _) in enumerate(pool.submitted) if w == 1)
    assert all(w != 1 for w, _, _ in pool.submitted[lost_at + 1:])  # never again to the retired slot
    (row,) = [r for r in sched.ledger if r.failure]
    assert row.failure.startswith("worker lost: ") and row.worker == "w1" and row.attempt == 1


def test_a_replacement_joins_the_round_when_it_is_ready():
    pool = ShrinkingPool(size=2, behaviour=_lost_once(0), start_polls=2)
    sched, got, _ = _run(pool, _tasks(list(range(10, 20))))
    assert sorted(o.cid for o in got) == list(range(10, 20))
    assert pool.slots == [1, 2] and any(w == 2 for w, _, _ in pool.submitted)  # the new slot took work


def test_no_worker_left_aborts_naming_the_lost_workers():
    pool = ShrinkingPool(size=2, behaviour=lambda widx, items, attempt: "lost")
    with pytest.raises(RunAborted, match=r"round 7: no client worker left: workers lost: w\d, w\d"):
        _run(pool, _tasks([10, 11, 12]), FailurePolicy(max_client_retries=5, max_worker_restarts=5))
    assert pool.slots == []


def test_no_worker_left_waits_for_a_replacement_that_can_start():
    pool = ShrinkingPool(size=1, behaviour=_lost_once(0), start_polls=3)
    sched, got, _ = _run(pool, _tasks([10, 11]))
    assert sorted(o.cid for o in got) == [10, 11] and pool.slots == [1]


def test_pinned_tasks_of_a_retired_worker_move_to_a_live_one_and_replay():
    """Split: worker 1 is lost with no replacement; its task is replayed on worker 0, and later tasks pinned to
    worker 1 run on worker 0 too (which now holds those clients' state), without a further replay."""
    pool = ShrinkingPool(size=2, behaviour=_lost_once(1))
    tasks = [Task(((0, 10),), worker=0), Task(((1, 11),), worker=1)]
    sched, got, _ = _run(pool, tasks, atomic=True, record_success=False)
    assert sorted(o.cid for o in got) == [10, 11]
    assert pool.submitted[-1] == (0, ((1, 11),), True)  # moved to the live worker, replayed
    n = len(pool.submitted)
    sched.run([Task(((0, 10),), worker=0), Task(((1, 11),), worker=1)],
              lambda widx, task: pool.submit(widx, task.items, task.replay), got.append)  # the next iteration
    assert sorted(pool.submitted[n:]) == [(0, ((0, 10),), False), (0, ((1, 11),), False)]


def test_every_client_state_on_a_lost_worker_is_replayed_on_its_new_worker():
    """Worker 0 ran its own task and (moved there) worker 1's; when it dies too, both tasks of the next
    iteration run on the replacement as replays (their state died with worker 0)."""
    pool = ShrinkingPool(size=2, behaviour=_lost_once(1), start_polls=1)
    pool.start_polls = None  # worker 1's loss brings no replacement
    sched, got, _ = _run(pool, [Task(((0, 10),), worker=0), Task(((1, 11),), worker=1)], atomic=True,
                         record_success=False)
    pool.start_polls, pool.behaviour = 1, lambda widx, items, attempt: "lost" if widx == 0 else "ok"
    n = len(pool.submitted)
    sched.run([Task(((0, 10),), worker=0), Task(((1, 11),), worker=1)],
              lambda widx, task: pool.submit(widx, task.items, task.replay), got.append)
    later = [s for s in pool.submitted[n:] if s[0] != 0]
    assert pool.slots == [3] and sorted(later) == [(3, ((0, 10),), True), (3, ((1, 11),), True)]


def test_a_round_starts_with_the_replacements_that_are_ready_or_fails_with_none():
    pool = ShrinkingPool(size=2, start_polls=1)
    pool.replace(0)
    assert live_workers(pool, 3) == [1, 2]  # the replacement was ready: it takes part in the round
    pool.start_polls = None
    pool.replace(1)
    pool.replace(2)
    with pytest.raises(RunAborted, match=r"round 4: no client worker left: workers lost: w0, w1, w2"):
        live_workers(pool, 4)


# ------------------------------------------------------------------ pipelining: two tasks per worker (like RayPool)
class _DiesWhole:
    """A worker that dies takes every task it holds with it (the tasks queued behind the one that failed);
    ``reverse``: ``wait`` reports the latest finished task first (the scheduler must not rely on the order);
    ``batch``: it reports every task at once (a task taken back with its dead worker is among them)."""

    pipeline_depth = 2
    reverse = batch = False

    def submit(self, widx, items, replay=False):
        h = super().submit(widx, items, replay)
        h.life = (widx, self.restarts)
        self.held = getattr(self, "held", {})
        self.held[widx] = self.held.get(widx, 0) + 1
        self.max_held = max(getattr(self, "max_held", 0), self.held[widx])
        if isinstance(h.what, str) and h.what == "lost":
            self.dead = getattr(self, "dead", set()) | {h.life}
        return h

    def wait(self, handles, timeout=None):  # one finished task, or (batch) like Ray's: every one finished at once
        handles = handles[::-1] if self.reverse else list(handles)
        return handles if self.batch else handles[:1]

    def result(self, h):
        self.held[h.widx] -= 1
        if h.life in getattr(self, "dead", set()):
            raise WorkerLost(f"w{h.widx} died")
        return super().result(h)

    def cancel(self, handles):
        super().cancel(handles)
        for h in handles:
            self.held[h.widx] -= 1


class PipelinedPool(_DiesWhole, FakePool):
    pass


class PipelinedShrinkingPool(_DiesWhole, ShrinkingPool):
    pass


def test_pipelined_workers_take_a_second_task_before_the_first_returns():
    """With depth 2, four tasks are out before any result comes back (two per worker), a new task goes to the
    worker holding the fewest (then the lowest slot), and the largest-first order still holds."""
    pool = PipelinedPool(size=2)
    costs = [5, 40, 5, 90, 12]
    tasks = [Task(((p, 10 + p),), cost=c) for p, c in enumerate(costs)]
    got, returned_at_submit = [], []

    def call(widx, task):
        returned_at_submit.append(len(got))
        return pool.submit(widx, task.items)

    sched = TaskScheduler(pool, FailurePolicy(1, 5), rnd=1)
    assert sched.depth == 2
    sched.run(tasks, call, got.append)
    assert [(w, items[0][0]) for w, items, _ in pool.submitted] == [(0, 3), (1, 1), (0, 4), (1, 0), (0, 2)]
    assert returned_at_submit == [0, 0, 0, 0, 1] and pool.max_held == 2
    assert sorted(o.pos for o in got) == [0, 1, 2, 3, 4]
    assert TaskScheduler(pool, FailurePolicy(1, 5), rnd=1, atomic=True).depth == 1  # pinned: one at a time


@pytest.mark.parametrize("reverse", [False, True], ids=["running-task-reports-first", "queued-task-reports-first"])
def test_a_worker_dying_with_two_tasks_is_replaced_once_and_only_the_running_task_is_charged(reverse):
    """Worker 0 dies running client 10's task, with client 12's queued behind it: one replacement, one restart
    counted (max_worker_restarts=1 is not exceeded by the second task's report), one failed attempt and one
    ledger row for client 10 only; client 12, which never started, runs later as its first attempt. The same
    when the queued task's failure is reported first."""
    pool = PipelinedPool(size=2, behaviour=lambda widx, items, attempt: "lost" if items[0][1] == 10 and attempt == 1
                         else "ok")  # client 10's first task (worker 0); client 12 waits behind it
    pool.reverse = pool.batch = reverse
    sched, got, dropped = _run(pool, _tasks([10, 11, 12, 13, 14]), FailurePolicy(max_client_retries=0,
                                                                                 max_worker_restarts=1))
    assert [items[0][1] for w, items, _ in pool.submitted[:4]] == [10, 11, 12, 13] and pool.submitted[2][0] == 0
    assert dropped == [(0, 10)] and sorted(o.cid for o in got) == [11, 12, 13, 14]
    assert pool.replaced == [0] and sched.worker_restarts == 1 and sched.retries == 0
    (row,) = [r for r in sched.ledger if r.failure]
    assert row.client == 10 and row.failure.startswith("worker lost: ") and row.attempt == 1
    assert {r.client: r.attempt for r in sched.ledger if r.failure is None}[12] == 1


def test_a_task_that_finished_before_its_worker_died_stands_and_the_running_one_is_charged():
    """Worker 0 finished client 10's task (its result is in, not yet taken) and then died running client 12's,
    queued behind it; the death is seen first. Client 10's result stands (no failed attempt, no ledger failure);
    client 12, the one running, is charged (the chaos runs once charged client 10 and re-ran it instead)."""

    class FinishedFirst(PipelinedPool):
        def result(self, h):  # only the task running at the death is lost
            self.held[h.widx] -= 1
            if isinstance(h.what, str) and h.what == "lost":
                raise WorkerLost(f"w{h.widx} died")
            return FakePool.result(self, h)

    pool = FinishedFirst(size=2, behaviour=lambda widx, items, attempt: "lost" if items[0][1] == 12 and attempt == 1
                         else "ok")
    pool.reverse = pool.batch = True  # client 12's loss is reported before client 10's result is taken
    sched, got, dropped = _run(pool, _tasks([10, 11, 12, 13, 14]), FailurePolicy(max_client_retries=0,
                                                                                 max_worker_restarts=1))
    assert [items[0][1] for w, items, _ in pool.submitted[:3]] == [10, 11, 12] and pool.submitted[2][0] == 0
    assert dropped == [(2, 12)] and sorted(o.cid for o in got) == [10, 11, 13, 14]
    (row,) = [r for r in sched.ledger if r.failure]
    assert row.client == 12 and row.failure.startswith("worker lost: ")
    assert [items[0][1] for w, items, _ in pool.submitted].count(10) == 1  # client 10 never ran again


def test_a_pipelined_worker_lost_for_good_is_retired_once():
    """Like Ray: the dead worker's slot is retired once (ShrinkingPool asserts it is not reported lost again),
    its queued task moves to the worker left, and only the running task's client has a failed attempt."""
    pool = PipelinedShrinkingPool(size=2, behaviour=_lost_once(1))
    sched, got, _ = _run(pool, _tasks([10, 11, 12, 13, 14, 15]), FailurePolicy(max_client_retries=1,
                                                                               max_worker_restarts=1))
    assert sorted(o.cid for o in got) == [10, 11, 12, 13, 14, 15]
    assert pool.replaced == [1] and pool.slots == [0] and sched.worker_restarts == 1
    assert [r.client for r in sched.ledger if r.failure] == [11]
    assert all(w == 0 for w, _, _ in pool.submitted[4:])
