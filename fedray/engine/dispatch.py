"""One task scheduler with one failure policy, used by both round programs.

A round program hands the scheduler :class:`Task` s (a list of clients for one worker call) and a
function that submits a task to a worker; the scheduler keeps the idle workers and the tasks in flight,
replaces a worker whose process died, retries or drops clients, writes one :class:`LedgerRow` per failed
attempt (and per success when asked), and hands every successful client outcome to the program.
What to do with a failure is decided in one place, :class:`FailurePolicy`, as a :class:`FailureDecision`
(retry, drop, accept the round's result, abort the round or the run). How a task's result and its worker's
death are taken in is one of three :class:`OutcomeStrategy` s, chosen per task:

- **Federated tasks** (``atomic=False``, :class:`IndependentClients`): a client that raises is retried alone; after
  ``engine.max_client_retries`` failed attempts it is dropped (the program's fold skips it). A lost
  worker counts as a failed attempt of each client of its task; the survivors are resubmitted together
  (multi-client groups keep their members).
- **Fold groups** (``Task.group``, ``engine.fold_group > 1``, :class:`FoldGroups`): the worker returns one partial sum for the
  task's clients, so a client that raises sends the whole group again (its members in sampled order);
  after ``engine.max_client_retries`` failed attempts it is dropped and the group runs once more without
  it (deterministic: the partial sum is over the surviving members, in sampled order).
- **Items that cannot be dropped** (``FailurePolicy(can_drop=False)`` on non-atomic tasks, e.g. evaluation
  shards) are retried like clients and abort the round after ``engine.max_client_retries`` failed attempts.
- **Split tasks** (``atomic=True``, :class:`PinnedReplay`; its policy never drops): a worker holds its clients' state for the whole round, so a failure
  resubmits the worker's whole task (pinned to that worker, flagged ``replay``). A client cannot be
  dropped half-way through a round: more than ``max_client_retries`` failures abort the round.
- A lost worker's slot is given back to the pool (``pool.replace``): the in-process pool replaces it in place;
  the Ray pool retires the slot and starts a replacement in the background, which joins the round when it is
  ready (:meth:`TaskScheduler._refill`). Meanwhile the round goes on with the workers left (the pool
  shrinks); tasks pinned to a retired slot (split) move to a live one and are replayed there. Only when no
  worker is left does the scheduler wait for a replacement, and when none can come the run aborts naming the
  lost workers. Each worker started after the pool's start counts as a restart (a replacement, or a new start
  of a replacement that died before it was ready); losing a worker with ``engine.max_worker_restarts``
  restarts already made in the round aborts the run, and past the limit a dead replacement is not started
  again.
- **Pipelining.** A worker may hold ``depth`` unpinned tasks at once (``pool.pipeline_depth``: 2 on Ray, 1
  in-process): while it trains one, the next waits in its actor's queue, so it starts the moment the last one
  ends instead of after the result's round trip through the coordinator (its transfer, the fold, the next
  submission). A new task goes to the worker holding the fewest. When a worker dies, its death is handled
  once (one replacement, one restart counted) and every task it held is taken back: one whose result came in
  before the death stands; of the others, the earliest submitted (the one it was running) is treated as above, the ones queued behind it go back to the queue unchanged,
  without a failed attempt or a ledger row. Pinned (split) tasks keep one per worker.
- A client error that is a configuration error (``outcome.fatal``) aborts the run at once: no retry fixes it.
- After a federated round, more dropped clients than ``engine.max_dropped_fraction`` of the sampled ones
  (default 0: any) abort the run, and so does a round in which every client was dropped
  (:meth:`TaskScheduler.check_drops`): a model averaged over what happened to survive is not a result.
"""

from __future__ import annotations

import abc
import enum
import heapq
import itertools
import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

from fedray.engine.outcomes import WorkerLost
from fedray.engine.round_report import LedgerRow

__all__ = ["ClientItem", "FailureDecision", "FailurePolicy", "GroupItem", "RoundAborted", "RunAborted", "SplitItem", "Task",
           "TaskScheduler", "live_workers"]


