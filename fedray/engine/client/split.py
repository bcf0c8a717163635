"""The worker side of the split program: each client's client-side model across the tasks of a round.

Task ``t`` of a round on a worker: for each of its clients, back-propagate the gradient rows of iteration
``t-1`` (if any) through that client's client-side model and step its optimizer, then forward minibatch
``t`` and return (activations, labels); task ``local_iters`` returns the trained client-side vector. The
runtime keeps each client's weights (one flat leaf tensor), optimizer and autograd graph between the tasks
of a round. A resubmitted task (``replay``) rebuilds its clients from the round's start vector and
re-runs iterations ``0..t-1`` with the coordinator's recorded gradient rows, exactly as they first ran.
Minibatches are keyed by (seed, round, client), dropout by (seed, round, client, iteration).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import functional_call

from fedray.algorithms.base import ClientContext
from fedray.algorithms.training import make_optimizer
from fedray.core.seeds import seed_of, seeded
from fedray.data.loader import train_batch
from fedray.engine.outcomes import SplitOutcome, error_text, is_fatal
from fedray.engine.split_layout import SplitPlan, batch_plan, has_dropout, views

__all__ = ["SplitRuntime", "SplitStateLost"]


class SplitStateLost(RuntimeError):
    """A worker was asked to continue a client it holds no state for (it must be replayed)."""


class _Constants:
    """Per-worker constants of the split program: the :class:`~fedray.engine.split_layout.SplitPlan` the
    coordinator builds too, the client-side part and its auxiliary head on the worker's device."""

    def __init__(self, replica):
        algo = replica.algorithm
        self.algorithm = algo
        self.plan = plan = SplitPlan.build(algo, replica.model, replica.meta)
        self.shape, self.point, self.layout = plan.shape, plan.point, plan.layout
        self.client, _ = replica.model.split(self.point)
        self.has_dropout = has_dropout(self.client)
        self.aux = None if plan.aux is None else plan.aux.to(replica.device)
        self.aux_entries = plan.aux_entries

    def client_tensors(self, p: torch.Tensor, f: torch.Tensor) -> dict[str, torch.Tensor]:
        return {**views(p, self.layout.ct_entries), **views(f, self.layout.cf_entries)}


@dataclass
class _ClientRun:
    ctx: ClientContext
    plan: list
    p: torch.Tensor  # trainable leaf: [client train | aux]
    f: torch.Tensor  # fixed: client buffers / frozen params
    opt: torch.optim.Optimizer
    gen: torch.Generator | None
    pending: torch.Tensor | None = None  # last forward's output (with its graph) awaiting gradient rows
    next_it: int = 0
    samples: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
    seconds: float = 0.0


def _rows(grads, pos):
    return None if grads is None else grads.get(pos)


