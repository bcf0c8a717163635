"""The split round program (SCALA, SplitFed V1/V2/V3, SFL with local losses).

Used by the coordinator when ``algorithm.program == "split"``; the algorithms themselves (what the server
does with the activations) live in :mod:`fedray.algorithms.split`. One round:

1. **Sample and size.** The federated sampler picks the round's clients; client k gets the batch size
   ``B_k = max(1, floor(B * |D_k| / sum_j |D_j|))`` (capped at ``|D_k|``) and a minibatch plan drawn from
   the generator keyed by (seed, round, client) (:func:`batch_plan`). Clients are pinned to workers for
   the whole round (greedy balance on ``B_k``, :func:`assign_clients`); each worker gets one task per
   local iteration holding all its clients, and all workers' tasks of an iteration are in flight at once.
2. **Iterate.** Task ``t`` on a worker: for each of its clients, back-propagate the gradient rows of
   iteration ``t-1`` (if any) through that client's client-side model and step its optimizer, then forward
   minibatch ``t`` and return (activations, labels). A worker keeps each client's client-side weights
   (one flat leaf tensor), optimizer and autograd graph between the tasks of a round
   (:class:`SplitClientMixin`, mixed into :class:`fedray.engine.worker.ClientWorker`). The coordinator
   concatenates the uploads **in sampled order** (so nothing depends on the number of workers or on
   completion order), runs ``algorithm.server_iteration`` on the server-side model it holds
   (:class:`SplitServer`, on the coordinator's device, a GPU when ``engine.device: cuda``) and sends each
   client its gradient rows with the next task. Task ``T`` (after the last iteration) returns the trained
   client-side vectors. Algorithms with ``sequential_clients`` (SplitFedV2's default ``order: client``)
   run this loop once per client instead, one client at a time in the server's seeded order, so each
   client's whole local training meets the server model the previous clients left.
3. **Aggregate.** Client-side vectors are averaged with weights ``client_weight(|D_k|)`` folded in sampled
   order; the server side becomes the single server model (SCALA, V2, local loss) or the weighted average
   of the per-client copies (V1, V3). Both halves are written into the global weight vector; the
   server-side optimizer state (momentum, Adam moments) and any auxiliary client head live in the algorithm
   state, so checkpoints and ``--resume`` continue exactly.

**Faults.** The coordinator keeps the gradient rows of every iteration of the current round. When a
worker dies (or one of its clients raises) during iteration ``t``, the worker is replaced (or, for a
client error, kept) and its task is resubmitted with that history: the worker rebuilds its clients from
the round's start weights and *replays* iterations ``0..t-1`` (same minibatches, same dropout seeds,
same gradient rows; nothing on the server side is recomputed), then carries on. The result equals an
undisturbed run bit for bit. A client failing more than ``engine.max_client_retries`` times fails the
round (a split round cannot drop a client half-way); worker replacements are bounded by
``engine.max_worker_restarts`` per round.

**Determinism.** Every random draw is keyed: minibatches by (seed, round, client), client-side dropout
by (seed, round, client, iteration), server-side dropout by (seed, round, server step, forward call), the
SplitFedV2 client order by (seed, round); the fold order is the sampled order. The same config gives the
same weights whatever the backend or the number of workers, with or without worker crashes.
"""

from __future__ import annotations

import math
import time
import traceback
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

__all__ = [
    "SERVER_STREAM",
    "batch_sizes",
    "batch_plan",
    "assign_clients",
    "SplitLayout",
    "SplitOutcome",
    "SplitClientMixin",
    "SplitServer",
    "SplitProgram",
    "run_split_round",
    "client_output_shape",
]

# Generator keys of server-side draws: [seed, round, SERVER_STREAM, purpose, ...] never collide with the
# client keys [seed, round, cid, ...] (client ids are far below 2**40).
SERVER_STREAM = 1 << 40


