"""The default client runtime: a task's clients one after another, each from the broadcast weights."""

from __future__ import annotations

import time

import numpy as np

from fedray.algorithms.base import ClientContext, ClientHints
from fedray.core.seeds import seed_of, seeded
from fedray.engine.outcomes import ClientOutcome, error_text, is_fatal
from fedray.engine.split_layout import has_dropout

__all__ = ["SequentialRuntime"]


class SequentialRuntime:
    """Trains each (position, client id) of a task from the broadcast weights; one outcome per client.
    A client's exception is reported in its outcome, so one bad client does not take its task down."""

    def __init__(self, replica, states, faults, name: str):
        self.replica, self.states, self.faults, self.name = replica, states, faults, name
        # dropout draws its masks from the global torch RNG, whose state in a worker depends on what the worker
        # ran before: a model with dropout trains each client with it seeded per (seed, round, client)
        self.has_dropout = has_dropout(replica.model)

    def run(self, rnd: int, weights, payload: dict, chunk: list[tuple[int, int]],
            hints: ClientHints) -> list[ClientOutcome]:
        weights = np.asarray(weights)
        out = []
        for pos, cid in chunk:
            t0 = time.perf_counter()
            try:
                out.append(self._one(rnd, weights, payload, pos, cid, hints, t0))
            except Exception as e:  # noqa: BLE001 - reported per client, the coordinator decides
                out.append(ClientOutcome(cid=cid, pos=pos, weights=None, num_samples=0, loss=float("nan"),
                                         seconds=time.perf_counter() - t0, worker=self.name, error=error_text(e),
                                         fatal=is_fatal(e)))
        return out

    def _one(self, rnd, weights, payload, pos, cid, hints, t0) -> ClientOutcome:
        rp = self.replica
        self.faults.client(rnd, cid)
        images, labels = rp.store.client_arrays(cid)
        rp.flat.load(weights)
        algo = rp.algorithm
        state = self.states.load(cid, rnd) if (self.states is not None and algo.stateful_clients) else None
        ctx = ClientContext(cid=cid, rnd=rnd, seed=int(rp.cfg.seed), model=rp.model, flat=rp.flat,
                            global_weights=weights, images=images, labels=labels, meta=rp.meta, train=rp.cfg.train,
                            device=rp.device, normalize=bool(rp.cfg.data.normalize), augment=rp.augment,
                            state=state, num_classes=rp.meta.num_classes, model_factory=rp.model_factory,
                            prox_mu=float(hints.prox_mu))
        with seeded(self.has_dropout, seed_of(ctx.rng("dropout")) if self.has_dropout else 0, rp.device):
            upd = algo.local_update(ctx, payload)
        rp.store.recheck_client(cid)  # its rows were views of the mapped partition: unchanged while in use
        if upd.state is not None and self.states is not None:
            self.states.save(cid, rnd, upd.state)
        return ClientOutcome(cid=cid, pos=pos, weights=upd.weights, num_samples=int(upd.num_samples),
                             loss=float(upd.loss), seconds=time.perf_counter() - t0, worker=self.name,
                             extras=upd.extras)