class SplitRuntime:
    """Runs split tasks on one worker's replica (see the module docstring)."""

    def __init__(self, replica, states, faults, name: str, tensors: bool = False):
        self.replica, self.states, self.faults, self.name = replica, states, faults, name
        self.tensors = tensors  # hand activations and labels over as tensors (a worker in the coordinator's process)
        self.k = _Constants(replica)
        self.rnd: int | None = None
        self.clients: dict[int, _ClientRun] = {}

    def step(self, rnd: int, it: int, init, payload: dict, items: list, grads: dict | None = None,
             replay: list | None = None) -> list[SplitOutcome]:
        """Task ``it`` of round ``rnd`` for this worker's clients ``items`` = [(position, client id, B_k)].

        ``init`` is the round's client-side start vector (wire format); ``grads[position]`` the rows for
        iteration ``it-1``; ``replay`` (recovery) the gradient rows of iterations ``0..it-2``. Errors are
        reported per client (``SplitOutcome.error``)."""
        if self.rnd != rnd:
            self.clients, self.rnd = {}, rnd
        out = []
        for pos, cid, bk in items:
            pos, cid, bk = int(pos), int(cid), int(bk)
            t0 = time.perf_counter()
            try:
                if replay is not None or it == 0:
                    self.clients[cid] = self._rebuild(rnd, cid, pos, bk, init, it, replay)
                done = self._advance(rnd, it, pos, cid, grads, t0)
                if done.weights is not None:  # its last iteration: its rows (views of the mapped partition) unchanged
                    self.replica.store.recheck_client(cid)
                out.append(done)
            except Exception as e:  # noqa: BLE001 - reported per client, the coordinator replays or fails
                self.clients.pop(cid, None)
                out.append(SplitOutcome(pos, cid, seconds=time.perf_counter() - t0, worker=self.name,
                                        error=error_text(e), fatal=is_fatal(e)))
        return out

    # ---------------------------------------------------------------------------------------
    def _rebuild(self, rnd: int, cid: int, pos: int, bk: int, init, it: int, replay) -> _ClientRun:
        """A client's state at the start of task ``it``: built from ``init``, tasks 0..it-1 replayed."""
        st = self._begin(rnd, cid, bk, init)
        for j in range(it):  # replay: the tasks 0..it-1 exactly as they first ran
            self.faults.client(rnd, cid, iteration=j)
            if j > 0:
                self._backward(st, _rows(replay[j - 1], pos))
            self._forward(st, j)
        return st

    def _advance(self, rnd: int, it: int, pos: int, cid: int, grads, t0: float) -> SplitOutcome:
        st = self.clients.get(cid)
        if st is None or st.next_it != it:
            have = None if st is None else st.next_it
            raise SplitStateLost(f"worker {self.name} holds no state for client {cid} at iteration {it} "
                                 f"of round {rnd} (has {have})")
        self.faults.client(rnd, cid, iteration=it)
        if it > 0:
            self._backward(st, _rows(grads, pos))
        if it < self.k.shape.local_iters:
            acts, labels = self._forward(st, it)
            st.seconds += time.perf_counter() - t0
            return SplitOutcome(pos, cid, activations=acts, labels=labels, num_samples=int(labels.shape[0]),
                                seconds=time.perf_counter() - t0, worker=self.name)
        vec = torch.cat([st.p.detach(), st.f]).to("cpu").numpy().copy()
        if self.k.shape.client_models == "local":
            self.states.save(cid, rnd, {"client": vec})
        st.seconds += time.perf_counter() - t0
        loss = st.loss_sum / st.loss_n if st.loss_n else math.nan
        del self.clients[cid]
        return SplitOutcome(pos, cid, weights=vec, num_samples=st.samples, loss=loss, seconds=st.seconds,
                            worker=self.name)

    def _start_vector(self, rnd: int, cid: int, init) -> np.ndarray:
        vec = np.asarray(init, dtype=np.float32)
        if self.k.shape.client_models != "local":
            return vec
        if self.states is None:
            raise RuntimeError(f"{self.k.algorithm.name!r} keeps client models local but the worker has no "
                               "client-state store (WorkerSpec.state_path)")
        saved = self.states.load(cid, rnd)
        if saved is not None and "client" in saved:
            if saved["client"].shape != vec.shape:
                raise ValueError(f"client {cid}: stored client-side model has shape {saved['client'].shape}, "
                                 f"expected {vec.shape}")
            vec = np.asarray(saved["client"], dtype=np.float32)
        return vec

    def _begin(self, rnd: int, cid: int, bk: int, init) -> _ClientRun:
        rp = self.replica
        images, labels = rp.store.client_arrays(cid)
        vec = self._start_vector(rnd, cid, init)
        ctx = ClientContext(cid=cid, rnd=rnd, seed=int(rp.cfg.seed), model=rp.model, flat=rp.flat,
                            global_weights=vec, images=images, labels=labels, meta=rp.meta, train=rp.cfg.train,
                            device=rp.device, normalize=bool(rp.cfg.data.normalize), augment=rp.augment,
                            state=None, num_classes=rp.meta.num_classes, model_factory=rp.model_factory)
        n = int(labels.shape[0])
        if n == 0:
            raise ValueError(f"client {cid} has no data")
        train, fixed = self.k.plan.unpack(vec)
        p = torch.tensor(train, device=rp.device).requires_grad_(True)
        f = torch.tensor(fixed, device=rp.device)
        opt = make_optimizer(ctx, [p])
        plan = batch_plan(ctx.rng("order"), n, bk, self.k.shape.local_iters)
        gen = ctx.torch_generator("augment") if rp.augment is not None else None
        return _ClientRun(ctx=ctx, plan=plan, p=p, f=f, opt=opt, gen=gen)

    def _step_opt(self, st: _ClientRun) -> None:
        clip = self.replica.cfg.train.grad_clip
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([st.p], float(clip))
        st.opt.step()

    def _forward(self, st: _ClientRun, j: int) -> tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor]:
        k, ctx, dev = self.k, st.ctx, self.replica.device
        idx = st.plan[j]
        xb = train_batch(torch.from_numpy(np.ascontiguousarray(ctx.images[idx])), ctx.meta, ctx.normalize, dev,
                         ctx.augment, st.gen)
        y_np = np.ascontiguousarray(ctx.labels[idx], dtype=np.int64)
        yb = torch.from_numpy(y_np.copy())
        if dev.type != "cpu":
            yb = yb.to(dev, non_blocking=True)
        k.client.train()
        with seeded(k.has_dropout, seed_of(ctx.rng("dropout", j)), dev):
            out = functional_call(k.client, k.client_tensors(st.p, st.f), (xb,))
        if k.shape.returns_gradients:
            st.pending = out
        else:  # local loss: the client learns from its auxiliary head right away
            nct = k.layout.client_train.size
            k.aux.train()
            aux_logits = functional_call(k.aux, views(st.p, k.aux_entries, nct), (out,))
            loss = k.algorithm.client_local_loss(aux_logits, yb)
            st.opt.zero_grad(set_to_none=True)
            loss.backward()
            self._step_opt(st)
            st.loss_sum += float(loss.detach()) * int(yb.shape[0])
            st.loss_n += int(yb.shape[0])
        st.next_it = j + 1
        st.samples += int(yb.shape[0])
        act = out.detach()
        if self.tensors:  # the coordinator reads them in this process, on this device; nothing writes them again
            return act, yb
        act = act.to("cpu").numpy() if act.device.type != "cpu" else act.numpy().copy()
        return act, y_np

    def _backward(self, st: _ClientRun, g) -> None:
        if not self.k.shape.returns_gradients:
            return
        if st.pending is None:
            raise SplitStateLost(f"client {st.ctx.cid}: no forward pass is waiting for gradient rows")
        if g is None:
            raise ValueError(f"client {st.ctx.cid}: the coordinator sent no gradient rows")
        if torch.is_tensor(g):  # rows handed over in this process (SplitRuntime.tensors)
            gt = g.detach().to(device=self.replica.device, dtype=torch.float32)
        else:
            gt = torch.tensor(np.asarray(g, dtype=np.float32), device=self.replica.device)
        if tuple(gt.shape) != tuple(st.pending.shape):
            raise ValueError(f"client {st.ctx.cid}: gradient rows of shape {tuple(gt.shape)} for activations "
                             f"of shape {tuple(st.pending.shape)}")
        st.opt.zero_grad(set_to_none=True)
        st.pending.backward(gt)
        st.pending = None
        self._step_opt(st)