# ------------------------------------------------------------------------------------------- plans
def batch_sizes(sizes, batch_size: int) -> np.ndarray:
    """SCALA Eq. 3: ``B_k = max(1, floor(B * |D_k| / sum_j |D_j|))`` over the participating clients,
    capped at ``|D_k|`` (a client cannot contribute more distinct samples than it has). The sizes sum to
    at most ``B`` (when no cap applies) and at least ``B - K`` (floors), and grow with ``|D_k|``."""
    n = np.asarray(sizes, dtype=np.int64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError(f"sizes must be a non-empty 1-D array of client data sizes, got shape {n.shape}")
    if (n <= 0).any():
        raise ValueError(f"every participating client needs data; got sizes {n.tolist()}")
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    bk = (int(batch_size) * n) // int(n.sum())
    return np.minimum(np.maximum(bk, 1), n)


def batch_plan(rng: np.random.Generator, n: int, bk: int, iters: int) -> list[np.ndarray]:
    """The row indices of a client's ``iters`` minibatches of size ``bk`` from its ``n`` samples.

    Consecutive slices of a permutation drawn from ``rng``; when fewer than ``bk`` rows remain, a fresh
    permutation starts (an epoch boundary; the remainder is skipped, like ``drop_last``)."""
    bk = int(min(bk, n))
    if bk < 1:
        raise ValueError(f"a client with {n} samples cannot form minibatches of size {bk}")
    out = []
    perm, pos = rng.permutation(n), 0
    for _ in range(int(iters)):
        if pos + bk > n:
            perm, pos = rng.permutation(n), 0
        out.append(perm[pos : pos + bk])
        pos += bk
    return out


def assign_clients(bks, num_workers: int) -> dict[int, list[int]]:
    """Pin the round's clients (positions in sampled order) to workers: largest ``B_k`` first onto the
    least-loaded worker (ties by index). Only used for load balance; results never depend on it."""
    bks = [int(b) for b in bks]
    w = max(1, min(int(num_workers), len(bks)))
    loads = [0] * w
    out: dict[int, list[int]] = {i: [] for i in range(w)}
    for pos in sorted(range(len(bks)), key=lambda p: (-bks[p], p)):
        i = min(range(w), key=lambda j: (loads[j], j))
        out[i].append(pos)
        loads[i] += bks[pos]
    return {i: sorted(v) for i, v in out.items() if v}


def _seed_of(key) -> int:
    rng = key if isinstance(key, np.random.Generator) else np.random.default_rng(key)
    return int(rng.integers(0, 2**63 - 1))


@contextmanager
def _seeded(enabled: bool, seed: int, device: torch.device):
    """Run the body with the torch RNG seeded to ``seed`` (dropout masks), restoring the state after."""
    if not enabled:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in module.modules())


# ------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class _Entry:
    name: str
    shape: tuple[int, ...]
    offset: int  # within its side's vector
    numel: int


def _views(vec: torch.Tensor, entries, base: int = 0) -> dict[str, torch.Tensor]:
    return {e.name: vec[base + e.offset : base + e.offset + e.numel].view(e.shape) for e in entries}


def _param_entries(module: nn.Module) -> tuple[tuple[_Entry, ...], int]:
    """Entries of a module's parameters (in ``named_parameters`` order); it must hold no float buffers."""
    if any(torch.is_floating_point(b) for b in module.buffers()):
        raise ValueError(f"{type(module).__name__}: an auxiliary head must not have floating-point buffers")
    out, off = [], 0
    for name, p in module.named_parameters():
        out.append(_Entry(name, tuple(p.shape), off, p.numel()))
        off += p.numel()
    return tuple(out), off


def _params_vector(module: nn.Module) -> np.ndarray:
    parts = [p.detach().reshape(-1).to("cpu", torch.float32) for p in module.parameters()]
    return torch.cat(parts).numpy().copy() if parts else np.zeros(0, np.float32)