class FailureDecision(enum.Enum):
    RETRY = "retry"  # run the client (or its task) again
    DROP = "drop"  # give the client up for this round; the fold skips it
    ACCEPT = "accept"  # the round's result stands with what the failures left
    ABORT_ROUND = "abort_round"  # the round cannot produce a result
    ABORT_RUN = "abort_run"  # the run cannot go on


class RoundAborted(RuntimeError):
    """A round cannot produce a result (e.g. a split client failed more than its retries)."""


class RunAborted(RuntimeError):
    """The run cannot go on (e.g. more worker replacements in a round than allowed)."""


@dataclass(frozen=True)
class FailurePolicy:
    max_client_retries: int
    max_worker_restarts: int
    can_drop: bool = True  # False: a client failing past its retries aborts the round
    max_dropped_fraction: float = 1.0  # of a round's sampled clients (checked after the round)

    @classmethod
    def from_engine(cls, engine, *, can_drop: bool = True) -> FailurePolicy:
        return cls(int(engine.max_client_retries), int(engine.max_worker_restarts), can_drop,
                   float(getattr(engine, "max_dropped_fraction", 0.0)))

    def client_failed(self, attempts: int) -> FailureDecision:
        """A client has now failed ``attempts`` times in this round."""
        if attempts <= self.max_client_retries:
            return FailureDecision.RETRY
        return FailureDecision.DROP if self.can_drop else FailureDecision.ABORT_ROUND

    def round_dropped(self, dropped: int, sampled: int) -> FailureDecision:
        """``dropped`` of the round's ``sampled`` clients were dropped: can the round's result stand (ACCEPT)?"""
        if dropped and (dropped >= sampled or dropped > self.max_dropped_fraction * sampled):
            return FailureDecision.ABORT_RUN
        return FailureDecision.ACCEPT

    def worker_lost(self, restarts: int) -> FailureDecision:
        """A worker died; ``restarts`` workers were already replaced in this round."""
        return FailureDecision.ABORT_RUN if restarts >= self.max_worker_restarts else FailureDecision.RETRY


def live_workers(pool, rnd: int) -> list[int]:
    """At the start of round ``rnd``: the pool's live slots, after taking in the replacements that are ready;
    with none live, wait for one (``pool.await_worker``), and abort the run when none can come."""
    pool.poll()
    if not pool.slots and not pool.await_worker():
        raise RunAborted(f"round {rnd}: no client worker left: {pool.lost_summary()}")
    return pool.slots


class ClientItem(NamedTuple):
    """One client of a task: its position in the round's sampled order and its id (an evaluation shard: its
    index twice)."""

    pos: int
    cid: int


class GroupItem(NamedTuple):
    """One client of an ``engine.fold_group`` task, with its coefficient ``a_k`` in the round's weighted sum."""

    pos: int
    cid: int
    coefficient: float


class SplitItem(NamedTuple):
    """One client of a split task, with its share ``B_k`` of the round's batch."""

    pos: int
    cid: int
    batch: int


@dataclass(frozen=True)
class Task:
    """Clients for one worker call (:class:`ClientItem`, :class:`GroupItem` or :class:`SplitItem`: typed tuples,
    so a worker unpacks them as ``pos, cid[, a_k | B_k]``)."""

    items: tuple
    worker: int | None = None  # pinned to this worker (split: it holds these clients' state)
    replay: bool = False  # a resubmission after a failure (split: rebuild and replay the round so far)
    group: bool = False  # one partial sum for all items (engine.fold_group): a failure re-runs the group
    cost: float = 0.0  # estimated work (e.g. the clients' samples): of the tasks ready to start, the largest first

    @property
    def first(self) -> int:
        return int(self.items[0][0])


