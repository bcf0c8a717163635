"""The split round program (SCALA, SplitFed V1/V2/V3, SFL with local losses): the coordinator's side.

The algorithms (what the server does with the activations) live in :mod:`fedray.algorithms.split`; the
workers' side in :mod:`fedray.engine.client.split`; what both sides share in
:mod:`fedray.engine.split_layout`. One round (``docs/engine.md`` has the whole story):

1. **Sample and size.** Client k gets the batch size ``B_k`` of SCALA Eq. 3 and is pinned to a worker for
   the whole round (greedy balance on ``B_k``); each worker gets one task per local iteration holding all
   its clients, and all workers' tasks of an iteration are in flight at once.
2. **Iterate.** The uploads are concatenated **in sampled order**, ``algorithm.server_iteration`` runs on
   the server-side model (:class:`~fedray.engine.programs.split_server.SplitServer`) and each client gets
   its gradient rows with the next task; task ``T`` returns the trained client-side vectors. With
   ``shape.sequential_clients`` (SplitFedV2's ``order: client``) the loop runs once per client instead,
   in the server's seeded order of the round.
3. **Aggregate.** Client-side vectors are folded in sampled order (:class:`~fedray.engine.fold.OrderedFold`);
   the server side becomes the server model or the average of the per-client copies; the server-side
   optimizer state and any auxiliary client head live in the algorithm state (checkpointed).

**Faults.** The program keeps the gradient rows of every iteration of the round; the scheduler
(:mod:`fedray.engine.dispatch`, atomic tasks) resubmits a failed worker's task with that history and the
worker replays the round so far, so the result equals an undisturbed run bit for bit. A client failing
more than ``engine.max_client_retries`` times aborts the round (a split round cannot drop a client).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np
import torch

from fedray.algorithms.split import SplitBatch
from fedray.config import lr_factor, round_lr
from fedray.core.seeds import SERVER_STREAM, seed_of
from fedray.engine.dispatch import FailurePolicy, SplitItem, Task, TaskScheduler, live_workers
from fedray.engine.fold import OrderedFold
from fedray.engine.outcomes import SplitOutcome
from fedray.engine.programs.split_server import SplitServer
from fedray.engine.round_report import ByteCounts, LedgerRow, RoundReport, RoundResult, arrays_nbytes
from fedray.engine.sampling import sample_clients
from fedray.engine.split_layout import SplitPlan, assign_clients, batch_sizes, params_vector

__all__ = ["SplitProgram"]


class _Round:
    """What one split round accumulates while its iterations run."""

    def __init__(self, rnd, sampled, items_of, init_ref, p_ref, sched):
        self.rnd, self.sampled, self.items_of = rnd, sampled, items_of
        self.init_ref, self.p_ref, self.sched = init_ref, p_ref, sched
        self.nbytes = {"activations": 0, "labels": 0, "gradients": 0}
        self.losses: list[float] = []
        self.metrics: dict[str, list[float]] = defaultdict(list)
        self.client_losses: dict[int, list[float]] = defaultdict(list)
        self.timing = {"clients": 0.0, "server": 0.0}
        self.final: dict[int, SplitOutcome] = {}


class SplitProgram:
    def __init__(self, *, cfg, algorithm, pool, sizes, model, meta, class_counts, device, faults=None,
                 check_clients=None, **_unused):
        self.cfg, self.algorithm, self.pool, self.sizes = cfg, algorithm, pool, sizes
        self.faults = faults
        self.check_clients = check_clients  # as FederatedProgram's: sizes are a view of the mapped client index
        self.shape = algorithm.shape
        self.plan = SplitPlan.build(algorithm, model, meta)  # the workers' runtime builds the same plan
        self.point, self.layout = self.plan.point, self.plan.layout
        self.server = SplitServer(model, self.layout, algorithm, cfg.train, int(cfg.seed), device)
        self._class_counts = class_counts  # an (N, C) array, or a callable giving it (read at first use)
        self.num_classes = self.plan.num_classes

    @property
    def class_counts(self) -> np.ndarray:
        """Every client's class counts (the manifest's), read when a round first needs them."""
        if callable(self._class_counts):
            self._class_counts = np.asarray(self._class_counts())
        return self._class_counts

    def init_aux(self) -> np.ndarray:
        """The auxiliary head's initial weights, drawn from a generator keyed by the seed."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed_of([int(self.cfg.seed), SERVER_STREAM, 1003]))
            head = self.algorithm.aux_head(self.plan.act_shape, self.num_classes)
        return params_vector(head)

    # ---------------------------------------------------------------------------------------
    def run_round(self, rnd: int, weights: np.ndarray, algo_state: dict) -> RoundResult:
        cfg, algo, shape = self.cfg, self.algorithm, self.shape
        secs: dict[str, float] = {}
        t0 = time.perf_counter()
        sampled = sample_clients(self.sizes, cfg.train.clients_per_round, cfg.seed, rnd, cfg.engine.over_selection)
        if not sampled:
            raise RuntimeError(f"round {rnd}: no client with data was sampled")
        sizes = self.sizes[sampled]
        bks = batch_sizes(sizes, shape.batch_size)
        slots = live_workers(self.pool, rnd)  # a pool that lost workers has fewer, not always 0..n-1
        assignment = assign_clients(bks, len(slots))
        items_of = {slots[w]: [SplitItem(p, int(sampled[p]), int(bks[p])) for p in ps] for w, ps in assignment.items()}
        secs["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        state = dict(algo_state or {})
        aux = state.get("aux")
        if self.plan.aux_size and aux is None:
            aux = self.init_aux()
        init = self.plan.client_vector(weights, aux)
        payload = dict(algo.broadcast(rnd, weights, state))
        decay = lr_factor(cfg.train, rnd)
        s_train, s_fixed = self.layout.server_vectors(weights)
        client_w = [algo.client_weight(int(s)) for s in sizes]
        self.server.begin_round(rnd, s_train, s_fixed, algo.server_lr(float(cfg.train.lr)) * decay,
                                None if shape.server_copies else state.get("server_optimizer"),
                                client_w if shape.server_copies else None)
        sched = TaskScheduler(self.pool, FailurePolicy.from_engine(cfg.engine, can_drop=False), rnd, atomic=True,
                              record_success=False, faults=self.faults)
        r = _Round(rnd, sampled, items_of, self.pool.put(init), self.pool.put(payload), sched)
        secs["broadcast"] = time.perf_counter() - t0

        if shape.sequential_clients:  # one client at a time, in the server's order of the round
            for k, p in enumerate(self.server.client_order(len(sampled))):
                self._iterate(r, [p], k * shape.local_iters)
        else:
            self._iterate(r, list(range(len(sampled))), 0)
        secs["clients"] = r.timing["clients"]
        secs["server"] = r.timing["server"]

        t0 = time.perf_counter()
        new, new_state = self._aggregate(r, weights, state, client_w)
        new, new_state = algo.after_aggregate(rnd, new, [], new_state, broadcast=weights)
        secs["aggregate"] = time.perf_counter() - t0
        report = self._report(r, bks, init, len(assignment), arrays_nbytes(payload))
        report.seconds = secs
        report.add_extra(algo.round_metrics(rnd, new_state, len(sampled)), f"algorithm {algo.name!r}'s round_metrics")
        if self.check_clients is not None:
            self.check_clients(sampled, f"round {rnd}'s clients")
        return RoundResult(weights=np.ascontiguousarray(new, dtype=np.float32), algo_state=new_state, report=report)

    # ---------------------------------------------------------------------------------------
    def _iterate(self, r: _Round, group: list[int], step0: int) -> None:
        """Run the positions ``group`` together through the local iterations (server steps numbered from
        ``step0``); their trained client-side vectors go into ``r.final``."""
        members = set(group)
        items = {w: [x for x in its if x[0] in members] for w, its in r.items_of.items()}
        items = {w: its for w, its in items.items() if its}
        history: list[dict | None] = []
        grads: dict | None = None
        for it in range(self.shape.local_iters + 1):
            t0 = time.perf_counter()
            outs = self._run_tasks(r, it, items, grads, history)
            r.timing["clients"] += time.perf_counter() - t0
            if it == self.shape.local_iters:
                r.final.update(outs)
                return
            t0 = time.perf_counter()
            grads = self._server_iteration(r, group, outs, step0 + it)
            history.append(grads)
            r.timing["server"] += time.perf_counter() - t0

    def _server_iteration(self, r: _Round, group: list[int], outs: dict, step: int) -> dict | None:
        """Concatenate the group's uploads in sampled order, run the algorithm's server iteration; returns
        each client's gradient rows (None for methods without gradient returns)."""
        algo, dev = self.algorithm, self.server.device
        for p in group:
            r.nbytes["activations"] += int(outs[p].activations.nbytes)
            r.nbytes["labels"] += int(outs[p].labels.nbytes)
        # the uploads are joined, then cross to the server's device in one copy per tensor (on a GPU, one
        # transfer instead of two a client); each client's rows are views of the joined tensor, the same values
        rows = [int(outs[p].labels.shape[0]) for p in group]
        handed = all(torch.is_tensor(outs[p].activations) for p in group)  # workers in this process (LocalPool)
        if handed:  # tensors where the clients computed them: joined there, nothing crosses host memory
            a_all = torch.cat([outs[p].activations.to(torch.float32) for p in group])
            y_all = torch.cat([outs[p].labels.to(torch.int64) for p in group])
        else:  # numpy arrays from Ray workers: joined on the host
            a_all = torch.from_numpy(np.concatenate([np.asarray(outs[p].activations, np.float32) for p in group]))
            y_all = torch.from_numpy(np.concatenate([np.asarray(outs[p].labels, np.int64) for p in group]))
        acts = list(torch.split(a_all.to(dev), rows, 0))
        labels = list(torch.split(y_all.to(dev), rows, 0))
        cids = [int(r.sampled[p]) for p in group]
        batch = SplitBatch(positions=list(group), cids=cids, activations=acts, labels=labels,
                           class_counts=self.class_counts[cids], num_classes=self.num_classes)
        self.server.begin_iteration(step)
        res = algo.server_iteration(self.server, batch)
        r.losses.append(float(res.loss))
        for key, v in res.metrics.items():
            r.metrics[key].append(float(v))
        for p, loss in zip(group, res.client_losses):
            r.client_losses[p].append(float(loss))
        if not self.shape.returns_gradients:
            return None
        if res.grads is None or len(res.grads) != len(group):
            raise RuntimeError(f"{algo.name}.server_iteration returned no gradient rows for every client")
        if handed:  # back the way the activations came: tensors on the device, for workers in this process
            grads = {p: g.detach().to(torch.float32) for p, g in zip(group, res.grads)}
        else:  # one transfer to the host for every client's rows, then a copy of each client's block (its own
            # buffer on the wire and in the replay history)
            g_all = torch.cat([g.detach().to(torch.float32) for g in res.grads], 0).to("cpu").numpy()
            cuts = np.cumsum([int(g.shape[0]) for g in res.grads])[:-1]
            grads = {p: np.array(g, dtype=np.float32, copy=True) for p, g in zip(group, np.split(g_all, cuts, 0))}
        r.nbytes["gradients"] += int(sum(g.nbytes for g in grads.values()))
        return grads

    def _run_tasks(self, r: _Round, it: int, items_of: dict, grads: dict | None,
                   history: list) -> dict[int, SplitOutcome]:
        """Task ``it`` on every worker at once; a failed task is resubmitted with the round's gradient
        history and replayed (see the module docstring)."""

        def call(widx: int, task: Task):
            ps = [p for p, _, _ in task.items]
            g = None if grads is None else {p: grads[p] for p in ps}
            replay = None
            if task.replay:
                replay = [None if h is None else {p: h[p] for p in ps} for h in history[: max(it - 1, 0)]]
            return self.pool.submit(widx, "split_step", r.rnd, it, r.init_ref, r.p_ref, list(task.items), g, replay)

        results: dict[int, SplitOutcome] = {}
        tasks = [Task(tuple(items), worker=w) for w, items in items_of.items()]
        r.sched.run(tasks, call, lambda o: results.__setitem__(o.pos, o), label=f" in split iteration {it}")
        return results

    def _aggregate(self, r: _Round, weights: np.ndarray, state: dict, client_w: list[float]):
        fold = OrderedFold(client_w)
        for p in range(len(r.sampled)):  # ordered fold in sampled order
            w = r.final[p].weights
            assert w is not None  # a split round has every client's final weights (it cannot drop one)
            fold.add(p, w)
        s_train, s_fixed, opt_state = self.server.end_round()
        new = np.array(weights, dtype=np.float32, copy=True)
        avg = fold.result()
        assert avg is not None
        aux_new = self.plan.write(new, avg.astype(np.float32, copy=False), s_train, s_fixed)
        new_state = dict(state)
        if self.plan.aux_size:
            new_state["aux"] = aux_new
        if opt_state is not None:
            new_state["server_optimizer"] = opt_state
        return new, new_state

    def _report(self, r: _Round, bks, init, workers: int, payload_bytes: int) -> RoundReport:
        k = len(r.sampled)
        ledger = r.sched.ledger
        for p, cid in enumerate(r.sampled):
            o = r.final[p]
            cl = r.client_losses.get(p) or [math.nan]
            ledger.append(LedgerRow(client=int(cid), round=r.rnd, samples=int(o.num_samples),
                                    loss=float(np.mean(cl)), seconds=float(o.seconds), worker=o.worker,
                                    failure=None, attempt=r.sched.attempts[int(cid)] + 1))
        weight_bytes = int(init.nbytes) * k
        report = RoundReport(
            round=r.rnd, num_clients=k, num_samples=int(sum(r.final[p].num_samples for p in range(k))),
            loss=float(np.mean(r.losses)) if r.losses else math.nan, retries=int(r.sched.retries),
            worker_restarts=int(r.sched.worker_restarts), lr=round_lr(self.cfg.train, r.rnd),
            bytes=ByteCounts(broadcast=weight_bytes, upload=weight_bytes, signals_broadcast=payload_bytes * k,
                             activations=r.nbytes["activations"], labels=r.nbytes["labels"],
                             gradients=r.nbytes["gradients"]),
            ledger=ledger)
        extra: dict = {"split": {"point": self.point, "iterations": self.shape.local_iters, "batch": int(bks.sum()),
                                 "workers": workers}}
        for key, vals in r.metrics.items():
            extra[key] = float(np.mean(vals))
        if not self.shape.returns_gradients:
            local = [r.final[p].loss for p in range(k) if not math.isnan(r.final[p].loss)]
            extra["client_loss"] = float(np.mean(local)) if local else math.nan
        report.add_extra(extra, f"algorithm {self.algorithm.name!r}'s server iteration")
        return report
