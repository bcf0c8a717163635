"""The local training loop every federated algorithm shares (:func:`local_sgd`), its batch schedule, the
client optimizer and the proximal term of :class:`~fedray.algorithms.base.ClientHints`."""

from __future__ import annotations

import functools
import inspect
import math
import sys
from typing import Callable

import numpy as np
import torch
from torch.optim import optimizer as _torch_optimizer

from fedray.algorithms.context import ClientContext
from fedray.losses import proximal_term

__all__ = ["LossSum", "batch_schedule", "broadcast_proximal_term", "local_sgd", "make_optimizer",
           "make_torch_optimizer", "param_anchors"]


@functools.cache
def _optimizers_without_dynamo() -> None:
    """Let ``torch.optim.Optimizer``'s bookkeeping methods run without importing ``torch._dynamo``.

    torch wraps ``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` in
    ``torch._compile._disable_dynamo``, which imports ``torch._dynamo`` at the first call to turn dynamo off
    around the method: in every fresh process that builds an optimizer, 1.3 CPU-seconds and 70 MB (a cold
    run's round 1 paid it in each client worker). That wrapper caches the dynamo-disabled function on the
    method as ``__dynamo_disable``; cache the method itself instead. fedray never runs ``torch.compile``, so
    there is no dynamo frame to turn off and the call is the same. Nothing changes once ``torch._dynamo`` is
    imported (someone may compile), or on a torch whose wrapper differs. Once per process (cached). The step:
    :func:`_without_dynamo`."""
    if "torch._dynamo" in sys.modules:
        return
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return
    wrapper_code = _disable_dynamo(lambda: None).__code__
    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        method = vars(torch.optim.Optimizer).get(name)
        inner = getattr(method, "__wrapped__", None)
        if getattr(method, "__code__", None) is wrapper_code and inner is not None \
                and getattr(inner, "__dynamo_disable", None) is None:
            setattr(inner, "__dynamo_disable", inner)


def _hooks_or_profiler(opt: torch.optim.Optimizer) -> bool:
    """Whether a step of ``opt`` has optimizer hooks to run (its own or global ones) or a torch profiler to
    record into (checked at every step: module attributes, no import)."""
    return bool(opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
                or _torch_optimizer._global_optimizer_pre_hooks or _torch_optimizer._global_optimizer_post_hooks
                or torch.autograd._profiler_enabled())


