"""Split federated learning: SCALA and the SplitFed baselines (``program = "split"``).

The model is cut at a split point (``algorithm.params.split_point``, default the model's
``default_split``; ``alexnet_split`` cuts after its first 6 layers) into a client-side part h(w_c) and a
server-side part f(w_s). The engine's split round program (:mod:`fedray.engine.programs.split`) runs, per round:

1. sample clients (the federated sampler), per-client batch sizes
   ``B_k = max(1, floor(B * |D_k| / sum_j |D_j|))`` (capped at ``|D_k|``), ``B = params.batch_size``;
2. for each of ``params.local_iters`` local iterations: every client forwards its next minibatch through
   its client-side model on a worker; activations ``A_k`` and labels ``Y_k`` go to the coordinator, which
   calls :meth:`SplitAlgorithm.server_iteration` (the part that differs between the methods below) with
   the activations in sampled order; the returned gradient rows go back and each client back-propagates
   them through h and takes an optimizer step;
3. the client-side models are averaged weighted by ``|D_k|`` (folded in sampled order); the server-side
   model(s) are handled as the method says.

All methods use the client optimizer settings of ``train`` (``optimizer``, ``lr`` decayed by
``lr_decay`` per round, ``momentum``, ``weight_decay``, ``grad_clip``) on both sides, except that
``params.server_lr`` (if set) replaces ``train.lr`` for the server-side model. ``train.batch_size`` and
``train.local_epochs`` are not used by split methods (``params.batch_size`` / ``params.local_iters`` are;
``train.local_steps`` is refused).

| name             | server side                                                         | client side              |
|------------------|---------------------------------------------------------------------|--------------------------|
| ``scala``        | one model, one step per iteration on the concatenated batch, loss    | gradients of Eq. 15      |
|                  | CE(z + log P_s) (Eq. 14)                                             | (logit-adjusted by P_k)  |
| ``splitfed_v1``  | one copy per client (from the global one each round), CE, copies     | exact back-prop,         |
|                  | trained in parallel and averaged at round end                        | averaged                 |
| ``splitfed_v2``  | one model, updated sequentially over the clients (seeded random      | exact back-prop,         |
|                  | order per round): client after client (``order: iteration``: within  | averaged                 |
|                  | every iteration)                                                     |                          |
| ``splitfed_v3``  | as V1 (per-client copies, averaged)                                  | kept local (client state)|
| ``sfl_local_loss``| one model, CE on the concatenated activations                       | auxiliary head, local    |
|                  |                                                                      | loss, no gradient return |

The server-side optimizer state of the single-model methods (momentum / Adam moments) persists across
rounds in the algorithm state (checkpointed); copies (V1, V3) start a fresh optimizer every round, like the
clients. Dropout in the server-side part is seeded per (seed, round, iteration, forward call), in the
client-side part per (seed, round, client, iteration), so every run is reproducible bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedray.algorithms.base import Algorithm
from fedray.algorithms.registry import register
from fedray.config import ConfigError
from fedray.core.params import ParamSpec
from fedray.losses import ZERO_MODES, label_prior, logit_adjusted_ce

__all__ = [
    "SplitBatch",
    "SplitShape",
    "IterationResult",
    "SplitAlgorithm",
    "Scala",
    "SplitFedV1",
    "SplitFedV2",
    "SplitFedV3",
    "SFLLocalLoss",
]

# the logit adjustment's zero-frequency handling, shared with FedLogit (fedray.algorithms.logit)
ZERO_MODE_SPEC = ParamSpec("clamp", "zero label frequencies: 'clamp' (log max(P, eps)) or 'exclude' (class left out "
                           "of the softmax)", str, choices=ZERO_MODES)
EPS_SPEC = ParamSpec(1e-9, "floor of the clamped label frequencies", float, gt=0, lt=1)


@dataclass
class SplitBatch:
    """One local iteration's uploads, in sampled order (what the server sees).

    activations[k] / labels[k]: client k's activations (B_k, ...) and labels (B_k,) on the server device;
    class_counts[k]: client k's whole local label counts (C,) (the manifest's, for ``prior: local``).
    """

    positions: list[int]
    cids: list[int]
    activations: list[torch.Tensor]
    labels: list[torch.Tensor]
    class_counts: np.ndarray
    num_classes: int

    @property
    def sizes(self) -> list[int]:
        return [int(y.shape[0]) for y in self.labels]

    def __len__(self) -> int:
        return len(self.cids)

    def concat(self, requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, Y): the concatenation in sampled order; ``A`` is a fresh leaf (``requires_grad`` if asked)."""
        a = torch.cat([t.detach() for t in self.activations], 0)
        if requires_grad:
            a.requires_grad_(True)
        return a, torch.cat(self.labels, 0)

    def split_rows(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Cut a (sum B_k, ...) tensor back into the clients' row blocks."""
        return list(torch.split(t, self.sizes, 0))

    def client_priors(self, kind: str) -> torch.Tensor:
        """Per-row prior (sum B_k, C): row i holds P_k of the client k it came from.

        ``kind="local"``: the client's whole local label distribution; ``"batch"``: the label frequencies
        of the client's current minibatch."""
        rows = []
        dev = self.labels[0].device
        if kind == "local":  # every client's counts cross to the device in one copy; checked on the host
            counts_np = np.asarray(self.class_counts, dtype=np.float32)
            counts_all = torch.as_tensor(counts_np, device=dev)
        for k, y in enumerate(self.labels):
            if kind == "local":
                if float(counts_np[k].sum()) <= 0:  # a manifest without counts: fall back to the batch
                    p = label_prior(y, self.num_classes)
                else:
                    counts = counts_all[k]
                    p = counts / counts.sum()
            else:
                p = label_prior(y, self.num_classes)
            rows.append(p.to(dev).expand(int(y.shape[0]), self.num_classes))
        return torch.cat(rows, 0)


@dataclass
class IterationResult:
    """What a server iteration returns.

    grads: per client (sampled order) the gradient rows of its activations, or None (no gradient return);
    loss: the server-side training loss of the iteration (mean over the concatenated batch);
    client_losses: per client, the plain CE of the server-side logits on its rows (for the ledger);
    metrics: extra scalars averaged over the iterations into the round report (e.g. SCALA's client loss).
    """

    grads: list[torch.Tensor] | None
    loss: float
    client_losses: list[float]
    metrics: dict[str, float] = field(default_factory=dict)


def _row_ce(z: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[float]:
    """Each client's mean cross-entropy over its rows (NaN for a client without rows), read from the device
    in one transfer: one synchronisation an iteration, not one a client."""
    with torch.no_grad():
        per = F.cross_entropy(z.detach().float(), y, reduction="none")
        parts = torch.split(per, sizes, 0)
        means = [t.mean() for t in parts if t.numel()]
        got = iter(torch.stack(means).tolist() if means else [])
        return [next(got) if t.numel() else math.nan for t in parts]


@dataclass(frozen=True)
class SplitShape:
    """How a split method runs: the one description of it the engine reads.

    - ``returns_gradients``: the server sends activation gradients back (False: clients learn locally);
    - ``client_models``: ``"average"`` (FedAvg of the client-side models each round) or ``"local"``
      (each client keeps its own client-side model as client state; the global client-side part is still
      the weighted average, used for evaluation and as the start model of first-time clients);
    - ``server_copies``: one server-side copy per participating client, averaged at round end;
    - ``sequential_clients``: the clients go through their local iterations one after another (in the
      server's seeded random order of the round), each client's whole local training meeting the server
      before the next client starts; otherwise all clients take every iteration together;
    - ``local_iters`` / ``batch_size``: the method's parameters (SCALA's T and B; 0 in a declaration).
    """

    returns_gradients: bool = True
    client_models: str = "average"
    server_copies: bool = False
    sequential_clients: bool = False
    local_iters: int = 0
    batch_size: int = 0


class SplitAlgorithm(Algorithm):
    """Base of the split methods; by itself it is concatenated-activation split learning with plain CE
    (the paper's Algorithm 1 without logit adjustment), which SCALA specialises.

    A subclass declares its shape in ``declared`` (a :class:`SplitShape`); the engine reads only
    :attr:`shape`, which adds the parameters ``local_iters`` and ``batch_size``.
    """

    program = "split"
    model_needs = ("split",)
    declared = SplitShape()
    params_spec = {
        "batch_size": ParamSpec(320, "B: the round's total batch, split over the clients by their sizes", int, ge=1),
        "local_iters": ParamSpec(5, "local iterations per round", int, ge=1),
        "split_point": ParamSpec(None, "where the model is cut (null: the model's default split)", str, nullable=True),
        "server_lr": ParamSpec(None, "learning rate of the server-side model (null: train.lr)", float, ge=0,
                               nullable=True),
    }

    @property
    def shape(self) -> SplitShape:
        return replace(self.declared, local_iters=int(self.params["local_iters"]),
                       batch_size=int(self.params["batch_size"]))

    @property
    def stateful_clients(self) -> bool:  # the worker opens the client-state store for "local" models
        return self.declared.client_models == "local"

    def validate(self) -> None:
        cfg = self.cfg
        if cfg is not None:
            if cfg.server.name != "none":
                raise ConfigError(f"server.name: {self.name!r} is a split algorithm; server optimizers "
                                  f"({cfg.server.name!r}) only compose with federated algorithms, use 'none'")
            if cfg.engine.over_selection:
                raise ConfigError(f"engine.over_selection: not supported by the split program ({self.name!r}): "
                                  "every sampled client takes part in every local iteration")
            if cfg.engine.round_deadline_s is not None:
                raise ConfigError(f"engine.round_deadline_s: not supported by the split program ({self.name!r})")
            if getattr(cfg.train, "local_steps", None) is not None:
                raise ConfigError(f"train.local_steps: not used by the split program ({self.name!r}); its local "
                                  "iterations per round are algorithm.params.local_iters")

    # ------------------------------------------------------------------------------------ model
    def split_point_for(self, model) -> str:
        """The cut used with ``model`` (``params.split_point`` or the model's default split)."""
        sp = self.params["split_point"] or getattr(model, "default_split", None)
        name = getattr(model, "model_name", type(model).__name__)
        points = list(getattr(model, "split_points", ()))
        if sp is None:
            raise ConfigError(f"algorithm.params.split_point: model {name!r} has no default split point; "
                              f"set one of {points}")
        if sp not in points:
            raise ConfigError(f"algorithm.params.split_point: unknown split point {sp!r} for model {name!r} "
                              f"(split points: {points})")
        return sp

    def aux_head(self, act_shape: tuple[int, ...], num_classes: int) -> nn.Module | None:
        """Client-side auxiliary module trained with the client-side model (None: no auxiliary head)."""
        return None

    def client_local_loss(self, aux_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Local loss of methods without gradient returns (computed on the client's auxiliary logits)."""
        return F.cross_entropy(aux_logits, labels)

    def server_lr(self, base_lr: float) -> float:
        lr = self.params["server_lr"]
        return float(base_lr if lr is None else lr)

    # ------------------------------------------------------------------------------------ server
    def server_iteration(self, srv, batch: SplitBatch) -> IterationResult:
        """One local iteration on the coordinator. ``srv`` (:class:`fedray.engine.programs.split_server.SplitServer`)
        gives ``srv.main`` / ``srv.copies``, ``srv.forward(model, x)`` and
        ``srv.step(model, loss, wrt=(...))`` (gradients w.r.t. ``wrt`` plus an optimizer step).

        Default: one server model on the concatenated batch with plain CE; the gradient rows are the exact
        back-propagated gradient of that loss (computed at the pre-step server weights)."""
        a, y = batch.concat(requires_grad=True)
        z = srv.forward(srv.main, a)
        loss = F.cross_entropy(z, y)
        (ga,) = srv.step(srv.main, loss, wrt=(a,))
        return IterationResult(batch.split_rows(ga), float(loss.detach()), _row_ce(z, y, batch.sizes))


@register
class Scala(SplitAlgorithm):
    """SCALA (Yang & Liu): concatenated activations + logit adjustment on both sides (METHODS.md §3).

    Server loss ``CE(z + log P_s)`` over the concatenated batch (Eq. 14), P_s its label frequencies
    (``server_prior: batch``; ``clients`` uses the participating clients' whole local counts instead).
    Client gradients (Eq. 8 with the client loss of Eq. 15): client k receives
    ``G_k = d/dA_k (1/B_k) sum_{i in k} CE(z_i + log P_k)``, the gradient of *its own* loss, the mean over
    its B_k rows (``grad_scale: client``, the default), evaluated at the *pre-step* server weights (the same
    forward as the server loss). Option ``grad_scale: concat`` keeps the older form, the rows of the mean
    over the concatenated batch (scale 1/sum B_j, which shrinks client k's step by B_k / sum B_j).
    ``prior: local`` (default) is client k's local label distribution, ``batch`` its current minibatch's.
    Zero frequencies: ``zero_mode: clamp`` (log of max(P, eps), eps 1e-9) or ``exclude`` (class left out
    of the softmax). With one client and ``prior: batch`` the client gradient is exact back-propagation.
    """

    name = "scala"
    description = "SCALA: split FL on concatenated activations with logit adjustment (server + clients)"
    params_spec = {
        **SplitAlgorithm.params_spec,
        "prior": ParamSpec("local", "client prior P_k: its whole label distribution ('local') or its minibatch's "
                           "('batch')", str, choices=("local", "batch")),
        "server_prior": ParamSpec("batch", "server prior P_s: label frequencies of the concatenated batch ('batch') "
                                  "or the participating clients' local counts ('clients')", str,
                                  choices=("batch", "clients")),
        "zero_mode": ZERO_MODE_SPEC,
        "eps": EPS_SPEC,
        "grad_scale": ParamSpec("client", "client gradient rows: the gradient of the client's own mean loss "
                                "(Eq. 8, 'client') or of the mean over the concatenated batch ('concat')", str,
                                choices=("client", "concat")),
    }

    def server_iteration(self, srv, batch: SplitBatch) -> IterationResult:
        p = self.params
        eps, zm = float(p["eps"]), p["zero_mode"]
        a, y = batch.concat(requires_grad=True)
        z = srv.forward(srv.main, a)
        if p["server_prior"] == "batch":
            p_s = label_prior(y, batch.num_classes)
        else:
            counts = np.asarray(batch.class_counts, dtype=np.float64).sum(0)
            p_s = torch.as_tensor(counts / max(counts.sum(), 1.0), dtype=torch.float32, device=z.device)
        loss_s = logit_adjusted_ce(z, y, p_s, eps=eps, zero_mode=zm)
        loss_c = logit_adjusted_ce(z, y, batch.client_priors(p["prior"]), eps=eps, zero_mode=zm)
        (ga,) = torch.autograd.grad(loss_c, (a,), retain_graph=True)  # at the pre-step server weights
        srv.step(srv.main, loss_s)
        rows = batch.split_rows(ga)
        if p["grad_scale"] == "client":
            total = float(sum(batch.sizes))
            rows = [g * (total / g.shape[0]) for g in rows]
        server_loss, client_loss = torch.stack([loss_s.detach(), loss_c.detach()]).tolist()  # one device read
        return IterationResult(rows, server_loss, _row_ce(z, y, batch.sizes), {"client_loss": client_loss})


@register
class SplitFedV1(SplitAlgorithm):
    """SplitFedV1 (Thapa et al.): every participating client trains with its own copy of the server-side
    model (initialised from the global one each round, plain CE, exact back-prop); at round end the copies
    are averaged weighted by |D_k| (the reference averages them unweighted over equal-sized clients) and
    so are the client-side models."""

    name = "splitfed_v1"
    description = "SplitFedV1: per-client server-side copies trained in parallel, averaged each round"
    declared = SplitShape(server_copies=True)

    def server_iteration(self, srv, batch: SplitBatch) -> IterationResult:
        grads, losses, total = [], [], 0.0
        for k in range(len(batch)):
            a = batch.activations[k].detach().requires_grad_(True)
            y = batch.labels[k]
            model = srv.copies[k]
            z = srv.forward(model, a)
            loss = F.cross_entropy(z, y)
            (ga,) = srv.step(model, loss, wrt=(a,))
            grads.append(ga)
            losses.append(float(loss.detach()))
            total += losses[-1] * int(y.shape[0])
        return IterationResult(grads, total / max(1, sum(batch.sizes)), losses)


@register
class SplitFedV2(SplitAlgorithm):
    """SplitFedV2 (Thapa et al.): one server-side model updated sequentially over the clients, in a random
    order drawn once per round from (seed, round); each client's gradient is exact back-prop at the server
    weights it met (before its own step). Client-side models are averaged each round.

    ``order: client`` (default, the reference SFLV2 code): a client runs all its local iterations against
    the server before the next client starts (``local_iters`` x clients round trips per round, one client
    at a time). ``order: iteration``: all clients take each local iteration together and the server steps
    once per client within it (clients interleaved; ``local_iters`` round trips per round)."""

    name = "splitfed_v2"
    description = "SplitFedV2: one server-side model updated sequentially over clients in random order"
    params_spec = {**SplitAlgorithm.params_spec,
                   "order": ParamSpec("client", "server updates: client after client ('client') or within every "
                                      "iteration ('iteration')", str, choices=("client", "iteration"))}

    @property
    def shape(self) -> SplitShape:
        return replace(super().shape, sequential_clients=self.params["order"] == "client")

    def server_iteration(self, srv, batch: SplitBatch) -> IterationResult:
        n = len(batch)
        grads: list[torch.Tensor | None] = [None] * n
        losses = [math.nan] * n
        for k in srv.client_order(n):
            a = batch.activations[k].detach().requires_grad_(True)
            y = batch.labels[k]
            z = srv.forward(srv.main, a)
            loss = F.cross_entropy(z, y)
            (ga,) = srv.step(srv.main, loss, wrt=(a,))
            grads[k] = ga
            losses[k] = float(loss.detach())
        total = sum(loss_k * s for loss_k, s in zip(losses, batch.sizes))
        return IterationResult(grads, total / max(1, sum(batch.sizes)), losses)


@register
class SplitFedV3(SplitFedV1):
    """SplitFedV3 (Gawali et al.): per-client server-side copies averaged each round (as V1), while the
    client-side models stay local: each client resumes from its own client-side model (client state; a
    first-time client starts from the global client-side part). The global client-side part is the
    |D_k|-weighted average of the round's client models and is used for evaluation only."""

    name = "splitfed_v3"
    description = "SplitFedV3: client-side models kept local, server-side copies averaged"
    declared = SplitShape(server_copies=True, client_models="local")


@register
class SFLLocalLoss(SplitAlgorithm):
    """Split FL with local losses (Han et al. 2021): the client-side model gets an auxiliary classifier
    (``aux: linear``: flatten + Linear(activation size, C)) and trains on its own CE loss, with no gradient
    sent back; the server trains one server-side model with CE on the concatenated activations it receives
    (computed before the client's step). Client-side models and auxiliary heads are averaged each round;
    the auxiliary head is not part of the evaluated model."""

    name = "sfl_local_loss"
    description = "SFL with local losses: client auxiliary head, no gradient returns"
    declared = SplitShape(returns_gradients=False)
    params_spec = {**SplitAlgorithm.params_spec,
                   "aux": ParamSpec("linear", "client auxiliary head: 'linear' or 'pool_linear' (average-pooled first)",
                                    str, choices=("linear", "pool_linear"))}

    def aux_head(self, act_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if self.params["aux"] == "pool_linear" and len(act_shape) == 3:
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(int(act_shape[0]), num_classes))
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(act_shape)), num_classes))

    def server_iteration(self, srv, batch: SplitBatch) -> IterationResult:
        a, y = batch.concat(requires_grad=False)
        z = srv.forward(srv.main, a)
        loss = F.cross_entropy(z, y)
        srv.step(srv.main, loss)
        return IterationResult(None, float(loss.detach()), _row_ce(z, y, batch.sizes))
