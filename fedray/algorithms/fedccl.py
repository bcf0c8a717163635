"""FedCCL (Qiao et al., dual-clustered signal contrast), its ablations, FedCCL+ and FedAvg+ (METHODS.md §2).

Model = feature extractor f (the ``embedding`` tap) + classifier g. With a frozen pre-trained backbone
(``cnn_backbone_mlp`` with ``freeze_backbone: true``, the paper's inter-domain setting) f is the trainable
head's hidden layer (``head_hidden``) instead; ``tap`` picks another (:func:`resolve_signal_tap`). Round r:

1. Client i trains with ``L = CE + w_local·L_local + w_global·L_global`` (Eq. 18, weights 1). With no signal
   yet (round 1) the loss is CE only.
2. After training it embeds its data with the trained model (eval mode, no augmentation) and runs FINCH
   **per class** (cosine first neighbours, recursive merging on means of the original points, the
   coarsest partition FINCH keeps): the cluster means ξ̄_{i,l}^j are its local clustered signals
   (Eq. 8-10), uploaded next to the weights (``extras``).
3. The coordinator keeps the latest signals of every client that has taken part (Eq. 11; partial
   participation keeps older ones) in ascending client id, so nothing depends on sampling or arrival
   order. Per class j it runs FINCH on that collection (Eq. 13-14) and averages the cluster means
   G_j^k into one global signal U_j = mean_k G_j^k (Eq. 15; the paper writes a sum, which has the same
   direction and so the same cosine similarities). Collection and global signals go out next round.
4. Models are averaged FedAvg-style, weighted by sample count.

Losses (sample ξ = f(x) of class j, sim = cosine, τ = 0.07, mean over the batch, samples whose class has
no signal contribute 0; :func:`fedray.losses.cluster_contrast_local` / ``cluster_contrast_global``):

* ``L_local  = −log( Σ_{Z∈P_j^L} e^{sim(ξ,Z)/τ} / Σ_{Z∈C} e^{sim(ξ,Z)/τ} )`` over the collected local signals
  C of all clients, P_j^L those of class j (Eq. 16);
* ``L_global = −log( e^{sim(ξ,U_j)/τ} / Σ_c e^{sim(ξ,U_c)/τ} )`` over the global signals (Eq. 17).

Ablations (Tables 5-7) as parameters: ``signals: both | local | global`` (which contrast terms are used;
only the signals a term needs are broadcast), ``local_mode: clustered | averaged`` (a client's signal of
class j is its cluster means or its plain class mean), ``global_mode: clustered | averaged`` (U_j from
FINCH clusters, or the plain mean of the collected class-j signals, Eq. 12).

Robust variants (Appendix A, Table 8), adversarial examples x̃ generated per batch in pixel space
(:mod:`fedray.metrics.robustness`; ``adv: pgd`` with ``adv_steps`` steps of size ``adv_alpha``
(default 2.5·ε/steps) from a random start in the ε-ball, or ``adv: fgsm``), radius ``adv_eps``:

* ``fedavg_plus`` (FedAvg+): ``CE(g(f(x̃)), y)`` (Eq. 21);
* ``fedccl_plus`` (FedCCL+): ``CE(g(f(x̃)), y) + w_local·L_local(f(x̃)) + w_global·L_global(f(x̃))``
  (Eq. 22-24): the adversarial features are contrasted with the signals obtained on clean images, and
  the uploaded signals are computed on clean data.

The paper gives no attack radius; ``adv_eps = 0.1`` (the evaluation default of ``eval.adversarial`` too)
and ``adv_steps = 10`` are fedray's choices. Round metrics gain ``num_signals`` (size of the collection); the
engine measures the signal bytes broadcast to the sampled clients and uploaded by them (``bytes_signals``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate
from fedray.algorithms.registry import register
from fedray.algorithms.training import local_sgd
from fedray.algorithms.fedavg import FedAvg
from fedray.algorithms.signals import (
    SIGNAL_TAP,
    as_tensor,
    class_means,
    clustered_means,
    embed_client,
    logits_and_features,
    resolve_signal_tap,
)
from fedray.core.params import ParamSpec

SIGNALS = ("both", "local", "global")
MODES = ("clustered", "averaged")
ADV = ("pgd", "fgsm")


# --------------------------------------------------------------------------------------------------------
# coordinator-side signal computation (pure numpy: easy to test and order-independent)
# --------------------------------------------------------------------------------------------------------


def collect_signals(clients: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate the kept local signals of every client in ascending client id (Eq. 11).

    ``clients`` maps client id -> ``{"signals": (m, D), "labels": (m,)}``. Returns
    ``(signals (M, D) float32, labels (M,) int64, owner client ids (M,) int64)``.
    """
    cids = sorted(int(c) for c in clients)
    if not cids:
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64), np.zeros(0, np.int64)
    sig = np.concatenate([clients[c]["signals"] for c in cids]).astype(np.float32, copy=False)
    lab = np.concatenate([clients[c]["labels"] for c in cids]).astype(np.int64, copy=False)
    own = np.concatenate([np.full(clients[c]["labels"].shape[0], c, np.int64) for c in cids])
    return np.ascontiguousarray(sig), lab, own