@functools.cache
def _without_dynamo(cls: type) -> type:
    """``cls`` (a torch optimizer) with a ``step`` that runs the same update without importing
    ``torch._dynamo``: torch's ``_use_grad_for_differentiable`` wrapper imports it at every step to place a
    graph break around the update (meaningful only under ``torch.compile``) and sets the grad mode to
    ``defaults["differentiable"]``; this step sets the grad mode the same way and calls the update itself
    (``inspect.unwrap``).

    Optimizer hooks and the profiler: ``Optimizer.__init__`` wraps a class's ``step`` in
    ``profile_hook_step`` (a ``record_function`` range, the pre/post hooks), and ``zero_grad`` opens a range too;
    with neither hook nor profiler the two cost about 20 us a local step (the ranges are dispatcher calls): 11 %
    of a 3-row client's update on the scale workload (368 against 327 us, alternating in one process). This
    class's ``step`` (marked ``hooked``, so torch leaves it as it is) runs torch's wrapper whenever a hook is
    registered or a profiler records, and the update alone otherwise; ``zero_grad`` likewise sets the grads
    to None without the ``record_function`` range when no profiler records. The update is the same call in
    both cases: no bit moves."""
    update = inspect.unwrap(vars(cls)["step"]) if "step" in vars(cls) else None
    if update is None or update is vars(cls)["step"]:
        return cls  # no wrapper to skip: another torch

    def plain(self, closure=None):
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            return update(self, closure)

    hooked = torch.optim.Optimizer.profile_hook_step(plain)

    def step(self, closure=None):
        return hooked(self, closure) if _hooks_or_profiler(self) else plain(self, closure)

    step.hooked = True  # type: ignore[attr-defined]  # Optimizer._patch_step_function: already wrapped

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none or torch.autograd._profiler_enabled():
            return cls.zero_grad(self, set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        return None

    return type(cls.__name__, (cls,), {"step": step, "zero_grad": zero_grad, "__module__": __name__,
                                       "__doc__": cls.__doc__})


def make_torch_optimizer(train, params, lr: float) -> torch.optim.Optimizer:
    """``train.optimizer`` (sgd with momentum / weight decay, or adam) over ``params`` at ``lr``: torch's own
    classes and updates, used without importing ``torch._dynamo`` (:func:`_optimizers_without_dynamo`,
    :func:`_without_dynamo`)."""
    _optimizers_without_dynamo()
    if train.optimizer == "adam":
        return _without_dynamo(torch.optim.Adam)(params, lr=lr, weight_decay=train.weight_decay)
    return _without_dynamo(torch.optim.SGD)(params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)


def make_optimizer(ctx: ClientContext, params) -> torch.optim.Optimizer:
    """The client's optimizer of this round (learning rate decayed per round)."""
    return make_torch_optimizer(ctx.train, params, ctx.lr())


def local_sgd(ctx: ClientContext, loss_fn: Callable, *, after_step: Callable | None = None) -> float:
    """The standard local training loop shared by every federated algorithm.

    Epoch ``e`` visits the client's samples in the order of the e-th permutation drawn from
    ``ctx.rng("order")`` (epoch 1 is exactly the benchmark workload's order), batches of
    ``train.batch_size`` (last one smaller unless ``drop_last``); with ``train.local_steps = T`` exactly T
    batches of that stream instead (:func:`batch_schedule`); ``loss_fn(model, x, y)`` per batch,
    optional gradient-norm clipping, one optimizer step. Returns the sample-weighted mean loss.
    """
    from fedray.data.loader import train_batches

    model = ctx.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(ctx, params)
    prox = broadcast_proximal_term(ctx, params)
    t = ctx.train
    gen = ctx.torch_generator("augment") if ctx.augment is not None else None
    total, seen = LossSum(ctx.device), 0
    for xb, yb in train_batches(ctx.images, ctx.labels, batch_schedule(ctx), ctx.meta, ctx.normalize, ctx.device,
                                ctx.augment, gen):
        opt.zero_grad()
        loss = loss_fn(model, xb, yb)
        if prox is not None:
            loss = loss + prox()
        loss.backward()
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, float(t.grad_clip))
        opt.step()
        if after_step is not None:
            after_step()
        b = int(yb.shape[0])
        total.add(loss, b)
        seen += b
    return total.value() / seen if seen else math.nan


class LossSum:
    """Sample-weighted sums of batch losses, ``sum_b loss_b * n_b`` in float64: one sum, or one per row of a
    stack of clients (``rows``, :mod:`fedray.engine.client.grouped`).

    On a CUDA device the sums stay on the device (float64 tensors), so that no training step waits for the GPU:
    reading the loss at every step (``float(loss)``) synchronises the host with the device and keeps the host
    from queueing the next step's kernels while the GPU runs this one. The device does the host's operations
    (float32 -> float64, times the integer count, add) in the same order, so the sums are the same numbers; they
    are read once, at the end (:meth:`value`). Elsewhere (CPU, or MPS, which has no float64) plain Python floats.
    """

    def __init__(self, device: torch.device | str, rows: int | None = None, *, in_tensors: bool | None = None):
        # in_tensors: None = on a CUDA device only; True keeps tensor sums on any device (the tests compare both)
        self.on_device = torch.device(device).type == "cuda" if in_tensors is None else bool(in_tensors)
        if self.on_device:
            self.total: torch.Tensor | float | list[float] = torch.zeros(() if rows is None else (rows,),
                                                                         dtype=torch.float64, device=device)
        else:
            self.total = 0.0 if rows is None else [0.0] * rows

    def add(self, loss: torch.Tensor, count: int) -> None:
        """Add one batch's mean loss (a 0-d tensor) times its ``count`` samples."""
        if self.on_device:
            self.total += loss.detach().double() * count
        else:
            self.total += float(loss.detach()) * count

    def add_rows(self, losses: torch.Tensor, counts: list[int]) -> None:
        """Add the mean losses of rows ``0..len(counts)-1`` (a 1-d tensor) times their sample counts."""
        a = len(counts)
        if self.on_device:
            self.total[:a] += losses.detach().double() * torch.tensor(counts, dtype=torch.float64, device=losses.device)
        else:
            lv = losses.detach().to("cpu").tolist()
            for row in range(a):
                self.total[row] += float(lv[row]) * counts[row]

    def value(self, row: int | None = None) -> float:
        """The sum (of ``row``, with ``rows``)."""
        t = self.total if row is None else self.total[row]
        return float(t)


