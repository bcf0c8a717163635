"""``engine.fold_group: g``: the federated round with partial sums computed on the workers.

The sampled clients are cut into groups of g consecutive positions (the last may be shorter); one group is
one task. The worker trains its members in sampled order and returns ``sum_k a_k w_k`` over them
(:mod:`fedray.engine.client.partial`, ``a_k`` as the ordered fold computes it); the coordinator folds the
groups' partial sums in group order (:class:`~fedray.engine.fold.OrderedFold` with ``scaled=True``). So
one vector per group crosses the object store instead of one per client, and the result is
``(a_1 w_1 + ... + a_g w_g) + (a_{g+1} w_{g+1} + ...) + ...``: a function of the sampled clients and g (a
hashed config field), never of the number of workers, their timing, the backend or a resume. g = 1 is the
client-by-client fold's arithmetic (the default path does not come here).

Failures keep their meaning (``docs/engine.md``): a member that raises is retried with its whole group
(the sum needs its members in order); past ``engine.max_client_retries`` it is dropped, the group runs
again without it, and the final average is renormalised over the folded weight as for any dropped client.
A lost worker's group runs again on another worker. A group whose members were all dropped is skipped.

Not every experiment can sum on the workers (:func:`check_fold_group`): the split program, algorithms
with per-client state (``Algorithm.stateful_clients``: each client's update goes with its own state, so
it is refused conservatively) and straggler handling (which keeps individual clients by finishing time;
refused in ``fedray.config``).
"""

from __future__ import annotations

import math
import time

from fedray.algorithms import algorithm_of
from fedray.core.errors import ConfigError
from fedray.engine.dispatch import FailurePolicy, GroupItem, Task, TaskScheduler
from fedray.engine.fold import OrderedFold
from fedray.engine.round_report import ClientTally, TrainedClients

__all__ = ["check_fold_group", "train_groups"]


def check_fold_group(cfg, algorithm=None) -> None:
    """Raise ``ConfigError("engine.fold_group: ...")`` when the experiment cannot fold partial sums (module
    docstring). Builds the algorithm when it is not passed in; does nothing for ``engine.fold_group: 1``."""
    g = int(cfg.engine.fold_group)
    if g <= 1:
        return
    algorithm = algorithm_of(cfg) if algorithm is None else algorithm
    where = f"engine.fold_group: {g}"
    name = cfg.algorithm.name
    if getattr(algorithm, "program", "federated") != "federated":
        raise ConfigError(f"{where} needs the federated round program; algorithm {name!r} runs the "
                          f"{algorithm.program!r} program (client-side models folded per split round); "
                          f"set engine.fold_group: 1")
    if getattr(algorithm, "stateful_clients", False):
        raise ConfigError(f"{where}: algorithm {name!r} keeps per-client state (stateful_clients), so each "
                          f"client's update belongs with its own state and cannot be summed with others on a "
                          f"worker; set engine.fold_group: 1")


def train_groups(prog, rnd: int, sampled: list[int], w_ref, p_ref, hints) -> TrainedClients:
    """:meth:`FederatedProgram.train` with partial sums (``uploads``: the groups' vectors received)."""
    e = prog.cfg.engine
    g = int(e.fold_group)
    k = len(sampled)
    client_w = [prog.algorithm.client_weight(int(prog.sizes[c])) for c in sampled]
    clients = OrderedFold(client_w)  # the per-client coefficients a_k, exactly as the client-by-client fold
    groups = [range(i, min(i + g, k)) for i in range(0, k, g)]
    fold = OrderedFold([sum(client_w[p] for p in grp) for grp in groups], total=clients.total, scaled=True)
    alive = [len(grp) for grp in groups]
    window = max(1, math.ceil(int(e.reorder_window) / g)) if e.reorder_window else prog.reorder_window(1)
    tally, timing, uploads = ClientTally(), {"fold": 0.0}, [0]

    def folded(pairs) -> None:
        for _, res in pairs:
            for out in res.members:
                tally.add(out)

    def on_outcome(res) -> None:
        t = time.perf_counter()
        kept = 0.0
        for out in res.members:
            kept += client_w[out.pos]
        pairs = fold.add(res.pos // g, res.weights, res, weight=kept)
        timing["fold"] += time.perf_counter() - t
        uploads[0] += 1
        folded(pairs)

    def on_drop(pos, cid) -> None:
        gi = int(pos) // g
        alive[gi] -= 1
        if alive[gi] == 0:  # every member dropped: the group contributes nothing
            folded(fold.skip(gi))

    sched = TaskScheduler(prog.pool, FailurePolicy.from_engine(e), rnd, faults=prog.faults)
    tasks = [Task(tuple(GroupItem(p, sampled[p], clients.coefficient(p)) for p in grp), group=True,
                  cost=prog.samples(sampled, grp)) for grp in groups]
    sched.run(tasks, lambda widx, task: prog.pool.submit(widx, "run_group", rnd, w_ref, p_ref, list(task.items), hints),
              on_outcome, on_drop=on_drop, may_start=lambda task: task.first // g < fold.next + window)
    sched.check_drops(k)
    return TrainedClients(avg=fold.result(), tally=tally, fold_seconds=timing["fold"], dropped=sched.dropped,
                          retries=sched.retries, worker_restarts=sched.worker_restarts, ledger=sched.ledger,
                          receive_seconds=sched.receive_seconds, uploads=uploads[0])
