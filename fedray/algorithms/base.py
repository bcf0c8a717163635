"""The algorithm plug-in interface: :class:`Algorithm` and the types its hooks exchange. The local training loop
is :mod:`fedray.algorithms.training`, the registry :mod:`fedray.algorithms.registry`.

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

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.context import ClientContext, ClientHints, ClientUpdate
from fedray.algorithms.training import local_sgd
from fedray.config import ConfigError
from fedray.core.params import ParamSpec, check_params

__all__ = ["Algorithm", "ClientContext", "ClientHints", "ClientUpdate", "cross_entropy_loss", "reject_defaults_table"]


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
        """Extra fields of the round report, read after ``after_aggregate`` (e.g. FedCCL's ``num_signals``); a
        name the report holds already stops the run. The engine measures the bytes of ``broadcast``'s payload
        and of the clients' ``extras`` itself (the row's ``bytes.signals_*`` and ``bytes_signals``)."""
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


def reject_defaults_table(cls: type) -> None:
    """A plug-in class (algorithm or server optimizer) declaring the retired ``defaults`` dict would have its
    parameters silently ignored: fail at class creation instead."""
    if "defaults" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: declare parameters as params_spec = {{name: ParamSpec(default, doc, ...)}}, "
                        "not as a defaults dict")
