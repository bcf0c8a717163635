"""Multi-client execution: several clients of one round trained at once inside a worker.

With ``engine.multi_client: m`` (m > 1) a worker trains the clients of its task in *groups* of m
consecutive sampled clients (group ``j`` = sampled positions ``[j m, (j + 1) m)``) with stacked
parameters: every trainable tensor gets a leading client axis, one forward pass runs all clients of the
group through ``torch.func.functional_call`` under ``torch.func.vmap`` (a Linear becomes one batched
matmul, a convolution one grouped convolution), one backward pass gives every client its own gradient
(the group loss is the sum of the clients' losses, which share no parameters), and the optimizer update
is applied to the stacked tensors (SGD with momentum / weight decay and Adam are elementwise, so this is
exactly per-client). Per-client Python work (model reload, optimizer construction, small kernels) is paid
once per group instead of once per client, which is what dominates small models and small clients.

**Equal to sequential execution.** Each client sees exactly the batches of
:func:`fedray.algorithms.training.local_sgd` (same permutation per epoch from the generator keyed by (seed,
round, client), same augmentation generator, same learning rate, gradient clipping per client). The
results are equal to sequential execution within float tolerance (different kernels sum in a different
order), not bit for bit.

**Ragged schedules.** Clients of a group usually differ in their number of batches, and a client's last
batch may be smaller than ``train.batch_size``. Short batches are padded with zero rows that carry zero
loss weight (the per-client loss is the sum over real rows divided by their count, as the batch mean of
the sequential loop). The group is ordered by number of steps, longest first, so the clients still
training are always a prefix of the stack: when a client has taken its last step its weights are read
out and the stack (parameters and optimizer state) shrinks to the remaining prefix, so a finished client
is never touched again and costs nothing.

**Determinism.** A group's result depends only on its members, which are fixed by the sampled order and
m; the coordinator rounds the task size (``engine.chunk_size``) up to a multiple of m, so groups never
straddle two tasks and the final weights are identical for any number of workers and either backend.
A client that fails on its own (an exception while reading its data) is left out of its group and
retried alone, which changes its numerics within float tolerance only.

**Scope.** Only algorithms whose local loss is cross-entropy on the model output, optionally plus a
proximal term ``mu/2 ||w - w_broadcast||^2`` (FedAvg, FedProx, and FedACG's client term), opt in with
``supports_multi_client = True`` declared on the class itself (not inherited: subclasses usually change
the loss); models with BatchNorm (batch statistics) or active dropout are refused, as are stateful
clients and the split program. :func:`check_multi_client` raises a :class:`~fedray.config.ConfigError`
naming ``engine.multi_client`` before any work starts.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedray.algorithms import algorithm_of
from fedray.algorithms.training import LossSum
from fedray.config import ConfigError
from fedray.data.loader import to_float
from fedray.engine.outcomes import ClientOutcome, error_text, is_fatal

__all__ = ["GroupMember", "GroupedRuntime", "check_multi_client", "declares_multi_client", "groups_of",
           "supported_algorithms", "train_group"]


# ------------------------------------------------------------------------------------------- checks
def declares_multi_client(algorithm) -> bool:
    """True when the algorithm's own class (not a base class) sets ``supports_multi_client = True``."""
    return bool(type(algorithm).__dict__.get("supports_multi_client", False))


def supported_algorithms() -> list[str]:
    """Names of the registered algorithms that support multi-client execution."""
    from fedray.algorithms import ALGORITHMS

    return sorted(n for n, cls in ALGORITHMS.items() if cls.__dict__.get("supports_multi_client", False))


def _unsupported_modules(model: nn.Module) -> tuple[list[str], list[str]]:
    bn = [n or type(model).__name__ for n, mod in model.named_modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)]
    drop = [n or type(model).__name__ for n, mod in model.named_modules()
            if isinstance(mod, nn.modules.dropout._DropoutNd) and float(mod.p) > 0.0]
    return bn, drop