def global_signals(signals: np.ndarray, labels: np.ndarray, mode: str = "clustered") -> tuple[np.ndarray, np.ndarray]:
    """One global signal per class present in the collection (classes ascending).

    ``clustered``: FINCH per class over the collected local signals (Eq. 13-14), then the plain mean of the
    resulting cluster means (Eq. 15). ``averaged``: the plain mean of the class's local signals (Eq. 12).
    Returns ``(U (K, D) float32, classes (K,) int64)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "averaged":
        return class_means(signals, labels)
    cluster, cluster_labels = clustered_means(signals, labels, "clustered")
    return class_means(cluster, cluster_labels)


# --------------------------------------------------------------------------------------------------------
# adversarial examples for local training (FedAvg+, FedCCL+)
# --------------------------------------------------------------------------------------------------------


class AdversarialExamples:
    """Per-client generator of adversarial training batches: model-space batch in, model-space batch out.

    The batch is mapped back to pixel space (undoing ``(x - mean)/std``), attacked there under
    ``‖x̃ − x‖∞ ≤ adv_eps`` within the valid pixel range, and normalised again. Random starts draw from
    ``ctx.torch_generator("algorithm")``, so runs are reproducible.
    """

    def __init__(self, ctx: ClientContext, params: dict):
        from fedray.metrics.robustness import PixelSpace

        self.space = PixelSpace.from_meta(ctx.meta, ctx.normalize)
        self.p = params
        self.gen = ctx.torch_generator("algorithm")

    def __call__(self, model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from fedray.metrics.robustness import fgsm_attack, pgd_attack

        p = self.p
        xp = self.space.to_pixels(x.detach())
        if self.space.clip is not None:
            xp = xp.clamp(*self.space.clip)
        if p["adv"] == "fgsm":
            xa = fgsm_attack(model, xp, y, float(p["adv_eps"]), self.space)
        else:
            xa = pgd_attack(model, xp, y, float(p["adv_eps"]), steps=int(p["adv_steps"]),
                            alpha=None if p["adv_alpha"] is None else float(p["adv_alpha"]),
                            random_start=bool(p["adv_random_start"]), generator=self.gen, space=self.space)
        return self.space.to_model(xa)


ADV_SPEC = {
    "adv": ParamSpec("pgd", "attack generating the training examples: 'pgd' or 'fgsm'", str, choices=ADV),
    "adv_eps": ParamSpec(0.1, "pixel-space L-inf radius of the attack", float, gt=0),
    "adv_steps": ParamSpec(10, "PGD steps", int, ge=1),
    "adv_alpha": ParamSpec(None, "PGD step size (null: 2.5 * adv_eps / adv_steps)", float, gt=0, nullable=True),
    "adv_random_start": ParamSpec(True, "PGD starts at a uniform point of the eps-ball", bool),
}


@register
class FedAvgPlus(FedAvg):
    """FedAvg+ (FedCCL paper, Eq. 21): FedAvg whose local loss is CE on adversarial examples x̃ only
    (PGD/FGSM in pixel space, radius ``adv_eps``; see the module docstring)."""

    name = "fedavg_plus"
    params_spec = {**FedAvg.params_spec, **ADV_SPEC}
    description = "FedAvg with local adversarial training (CE on PGD/FGSM examples)"

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        adv = AdversarialExamples(ctx, self.params)

        def loss_fn(model, x, y):
            return F.cross_entropy(model(adv(model, x, y)), y)

        loss = local_sgd(ctx, loss_fn)
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss)


# --------------------------------------------------------------------------------------------------------
# FedCCL
# --------------------------------------------------------------------------------------------------------


@register
class FedCCL(Algorithm):
    """FedCCL: ``CE + w_local·L_local + w_global·L_global`` with client-side per-class FINCH signals and
    coordinator-side FINCH over the collected signals (module docstring; τ = 0.07, weights 1)."""

    name = "fedccl"
    model_needs = ("features",)
    params_spec = {
        "tau": ParamSpec(0.07, "tau: temperature of both signal contrasts", float, gt=0),
        "w_local": ParamSpec(1.0, "weight of the local-signal contrast L_local (Eq. 18)", float, ge=0),
        "w_global": ParamSpec(1.0, "weight of the global-signal contrast L_global (Eq. 18)", float, ge=0),
        "signals": ParamSpec("both", "contrast terms used: 'both', 'local' or 'global'", str, choices=SIGNALS),
        "local_mode": ParamSpec("clustered", "a client's signal of a class: 'clustered' (FINCH cluster means) or "
                                "'averaged' (its class mean)", str, choices=MODES),
        "global_mode": ParamSpec("clustered", "global signal U_j: 'clustered' (FINCH, Eq. 13-15) or 'averaged' "
                                 "(plain mean, Eq. 12)", str, choices=MODES),
        "tap": SIGNAL_TAP,
    }
    description = "FedCCL: local + global clustered-signal contrast (FINCH on clients and coordinator)"
    adversarial = False

    @property
    def uses_local(self) -> bool:
        return self.params["signals"] in ("both", "local")

    @property
    def uses_global(self) -> bool:
        return self.params["signals"] in ("both", "global")

    # ----------------------------------------------------------------------------------------- server
    def init_state(self, weights):
        return {"clients": {}, "local": None, "global": None}

    def broadcast(self, rnd, weights, state):
        out = {}
        if self.uses_local and state.get("local") is not None:
            out["local_signals"] = state["local"]["signals"]
            out["local_labels"] = state["local"]["labels"]
        if self.uses_global and state.get("global") is not None:
            out["global_signals"] = state["global"]["signals"]
            out["global_classes"] = state["global"]["classes"]
        return out

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        clients = dict(state["clients"])
        for e in extras:
            if "signals" not in e:
                raise RuntimeError(f"client {e.get('cid')} returned no 'signals' in its extras")
            if e["signals"].shape[0] > 0:
                clients[int(e["cid"])] = {"signals": np.asarray(e["signals"], np.float32),
                                          "labels": np.asarray(e["signal_labels"], np.int64)}
        new = {**state, "clients": clients}
        sig, lab, _ = collect_signals(clients)
        if sig.shape[0] > 0:
            new["local"] = {"signals": sig, "labels": lab}
            if self.uses_global:
                g, gc = global_signals(sig, lab, self.params["global_mode"])
                new["global"] = {"signals": g, "classes": gc}
        return weights, new

    def round_metrics(self, rnd, state, num_sampled):
        return {"num_signals": int(state["local"]["labels"].shape[0]) if state.get("local") else 0}

    # ----------------------------------------------------------------------------------------- client
    def make_contrast(self, ctx: ClientContext, payload: dict):
        """``contrast(feats, y) -> w_local·L_local + w_global·L_global`` for this round, or None (CE only)."""
        from fedray.losses import cluster_contrast_global, cluster_contrast_local

        tau = float(self.params["tau"])
        w_l, w_g = float(self.params["w_local"]), float(self.params["w_global"])
        terms = []
        if self.uses_local and "local_signals" in payload and w_l > 0:
            ls = as_tensor(payload["local_signals"], ctx.device)
            ll = as_tensor(payload["local_labels"], ctx.device)
            terms.append(lambda f, y: w_l * cluster_contrast_local(f, y, ls, ll, tau=tau))
        if self.uses_global and "global_signals" in payload and w_g > 0:
            gs = as_tensor(payload["global_signals"], ctx.device)
            gc = as_tensor(payload["global_classes"], ctx.device)
            terms.append(lambda f, y: w_g * cluster_contrast_global(f, y, gs, gc, tau=tau))
        if not terms:
            return None

        def contrast(f, y):
            total = terms[0](f, y)
            for t in terms[1:]:
                total = total + t(f, y)
            return total

        return contrast

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        contrast = self.make_contrast(ctx, payload)
        adv = AdversarialExamples(ctx, self.params) if self.adversarial else None
        tap = resolve_signal_tap(ctx.model, self.params["tap"])

        def loss_fn(model, x, y):
            if adv is not None:
                x = adv(model, x, y)
            if contrast is None:
                return F.cross_entropy(model(x), y)
            logits, feats = logits_and_features(model, x, tap)
            return F.cross_entropy(logits, y) + contrast(feats, y)

        loss = local_sgd(ctx, loss_fn)
        feats, labels = embed_client(ctx, tap)
        signals, signal_labels = clustered_means(feats, labels, self.params["local_mode"])
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss,
                            extras={"signals": signals, "signal_labels": signal_labels})


@register
class FedCCLPlus(FedCCL):
    """FedCCL+ (Appendix A.2, Eq. 22-24): FedCCL whose CE and contrast terms use adversarial examples x̃
    (features f(x̃) contrasted with the clean-data signals); parameters as FedCCL plus ``adv*``."""

    name = "fedccl_plus"
    params_spec = {**FedCCL.params_spec, **ADV_SPEC}
    description = "FedCCL with local adversarial training (FedCCL+)"
    adversarial = True