class TaskScheduler:
    """Runs tasks on ``pool`` for round ``rnd`` under ``policy``; keeps the round's ledger and counters.

    One scheduler serves a whole round (the split program calls :meth:`run` once per local iteration).
    ``depth``: tasks a worker holds at once (default ``pool.pipeline_depth``, else 1; always 1 when ``atomic``)."""

    def __init__(self, pool, policy: FailurePolicy, rnd: int, *, atomic: bool = False, record_success: bool = True,
                 faults=None, depth: int | None = None):
        if atomic:  # a client cannot be dropped half-way through a split round: the policy aborts instead
            policy = replace(policy, can_drop=False)
        self.pool, self.policy, self.rnd = pool, policy, int(rnd)
        self.faults = faults  # a FaultInjector (engine.fault_injection: coordinator_exit) or None
        self.atomic, self.record_success = atomic, record_success
        self.ledger: list[LedgerRow] = []
        self.attempts: dict[int, int] = defaultdict(int)  # failed attempts per client id
        self.retries = 0
        self.dropped: list[int] = []
        self.last_error: dict[int, str] = {}  # client id -> first line of its last error
        self.restarts0 = pool.restarts
        self.depth = 1 if atomic else max(1, int(depth if depth is not None else getattr(pool, "pipeline_depth", 1)))
        self._known: set[int] = set()  # every slot seen live in this round (retired ones stay in it)
        self._retired: set[int] = set()
        self._moved: dict[int, int] = {}  # pinned slot -> the live slot its tasks run on now (split)
        self._replay_due: set[int] = set()  # pinned slots whose clients' state was lost (split)
        self._pinned: set[int] = set()  # every slot a task was pinned to in this round
        self.receive_seconds = 0.0  # time spent fetching task results (Ray: from the object store)
        self._queue: list = []  # heap of (first position, sequence, task): not yet admitted by ``may_start``
        self._ready: list = []  # heap of (-cost, first position, sequence, task): admitted, waiting for a worker
        self._seq = itertools.count()
        self._inflight: dict = {}  # handle -> (worker, task, submission sequence)
        self._refill()

    @property
    def worker_restarts(self) -> int:
        return self.pool.restarts - self.restarts0

    def push(self, task: Task) -> None:
        heapq.heappush(self._queue, (task.first, next(self._seq), task))

    def run(self, tasks, call: Callable, on_outcome: Callable, *, on_drop: Callable | None = None,
            may_start: Callable | None = None, stop: Callable | None = None, deadline: float | None = None,
            label: str = "") -> None:
        """Run ``tasks`` (and their retries) until none is left, ``stop()`` is true, or ``deadline``
        (``time.perf_counter()`` value) passes. ``call(worker, task)`` submits a task and returns a pool
        handle; ``on_outcome(outcome)`` gets every successful client outcome; ``on_drop(position, cid)``
        every dropped client; ``may_start(task)`` can hold the head of the queue back (reorder window).
        ``label`` describes the work in ledger rows and errors (e.g. " in split iteration 3")."""
        self._label = label
        for t in tasks:
            self.push(t)
        while self._queue or self._ready or self._inflight:
            if stop is not None and stop():
                return
            self._refill()
            self._start(call, may_start)
            timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
            if (self._queue or self._ready) and not self._inflight and not self._free():  # no worker left
                if not self.pool.await_worker(self._may_restart(), timeout):
                    if deadline is not None and time.perf_counter() >= deadline:
                        return
                    raise RunAborted(f"round {self.rnd}: no client worker left{label}: {self.pool.lost_summary()}")
                continue
            beat = self.pool.heartbeat_interval  # a bounded wait: the busy workers' heartbeats are checked
            if beat is not None:
                timeout = beat if timeout is None else min(beat, timeout)
            ready = self.pool.wait(list(self._inflight), timeout=timeout)
            self.pool.check_heartbeats({entry[0] for entry in self._inflight.values()})
            if not ready and deadline is not None and time.perf_counter() >= deadline:
                return
            for h in ready:
                entry = self._inflight.pop(h, None)
                if entry is None:  # taken back when its worker's death was handled (_worker_lost)
                    continue
                widx, task, seq = entry
                t_get = time.perf_counter()
                try:
                    outs = self.pool.result(h)
                except WorkerLost as err:
                    self._worker_lost(widx, task, err, on_outcome, on_drop, label, seq)
                    continue
                self.receive_seconds += time.perf_counter() - t_get
                if self.faults is not None:  # mid-round: tasks dispatched, nothing of this one folded yet
                    self.faults.coordinator(self.rnd)
                self._strategy(task).take(self, widx, task, outs, on_outcome, on_drop, label)

    def cancel_rest(self) -> int:
        """Cancel what is still queued or running; returns the number of clients not finished."""
        n = sum(len(entry[1].items) for entry in self._inflight.values()) + \
            sum(len(entry[-1].items) for entry in [*self._queue, *self._ready])
        if self._inflight:
            self.pool.cancel(list(self._inflight))
        self._inflight.clear()
        self._queue.clear()
        self._ready.clear()
        return n

    def check_drops(self, sampled: int) -> None:
        """Abort the run when the round dropped more clients than the policy tolerates."""
        n = len(self.dropped)
        if self.policy.round_dropped(n, sampled) is FailureDecision.ABORT_RUN:
            first = self.dropped[0]
            raise RunAborted(
                f"round {self.rnd}: {n} of {sampled} clients failed more than engine.max_client_retries="
                f"{self.policy.max_client_retries} times and were dropped (engine.max_dropped_fraction="
                f"{self.policy.max_dropped_fraction:g}); client {first}: {self.last_error.get(first, 'worker lost')}")

    # ----------------------------------------------------------------------------------------------
    def _strategy(self, task: Task) -> OutcomeStrategy:
        """How ``task``'s result and its worker's death are taken in (module docstring)."""
        if self.atomic:
            return PINNED_REPLAY
        return FOLD_GROUP if task.group else INDEPENDENT

    def _may_restart(self) -> bool:
        return self.policy.worker_lost(self.worker_restarts) is FailureDecision.RETRY

    def _refill(self) -> None:
        """Replacements that became ready join the round's workers."""
        self.pool.poll(self._may_restart())
        self._known.update(self.pool.slots)

    def _held(self) -> dict[int, int]:
        """Tasks in flight per live worker (a dead worker's tasks were taken back when its death was handled)."""
        held = {w: 0 for w in self._known - self._retired}
        for w, _, _ in self._inflight.values():
            held[w] += 1
        return held

    def _free(self, held: dict[int, int] | None = None) -> list[int]:
        """The live workers that can take a task now (fewer than ``depth`` in flight), in slot order."""
        held = self._held() if held is None else held
        return [w for w in sorted(held) if held[w] < self.depth]

    def _owner(self, w: int, adopt: bool = True) -> int | None:
        """The live slot that runs the tasks pinned to slot ``w``: ``w`` itself, or (``w`` retired) the live slot
        its tasks moved to, chosen now if needed (the one with the fewest moved slots, then the lowest); None
        when no worker is live (or not ``adopt`` and none was chosen yet)."""
        live = self._known - self._retired
        seen = set()
        while w not in live and w not in seen:
            seen.add(w)
            if w not in self._moved or self._moved[w] in seen:
                if not live or not adopt:
                    return None
                load = {s: 0 for s in live}
                for target in self._moved.values():
                    if target in load:
                        load[target] += 1
                self._moved[w] = min(sorted(live), key=lambda s: (load[s], s))
            w = self._moved[w]
        return w if w in live else None

    def _start(self, call, may_start) -> None:
        """Admit queued tasks in sampled order while ``may_start`` lets them (it only ever admits more: the
        fold moves on), then give idle workers the admitted tasks, the largest ``cost`` first (longest tasks
        first keeps the round's last worker from finishing long after the others; the fold's order, hence
        the result, does not depend on it)."""
        while self._queue and (may_start is None or may_start(self._queue[0][2])):
            first, seq, task = heapq.heappop(self._queue)
            heapq.heappush(self._ready, (-float(task.cost), first, seq, task))
        held = []
        while self._ready:
            load = self._held()
            free = self._free(load)
            if not free:
                break
            entry = heapq.heappop(self._ready)
            task = entry[-1]
            if task.worker is not None:
                widx = self._owner(task.worker)
                if widx is None or widx not in free:
                    held.append(entry)
                    continue
                self._pinned.add(task.worker)
                if task.worker in self._replay_due:  # its clients' state died with the slot it ran on
                    self._replay_due.discard(task.worker)
                    task = replace(task, replay=True)
            else:
                widx = min(free, key=lambda w: load[w])  # the fewest tasks in flight, then the lowest slot
            self._inflight[call(widx, task)] = (widx, task, next(self._seq))
        for entry in held:
            heapq.heappush(self._ready, entry)

    def _fatal(self, out) -> None:
        if out.fatal:
            first, _, trace = out.error.partition("\n")
            why = ("the partition's data: a retry would read the same" if first.startswith("DataError")
                   else "an error of the client's code or configuration: no retry can fix it")
            raise RunAborted(f"round {self.rnd}: client {out.cid}: {first} ({why})\n{trace.rstrip()}")

    def _failure_row(self, cid: int, failure: str, *, worker: str, seconds: float = 0.0, attempt: int) -> None:
        self.last_error[int(cid)] = failure
        self.ledger.append(LedgerRow(client=int(cid), round=self.rnd, samples=0, loss=math.nan,
                                     seconds=float(seconds), worker=worker, failure=failure, attempt=int(attempt)))

    def _client_failed(self, pos: int, cid: int, on_drop) -> bool:
        """Count a failed attempt of a droppable client; True when it runs again."""
        self.attempts[cid] += 1
        decision = self.policy.client_failed(self.attempts[cid])
        if decision is FailureDecision.RETRY:
            self.retries += 1
            return True
        if decision is FailureDecision.ABORT_ROUND:
            raise RoundAborted(
                f"round {self.rnd}: item {cid}{getattr(self, '_label', '')} failed {self.attempts[cid]} times "
                f"(engine.max_client_retries={self.policy.max_client_retries}) and cannot be dropped. Last error: "
                f"{self.last_error.get(cid, 'worker lost')}")
        self.dropped.append(cid)
        if on_drop is not None:
            on_drop(pos, cid)
        return False

    def _worker_lost(self, widx: int, task: Task, err: WorkerLost, on_outcome, on_drop, label: str,
                     seq: int = 0) -> None:
        """Worker ``widx`` died. Its death is handled once: the tasks it still held (pipelining) are taken back
        at once. One that finished before the death (its result is in, not yet taken) stands and is taken now;
        of the others, the earliest submitted was the one running (an actor runs its tasks in order) and is
        charged as below; the rest never started and go back to the queue as they were, without a ledger row."""
        name = self.pool.name(widx)
        if self.policy.worker_lost(self.worker_restarts) is FailureDecision.ABORT_RUN:
            raise RunAborted(
                f"round {self.rnd}: more than engine.max_worker_restarts={self.policy.max_worker_restarts} worker "
                f"restarts; last error: {err}") from err
        held_here = {w for w in self._pinned if self._owner(w, adopt=False) == widx}  # state that lived on widx
        taken = [h for h, e in self._inflight.items() if e[0] == widx]
        done = set(self.pool.wait(taken, timeout=0)) if taken else set()
        held = [(seq, task)]
        for h in taken:
            _, queued, queued_seq = self._inflight.pop(h)
            try:
                if h not in done:
                    raise WorkerLost("not finished")
                outs = self.pool.result(h)
            except WorkerLost:
                held.append((queued_seq, queued))
                continue
            self._strategy(queued).take(self, widx, queued, outs, on_outcome, on_drop, label)
        held.sort(key=lambda st: st[0])
        if taken:
            self.pool.cancel([h for h in taken if h not in done])
        task = held[0][1]
        for _, queued in held[1:]:
            self.push(queued)
        if not self.pool.replace(widx):  # False: retired (Ray); True: replaced in place, the slot takes tasks again
            self._retired.add(widx)
        self._replay_due |= held_here
        for item in task.items:
            self._failure_row(item[1], f"worker lost{label}: {err}", worker=name,
                              attempt=self.attempts[int(item[1])] + 1)
        self._strategy(task).lost(self, widx, task, on_drop)