def batch_schedule(ctx: ClientContext):
    """The row indices of every local step of :func:`local_sgd`, in order: epoch ``e`` is the e-th
    permutation drawn from ``ctx.rng("order")``, cut into batches of ``train.batch_size`` (the last one
    smaller unless ``drop_last``). Multi-client training uses the same schedule.

    ``train.local_steps = T`` (when set) replaces the epochs by exactly T steps: the first T batches of that
    same stream of keyed permutations (a new epoch starts whenever one is used up), so T = epochs x batches
    per epoch gives the epoch schedule. No step when an epoch has no batch (``drop_last`` with fewer rows than
    a batch, or no rows)."""
    t = ctx.train
    n = ctx.num_samples
    bs = int(t.batch_size)
    stop = (n // bs) * bs if t.drop_last else n
    steps = getattr(t, "local_steps", None)
    if stop <= 0:
        return
    order = ctx.rng("order")
    if steps is None:
        for _epoch in range(int(t.local_epochs)):
            perm = order.permutation(n)
            for i in range(0, stop, bs):
                yield perm[i : i + bs]
        return
    left = int(steps)
    while left > 0:
        perm = order.permutation(n)
        for i in range(0, stop, bs):
            yield perm[i : i + bs]
            left -= 1
            if left == 0:
                return


def param_anchors(ctx: ClientContext, vec: np.ndarray, params=None) -> list[torch.Tensor]:
    """Views of a flat weight vector ``vec`` (same layout as ``ctx.flat``) shaped like the trainable
    parameters ``params`` of ``ctx.model`` (default: all with ``requires_grad``), on ``ctx.device``.

    Used for proximal anchors (the broadcast weights) and per-parameter client state (FedDyn)."""
    vec = np.asarray(vec, dtype=np.float32)
    if vec.shape != (ctx.flat.layout.size,):
        raise ValueError(f"weight vector has shape {vec.shape}, the model's flat layout needs ({ctx.flat.layout.size},)")
    if not vec.flags.writeable:  # zero-copy arrays from the object store are read-only
        vec = vec.copy()
    t = torch.from_numpy(vec).to(ctx.device)
    by_name = {name: (off, n) for name, _, off, n in ctx.flat.layout.slices()}
    name_of = {id(p): name for name, p in ctx.model.named_parameters()}
    if params is None:
        params = [p for p in ctx.model.parameters() if p.requires_grad]
    out = []
    for p in params:  # in the caller's order
        off, n = by_name[name_of[id(p)]]
        out.append(t[off : off + n].view_as(p))
    return out


def broadcast_proximal_term(ctx: ClientContext, params) -> Callable[[], torch.Tensor] | None:
    """The client proximal term of :class:`ClientHints` (FedProx's mu, FedACG's beta), for every algorithm
    that trains with :func:`local_sgd`: ``prox_mu/2 * sum_k ||theta_k - theta_broadcast,k||^2``
    (:func:`fedray.losses.proximal_term`) over the trainable parameters (the anchor is
    ``ctx.global_weights``, the weights the client received). None when ``ctx.prox_mu`` is 0."""
    mu = float(ctx.prox_mu or 0.0)
    if mu == 0.0:
        return None
    if not math.isfinite(mu) or mu < 0:
        raise ValueError(f"prox_mu must be a finite number >= 0, got {ctx.prox_mu!r}")
    params = list(params)
    anchors = param_anchors(ctx, ctx.global_weights, params)
    return lambda: proximal_term(params, anchors, mu)