class SplitLayout:
    """Where the client-side and server-side parts of a model sit in its flat weight vector.

    Entries are split by side (the split part holding the tensor) and kind: *train* (parameters with
    ``requires_grad``) and *fixed* (floating-point buffers and frozen parameters). ``client_train`` etc.
    are index arrays into the full vector (:mod:`fedray.core.weights` order). A client's vector on the
    wire is ``[client train | auxiliary head | client fixed]``.
    """

    def __init__(self, model, point: str):
        from fedray.core.weights import layout_of

        self.point = point
        client, server = model.split(point)
        client_names = set(client.state_dict().keys())
        server_names = set(server.state_dict().keys())
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        idx = {k: [] for k in ("ct", "cf", "st", "sf")}
        ent = {k: [] for k in idx}
        size = {k: 0 for k in idx}
        for name, shape, off, n in layout_of(model).slices():
            if name in client_names:
                side = "c"
            elif name in server_names:
                side = "s"
            else:
                raise ValueError(f"split point {point!r}: weight {name!r} belongs to neither part")
            key = side + ("t" if name in trainable else "f")
            idx[key].append(np.arange(off, off + n, dtype=np.int64))
            ent[key].append(_Entry(name, tuple(shape), size[key], n))
            size[key] += n
        cat = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in idx.items()}
        self.client_train, self.client_fixed = cat["ct"], cat["cf"]
        self.server_train, self.server_fixed = cat["st"], cat["sf"]
        self.ct_entries, self.cf_entries = tuple(ent["ct"]), tuple(ent["cf"])
        self.st_entries, self.sf_entries = tuple(ent["st"]), tuple(ent["sf"])
        self.size = int(layout_of(model).size)

    @property
    def num_client(self) -> int:
        return int(self.client_train.size + self.client_fixed.size)

    @property
    def num_server(self) -> int:
        return int(self.server_train.size + self.server_fixed.size)

    def client_vector(self, full: np.ndarray, aux: np.ndarray | None) -> np.ndarray:
        aux = np.zeros(0, np.float32) if aux is None else np.asarray(aux, np.float32)
        return np.concatenate([full[self.client_train], aux, full[self.client_fixed]]).astype(np.float32, copy=False)

    def server_vectors(self, full: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return full[self.server_train].copy(), full[self.server_fixed].copy()

    def write(self, full: np.ndarray, client_vec: np.ndarray, aux_size: int, server_train: np.ndarray,
              server_fixed: np.ndarray) -> np.ndarray:
        """Put a client vector (wire format) and the server vectors into ``full`` (in place); returns the
        auxiliary part of the client vector."""
        nct = self.client_train.size
        full[self.client_train] = client_vec[:nct]
        full[self.client_fixed] = client_vec[nct + aux_size :]
        full[self.server_train] = server_train
        full[self.server_fixed] = server_fixed
        return client_vec[nct : nct + aux_size].copy()


def client_output_shape(model, point: str, meta) -> tuple[int, ...]:
    """Per-sample shape of the client-side part's output (the activation shape) for ``meta.shape`` input."""
    client, _ = model.split(point)
    modes = [m.training for m in client.modules()]
    dev = next(iter(model.parameters())).device
    client.eval()
    try:
        with torch.no_grad():
            out = client(torch.zeros((1, *tuple(int(s) for s in meta.shape)), device=dev))
    finally:
        for m, t in zip(client.modules(), modes):
            m.training = t
    return tuple(int(s) for s in out.shape[1:])


# ------------------------------------------------------------------------------------------- worker side
@dataclass
class SplitOutcome:
    """One client's result of one split task: activations + labels (iterations) or weights (final)."""

    pos: int
    cid: int
    activations: np.ndarray | None = None
    labels: np.ndarray | None = None
    weights: np.ndarray | None = None
    num_samples: int = 0
    loss: float = math.nan
    seconds: float = 0.0
    worker: str = ""
    error: str | None = None


class SplitStateLost(RuntimeError):
    """A worker was asked to continue a client it holds no state for (it must be replayed)."""


class _ClientRuntime:
    """Per-worker constants of the split program (built on first use)."""

    def __init__(self, worker):
        algo = worker.algorithm
        self.algorithm = algo
        self.point = algo.split_point_for(worker.model)
        self.layout = SplitLayout(worker.model, self.point)
        self.client, _ = worker.model.split(self.point)
        self.iters = int(algo.params["local_iters"])
        self.has_dropout = _has_dropout(self.client)
        self.aux = None
        self.aux_entries: tuple[_Entry, ...] = ()
        self.aux_size = 0
        if not algo.returns_gradients:
            shape = client_output_shape(worker.model, self.point, worker.meta)
            self.aux = algo.aux_head(shape, int(worker.meta.num_classes))
            if self.aux is None:
                raise ValueError(f"algorithm {algo.name!r} returns no gradients but defines no auxiliary head")
            self.aux.to(worker.device)
            self.aux_entries, self.aux_size = _param_entries(self.aux)
        self.num_train = int(self.layout.client_train.size) + self.aux_size

    def client_tensors(self, p: torch.Tensor, f: torch.Tensor) -> dict[str, torch.Tensor]:
        return {**_views(p, self.layout.ct_entries), **_views(f, self.layout.cf_entries)}


@dataclass
class _ClientRun:
    ctx: object  # fedray.algorithms.base.ClientContext
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
    extra: dict = field(default_factory=dict)


def _rows(grads, pos):
    if grads is None:
        return None
    return grads.get(pos)


class SplitClientMixin:
    """Worker-side methods of the split program, mixed into :class:`fedray.engine.worker.ClientWorker`
    (which provides ``model``, ``store``, ``cfg``, ``meta``, ``device``, ``augment``, ``states``,
    ``algorithm``, ``name`` and ``_maybe_fault``)."""

    def _split_runtime(self) -> _ClientRuntime:
        rt = getattr(self, "_split_rt", None)
        if rt is None:
            rt = self._split_rt = _ClientRuntime(self)
        return rt

    def split_step(self, rnd: int, it: int, init, payload: dict, items: list, grads: dict | None = None,
                   replay: list | None = None) -> list[SplitOutcome]:
        """Task ``it`` of round ``rnd`` for this worker's clients ``items`` = [(position, client id, B_k)].

        For each client: back-propagate ``grads[position]`` (the rows for iteration ``it-1``) and step,
        then, if ``it < local_iters``, forward minibatch ``it`` and return its activations and labels;
        at ``it == local_iters`` return the client's trained vector instead. ``init`` is the round's
        client-side start vector (wire format). ``replay`` (recovery) is the list of gradient rows of
        iterations ``0..it-2``: the clients are rebuilt from ``init`` and those iterations re-run first.
        Errors are reported per client (``SplitOutcome.error``)."""
        rt = self._split_runtime()
        if getattr(self, "_split_round", None) != rnd:
            self._split_clients: dict[int, _ClientRun] = {}
            self._split_round = rnd
        clients = self._split_clients
        out = []
        for pos, cid, bk in items:
            pos, cid, bk = int(pos), int(cid), int(bk)
            t0 = time.perf_counter()
            try:
                if replay is not None or it == 0:
                    st = self._split_begin(rt, rnd, cid, bk, init)
                    clients[cid] = st
                    for j in range(it):  # replay: the tasks 0..it-1 exactly as they first ran
                        self._split_fault(rnd, cid, j)
                        if j > 0:
                            self._split_backward(rt, st, _rows(replay[j - 1], pos))
                        self._split_forward(rt, st, j)
                st = clients.get(cid)
                if st is None or st.next_it != it:
                    have = None if st is None else st.next_it
                    raise SplitStateLost(f"worker {self.name} holds no state for client {cid} at iteration {it} "
                                         f"of round {rnd} (has {have})")
                self._split_fault(rnd, cid, it)
                if it > 0:
                    self._split_backward(rt, st, _rows(grads, pos))
                if it < rt.iters:
                    acts, labels = self._split_forward(rt, st, it)
                    st.seconds += time.perf_counter() - t0
                    out.append(SplitOutcome(pos, cid, activations=acts, labels=labels, num_samples=int(labels.shape[0]),
                                            seconds=time.perf_counter() - t0, worker=self.name))
                else:
                    vec = torch.cat([st.p.detach(), st.f]).to("cpu").numpy().copy()
                    if rt.algorithm.client_models == "local":
                        self.states.save(cid, rnd, {"client": vec})
                    st.seconds += time.perf_counter() - t0
                    loss = st.loss_sum / st.loss_n if st.loss_n else math.nan
                    out.append(SplitOutcome(pos, cid, weights=vec, num_samples=st.samples, loss=loss,
                                            seconds=st.seconds, worker=self.name))
                    del clients[cid]
            except Exception as e:  # noqa: BLE001 - reported per client, the coordinator replays or fails
                clients.pop(cid, None)
                out.append(SplitOutcome(pos, cid, seconds=time.perf_counter() - t0, worker=self.name,
                                        error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))
        return out

    # ---------------------------------------------------------------------------------------
    def _split_fault(self, rnd: int, cid: int, it: int) -> None:
        """``engine.fault_injection`` at the start of a client's work in a split task; an optional
        ``iteration`` key restricts it to that task (0 .. local_iters)."""
        f = self.faults
        if f and "iteration" in f and int(f["iteration"]) != it:
            return
        self._maybe_fault(rnd, cid)

    def _split_begin(self, rt: _ClientRuntime, rnd: int, cid: int, bk: int, init) -> _ClientRun:
        from fedray.algorithms.base import ClientContext, make_optimizer

        images, labels = self.store.client_arrays(cid)
        vec = np.asarray(init, dtype=np.float32)
        if rt.algorithm.client_models == "local":
            if self.states is None:
                raise RuntimeError(f"{rt.algorithm.name!r} keeps client models local but the worker has no "
                                   "client-state store (WorkerSpec.state_path)")
            saved = self.states.load(cid, rnd)
            if saved is not None and "client" in saved:
                if saved["client"].shape != vec.shape:
                    raise ValueError(f"client {cid}: stored client-side model has shape {saved['client'].shape}, "
                                     f"expected {vec.shape}")
                vec = np.asarray(saved["client"], dtype=np.float32)
        ctx = ClientContext(cid=cid, rnd=rnd, seed=int(self.cfg.seed), model=self.model, flat=self.flat,
                            global_weights=vec, images=images, labels=labels, meta=self.meta, train=self.cfg.train,
                            device=self.device, normalize=bool(self.cfg.data.normalize), augment=self.augment,
                            state=None, num_classes=self.meta.num_classes, model_factory=self._model_factory)
        n = int(labels.shape[0])
        if n == 0:
            raise ValueError(f"client {cid} has no data")
        p = torch.tensor(vec[: rt.num_train], device=self.device).requires_grad_(True)
        f = torch.tensor(vec[rt.num_train :], device=self.device)
        opt = make_optimizer(ctx, [p])
        plan = batch_plan(ctx.rng("order"), n, bk, rt.iters)
        gen = ctx.torch_generator("augment") if self.augment is not None else None
        return _ClientRun(ctx=ctx, plan=plan, p=p, f=f, opt=opt, gen=gen)

    def _split_step_opt(self, st: _ClientRun) -> None:
        clip = self.cfg.train.grad_clip
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([st.p], float(clip))
        st.opt.step()

    def _split_forward(self, rt: _ClientRuntime, st: _ClientRun, j: int) -> tuple[np.ndarray, np.ndarray]:
        from fedray.data.loader import to_float

        ctx = st.ctx
        idx = st.plan[j]
        xb = to_float(torch.from_numpy(np.ascontiguousarray(ctx.images[idx])), ctx.meta, ctx.normalize)
        y_np = np.ascontiguousarray(ctx.labels[idx], dtype=np.int64)
        yb = torch.from_numpy(y_np.copy())
        if ctx.augment is not None:
            xb = ctx.augment(xb, st.gen)
        if self.device.type != "cpu":
            xb, yb = xb.to(self.device), yb.to(self.device)
        rt.client.train()
        with _seeded(rt.has_dropout, _seed_of(ctx.rng("dropout", j)), self.device):
            out = functional_call(rt.client, rt.client_tensors(st.p, st.f), (xb,))
        if rt.algorithm.returns_gradients:
            st.pending = out
        else:  # local loss: the client learns from its auxiliary head right away
            nct = rt.layout.client_train.size
            rt.aux.train()
            aux_logits = functional_call(rt.aux, _views(st.p, rt.aux_entries, nct), (out,))
            loss = rt.algorithm.client_local_loss(aux_logits, yb)
            st.opt.zero_grad(set_to_none=True)
            loss.backward()
            self._split_step_opt(st)
            st.loss_sum += float(loss.detach()) * int(yb.shape[0])
            st.loss_n += int(yb.shape[0])
        st.next_it = j + 1
        st.samples += int(yb.shape[0])
        act = out.detach()
        act = act.to("cpu").numpy() if act.device.type != "cpu" else act.numpy().copy()
        return act, y_np

    def _split_backward(self, rt: _ClientRuntime, st: _ClientRun, g) -> None:
        if not rt.algorithm.returns_gradients:
            return
        if st.pending is None:
            raise SplitStateLost(f"client {st.ctx.cid}: no forward pass is waiting for gradient rows")
        if g is None:
            raise ValueError(f"client {st.ctx.cid}: the coordinator sent no gradient rows")
        gt = torch.tensor(np.asarray(g, dtype=np.float32), device=self.device)
        if tuple(gt.shape) != tuple(st.pending.shape):
            raise ValueError(f"client {st.ctx.cid}: gradient rows of shape {tuple(gt.shape)} for activations "
                             f"of shape {tuple(st.pending.shape)}")
        st.opt.zero_grad(set_to_none=True)
        st.pending.backward(gt)
        st.pending = None
        self._split_step_opt(st)


# ------------------------------------------------------------------------------------------- server side
class _ServerModel:
    """One server-side model: a trainable flat leaf, its fixed tensors and its optimizer."""

    def __init__(self, train: torch.Tensor, fixed: torch.Tensor, opt: torch.optim.Optimizer, slot: int):
        self.train = train
        self.fixed = fixed
        self.opt = opt
        self.slot = slot


class SplitServer:
    """The server-side model(s) of a split round, on the coordinator (standalone-constructible for tests).

    ``main`` is the server-side model; ``copies`` (SplitFedV1/V3) one copy per participating client in
    sampled order, created from ``main`` at :meth:`begin_round` with fresh optimizers and averaged at
    :meth:`end_round`. Algorithms use :meth:`forward` and :meth:`step`."""

    def __init__(self, model, layout: SplitLayout, algorithm, train_cfg, seed: int, device=None):
        self.layout = layout
        self.algorithm = algorithm
        self.train_cfg = train_cfg
        self.seed = int(seed)
        _, self.part = model.split(layout.point)
        self.device = torch.device(device) if device is not None else next(iter(model.parameters())).device
        self.has_dropout = _has_dropout(self.part)
        self.main: _ServerModel | None = None
        self.copies: list[_ServerModel] = []
        self._copy_weights: list[float] = []
        self.rnd = 0
        self.it = 0
        self._calls = 0
        self._order: np.ndarray | None = None

    # ------------------------------------------------------------------------------ round
    def _optimizer(self, params, lr: float) -> torch.optim.Optimizer:
        t = self.train_cfg
        if t.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=t.weight_decay)
        return torch.optim.SGD(params, lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)

    def _model(self, train: np.ndarray, fixed: np.ndarray, lr: float, slot: int) -> _ServerModel:
        tr = torch.tensor(np.asarray(train, np.float32), device=self.device).requires_grad_(True)
        fx = torch.tensor(np.asarray(fixed, np.float32), device=self.device)
        return _ServerModel(tr, fx, self._optimizer([tr], lr), slot)

    def begin_round(self, rnd: int, train: np.ndarray, fixed: np.ndarray, lr: float,
                    opt_state: dict | None = None, copy_weights: list[float] | None = None) -> None:
        """Load the round's server weights. ``opt_state`` restores ``main``'s optimizer state (persistent
        across rounds); ``copy_weights`` (one per client) creates the per-client copies."""
        self.rnd = int(rnd)
        self._order = None
        self.main = self._model(train, fixed, lr, 0)
        if opt_state:
            st = {}
            for k, v in opt_state.items():
                t = torch.as_tensor(np.asarray(v)).clone()
                st[k] = t if k == "step" else t.to(self.device)
            self.main.opt.state[self.main.train] = st
        self._copy_weights = [float(w) for w in (copy_weights or [])]
        self.copies = [self._model(train, fixed, lr, k + 1) for k in range(len(self._copy_weights))]
        self.part.train()

    def begin_iteration(self, it: int) -> None:
        self.it = int(it)
        self._calls = 0

    def end_round(self) -> tuple[np.ndarray, np.ndarray, dict | None]:
        """(server train vector, server fixed vector, main optimizer state or None for copies)."""
        if self.copies:
            total = float(sum(self._copy_weights))
            acc_t = acc_f = None
            for m, w in zip(self.copies, self._copy_weights):  # ordered fold, float32
                a = w / total
                t = m.train.detach().to("cpu").numpy()
                f = m.fixed.to("cpu").numpy()
                if acc_t is None:
                    acc_t, acc_f = t * a, f * a
                else:
                    acc_t += t * a
                    acc_f += f * a
            return acc_t.astype(np.float32), acc_f.astype(np.float32), None
        m = self.main
        state = {}
        for k, v in m.opt.state.get(m.train, {}).items():
            if v is None:
                continue
            state[k] = v.detach().to("cpu").numpy().copy() if torch.is_tensor(v) else np.asarray(v)
        return (m.train.detach().to("cpu").numpy().copy(), m.fixed.to("cpu").numpy().copy(), state)

    # ------------------------------------------------------------------------------ algorithm API
    def forward(self, model: _ServerModel, x: torch.Tensor) -> torch.Tensor:
        """Server-side logits of ``model`` on activations ``x``; dropout seeded per (seed, round,
        iteration, call number)."""
        key = [self.seed, self.rnd, SERVER_STREAM, 1002, self.it, self._calls]
        self._calls += 1
        tensors = {**_views(model.train, self.layout.st_entries), **_views(model.fixed, self.layout.sf_entries)}
        with _seeded(self.has_dropout, _seed_of(key), self.device):
            return functional_call(self.part, tensors, (x,))

    def step(self, model: _ServerModel, loss: torch.Tensor, wrt=()) -> tuple[torch.Tensor, ...]:
        """Gradients of ``loss`` w.r.t. ``wrt`` (e.g. the activations), then one optimizer step of
        ``model`` on ``loss`` (with ``train.grad_clip``). Both come from the same backward pass, so the
        returned gradients are at the pre-step weights."""
        grads = torch.autograd.grad(loss, (model.train, *wrt))
        model.train.grad = grads[0]
        clip = self.train_cfg.grad_clip
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([model.train], float(clip))
        model.opt.step()
        model.train.grad = None
        return tuple(g.detach() for g in grads[1:])

    def client_order(self, n: int) -> list[int]:
        """A random order of the round's ``n`` clients, drawn once per (seed, round) (SplitFedV2)."""
        if self._order is None or self._order.size != n:
            self._order = np.random.default_rng([self.seed, self.rnd, SERVER_STREAM, 1000]).permutation(n)
        return [int(i) for i in self._order]