class OutcomeStrategy(abc.ABC):
    """How the scheduler takes in a task's result (:meth:`take`) and the death of the worker that ran it
    (:meth:`lost`, after the failure rows are written); every decision is the policy's."""

    @abc.abstractmethod
    def take(self, sched: TaskScheduler, widx: int, task: Task, result, on_outcome, on_drop, label: str) -> None:
        """Take in ``result``, the outcome of ``task`` run on worker ``widx``."""

    def lost(self, sched: TaskScheduler, widx: int, task: Task, on_drop) -> None:
        """Each client of the task is charged a failed attempt; those the policy retries run again as one task,
        so multi-client groups (and fold groups) keep their members."""
        again = tuple(item for item in task.items if sched._client_failed(int(item[0]), int(item[1]), on_drop))
        if again:
            sched.push(replace(task, items=again))

    @staticmethod
    def success_row(sched: TaskScheduler, out) -> None:
        if sched.record_success:
            sched.ledger.append(LedgerRow(client=int(out.cid), round=sched.rnd, samples=int(out.num_samples),
                                          loss=float(out.loss), seconds=float(out.seconds), worker=out.worker,
                                          failure=None, attempt=sched.attempts[out.cid] + 1))


class IndependentClients(OutcomeStrategy):
    """Federated tasks: every client's outcome on its own; a client that raises is retried alone, then dropped."""

    def take(self, sched, widx, task, result, on_outcome, on_drop, label) -> None:
        for out in result:
            if out.error is not None:
                sched._fatal(out)
                sched._failure_row(out.cid, out.error.splitlines()[0], worker=out.worker, seconds=out.seconds,
                                   attempt=sched.attempts[out.cid] + 1)
                if sched._client_failed(out.pos, out.cid, on_drop):
                    sched.push(Task((ClientItem(out.pos, out.cid),)))
                continue
            self.success_row(sched, out)
            on_outcome(out)


