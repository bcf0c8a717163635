"""``engine.fold_group: g`` on the worker: train a group of consecutive sampled clients, return one partial sum.

The worker trains the group's clients in sampled order with its runtime (one at a time, or in multi-client
groups of ``engine.multi_client``) and folds each model as the coordinator's ordered fold would:
``acc = a_1 w_1``, ``acc += a_k w_k`` in float32 with ``a_k = weight_k / total`` (given by the coordinator
with the task, :meth:`fedray.engine.fold.OrderedFold.coefficient`). Only the partial sum crosses the object
store; the members' outcomes come back without weights (statistics, extras, ledger). A member that fails
ends the group: the outcome carries no sum and the coordinator's scheduler runs the group again
(:mod:`fedray.engine.dispatch`).
"""

from __future__ import annotations

import numpy as np

from fedray.engine.outcomes import GroupOutcome

__all__ = ["run_partial_sum"]


def run_partial_sum(runtime, rnd: int, weights, payload: dict, items: list, hints, step: int = 1) -> GroupOutcome:
    """Train ``items = [(position, client id, a_k)]`` with ``runtime`` (``step`` clients per call) and fold them."""
    coeff = {int(p): float(a) for p, _, a in items}
    acc = scratch = None
    members = []
    for i in range(0, len(items), max(1, step)):
        outs = runtime.run(rnd, weights, payload, [(int(p), int(c)) for p, c, _ in items[i:i + step]], hints)
        for o in outs:
            members.append(o)
            if o.error is not None:
                return GroupOutcome(pos=int(items[0][0]), weights=None, members=members)
            if acc is None:
                acc = o.weights * coeff[o.pos]
            else:  # a_k w_k into one scratch buffer per group, then added: the same roundings, one allocation
                scratch = np.multiply(o.weights, coeff[o.pos], out=scratch)
                acc += scratch
            o.weights = None
    return GroupOutcome(pos=int(items[0][0]), weights=acc, members=members)