# ------------------------------------------------------------------------------------------- program
class SplitProgram:
    """The coordinator side of the split round program (created lazily by the coordinator)."""

    def __init__(self, coord):
        self.coord = coord
        algo = coord.algorithm
        self.algorithm = algo
        self.point = algo.split_point_for(coord.model)
        self.layout = SplitLayout(coord.model, self.point)
        self.server = SplitServer(coord.model, self.layout, algo, coord.cfg.train, int(coord.cfg.seed), coord.device)
        self.class_counts = coord.store.class_counts()
        self.num_classes = int(coord.meta.num_classes)
        self.iters = int(algo.params["local_iters"])
        self.batch_size = int(algo.params["batch_size"])
        self.aux_size = 0
        self.act_shape = client_output_shape(coord.model, self.point, coord.meta)
        if not algo.returns_gradients:
            head = algo.aux_head(self.act_shape, self.num_classes)
            if head is None:
                raise ValueError(f"algorithm {algo.name!r} returns no gradients but defines no auxiliary head")
            self.aux_size = _param_entries(head)[1]

    def init_aux(self) -> np.ndarray:
        """The auxiliary head's initial weights, drawn from a generator keyed by the seed."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed_of([int(self.coord.cfg.seed), SERVER_STREAM, 1003]))
            head = self.algorithm.aux_head(self.act_shape, self.num_classes)
        return _params_vector(head)

    # ---------------------------------------------------------------------------------------
    def run_round(self, rnd: int) -> dict:
        from fedray.algorithms.split import SplitBatch
        from fedray.engine.coordinator import _ema

        coord, algo = self.coord, self.algorithm
        cfg = coord.cfg
        pool = coord.pool
        secs: dict[str, float] = {}
        t0 = time.perf_counter()
        sampled = coord.sample(rnd)
        if not sampled:
            raise RuntimeError(f"round {rnd}: no client with data was sampled")
        sizes = coord.sizes[sampled]
        bks = batch_sizes(sizes, self.batch_size)
        assignment = assign_clients(bks, pool.size)
        items_of = {w: [(p, int(sampled[p]), int(bks[p])) for p in ps] for w, ps in assignment.items()}
        secs["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        state = dict(coord.algo_state or {})
        aux = state.get("aux")
        if self.aux_size and aux is None:
            aux = self.init_aux()
        w = coord.weights
        init = self.layout.client_vector(w, aux if self.aux_size else None)
        payload = dict(algo.broadcast(rnd, w, state))
        init_ref, p_ref = pool.put(init), pool.put(payload)
        decay = float(cfg.train.lr_decay) ** (rnd - 1)
        s_train, s_fixed = self.layout.server_vectors(w)
        client_w = [algo.client_weight(int(s)) for s in sizes]
        self.server.begin_round(rnd, s_train, s_fixed, algo.server_lr(float(cfg.train.lr)) * decay,
                                None if algo.server_copies else state.get("server_optimizer"),
                                client_w if algo.server_copies else None)
        secs["broadcast"] = time.perf_counter() - t0

        track = {"restarts0": pool.restarts, "retries": 0, "attempts": defaultdict(int), "ledger": []}
        nbytes = {"activations": 0, "labels": 0, "gradients": 0}
        losses: list[float] = []
        metrics: dict[str, list[float]] = defaultdict(list)
        client_losses: dict[int, list[float]] = defaultdict(list)
        timing = {"clients": 0.0, "server": 0.0}
        final: dict[int, SplitOutcome] = {}
        dev = self.server.device

        def iterate(group: list[int], step0: int) -> None:
            """Run the positions ``group`` together through the local iterations (server steps numbered
            from ``step0``); their trained client-side vectors go into ``final``."""
            members = set(group)
            items = {w: [x for x in its if x[0] in members] for w, its in items_of.items()}
            items = {w: its for w, its in items.items() if its}
            history: list[dict | None] = []
            grads: dict | None = None
            for it in range(self.iters + 1):
                t0 = time.perf_counter()
                outs = self._run_tasks(rnd, it, init_ref, p_ref, items, grads, history, track)
                timing["clients"] += time.perf_counter() - t0
                if it == self.iters:
                    final.update(outs)
                    return
                t0 = time.perf_counter()
                acts, labels = [], []
                for p in group:
                    o = outs[p]
                    nbytes["activations"] += int(o.activations.nbytes)
                    nbytes["labels"] += int(o.labels.nbytes)
                    acts.append(torch.tensor(o.activations, device=dev))
                    labels.append(torch.tensor(o.labels, dtype=torch.int64, device=dev))
                cids = [int(sampled[p]) for p in group]
                batch = SplitBatch(positions=list(group), cids=cids, activations=acts, labels=labels,
                                   class_counts=self.class_counts[cids], num_classes=self.num_classes)
                self.server.begin_iteration(step0 + it)
                res = algo.server_iteration(self.server, batch)
                losses.append(float(res.loss))
                for key, v in res.metrics.items():
                    metrics[key].append(float(v))
                for p, l in zip(group, res.client_losses):
                    client_losses[p].append(float(l))
                if algo.returns_gradients:
                    if res.grads is None or len(res.grads) != len(group):
                        raise RuntimeError(f"{algo.name}.server_iteration returned no gradient rows for every client")
                    grads = {p: np.ascontiguousarray(g.detach().to("cpu").numpy(), dtype=np.float32)
                             for p, g in zip(group, res.grads)}
                    nbytes["gradients"] += int(sum(g.nbytes for g in grads.values()))
                else:
                    grads = None
                history.append(grads)
                timing["server"] += time.perf_counter() - t0

        if algo.sequential_clients:  # one client at a time, in the server's order of the round
            for k, p in enumerate(self.server.client_order(len(sampled))):
                iterate([p], k * self.iters)
        else:
            iterate(list(range(len(sampled))), 0)
        secs["clients"] = timing["clients"]
        secs["server"] = timing["server"]

        t0 = time.perf_counter()
        total_w = float(sum(client_w))
        acc = None
        for p in range(len(sampled)):  # ordered fold in sampled order
            a = client_w[p] / total_w
            vec = final[p].weights
            if acc is None:
                acc = vec * a
            else:
                acc += vec * a
        s_train, s_fixed, opt_state = self.server.end_round()
        new = np.array(coord.weights, dtype=np.float32, copy=True)
        aux_new = self.layout.write(new, acc.astype(np.float32, copy=False), self.aux_size, s_train, s_fixed)
        new_state = dict(state)
        if self.aux_size:
            new_state["aux"] = aux_new
        if opt_state is not None:
            new_state["server_optimizer"] = opt_state
        new, new_state = algo.after_aggregate(rnd, new, [], new_state)
        coord.weights = np.ascontiguousarray(new, dtype=np.float32)
        coord.algo_state = new_state
        coord.round = rnd
        secs["aggregate"] = time.perf_counter() - t0

        k = len(sampled)
        ledger = track["ledger"]
        for p, cid in enumerate(sampled):
            o = final[p]
            cl = client_losses.get(p) or [math.nan]
            ledger.append({"client": int(cid), "round": rnd, "samples": int(o.num_samples),
                           "loss": float(np.mean(cl)), "seconds": float(o.seconds), "worker": o.worker,
                           "failure": None, "attempt": track["attempts"][int(cid)] + 1})
        weight_bytes = int(init.nbytes) * k
        report = {
            "round": rnd,
            "num_clients": k,
            "num_samples": int(sum(final[p].num_samples for p in range(k))),
            "loss": float(np.mean(losses)) if losses else math.nan,
            "dropped": [],
            "retries": int(track["retries"]),
            "worker_restarts": int(pool.restarts - track["restarts0"]),
            "stragglers_cancelled": 0,
            "lr": float(cfg.train.lr) * decay,
            "bytes": {"broadcast": weight_bytes, "upload": weight_bytes, **nbytes,
                      "total": 2 * weight_bytes + sum(nbytes.values())},
            "split": {"point": self.point, "iterations": self.iters, "batch": int(bks.sum()),
                      "workers": len(assignment)},
        }
        for key, vals in metrics.items():
            report[key] = float(np.mean(vals))
        if not algo.returns_gradients:
            local = [final[p].loss for p in range(k) if not math.isnan(final[p].loss)]
            report["client_loss"] = float(np.mean(local)) if local else math.nan
        t0 = time.perf_counter()
        last = rnd == int(cfg.train.rounds)
        if rnd % int(cfg.eval.every) == 0 or last:
            ana = int(cfg.eval.analysis_every)
            report.update(coord.evaluate(analysis=bool(ana) and (rnd % ana == 0 or last)))
            coord.ema = _ema(coord.ema, report["accuracy"], cfg.eval.ema)
            report["ema_accuracy"] = coord.ema
        secs["eval"] = time.perf_counter() - t0
        report["seconds"] = secs
        report["seconds_total"] = float(sum(secs.values()))
        report["ledger"] = ledger
        return report

    # ---------------------------------------------------------------------------------------
    def _run_tasks(self, rnd: int, it: int, init_ref, p_ref, items_of: dict, grads: dict | None,
                   history: list, track: dict) -> dict[int, SplitOutcome]:
        """Dispatch task ``it`` to every worker at once and collect the per-client outcomes, replacing
        dead workers and replaying failed tasks (see the module docstring)."""
        from fedray.engine.pool import WorkerLost

        pool = self.coord.pool
        e = self.coord.cfg.engine

        def submit(widx: int, replay):
            items = items_of[widx]
            g = None if grads is None else {p: grads[p] for p, _, _ in items}
            return pool.submit_call(widx, "split_step", rnd, it, init_ref, p_ref, items, g, replay)

        def replay_for(widx: int) -> list:
            ps = [p for p, _, _ in items_of[widx]]
            return [None if h is None else {p: h[p] for p in ps} for h in history[: max(it - 1, 0)]]

        def fail_rows(items, worker, reason):
            for _, cid, _ in items:
                track["ledger"].append({"client": int(cid), "round": rnd, "samples": 0, "loss": math.nan,
                                        "seconds": 0.0, "worker": worker, "failure": reason,
                                        "attempt": track["attempts"][int(cid)] + 1})

        results: dict[int, SplitOutcome] = {}
        inflight = {submit(w, None): w for w in items_of}
        while inflight:
            for h in pool.wait(list(inflight)):
                widx = inflight.pop(h)
                try:
                    outs = pool.result(h)
                except WorkerLost as err:
                    if pool.restarts - track["restarts0"] >= int(e.max_worker_restarts):
                        raise RuntimeError(
                            f"round {rnd}: more than engine.max_worker_restarts={e.max_worker_restarts} worker "
                            f"restarts; last error: {err}") from err
                    fail_rows(items_of[widx], f"w{widx}", f"worker lost in split iteration {it}: {err}")
                    pool.replace(widx)
                    track["retries"] += 1
                    inflight[submit(widx, replay_for(widx))] = widx
                    continue
                bad = [o for o in outs if o.error is not None]
                if bad:
                    for o in bad:
                        first = o.error.splitlines()[0]
                        track["attempts"][o.cid] += 1
                        track["ledger"].append({"client": o.cid, "round": rnd, "samples": 0, "loss": math.nan,
                                                "seconds": float(o.seconds), "worker": o.worker,
                                                "failure": first, "attempt": track["attempts"][o.cid]})
                        if track["attempts"][o.cid] > int(e.max_client_retries):
                            raise RuntimeError(
                                f"round {rnd}: client {o.cid} failed {track['attempts'][o.cid]} times in split "
                                f"iteration {it} (engine.max_client_retries={e.max_client_retries}); a split "
                                f"round cannot drop a client mid-round. Last error: {o.error}")
                    track["retries"] += 1
                    inflight[submit(widx, replay_for(widx))] = widx
                    continue
                for o in outs:
                    results[o.pos] = o
        return results


def run_split_round(coord, rnd: int) -> dict:
    """Run round ``rnd`` of a split algorithm on ``coord`` (a :class:`fedray.engine.coordinator.Coordinator`)."""
    prog = getattr(coord, "_split_program", None)
    if prog is None:
        prog = coord._split_program = SplitProgram(coord)
    return prog.run_round(rnd)