class FoldGroups(OutcomeStrategy):
    """``engine.fold_group`` tasks: one partial sum (:class:`~fedray.engine.outcomes.GroupOutcome`) when every
    member succeeded, else the group runs again, without the members the policy drops now."""

    def take(self, sched, widx, task, result, on_outcome, on_drop, label) -> None:
        bad = [o for o in result.members if o.error is not None]
        if not bad:
            for o in result.members:
                self.success_row(sched, o)
            on_outcome(result)
            return
        failed = set()
        for o in bad:
            sched._fatal(o)
            sched._failure_row(o.cid, o.error.splitlines()[0], worker=o.worker, seconds=o.seconds,
                               attempt=sched.attempts[o.cid] + 1)
            failed.add(int(o.cid))
        again = tuple(it for it in task.items
                      if int(it[1]) not in failed or sched._client_failed(int(it[0]), int(it[1]), on_drop))
        if again:
            sched.push(replace(task, items=again))


class PinnedReplay(OutcomeStrategy):
    """Split tasks (``atomic``): the worker holds its clients' state for the round, so any failure replays its
    whole task, pinned to it; past its retries a client aborts the round (the policy cannot drop it)."""

    def take(self, sched, widx, task, result, on_outcome, on_drop, label) -> None:
        bad = [o for o in result if o.error is not None]
        if not bad:
            for o in result:
                on_outcome(o)
            return
        for o in bad:
            sched._fatal(o)
            sched.attempts[o.cid] += 1
            n = sched.attempts[o.cid]
            sched._failure_row(o.cid, o.error.splitlines()[0], worker=o.worker, seconds=o.seconds, attempt=n)
            if sched.policy.client_failed(n) is FailureDecision.ABORT_ROUND:
                raise RoundAborted(
                    f"round {sched.rnd}: client {o.cid} failed {n} times{label} "
                    f"(engine.max_client_retries={sched.policy.max_client_retries}); a split round cannot drop a "
                    f"client mid-round. Last error: {o.error}")
        self.lost(sched, widx, task, on_drop)

    def lost(self, sched, widx, task, on_drop) -> None:
        """The worker's clients are rebuilt and replayed together; no client is charged for a lost worker."""
        sched.retries += 1
        sched.push(replace(task, worker=widx if task.worker is None else task.worker, replay=True))


INDEPENDENT, FOLD_GROUP, PINNED_REPLAY = IndependentClients(), FoldGroups(), PinnedReplay()
