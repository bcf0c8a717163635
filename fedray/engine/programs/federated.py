"""The federated round program: broadcast -> local updates on the workers -> ordered fold -> server step.

One round: sample clients (:mod:`fedray.engine.sampling`); put the broadcast weights and the algorithm's
payload into the object store once; cut the sampled clients into tasks (:meth:`FederatedProgram.chunk_size`)
and run them on the workers through the :class:`~fedray.engine.dispatch.TaskScheduler`; fold the client
models in sampled order (:class:`~fedray.engine.fold.OrderedFold`); then the server optimizer's step and
the algorithm's ``after_aggregate``. Dispatch never runs more than ``engine.reorder_window`` clients ahead
of the fold, so the coordinator holds a bounded number of updates whatever the clients per round.
Straggler handling: with ``engine.over_selection`` or ``engine.round_deadline_s`` the first clients to
finish (up to ``train.clients_per_round``) are kept and folded in sampled order.
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedray.config import round_lr
from fedray.engine.dispatch import ClientItem, FailurePolicy, Task, TaskScheduler, live_workers
from fedray.engine.fold import OrderedFold
from fedray.engine.outcomes import ClientOutcome
from fedray.engine.round_report import (
    ByteCounts,
    ClientTally,
    RoundReport,
    RoundResult,
    TrainedClients,
    arrays_nbytes,
)
from fedray.engine.programs.fold_group import train_groups
from fedray.engine.sampling import sample_clients

__all__ = ["FederatedProgram"]

# Default budget for client updates held by the coordinator at once (default chunk size; see chunk_size).
_HELD_UPDATES_BYTES = 256 << 20
# Tasks per worker and round by default in straggler mode (FederatedProgram.chunk_size).
_STRAGGLER_TASKS_PER_WORKER = 32
# A task shorter than this (its clients' seconds as the last round measured them) pays more in Ray's per-task cost
# (submit, schedule, return: a few ms on 2 cores) than it gains in balance: the default chunk grows to reach it.
_MIN_TASK_SECONDS = 0.05


class FederatedProgram:
    def __init__(self, *, cfg, algorithm, server_opt, pool, sizes, num_params: int, faults=None, check_clients=None,
                 **_unused):
        self.cfg, self.algorithm, self.server_opt, self.pool = cfg, algorithm, server_opt, pool
        self.faults = faults
        self.sizes = sizes  # a view of the mapped client index: check_clients(sampled, where) before a round counts
        self.check_clients = check_clients
        self.num_params = int(num_params)
        self.client_seconds: float | None = None  # a client's mean seconds in the last round (chunk_size)

    def held_updates(self) -> int:
        """How many client updates fit the coordinator's default budget for updates held at once (256 MB)."""
        return max(1, _HELD_UPDATES_BYTES // max(1, 4 * self.num_params))

    def reorder_window(self, unit: int) -> int:
        """Default dispatch window, in tasks of ``unit`` updates each: twice the workers' tasks, widened to
        what the held-updates budget allows beside the tasks returning, so that the longest-first order
        (:meth:`~fedray.engine.dispatch.TaskScheduler.run`) sees a whole round of a small model."""
        workers = max(1, self.pool.size)
        return max(2 * workers, self.held_updates() // max(1, unit) - workers)

    def samples(self, sampled: list[int], positions) -> float:
        """The training samples of the sampled clients at ``positions``: a task's ``cost`` (longest first)."""
        return float(sum(int(self.sizes[sampled[p]]) for p in positions))

    def chunk_size(self, k: int, stragglers: bool = False) -> int:
        """Clients per task: ``engine.chunk_size``, or about 4 tasks per worker and round, capped so that
        the updates held at once (reorder window ~ 2 x workers x chunk, plus the tasks returning) stay
        within 256 MB; with ``engine.multi_client: m``, whole groups of m consecutive sampled clients.
        ``stragglers`` (``engine.over_selection`` / ``engine.round_deadline_s``): at least
        ``_STRAGGLER_TASKS_PER_WORKER`` tasks per worker, since a task's clients count as finished only when the
        whole task has (at 10,000 clients per round and 2 workers, tasks of 1,250 clients made a deadline drop
        whole tasks of finished clients and over-selection train every sampled client).

        Outside straggler mode, tasks that the last round's clients say would be shorter than
        ``_MIN_TASK_SECONDS`` grow towards it, down to one task per worker: at 100 clients of 0.4 ms per round on
        2 workers, 8 tasks of 13 clients spent more in Ray's per-task cost than in training (one task per worker:
        1.16x the client updates/s, docs/scaling.md). The chunks never change the bits (the fold is in sampled
        order), only which worker trains which client."""
        e = self.cfg.engine
        if e.chunk_size:
            chunk = int(e.chunk_size)
        else:
            held = self.held_updates()
            workers = max(1, self.pool.size)
            cap = max(1, held // (3 * workers))
            per_worker = _STRAGGLER_TASKS_PER_WORKER if stragglers else 4
            chunk = max(1, min(int(math.ceil(k / (per_worker * workers))), cap))
            spc = self.client_seconds
            if not stragglers and spc and chunk * spc < _MIN_TASK_SECONDS:
                longer = min(int(math.ceil(_MIN_TASK_SECONDS / spc)), int(math.ceil(k / workers)), cap)
                chunk = max(chunk, longer)
        m = int(e.multi_client or 1)
        if m > 1:  # whole groups of m consecutive sampled clients per task (fedray.engine.client.grouped)
            chunk = (int(math.ceil(chunk / m)) if e.chunk_size else max(1, chunk // m)) * m
        return chunk

    def run_round(self, rnd: int, weights: np.ndarray, algo_state: dict) -> RoundResult:
        cfg, algo, opt = self.cfg, self.algorithm, self.server_opt
        secs: dict[str, float] = {}
        t0 = time.perf_counter()
        live_workers(self.pool, rnd)  # replacements started since the last round join (chunk sizes use the count)
        e = cfg.engine
        sampled = sample_clients(self.sizes, cfg.train.clients_per_round, cfg.seed, rnd, e.over_selection)
        secs["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        bw = opt.broadcast_weights(weights)
        payload = dict(algo.broadcast(rnd, bw, algo_state))
        hints = algo.client_hints().merge(opt.client_hints())
        w_ref, p_ref = self.pool.put(bw), self.pool.put(payload)
        secs["broadcast"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        if int(e.fold_group) > 1:  # partial sums on the workers (fedray.engine.programs.fold_group)
            agg = train_groups(self, rnd, sampled, w_ref, p_ref, hints)
        else:
            agg = self.train(rnd, sampled, w_ref, p_ref, hints)
        secs["train"] = time.perf_counter() - t0 - agg.fold_seconds

        t0 = time.perf_counter()
        new, state = weights, algo_state
        if agg.avg is not None:
            new = opt.step(weights, agg.avg)
            new, state = algo.after_aggregate(rnd, new, agg.tally.extras, algo_state, broadcast=bw)
            new = np.ascontiguousarray(new, dtype=np.float32)
        secs["aggregate"] = time.perf_counter() - t0 + agg.fold_seconds

        sent = int(bw.nbytes) * len(sampled)
        tally = agg.tally
        report = RoundReport(
            round=rnd, num_clients=tally.clients, num_samples=tally.samples, loss=tally.loss, dropped=agg.dropped,
            retries=agg.retries, worker_restarts=agg.worker_restarts, stragglers_cancelled=agg.cancelled,
            receive_seconds=agg.receive_seconds, lr=round_lr(cfg.train, rnd),
            bytes=ByteCounts(broadcast=sent, upload=int(bw.nbytes) * (tally.clients if agg.uploads is None else agg.uploads),
                             signals_broadcast=arrays_nbytes(payload) * len(sampled), signals_upload=tally.upload_signals),
            seconds=secs, ledger=agg.ledger)
        report.add_extra(algo.round_metrics(rnd, state, len(sampled)), f"algorithm {algo.name!r}'s round_metrics")
        if self.check_clients is not None:  # the sizes that sampled and weighed the clients: unchanged on disk
            self.check_clients(sampled, f"round {rnd}'s clients")
        return RoundResult(weights=new, algo_state=state, report=report)

    # -------------------------------------------------------------------------------------------------
    def train(self, rnd: int, sampled: list[int], w_ref, p_ref, hints) -> TrainedClients:
        """Run every sampled client once (with retries) and fold the results in sampled order."""
        e = self.cfg.engine
        collect_all = e.over_selection > 0 or e.round_deadline_s is not None
        target = min(len(sampled), int(self.cfg.train.clients_per_round))
        k = len(sampled)
        chunk = self.chunk_size(k, stragglers=collect_all)
        window = int(e.reorder_window or self.reorder_window(chunk) * chunk)
        client_w = [self.algorithm.client_weight(int(self.sizes[c])) for c in sampled]
        fold, tally = OrderedFold(client_w), ClientTally()
        timing = {"fold": 0.0}
        finished: dict[int, ClientOutcome] = {}  # straggler mode: outcomes by position, folded after the round

        def folded(pairs) -> None:
            for _, out in pairs:
                tally.add(out)

        def on_outcome(out) -> None:
            if collect_all:
                finished[out.pos] = out
                return
            t = time.perf_counter()
            pairs = fold.add(out.pos, out.weights, out)
            timing["fold"] += time.perf_counter() - t
            folded(pairs)

        def on_drop(pos, cid) -> None:
            if not collect_all:  # a drop can unblock results buffered behind it
                folded(fold.skip(pos))

        sched = TaskScheduler(self.pool, FailurePolicy.from_engine(e), rnd, faults=self.faults)
        # longest first, except when the first to finish are kept (stragglers): then in sampled order
        tasks = [Task(tuple(ClientItem(p, sampled[p]) for p in ps), cost=0.0 if collect_all else self.samples(sampled, ps))
                 for ps in (range(i, min(i + chunk, k)) for i in range(0, k, chunk))]
        deadline = time.perf_counter() + e.round_deadline_s if e.round_deadline_s is not None else None
        sched.run(tasks, lambda widx, task: self.pool.submit(widx, "run_clients", rnd, w_ref, p_ref, list(task.items),
                                                              hints),
                  on_outcome, on_drop=on_drop, deadline=deadline,
                  may_start=None if collect_all else (lambda task: task.first < fold.next + window),
                  stop=(lambda: len(finished) >= target) if collect_all else None)
        done = [row.seconds for row in sched.ledger if row.failure is None and row.seconds > 0]
        if done:  # the next round's chunks (chunk_size)
            self.client_seconds = sum(done) / len(done)
        # stragglers: clients still running (cancelled) or never started when the round closed
        cancelled = sched.cancel_rest()
        sched.check_drops(k)
        if collect_all:
            fold, cancelled = self._keep_first(sampled, client_w, sched, finished, target, cancelled)
            for p in range(k):
                out = finished.get(p)
                t = time.perf_counter()
                pairs = fold.add(p, out.weights, out) if out is not None else fold.skip(p)
                timing["fold"] += time.perf_counter() - t
                folded(pairs)
        return TrainedClients(avg=fold.result(), tally=tally, fold_seconds=timing["fold"], dropped=sched.dropped,
                              retries=sched.retries, worker_restarts=sched.worker_restarts, ledger=sched.ledger,
                              receive_seconds=sched.receive_seconds, cancelled=cancelled)

    @staticmethod
    def _keep_first(sampled, client_w, sched, finished: dict, target: int, cancelled: int):
        """Straggler mode: keep the first ``target`` clients to finish (completion order, as recorded in the
        ledger); the rest count as stragglers. Returns the fold over the kept ones and the straggler count."""
        pos_of = {c: p for p, c in enumerate(sampled)}
        done = [pos_of[row.client] for row in sched.ledger if row.failure is None]
        keep = set(done[:target])
        cancelled += len(done) - len(keep)
        for p in list(finished):
            if p not in keep:
                del finished[p]
        total = float(sum(client_w[p] for p in keep)) or 1.0
        return OrderedFold(client_w, total=total), cancelled
