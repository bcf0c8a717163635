"""The algorithm plug-in interface and the registry.

An algorithm is one class with a server side (run by the coordinator) and a client side (run by the
client workers, one virtual client at a time). The engine owns everything else: sampling, broadcasting
the weights once per round, dispatch, fault handling, the ordered weighted average, the server
optimizer, evaluation, checkpoints.

Federated round program (``program = "federated"``)::

    payload = algo.broadcast(rnd, server_weights, state)          # coordinator: extras for clients
    for each sampled client (on workers, in parallel):
        upd = algo.local_update(ctx, payload)                     # ctx.model holds the broadcast weights
    avg = sum_k a_k * upd_k.weights  (a_k = algo.client_weight(n_k) / sum, folded in sampled order)
    new = server_opt.step(weights, avg)                          # FedAvgM, FedAdam, FedACG or identity
    new, state = algo.after_aggregate(rnd, new, [upd_k.extras], state, broadcast=server_weights)

What the engine reads of an algorithm besides these hooks is typed: ``client_hints()`` (a
:class:`ClientHints`, merged with the server optimizer's), ``round_metrics()`` (extra report fields) and
``adapt_model(model)`` (the model the algorithm trains, e.g. MOON's projection head around the configured one).
The split program (SCALA and SplitFed) declares ``program = "split"`` and the hooks of
:mod:`fedray.algorithms.split`; the coordinator picks the round program once, from ``program``.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedray.config import ConfigError
from fedray.core.params import ParamSpec, check_params
from fedray.core.registry import Registry, RegistryError
from fedray.core.seeds import PURPOSES
from fedray.losses import proximal_term


@dataclass(frozen=True)
class ClientHints:
    """What the server side tells every client's local training besides the payload, typed.

    ``prox_mu``: weight of the proximal term ``prox_mu/2 ||theta - theta_broadcast||^2`` that
    :func:`local_sgd` (and multi-client training) adds to the local loss; the anchor is the broadcast
    weights. FedProx sets it from its ``mu``, FedACG's server optimizer from its ``beta``; hints of the
    algorithm and of the server optimizer add up (:meth:`merge`)."""

    prox_mu: float = 0.0

    def merge(self, other: "ClientHints") -> "ClientHints":
        return ClientHints(prox_mu=float(self.prox_mu) + float(other.prox_mu))


@dataclass
class ClientContext:
    """Everything a client update may use. Built by the worker for one (round, client)."""

    cid: int
    rnd: int
    seed: int
    model: torch.nn.Module  # holds the broadcast weights on entry
    flat: Any  # fedray.core.weights.FlatParams bound to ``model``
    global_weights: np.ndarray  # the broadcast weights (read-only view)
    images: np.ndarray  # this client's images (zero-copy from its shard)
    labels: np.ndarray
    meta: Any  # DatasetMeta
    train: Any  # TrainConfig
    device: torch.device
    normalize: bool
    augment: Any = None  # fedray.data.loader.Augment or None
    state: dict | None = None  # this client's persisted state (stateful algorithms), None at first visit
    num_classes: int = 0
    model_factory: Callable[[], torch.nn.Module] | None = None  # builds another replica (e.g. MOON's global copy)
    # ClientHints.prox_mu of the round (FedProx's mu, FedACG's beta): local_sgd adds
    # prox_mu/2 * ||theta - theta_broadcast||^2 to every algorithm's loss (0 = off)
    prox_mu: float = 0.0

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def rng(self, purpose: str, *extra: int) -> np.random.Generator:
        """numpy generator keyed by (seed, round, client, purpose[, extra]). ``order`` keeps the exact
        key [seed, round, client] of the benchmark workload."""
        if purpose == "order" and not extra:
            return np.random.default_rng([self.seed, self.rnd, self.cid])
        return np.random.default_rng([self.seed, self.rnd, self.cid, 1000 + PURPOSES[purpose], *extra])

    def torch_generator(self, purpose: str, *extra: int) -> torch.Generator:
        g = torch.Generator(device="cpu")
        g.manual_seed(int(self.rng(purpose, *extra).integers(0, 2**63 - 1)))
        return g

    def lr(self) -> float:
        return float(self.train.lr) * float(self.train.lr_decay) ** (self.rnd - 1)


@dataclass
class ClientUpdate:
    """What a client returns. ``weights`` is the trained flat float32 vector."""

    weights: np.ndarray
    num_samples: int
    loss: float
    extras: dict = field(default_factory=dict)  # small per-client payloads for after_aggregate
    state: dict | None = None  # new client state to persist (stateful algorithms)


class Algorithm:
    """Base class. Subclasses set ``name``, ``params_spec`` and override the hooks they need.

    ``params_spec`` declares every parameter as a :class:`~fedray.core.params.ParamSpec` (default, doc, type,
    bounds, choices); a subclass that adds parameters to its parent's writes ``{**Parent.params_spec, ...}``.
    ``__init__`` resolves the given params against it (defaults filled in, unknown keys and wrong types or
    ranges rejected as ``algorithm.params.<name>: ...``) into ``self.params``; :meth:`validate` is left for
    the rules one value cannot express (several fields, the experiment config, value normalisation)."""

    name: str = ""
    program: str = "federated"
    stateful_clients: bool = False
    params_spec: dict[str, ParamSpec] = {}
    description: str = ""
    # Multi-client execution (``engine.multi_client > 1``, fedray.engine.client.grouped) trains several clients at
    # once with stacked parameters, for local losses CE(model(x), y) + mu/2 ||w - w_broadcast||^2 only. A class
    # opts in by setting this *itself*: it is not inherited, since subclasses usually change the loss.
    supports_multi_client: bool = False
    # What the algorithm needs of the model besides ``forward(x) -> logits``, checked before any work
    # (:func:`fedray.plugins.check_model_needs`): "features" (``forward_features`` with an ``embedding`` tap) and
    # "split" (named split points): a :class:`~fedray.models.base.FedModel`, e.g. ``FedModel.wrap(features,
    # classifier)``. A plain ``torch.nn.Module`` serves every algorithm that declares nothing.
    model_needs: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        reject_defaults_table(cls)

    def __init__(self, params: dict | None, cfg=None):
        self.params = check_params(dict(params or {}), self.params_spec, "algorithm.params", ConfigError)
        self.cfg = cfg
        self.validate()

    def validate(self) -> None:
        """Rules beyond the per-value checks of ``params_spec`` (several fields, ``self.cfg``); raise
        ConfigError('algorithm.params.x: ...')."""

    # ----------------------------------------------------------------- server side
    def init_state(self, weights: np.ndarray) -> dict:
        """Algorithm server state (numpy / python values only: it is checkpointed)."""
        return {}

    def broadcast(self, rnd: int, weights: np.ndarray, state: dict) -> dict:
        """Extras sent to every client of the round next to the weights."""
        return {}

    def client_weight(self, num_samples: int) -> float:
        """Unnormalised aggregation weight of a client (FedAvg: its sample count)."""
        return float(num_samples)

    def after_aggregate(self, rnd: int, weights: np.ndarray, extras: list[dict], state: dict, *,
                        broadcast: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
        """Server-side work after averaging (FedDyn correction, FedCCL global clustering, ...).

        ``weights``: the server optimizer's output; ``extras``: the clients' extras in sampled order;
        ``broadcast``: the weights the round's clients started from (None in unit tests that do not need it)."""
        return weights, state

    def client_hints(self) -> ClientHints:
        """Hints for every client's local training (FedProx: its proximal weight)."""
        return ClientHints()

    def adapt_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model this algorithm trains, built from the configured one (default: unchanged). The engine
        calls it every time it builds a model (:meth:`fedray.engine.replica.Replica.model_factory`: the
        initial global model, every worker's replica and the frozen copies), so all of them share one
        architecture and one flat weight layout; e.g. MOON adds its projection head here."""
        return model

    def round_metrics(self, rnd: int, state: dict, num_sampled: int) -> dict:
        """Extra fields of the round report, read after ``after_aggregate``; a ``"bytes"`` mapping is merged
        into the report's byte counts (e.g. FedCCL's signal bytes)."""
        return {}

    # ----------------------------------------------------------------- client side
    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        loss = local_sgd(ctx, self.make_loss(ctx, payload))
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss)

    def make_loss(self, ctx: ClientContext, payload: dict) -> Callable:
        """Return ``loss(model, x, y) -> scalar tensor`` for :func:`local_sgd`."""
        return cross_entropy_loss



def cross_entropy_loss(model, x, y):
    return F.cross_entropy(model(x), y)


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


@functools.cache
def _without_dynamo(cls: type) -> type:
    """``cls`` (a torch optimizer) with a ``step`` that runs the same update without importing
    ``torch._dynamo``: torch's ``_use_grad_for_differentiable`` wrapper imports it at every step to place a
    graph break around the update (meaningful only under ``torch.compile``) and sets the grad mode to
    ``defaults["differentiable"]``; this step sets the grad mode the same way and calls the update itself
    (``inspect.unwrap``). Optimizer hooks still run (Optimizer.__init__ wraps ``step`` for them)."""
    update = inspect.unwrap(vars(cls)["step"]) if "step" in vars(cls) else None
    if update is None or update is vars(cls)["step"]:
        return cls  # no wrapper to skip: another torch

    def step(self, closure=None):
        with torch.set_grad_enabled(bool(self.defaults.get("differentiable", False))):
            return update(self, closure)

    return type(cls.__name__, (cls,), {"step": step, "__module__": __name__, "__doc__": cls.__doc__})


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
    from fedray.data.loader import to_float

    model = ctx.model
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(ctx, params)
    prox = broadcast_proximal_term(ctx, params)
    t = ctx.train
    gen = ctx.torch_generator("augment") if ctx.augment is not None else None
    total, seen = 0.0, 0
    images = ctx.images
    labels = ctx.labels
    for idx in batch_schedule(ctx):
        xb = to_float(torch.from_numpy(images[idx]), ctx.meta, ctx.normalize)
        yb = torch.from_numpy(labels[idx])
        if ctx.augment is not None:
            xb = ctx.augment(xb, gen)
        if ctx.device.type != "cpu":
            xb = xb.to(ctx.device, non_blocking=True)
            yb = yb.to(ctx.device, non_blocking=True)
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
        total += float(loss.detach()) * b
        seen += b
    return total / seen if seen else math.nan


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


def reject_defaults_table(cls: type) -> None:
    """A plug-in class (algorithm or server optimizer) declaring the retired ``defaults`` dict would have its
    parameters silently ignored: fail at class creation instead."""
    if "defaults" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: declare parameters as params_spec = {{name: ParamSpec(default, doc, ...)}}, "
                        "not as a defaults dict")


# ------------------------------------------------------------------------------- registry
ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "fedray.register_algorithm")
#: what an algorithm may need of a model (``Algorithm.model_needs``), as errors describe it
MODEL_NEEDS = {"features": "feature taps (forward_features(x, taps) with an 'embedding' tap)",
               "split": "split points (split(point) into a client and a server part)"}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: register an :class:`Algorithm` subclass under its ``name`` (the built-ins use it; a
    plugin's public name for it is :func:`fedray.register_algorithm`). A name another module registered is
    refused, naming both modules."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise RegistryError(f"register_algorithm: expected a subclass of fedray.algorithms.Algorithm, got {cls!r}")
    if not cls.name:
        raise RegistryError(f"register_algorithm: {cls.__module__}.{cls.__qualname__} has no name (set the class "
                            f"attribute name = '...')")
    if cls.program not in ("federated", "split"):
        raise RegistryError(f"register_algorithm: {cls.__qualname__}.program must be 'federated' or 'split', got "
                            f"{cls.program!r}")
    bad = sorted(set(cls.model_needs) - set(MODEL_NEEDS)) if isinstance(cls.model_needs, tuple) else [cls.model_needs]
    if bad:
        raise RegistryError(f"register_algorithm: {cls.__qualname__}.model_needs must be a tuple of "
                            f"{' / '.join(map(repr, MODEL_NEEDS))}, got {cls.model_needs!r}")
    ALGORITHMS.add(cls.name, cls, cls.__module__)
    return cls


def build_algorithm(name: str, params: dict | None, cfg=None) -> Algorithm:
    from fedray import algorithms  # noqa: F401  (imports every module so they register)

    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm.name: unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHMS))})")
    return ALGORITHMS[name](params, cfg)


def algorithm_of(cfg) -> Algorithm:
    """The algorithm an experiment config names (``algorithm.name`` with ``algorithm.params``)."""
    return build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
