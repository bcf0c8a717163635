"""Client-side baselines of FedRCL's comparisons (METHODS.md §1): FitNet, MOON, FedLC, FedNTD, FedDecorr,
FedMLB, FedProc and FedDyn.

Hyper-parameter names follow FedRCL's appendix E (β for FedNTD/FedDecorr, λ for FitNet, λ1/λ2 for FedMLB,
μ for MOON, τ for FedLC, α for FedDyn); every temperature is called ``tau``. Methods that need the global
model keep one frozen replica per worker (built once with ``ctx.model_factory``, reloaded with the
broadcast weights for every client, ``requires_grad`` off, eval mode). All of them train with
:func:`fedray.algorithms.training.local_sgd`, so FedACG's client proximal term and gradient clipping apply
unchanged, and all except FedDyn aggregate like FedAvg (``weighting: samples | uniform``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate
from fedray.algorithms.registry import register
from fedray.algorithms.training import local_sgd, param_anchors
from fedray.algorithms.fedavg import WEIGHTING, FedAvg
from fedray.algorithms.fedrcl import LEVELS_SPEC, level_taps, normalize_levels
from fedray.algorithms.signals import (
    SIGNAL_TAP,
    class_means,
    embed_client,
    logits_and_features,
    resolve_signal_tap,
)
from fedray.config import ConfigError
from fedray.core.params import ParamSpec
from fedray.core.weights import load_flat
from fedray.losses import (
    decorrelation_loss,
    fedntd_loss,
    logit_calibrated_ce,
    model_contrastive_loss,
    prototype_contrast_loss,
)


class _FrozenCopies:
    """Mixin: frozen replicas of the model, cached per worker process under a slot name."""

    def frozen_model(self, ctx: ClientContext, slot: str, weights: np.ndarray) -> torch.nn.Module:
        cache = self.__dict__.setdefault("_frozen", {})
        model = cache.get(slot)
        if model is None:
            if ctx.model_factory is None:
                raise RuntimeError(f"{self.name}: the client context has no model_factory to build a frozen {slot} model")
            model = ctx.model_factory().to(ctx.device)
            for p in model.parameters():
                p.requires_grad_(False)
            cache[slot] = model
        w = np.asarray(weights, dtype=np.float32)
        load_flat(model, w if w.flags.writeable else w.copy())
        model.eval()
        return model


# ------------------------------------------------------------------------------------------------ FitNet
@register
class FitNet(_FrozenCopies, FedAvg):
    r"""FedAvg + FitNet hints (Romero et al. 2015): match the frozen global model's features at every level.

    ``L = CE(z, y) + λ · mean_l h_l`` with ``f_l`` the local and ``g_l`` the global model's (detached)
    un-pooled feature maps at the levels of FedRCL (every tap but ``embedding``, or the last one with
    ``levels: last``), λ = 1e-3 (FedRCL appendix E), and the hint (Romero et al. Eq. 2/3)

    - ``reduce: mean`` (default): ``h_l = mean over the B·C·H·W elements of (f_l - g_l)²`` (an MSE, the
      per-element scale of the lab code's feature-alignment loss);
    - ``reduce: sum`` (option, the older default): ``h_l = (1/B) Σ_i ½‖f_l(x_i) - g_l(x_i)‖²``, which sums
      over every element of an un-pooled map and at λ = 1e-3 outweighs CE about 7x on FedRCL's ResNet-18.
    """

    name = "fitnet"
    model_needs = ("features",)
    params_spec = {"lam": ParamSpec(1e-3, "lambda: weight of the feature-matching hint", float, ge=0),
                   "levels": LEVELS_SPEC,
                   "reduce": ParamSpec("mean", "hint per level: mean squared difference over feature elements "
                                       "('mean') or the per-sample half sum of squares ('sum')", str,
                                       choices=("mean", "sum")),
                   "weighting": WEIGHTING}
    description = "FedAvg + FitNet feature matching to the global model at every level"

    def validate(self):
        super().validate()
        self.params["levels"] = normalize_levels(self.params["levels"])

    def make_loss(self, ctx: ClientContext, payload: dict):
        taps = level_taps(ctx.model, self.params["levels"])
        lam = float(self.params["lam"])
        glob = self.frozen_model(ctx, "global", ctx.global_weights)
        if self.params["reduce"] == "mean":
            def level_hint(f, g):
                return (f - g).pow(2).mean()
        else:
            def level_hint(f, g):
                return 0.5 * (f - g).pow(2).flatten(1).sum(1).mean()

        def loss_fn(model, x, y):
            logits, feats = model.forward_features(x, taps)
            with torch.no_grad():
                _, gfeats = glob.forward_features(x, taps)
            hint = torch.stack([level_hint(feats[t], gfeats[t]) for t in taps]).mean()
            return F.cross_entropy(logits, y) + lam * hint

        return loss_fn


# ------------------------------------------------------------------------------------------------ MOON
@register
class MOON(_FrozenCopies, FedAvg):
    r"""MOON (Li et al., CVPR 2021): model-contrastive learning against the global and previous local model.

    ``L = CE(z, y) + μ · mean_i -log( e^{cos(r_i, r^g_i)/τ} / (e^{cos(r_i, r^g_i)/τ} + e^{cos(r_i, r^p_i)/τ}) )``
    (the paper's Eq. 3-4) with ``r`` the ``embedding`` tap of the local, the frozen global and the frozen
    previous local model. μ = 1 (FedRCL appendix E), τ = 0.5.

    ``projection: true`` (default, the official MOON code's ``ModelFedCon``): the run's model is the configured
    one with a projection head (:class:`fedray.models.ProjectedModel`, requested through :meth:`adapt_model`):
    pooled feature h -> ``r = l2(ReLU(l1(h)))`` (D -> D -> ``proj_dim`` = 256) -> a new linear classifier on r,
    so both the contrast and the classification read r, and the head's weights are part of the averaged
    flat vector. ``projection: false`` (option, the FPL-group code's form): the configured model unchanged,
    r = its ``embedding`` (the vector its classifier reads).
    The previous local model is this client's weights after its last local training, kept in client state
    (``prev``, a flat vector); at a client's first visit it is the received global model, so the
    contrastive term is the constant log 2 (no gradient) as in the original code.
    """

    name = "moon"
    model_needs = ("features",)
    stateful_clients = True
    params_spec = {"mu": ParamSpec(1.0, "mu: weight of the model-contrastive term", float, ge=0),
                   "tau": ParamSpec(0.5, "tau: temperature of the model-contrastive term", float, gt=0),
                   "projection": ParamSpec(True, "add the official 2-layer projection head (contrast and classifier "
                                           "read its output); false: contrast the model's own embedding", bool),
                   "proj_dim": ParamSpec(256, "output size of the projection head", int, ge=1),
                   "weighting": WEIGHTING}
    description = "MOON: CE + model-contrastive loss (global vs previous local representation)"

    def adapt_model(self, model):
        if not self.params["projection"]:
            return model
        from fedray.models import ProjectedModel

        return ProjectedModel(model, int(self.params["proj_dim"]))

    def make_loss(self, ctx: ClientContext, payload: dict):
        from fedray.models import ProjectedModel

        if self.params["projection"] and not isinstance(ctx.model, ProjectedModel):
            raise RuntimeError("moon: projection: true trains the model returned by MOON.adapt_model (the configured "
                               f"model with a projection head); this client got a plain {type(ctx.model).__name__}")
        mu, tau = float(self.params["mu"]), float(self.params["tau"])
        glob = self.frozen_model(ctx, "global", ctx.global_weights)
        prev = None
        if ctx.state is not None and "prev" in ctx.state:
            prev = self.frozen_model(ctx, "previous", ctx.state["prev"])

        def loss_fn(model, x, y):
            logits, feats = model.forward_features(x, ["embedding"])
            with torch.no_grad():
                zg = glob.embed(x)
                zp = prev.embed(x) if prev is not None else zg
            return F.cross_entropy(logits, y) + mu * model_contrastive_loss(feats["embedding"], zg, zp, T=tau)

        return loss_fn

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        loss = local_sgd(ctx, self.make_loss(ctx, payload))
        w = ctx.flat.read()
        return ClientUpdate(weights=w, num_samples=ctx.num_samples, loss=loss, state={"prev": w})


# ------------------------------------------------------------------------------------------------ FedLC
@register
class FedLC(FedAvg):
    r"""FedLC (Zhang et al., ICML 2022): logit calibration by the client's label counts, replacing CE.

    ``L = mean_i -log softmax(z_i - τ·n^{-1/4})_{y_i}`` with ``n_c`` the client's raw count of class c
    (classes absent from the client are removed from the softmax), τ = 1.
    """

    name = "fedlc"
    params_spec = {"tau": ParamSpec(1.0, "tau: calibration strength (logits shifted by tau * n_c^(-1/4))", float, ge=0),
                   "weighting": WEIGHTING}
    description = "FedLC: cross-entropy on logits calibrated by local class counts"

    def make_loss(self, ctx: ClientContext, payload: dict):
        counts = torch.bincount(torch.from_numpy(np.array(ctx.labels, dtype=np.int64)),
                                minlength=int(ctx.num_classes)).to(torch.float32).to(ctx.device)
        tau = float(self.params["tau"])

        def loss_fn(model, x, y):
            return logit_calibrated_ce(model(x), y, counts, tau=tau)

        return loss_fn


# ------------------------------------------------------------------------------------------------ FedNTD
@register
class FedNTD(_FrozenCopies, FedAvg):
    r"""FedNTD (Lee et al., NeurIPS 2022): not-true distillation from the frozen global model.

    ``L = (1-β)·CE(z, y) + β·τ²·(1/B) Σ_i KL( softmax(z̃^g_i/τ) ‖ softmax(z̃_i/τ) )`` where ``z̃`` drops the
    true-class logit; β = 0.3, τ = 1 (:func:`fedray.losses.fedntd_loss`).
    """

    name = "fedntd"
    params_spec = {"beta": ParamSpec(0.3, "beta: weight of the not-true distillation against (1 - beta) CE", float,
                                     ge=0, le=1),
                   "tau": ParamSpec(1.0, "tau: distillation temperature", float, gt=0),
                   "weighting": WEIGHTING}
    description = "FedNTD: (1-beta) CE + beta KL on not-true logits vs the global model"

    def make_loss(self, ctx: ClientContext, payload: dict):
        if int(ctx.num_classes) < 2:
            raise ValueError("fedntd needs at least 2 classes")
        beta, tau = float(self.params["beta"]), float(self.params["tau"])
        glob = self.frozen_model(ctx, "global", ctx.global_weights)

        def loss_fn(model, x, y):
            logits = model(x)
            with torch.no_grad():
                gl = glob(x)
            return fedntd_loss(logits, gl, y, lam=beta, tau=tau)

        return loss_fn


# ------------------------------------------------------------------------------------------------ FedDecorr
@register
class FedDecorr(FedAvg):
    r"""FedDecorr (Shi et al., ICLR 2023): decorrelate the dimensions of the batch's embeddings.

    ``L = CE(z, y) + β·(1/B)·mean_{a≠b} K_ab²``, ``K = X̂ᵀX̂`` of the batch-standardised ``embedding`` tap
    (:func:`fedray.losses.decorrelation_loss`), β = 0.01.
    """

    name = "feddecorr"
    model_needs = ("features",)
    params_spec = {"beta": ParamSpec(0.01, "beta: weight of the decorrelation term", float, ge=0),
                   "weighting": WEIGHTING}
    description = "FedDecorr: CE + beta * decorrelation of standardised batch embeddings"

    def make_loss(self, ctx: ClientContext, payload: dict):
        beta = float(self.params["beta"])

        def loss_fn(model, x, y):
            logits, feats = model.forward_features(x, ["embedding"])
            return F.cross_entropy(logits, y) + beta * decorrelation_loss(feats["embedding"])

        return loss_fn


# ------------------------------------------------------------------------------------------------ FedMLB
def _forward_cuts(model, x: torch.Tensor, points: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits of ``model`` and, for each split point, the activation right after the cut (the tap after its
    post-activation, e.g. ReLU(l3)): what the server part of ``model.split(point)`` reads."""
    want = set(points)
    outs: dict[str, torch.Tensor] = {}
    h = x
    for seg in model.segments:
        t = seg.fn(model, h)
        h = seg.post(model, t) if seg.post is not None else t
        for tap in seg.taps:
            if tap in want:
                outs[tap] = h
    return h, outs


def _branch_points(model) -> list[str]:
    return [p for p in getattr(model, "split_points", ()) if p != "embedding"]


@register
class FedMLB(_FrozenCopies, FedAvg):
    r"""FedMLB (Kim, Kim, Han — ICML 2022): multi-level hybrid branches through the frozen global model.

    For every split point l of the model except ``embedding`` (``l1..l5`` on ``cnn_taps``/``resnet18_gn``),
    the local activation after the cut, ``h_l(x)``, is fed to the frozen global model's upper part
    (``global.split(l)[1]``) giving hybrid logits ``z_l``; gradients reach the local blocks through
    ``h_l``. With main logits ``z``:

    ``L = CE(z, y) + λ1·mean_l CE(z_l, y) + λ2·mean_l τ²·(1/B) Σ_i KL( softmax(z_l,i/τ) ‖ softmax(z_i/τ) )``,

    the hybrid outputs being the (not detached) distillation targets of the main pathway, as in the
    authors' code; λ1 = λ2 = 1 (FedRCL appendix E), τ = 1.
    """

    name = "fedmlb"
    model_needs = ("split",)
    params_spec = {"lam1": ParamSpec(1.0, "lambda1: weight of the hybrid branches' CE", float, ge=0),
                   "lam2": ParamSpec(1.0, "lambda2: weight of the hybrid branches' KL distillation", float, ge=0),
                   "tau": ParamSpec(1.0, "tau: distillation temperature", float, gt=0),
                   "weighting": WEIGHTING}
    description = "FedMLB: CE + CE and KL of hybrid branches through the global model's upper blocks"

    def validate(self):
        super().validate()
        self._check_model()

    def _check_model(self) -> None:
        """Fail at configuration time when the configured model has no split point to branch at."""
        if self.cfg is None:
            return
        from fedray.models import MODELS, build_model

        spec = MODELS.get(self.cfg.model.name)
        if spec is None or spec.inputs == "vector":
            return  # unknown names are reported as model.name by the runner
        try:
            probe = build_model(self.cfg.model.name, in_channels=1, image_size=(32, 32), num_classes=10,
                                **self.cfg.model.params)
        except Exception:  # noqa: BLE001 - invalid model options are reported by the model builder itself
            return
        if not _branch_points(probe):
            raise ConfigError(f"algorithm.name: fedmlb needs a model with split points other than 'embedding'; "
                              f"model.name {self.cfg.model.name!r} has {list(getattr(probe, 'split_points', ()))}")

    def make_loss(self, ctx: ClientContext, payload: dict):
        points = _branch_points(ctx.model)
        if not points:
            raise ConfigError(f"algorithm.name: fedmlb needs a model with split points other than 'embedding'; "
                              f"this model has {list(getattr(ctx.model, 'split_points', ()))}")
        lam1, lam2, tau = float(self.params["lam1"]), float(self.params["lam2"]), float(self.params["tau"])
        glob = self.frozen_model(ctx, "global", ctx.global_weights)
        servers = self.__dict__.setdefault("_servers", {})
        if servers.get("model") is not glob:  # the split parts share the replica's (reloaded) tensors
            servers.clear()
            servers["model"] = glob
            servers.update({p: glob.split(p)[1] for p in points})

        def loss_fn(model, x, y):
            logits, cuts = _forward_cuts(model, x, points)
            log_main = F.log_softmax(logits / tau, dim=1)
            ces, kls = [], []
            for p in points:
                zb = servers[p](cuts[p])
                ces.append(F.cross_entropy(zb, y))
                kls.append(F.kl_div(log_main, F.log_softmax(zb / tau, dim=1), reduction="batchmean", log_target=True))
            ce_b = torch.stack(ces).mean()
            kl_b = torch.stack(kls).mean() * (tau * tau)
            return F.cross_entropy(logits, y) + lam1 * ce_b + lam2 * kl_b

        return loss_fn


# ------------------------------------------------------------------------------------------------ FedProc
@register
class FedProc(FedAvg):
    r"""FedProc (Mu et al. 2023): contrast local embeddings with global class prototypes.

    ``L = α_r·L_proto + (1-α_r)·CE``, ``L_proto = mean_i -log( e^{cos(f_i,p_{y_i})/τ} / Σ_c e^{cos(f_i,p_c)/τ} )``
    over the global prototypes p_c (samples whose class has none count 0; τ = 1 as in the reference),
    ``α_r = 1 - (r-1)/(R-1)`` decaying linearly from 1 in round 1 to 0 in the last round R.
    f is the feature tap ``tap`` resolved like FedCCL/FedProto/FPL (:func:`~fedray.algorithms.signals.resolve_signal_tap`):
    ``auto`` (default) is the trainable head's hidden layer (``head_hidden``) when the model is a frozen
    backbone + MLP head, else ``embedding``; ``tap: embedding`` keeps the old choice, whose contrast has no
    gradient when the backbone is frozen.
    Prototypes: after local training each client embeds its data (that tap, eval mode, no augmentation)
    and sends the per-class means (extras); the coordinator averages them per class over the
    round's clients (unweighted) and broadcasts them next round. In a round without prototypes (round 1)
    the loss is plain CE — a documented deviation from the reference, whose round-0 loss is exactly 0.
    """

    name = "fedproc"
    model_needs = ("features",)
    params_spec = {"tau": ParamSpec(1.0, "tau: temperature of the prototype contrast", float, gt=0),
                   "tap": SIGNAL_TAP, "weighting": WEIGHTING}
    description = "FedProc: prototype contrast with global class prototypes, annealed against CE"

    def _alpha(self, rnd: int) -> float:
        if self.cfg is None:
            raise RuntimeError("fedproc needs the experiment config (train.rounds) for its alpha schedule")
        total = int(self.cfg.train.rounds)
        return 1.0 - (rnd - 1) / (total - 1) if total > 1 else 1.0

    def broadcast(self, rnd: int, weights: np.ndarray, state: dict) -> dict:
        if "prototypes" not in state:
            return {}
        return {"prototypes": state["prototypes"], "proto_classes": state["proto_classes"], "proc_alpha": self._alpha(rnd)}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        by_class: dict[int, list[np.ndarray]] = {}
        for e in extras:
            for c, p in zip(np.asarray(e["proto_classes"]).tolist(), np.asarray(e["protos"])):
                by_class.setdefault(int(c), []).append(p)
        if not by_class:
            return weights, state
        classes = sorted(by_class)
        protos = np.stack([np.mean(np.stack(by_class[c]), axis=0) for c in classes]).astype(np.float32)
        return weights, {"prototypes": protos, "proto_classes": np.asarray(classes, dtype=np.int64)}

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        tau = float(self.params["tau"])
        tap = resolve_signal_tap(ctx.model, self.params["tap"])
        if "prototypes" in payload:
            protos = torch.from_numpy(np.array(payload["prototypes"], dtype=np.float32)).to(ctx.device)
            classes = torch.from_numpy(np.array(payload["proto_classes"], dtype=np.int64)).to(ctx.device)
            alpha = float(payload["proc_alpha"])

            def loss_fn(model, x, y):
                logits, feats = logits_and_features(model, x, tap)
                con = prototype_contrast_loss(feats, y, protos, classes, tau=tau)
                return alpha * con + (1.0 - alpha) * F.cross_entropy(logits, y)
        else:
            def loss_fn(model, x, y):
                return F.cross_entropy(model(x), y)

        loss = local_sgd(ctx, loss_fn)
        protos_local, classes_local = class_means(*embed_client(ctx, tap))
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss,
                            extras={"protos": protos_local, "proto_classes": classes_local})


# ------------------------------------------------------------------------------------------------ FedDyn
@register
class FedDyn(Algorithm):
    r"""FedDyn (Acar et al., ICLR 2021), as in FedRCL's sister code (α = 0.1).

    Client k (state ``grad`` = g_k, zero at the first visit) minimises, from the broadcast θ_g,
    ``L = CE(z, y) - ⟨θ, g_k⟩ + (α/2)·‖θ - θ_g‖²`` over the trainable parameters, then keeps
    ``g_k ← g_k - α(θ_k - θ_g)``. Server (state h, zero at start): with the unweighted mean θ̄ of the S
    clients of the round (``client_weight`` is uniform) and N = ``data.partition.num_clients``,
    ``h ← h - α·(S/N)·(θ̄ - θ_g)`` (= ``h - (α/N) Σ_k (θ_k - θ_g)``) and ``θ ← θ̄ - h/α``. With a server
    optimizer, its output takes the place of θ̄.
    """

    name = "feddyn"
    stateful_clients = True
    params_spec = {"alpha": ParamSpec(0.1, "alpha: weight of the dynamic regulariser (client and server)", float, gt=0)}
    description = "FedDyn: dynamic regularisation with per-client gradient state (alpha = 0.1)"

    def client_weight(self, num_samples: int) -> float:
        return 1.0

    def init_state(self, weights: np.ndarray) -> dict:
        return {"h": np.zeros_like(weights, dtype=np.float32)}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        theta_g = None if broadcast is None else np.asarray(broadcast, dtype=np.float32)
        if theta_g is None or theta_g.shape != weights.shape:
            raise RuntimeError("feddyn: after_aggregate needs this round's broadcast weights")
        if self.cfg is None:
            raise RuntimeError("feddyn needs the experiment config (data.partition.num_clients)")
        alpha = np.float32(self.params["alpha"])
        n_total = int(self.cfg.data.partition.num_clients)
        s = sum(1 for e in extras if e.get("feddyn"))
        h = np.asarray(state["h"], dtype=np.float32)
        h = (h - alpha * np.float32(s / n_total) * (weights - theta_g)).astype(np.float32)
        new = (weights - h / alpha).astype(np.float32)
        return new, {"h": h}

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        alpha = float(self.params["alpha"])
        size = ctx.flat.layout.size
        g = np.zeros(size, dtype=np.float32)
        if ctx.state is not None and "grad" in ctx.state:
            g = np.asarray(ctx.state["grad"], dtype=np.float32)
            if g.shape != (size,):
                raise ValueError(f"feddyn: stored client gradient has shape {g.shape}, the model needs ({size},)")
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        g_t = param_anchors(ctx, g, params)
        theta_g = param_anchors(ctx, ctx.global_weights, params)

        def loss_fn(model, x, y):
            lin = torch.stack([(p * gp).sum() for p, gp in zip(params, g_t)]).sum()
            prox = torch.stack([(p - tg).pow(2).sum() for p, tg in zip(params, theta_g)]).sum()
            return F.cross_entropy(model(x), y) - lin + 0.5 * alpha * prox

        loss = local_sgd(ctx, loss_fn)
        w = ctx.flat.read()
        mask = _param_mask(ctx)
        g_new = g - np.float32(alpha) * (w - np.asarray(ctx.global_weights, dtype=np.float32))
        g_new = np.where(mask, g_new, np.float32(0)).astype(np.float32)
        if not np.all(np.isfinite(g_new)):
            raise FloatingPointError("feddyn: the client gradient state became non-finite")
        return ClientUpdate(weights=w, num_samples=ctx.num_samples, loss=loss, extras={"feddyn": 1},
                            state={"grad": g_new})


def _param_mask(ctx: ClientContext) -> np.ndarray:
    """Boolean mask of the flat vector's entries that belong to trainable parameters (not buffers)."""
    trainable = {n for n, p in ctx.model.named_parameters() if p.requires_grad}
    mask = np.zeros(ctx.flat.layout.size, dtype=bool)
    for name, _, off, n in ctx.flat.layout.slices():
        if name in trainable:
            mask[off : off + n] = True
    return mask


__all__ = ["FitNet", "MOON", "FedLC", "FedNTD", "FedDecorr", "FedMLB", "FedProc", "FedDyn"]