def check_multi_client(cfg, meta=None, *, model: nn.Module | None = None, algorithm=None) -> None:
    """Raise ``ConfigError("engine.multi_client: ...")`` when the experiment cannot use multi-client
    execution (m > 1): an algorithm that does not declare ``supports_multi_client``, a split or stateful
    algorithm, a model with BatchNorm or dropout. Builds the algorithm and, given ``meta``, the model
    when they are not passed in. Does nothing for ``engine.multi_client: 1``."""
    m = int(cfg.engine.multi_client)
    if m <= 1:
        return
    algorithm = algorithm_of(cfg) if algorithm is None else algorithm
    where = f"engine.multi_client: {m} clients at once"
    if getattr(algorithm, "program", "federated") != "federated":
        raise ConfigError(f"{where} is not available for the {algorithm.program!r} program of algorithm "
                          f"{cfg.algorithm.name!r}; set engine.multi_client: 1")
    if not declares_multi_client(algorithm):
        raise ConfigError(
            f"{where} needs a local loss of cross-entropy on the model output (plus an optional proximal term); "
            f"algorithm {cfg.algorithm.name!r} does not declare supports_multi_client (supported: "
            f"{', '.join(supported_algorithms()) or 'none'}); set engine.multi_client: 1")
    if getattr(algorithm, "stateful_clients", False):
        raise ConfigError(f"{where} does not support stateful clients (algorithm {cfg.algorithm.name!r}); "
                          f"set engine.multi_client: 1")
    if model is None and meta is not None:
        from fedray.models import model_for_meta

        model = model_for_meta(cfg.model.name, meta, **cfg.model.params)
    if model is not None:
        bn, drop = _unsupported_modules(model)
        if bn:
            raise ConfigError(f"{where} needs a model without batch statistics; model {cfg.model.name!r} has "
                              f"BatchNorm layers ({', '.join(bn[:4])}); use a GroupNorm variant or set "
                              f"engine.multi_client: 1")
        if drop:
            raise ConfigError(f"{where} needs a model without dropout; model {cfg.model.name!r} has active dropout "
                              f"({', '.join(drop[:4])}); set its dropout to 0 or engine.multi_client: 1")


# ------------------------------------------------------------------------------------------- groups
def groups_of(chunk: list[tuple[int, int]], m: int) -> list[list[tuple[int, int]]]:
    """Split a task's ``(position, client)`` items into groups of the same block ``position // m``,
    in order. With tasks aligned to multiples of m this gives the fixed groups of the module docstring."""
    out: list[list[tuple[int, int]]] = []
    block = None
    for pos, cid in chunk:
        b = int(pos) // m
        if not out or b != block:
            out.append([])
            block = b
        out[-1].append((pos, cid))
    return out


@dataclass
class GroupMember:
    """One client of a group: its id, sampled position and data (numpy views of its shard)."""

    cid: int
    pos: int
    images: np.ndarray
    labels: np.ndarray


@dataclass
class MemberResult:
    weights: np.ndarray
    num_samples: int
    loss: float
    steps: int


class _StackedOptimizer:
    """SGD (momentum, weight decay) or Adam on tensors with a leading client axis, elementwise as
    ``torch.optim.SGD`` / ``torch.optim.Adam`` (defaults: dampening 0, no Nesterov; betas 0.9/0.999,
    eps 1e-8, L2 weight decay). All stacked clients have taken the same number of steps, so Adam's
    bias correction is shared. ``keep(a)`` drops every client row past the first ``a``."""

    def __init__(self, train, lr: float):
        self.kind = train.optimizer
        self.lr = float(lr)
        self.momentum = float(train.momentum)
        self.wd = float(train.weight_decay)
        self.state: dict[str, list[torch.Tensor]] = {}
        self.t = 0

    def keep(self, a: int) -> None:
        for k, ts in self.state.items():
            self.state[k] = [t[:a] for t in ts]

    @torch.no_grad()
    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        self.t += 1
        if self.wd:
            grads = [g.add(p, alpha=self.wd) for p, g in zip(params, grads)]
        if self.kind == "adam":
            b1, b2, eps = 0.9, 0.999, 1e-8
            if not self.state:
                self.state = {"m": [torch.zeros_like(p) for p in params], "v": [torch.zeros_like(p) for p in params]}
            bc1 = 1 - b1**self.t
            bc2_sqrt = math.sqrt(1 - b2**self.t)
            step_size = self.lr / bc1
            for p, g, m, v in zip(params, grads, self.state["m"], self.state["v"]):
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(eps), value=-step_size)
            return
        if self.momentum:
            if not self.state:
                self.state = {"buf": [g.clone() for g in grads]}
            else:
                for b, g in zip(self.state["buf"], grads):
                    b.mul_(self.momentum).add_(g)
            grads = self.state["buf"]
        for p, g in zip(params, grads):
            p.add_(g, alpha=-self.lr)


