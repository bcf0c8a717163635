"""FedRCL (Seo, Kim, Kim, Han — CVPR 2024) and its contrastive ablations FedSCL and FedCL (METHODS.md §1).

All three train with :func:`fedray.algorithms.training.local_sgd` and aggregate like FedAvg (``weighting``:
``samples`` by default, ``uniform`` for FedRCL's unweighted mean; the two coincide on balanced
partitions). Feature levels are the model's feature taps: ``levels: all`` (default) uses every tap except
``embedding`` — ``l1..l5`` on ``cnn_taps`` / ``resnet18_gn``, i.e. the stem and the four stages taken
before their final ReLU — and ``levels: last`` (or ``[last]``) only the last of them (Table 4's
last-layer ablation). A model whose only tap is ``embedding`` uses that one. Maps are
global-average-pooled and L2-normalised inside the losses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedray.algorithms.base import ClientContext
from fedray.algorithms.registry import register
from fedray.algorithms.fedavg import WEIGHTING, FedAvg
from fedray.config import ConfigError
from fedray.core.params import ParamSpec
from fedray.losses import RCL_VARIANTS, multilevel_relaxed_contrastive_loss, supcon_infonce_loss
from fedray.models import pool_tap

LEVELS = ("all", "last")
# a list form ([last]) is accepted too, so the value is checked by normalize_levels in validate()
LEVELS_SPEC = ParamSpec("all", "feature levels: 'all' (every tap but embedding) or 'last' (the last one; [last] too)")


def normalize_levels(value) -> str:
    """``all`` | ``last`` (``[last]`` and ``[all]`` are accepted as in METHODS.md); ConfigError otherwise."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if value not in LEVELS:
        raise ConfigError(f"algorithm.params.levels: expected 'all' or 'last', got {value!r}")
    return value


def level_taps(model, levels: str) -> list[str]:
    """The tap names scored at each level: every tap but ``embedding`` (``all``) or the last one (``last``)."""
    taps = [t for t in getattr(model, "feature_taps", ()) if t != "embedding"]
    if not taps:
        if "embedding" not in getattr(model, "feature_taps", ()):
            raise ValueError(f"model {type(model).__name__} has no feature taps; FedRCL-family losses need a FedModel")
        taps = ["embedding"]
    return taps if levels == "all" else taps[-1:]


@register
class FedRCL(FedAvg):
    r"""FedRCL: cross-entropy plus the multi-level relaxed contrastive loss.

    ``L = CE(z, y) + mean_l SCL_l + β·mean_l PEN_l`` over the feature levels l (see the module docstring),
    with, per level and anchor i (cosine similarities s_ij of the pooled, L2-normalised features,
    temperature τ), in the default ``variant: reference`` (the authors' released code):

    * ``SCL_i = -log( e^{s_ip/τ} / (e^{s_ip/τ} + Σ_{n∈N2(i)} e^{s_in/τ}) )``, p the hardest positive (lowest
      same-class similarity, i included), N2(i) the two hardest negatives;
    * ``PEN_i = softplus((m_i - s_ii)/τ)`` when ``m_i = min_{j≠i, y_j=y_i} s_ij ≥ λ``, else 0;

    and in ``variant: paper`` (Eq. 5 read literally) the mean-over-positives SupCon term plus
    ``β·[log(Σ_{k∈P(i)} e^{s_ik/τ} + e^{1/τ}) - 1/τ]`` with ``P(i) = {k≠i: y_k=y_i, s_ik>λ}``.
    Each term is a mean over all B anchors (:func:`fedray.losses.multilevel_relaxed_contrastive_loss`).
    Defaults λ = 0.7, β = 1, τ = 0.05 (paper §5.1).
    """

    name = "fedrcl"
    model_needs = ("features",)
    params_spec = {
        "lam": ParamSpec(0.7, "lambda: similarity threshold from which a same-class pair is penalised", float,
                         ge=-1.0, le=1.0),
        "beta": ParamSpec(1.0, "beta: weight of the divergence penalty", float, ge=0),
        "tau": ParamSpec(0.05, "tau: temperature of the cosine similarities", float, gt=0),
        "variant": ParamSpec("reference", "'reference' (the authors' released code) or 'paper' (Eq. 5 read literally)",
                             str, choices=tuple(RCL_VARIANTS)),
        "levels": LEVELS_SPEC,
        "weighting": WEIGHTING,
    }
    description = "FedRCL: CE + multi-level relaxed contrastive loss (SCL + beta * divergence penalty)"

    def validate(self):
        super().validate()
        self.params["levels"] = normalize_levels(self.params["levels"])

    def make_loss(self, ctx: ClientContext, payload: dict):
        taps = level_taps(ctx.model, self.params["levels"])
        tau, lam, beta = float(self.params["tau"]), float(self.params["lam"]), float(self.params["beta"])
        variant = self.params["variant"]

        def loss_fn(model, x, y):
            logits, feats = model.forward_features(x, taps)
            scl, pen = multilevel_relaxed_contrastive_loss([feats[t] for t in taps], y, tau=tau, lam=lam,
                                                           beta=beta, variant=variant)
            loss = F.cross_entropy(logits, y) + scl
            return loss + beta * pen if beta > 0 else loss

        return loss_fn