def _clip_per_client(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """``clip_grad_norm_`` per client row: total L2 norm over the client's gradients, coefficient
    ``max_norm / (norm + 1e-6)`` clamped to 1."""
    sq = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads]).sum(0)  # (a,)
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    return [g * coef.view(-1, *([1] * (g.dim() - 1))) for g in grads]


def _workspace(cache: dict | None, model: nn.Module, names: list[str], shapes: list[tuple], rows: int,
               device: torch.device) -> list[torch.Tensor]:
    """Stacked parameter buffers of at least ``rows`` clients, kept in ``cache`` (the runtime's) and reused
    by every group: large fresh allocations are returned to the OS after each use and cost a page fault
    per 4 KiB when touched again, which for a multi-megabyte model costs more than the training step."""
    key = (id(model), tuple(names), str(device))
    bufs = cache.get(key) if cache is not None else None
    if bufs is None or bufs[0].shape[0] < rows:
        bufs = [torch.empty((rows, *shape), dtype=torch.float32, device=device) for shape in shapes]
        if cache is not None:
            if len(cache) > 4:
                cache.clear()
            cache[key] = bufs
    return bufs


class _Group:
    """The stacked state of one group while it trains (see :func:`train_group`)."""

    def __init__(self, model, layout, gw: np.ndarray, members, *, rnd, seed, train, meta, normalize, augment,
                 device, prox_mu, workspaces):
        from fedray.algorithms.base import ClientContext
        from fedray.algorithms.training import batch_schedule

        self.model, self.gw, self.members = model, gw, members
        self.train, self.meta, self.normalize, self.augment, self.device = train, meta, normalize, augment, device
        self.prox_mu = float(prox_mu or 0.0)
        g = torch.from_numpy(gw if gw.flags.writeable else gw.copy()).to(device)
        self.slices = {name: (off, n, shape) for name, shape, off, n in layout.slices()}
        self.trainable = [name for name, p in model.named_parameters() if p.requires_grad]
        missing = [n for n in self.trainable if n not in self.slices]
        if missing:
            raise ValueError(f"trainable parameters {missing} are not in the flat layout")
        self.fixed = {name: g[off : off + n].view(shape) for name, (off, n, shape) in self.slices.items()
                      if name not in self.trainable}
        self.anchors = [g[self.slices[n][0] : self.slices[n][0] + self.slices[n][1]].view(self.slices[n][2])
                        for n in self.trainable]
        # per-member schedules (the exact batches of local_sgd) and generators
        self.scheds, self.gens, lrs = [], [], []
        for mem in members:
            ctx = ClientContext(cid=int(mem.cid), rnd=int(rnd), seed=int(seed), model=model, flat=None,
                                global_weights=gw, images=mem.images, labels=mem.labels, meta=meta, train=train,
                                device=device, normalize=normalize, augment=augment)
            self.scheds.append(list(batch_schedule(ctx)))
            self.gens.append(ctx.torch_generator("augment") if augment is not None else None)
            lrs.append(ctx.lr())
        self.steps = [len(s) for s in self.scheds]
        self.results: list[MemberResult | None] = [None] * len(members)
        for i, s in enumerate(self.steps):  # nothing to train (drop_last with fewer rows than a batch)
            if s == 0:
                self.results[i] = MemberResult(weights=gw.copy(), num_samples=int(members[i].labels.shape[0]),
                                               loss=math.nan, steps=0)
        self.order = sorted((i for i in range(len(members)) if self.steps[i] > 0), key=lambda i: -self.steps[i])
        self.a = len(self.order)
        self.totals = LossSum(device, rows=len(members))  # by stack row: row r is member order[r] throughout
        self.seen = [0] * len(members)
        if self.a:
            bufs = _workspace(workspaces, model, self.trainable, [self.slices[n][2] for n in self.trainable], self.a,
                              device)
            self.params = [buf[: self.a].detach().copy_(anc.unsqueeze(0).expand_as(buf[: self.a])).requires_grad_(True)
                           for buf, anc in zip(bufs, self.anchors)]
            self.opt = _StackedOptimizer(train, lrs[self.order[0]])
            fixed = self.fixed
            self.batched = vmap(lambda p, x: functional_call(model, {**p, **fixed}, (x,)), in_dims=(0, 0))

    def finish(self, upto: int) -> None:
        """Read out the weights of the stacked rows ``upto..a-1`` (clients that took their last step)."""
        for row in range(upto, self.a):
            i = self.order[row]
            w = self.gw.copy()
            for n, p in zip(self.trainable, self.params):
                off, cnt, _ = self.slices[n]
                w[off : off + cnt] = p[row].detach().reshape(-1).to("cpu").numpy()
            self.results[i] = MemberResult(weights=w, num_samples=int(self.members[i].labels.shape[0]),
                                           loss=self.totals.value(row) / self.seen[i] if self.seen[i] else math.nan,
                                           steps=self.steps[i])

    def shrink(self, t: int) -> None:
        """Before step ``t``: clients whose schedule ended leave the stack (always a suffix of it)."""
        active = sum(1 for i in self.order if self.steps[i] > t)
        if active < self.a:
            self.finish(active)
            self.a = active
            self.params = [p.detach()[:active].requires_grad_(True) for p in self.params]
            self.opt.keep(active)

    def batch(self, t: int):
        """Step ``t``'s padded batch of every stacked client: (xs, ys, mask, real row counts)."""
        a, bs, dev = self.a, int(self.train.batch_size), self.device
        # made on the host and copied in one transfer each (one per row and tensor would be 3a small copies)
        xs = torch.zeros((a, bs, *tuple(self.meta.shape)), dtype=torch.float32)
        ys = torch.zeros((a, bs), dtype=torch.int64)
        mask = torch.zeros((a, bs), dtype=torch.float32)
        counts = []
        for row in range(a):
            i = self.order[row]
            idx = self.scheds[i][t]
            xb = to_float(torch.from_numpy(self.members[i].images[idx]), self.meta, self.normalize)
            if self.augment is not None:
                xb = self.augment(xb, self.gens[i])
            b = int(idx.shape[0])
            xs[row, :b] = xb
            ys[row, :b] = torch.from_numpy(np.asarray(self.members[i].labels[idx], dtype=np.int64))
            mask[row, :b] = 1.0
            counts.append(b)
        if dev.type != "cpu":
            xs, ys, mask = (t.to(dev, non_blocking=True) for t in (xs, ys, mask))
        return xs, ys, mask, counts

    def step(self, t: int) -> None:
        a, bs = self.a, int(self.train.batch_size)
        xs, ys, mask, counts = self.batch(t)
        cnt = torch.tensor(counts, dtype=torch.float32, device=self.device)
        logits = self.batched(dict(zip(self.trainable, self.params)), xs)  # (a, bs, classes)
        ce = F.cross_entropy(logits.reshape(a * bs, -1), ys.reshape(-1), reduction="none").view(a, bs)
        loss = (ce * mask).sum(1) / cnt
        if self.prox_mu:
            sq = torch.stack([(p - anc).pow(2).flatten(1).sum(1) for p, anc in zip(self.params, self.anchors)]).sum(0)
            loss = loss + 0.5 * float(self.prox_mu) * sq
        grads = list(torch.autograd.grad(loss.sum(), self.params))
        if self.train.grad_clip is not None:
            grads = _clip_per_client(grads, float(self.train.grad_clip))
        self.opt.step(self.params, grads)
        self.totals.add_rows(loss, counts)
        for row in range(a):
            self.seen[self.order[row]] += counts[row]


def train_group(model: nn.Module, layout, global_weights: np.ndarray, members: list[GroupMember], *, rnd: int,
                seed: int, train, meta, normalize: bool, augment=None, device: torch.device | str = "cpu",
                prox_mu: float = 0.0, workspaces: dict | None = None) -> list[MemberResult]:
    """Train ``members`` (one round, all from ``global_weights``) at once; one result per member, in order.

    ``model`` is any module with the flat ``layout`` (:class:`fedray.core.weights.WeightLayout`); its own
    tensors are not modified. ``prox_mu`` adds ``prox_mu/2 ||w - w_global||^2`` to every client's loss
    (FedProx's mu, FedACG's client term). ``workspaces``: a dict in which stacked buffers are kept between
    calls. See the module docstring for the schedule and the equivalence with
    :func:`fedray.algorithms.training.local_sgd`.
    """
    device = torch.device(device)
    gw = np.asarray(global_weights, dtype=np.float32)
    if gw.shape != (layout.size,):
        raise ValueError(f"weight vector has shape {gw.shape}, the model's flat layout needs ({layout.size},)")
    grp = _Group(model, layout, gw, members, rnd=rnd, seed=seed, train=train, meta=meta, normalize=normalize,
                 augment=augment, device=device, prox_mu=prox_mu, workspaces=workspaces)
    if not grp.order:
        return grp.results  # type: ignore[return-value]
    was_training = model.training
    model.train()
    try:
        for t in range(grp.steps[grp.order[0]]):
            grp.shrink(t)
            grp.step(t)
        grp.finish(0)
    finally:
        model.train(was_training)
    return grp.results  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------- runtime