@register
class FedSCL(FedRCL):
    r"""FedSCL: FedRCL without the divergence penalty (β = 0), i.e. ``L = CE + mean_l SCL_l``.

    The ablation of FedRCL's Table 3 ("a naïve supervised contrastive loss" at every level). ``beta`` and
    ``lam`` are fixed (λ only selects penalty pairs, so it has no effect here) and are not parameters.
    """

    name = "fedscl"
    params_spec = {k: FedRCL.params_spec[k] for k in ("tau", "variant", "levels", "weighting")}
    description = "FedSCL: CE + multi-level supervised contrastive loss (FedRCL with beta = 0)"

    def validate(self):
        self.params["beta"] = 0.0
        self.params["lam"] = 0.7
        super().validate()


def view_augmenter(spec):
    """The augmentation drawing two views (``algorithm.params.view_augment``, ``train.augment`` form); it must
    enable at least one op, since two identical views make a two-view contrast trivial."""
    from fedray.data.loader import Augment
    from fedray.data.table import DataError

    try:
        aug = Augment.from_spec(spec)
    except DataError as e:
        raise ConfigError(f"algorithm.params.view_augment: {e}") from None
    if not aug.enabled:
        raise ConfigError("algorithm.params.view_augment: must enable at least one of crop, flip, rotate "
                          f"(two identical views make the two-view contrast trivial), got {spec!r}")
    return aug


@register
class FedCL(FedAvg):
    r"""FedCL: cross-entropy plus a self-supervised InfoNCE loss on two augmented views, at every level.

    Each batch ``x`` (as delivered by the training loop, i.e. after ``train.augment`` when that is set) is
    augmented twice more with ``view_augment`` (default: rotation 10°, crop with padding 4, horizontal
    flip — FedRCL's train pipeline), drawing from the client's ``algorithm`` generator, giving views
    ``v1, v2`` that go through the model as one batch of 2B. Then

    ``L = CE([z(v1); z(v2)], [y; y]) + w · mean_l NT-Xent_l(v1, v2)``,

    ``NT-Xent = (1/2B) Σ_i -log( e^{s_{i,a(i)}/τ} / Σ_{k≠i} e^{s_ik/τ} )`` over the 2B pooled, normalised
    features (a(i) the other view of i, every other row a negative; CPC/SimCLR, FedRCL's reference [25]).
    The paper compares it "employing multi-level contrastive training" with FedRCL's settings, so the
    defaults are FedRCL's τ = 0.05 and weight w = 1 (the paper gives no other value: a documented choice).
    """

    name = "fedcl"
    model_needs = ("features",)
    params_spec = {
        "tau": ParamSpec(0.05, "tau: temperature of the NT-Xent loss", float, gt=0),
        "weight": ParamSpec(1.0, "w: weight of the NT-Xent term", float, ge=0),
        "levels": LEVELS_SPEC,
        "view_augment": ParamSpec(["rotate", "crop", "flip"],
                                  "augmentations drawing the two views (train.augment form; at least one)"),
        "weighting": WEIGHTING,
    }
    description = "FedCL: CE + multi-level self-supervised InfoNCE between two augmented views"

    def validate(self):
        super().validate()
        self.params["levels"] = normalize_levels(self.params["levels"])
        self._views = view_augmenter(self.params["view_augment"])

    def make_loss(self, ctx: ClientContext, payload: dict):
        taps = level_taps(ctx.model, self.params["levels"])
        tau, w = float(self.params["tau"]), float(self.params["weight"])
        gen = ctx.torch_generator("algorithm")
        views = self._views

        def loss_fn(model, x, y):
            b = x.shape[0]
            v = torch.cat([views(x, gen), views(x, gen)], dim=0)
            logits, feats = model.forward_features(v, taps)
            ce = F.cross_entropy(logits, torch.cat([y, y], dim=0))
            ssl = torch.stack([supcon_infonce_loss(pool_tap(feats[t][:b]), pool_tap(feats[t][b:]), tau)
                               for t in taps]).mean()
            return ce + w * ssl

        return loss_fn