class GroupedRuntime:
    """Client runtime for ``engine.multi_client > 1``: trains a task's clients in groups
    (:func:`groups_of`) with :func:`train_group`; one :class:`~fedray.engine.outcomes.ClientOutcome` per
    client, in the task's order. Fault injection and data errors are per client (that client is left out
    of its group and reported failed); an error while training a group fails its clients."""

    def __init__(self, replica, states, faults, name: str):
        # stateful clients are refused by check_multi_client, so ``states`` is never needed here
        check_multi_client(replica.cfg, model=replica.model, algorithm=replica.algorithm)
        self.replica, self.faults, self.name = replica, faults, name
        self.m = int(replica.cfg.engine.multi_client)
        self.workspaces: dict = {}

    def _failed(self, pos, cid, err: BaseException, seconds: float) -> ClientOutcome:
        return ClientOutcome(cid=cid, pos=pos, weights=None, num_samples=0, loss=float("nan"), seconds=seconds,
                             worker=self.name, error=error_text(err), fatal=is_fatal(err))

    def _members(self, rnd: int, group, outcomes: dict, t0: float) -> list[GroupMember]:
        members = []
        for pos, cid in group:
            try:
                self.faults.client(rnd, cid)
                images, labels = self.replica.store.client_arrays(cid)
                members.append(GroupMember(cid=cid, pos=pos, images=images, labels=labels))
            except Exception as e:  # noqa: BLE001 - reported per client, the coordinator decides
                outcomes[pos] = self._failed(pos, cid, e, time.perf_counter() - t0)
        return members

    def run(self, rnd: int, weights, payload: dict, chunk: list[tuple[int, int]], hints) -> list[ClientOutcome]:
        rp = self.replica
        weights = np.asarray(weights)
        outcomes: dict[int, ClientOutcome] = {}
        for group in groups_of(chunk, self.m):
            t0 = time.perf_counter()
            members = self._members(rnd, group, outcomes, t0)
            if not members:
                continue
            try:
                res = train_group(rp.model, rp.flat.layout, weights, members, rnd=rnd, seed=int(rp.cfg.seed),
                                  train=rp.cfg.train, meta=rp.meta, normalize=bool(rp.cfg.data.normalize),
                                  augment=rp.augment, device=rp.device, prox_mu=hints.prox_mu,
                                  workspaces=self.workspaces)
            except Exception as e:  # noqa: BLE001
                dt = time.perf_counter() - t0
                for mem in members:
                    outcomes[mem.pos] = self._failed(mem.pos, mem.cid, e, dt / len(members))
                continue
            dt = time.perf_counter() - t0
            total_steps = sum(r.steps for r in res)
            for mem, r in zip(members, res):
                try:  # its rows were views of the mapped partition: unchanged while in use
                    rp.store.recheck_client(mem.cid)
                except Exception as e:  # noqa: BLE001 - reported per client (a DataError: the run stops)
                    outcomes[mem.pos] = self._failed(mem.pos, mem.cid, e, dt / len(members))
                    continue
                # the group's wall time, shared out in proportion to each client's steps
                share = r.steps / total_steps if total_steps else 1.0 / len(res)
                outcomes[mem.pos] = ClientOutcome(cid=mem.cid, pos=mem.pos, weights=r.weights,
                                                  num_samples=r.num_samples, loss=r.loss, seconds=dt * share,
                                                  worker=self.name)
        return [outcomes[pos] for pos, _ in chunk if pos in outcomes]
