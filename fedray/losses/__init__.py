"""Local training losses of FedRCL, FedCCL, SCALA and their baselines (see ``METHODS.md``).

Every function is a plain, vectorised torch function (no Python loop over samples) that validates its
inputs and raises :class:`ValueError` naming the offending argument. Notation: ``B`` batch size, ``C``
classes, ``D`` feature dimension, ``τ`` temperature, ``s_ij`` cosine similarity, ``CE`` cross-entropy.
Half-precision inputs are computed in float32; every softmax-type quantity goes through ``logsumexp`` /
``log_softmax`` so temperatures as small as 0.05 (logits up to 1/τ = 20) or smaller never overflow.

Conventions shared by all functions:

* "mean over the batch" means the sum of the per-sample terms divided by the *full* batch size ``B``;
  samples that have no term (no positive, no prototype of their class, ...) count as 0.
* Targets that come from another model or from the coordinator (global logits, MOON's global/previous
  representations, clustered signals, prototypes, the global parameters of FedProx) are detached: only
  the local model receives gradients.
* When a loss has no term at all (e.g. no signal exists yet) the result is a zero that is still
  connected to the autograd graph of the local inputs, so ``loss.backward()`` always works.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .checks import _check_float, _check_nonnegative, _check_positive, _nonempty_batch, _shape, _work, _zero_like_graph
from .contrastive import (
    RCL_VARIANTS,
    model_contrastive_loss,
    multilevel_relaxed_contrastive_loss,
    relaxed_contrastive_loss,
    supcon_infonce_loss,
)
from .logit import (
    ZERO_MODES,
    fedntd_loss,
    label_prior,
    logit_adjusted_ce,
    logit_calibrated_ce,
    not_true_distillation,
)
from .prototypes import (
    cluster_contrast_global,
    cluster_contrast_local,
    fpl_infonce_loss,
    fpl_mse_loss,
    prototype_anchor_contrast,
    prototype_contrast_loss,
    prototype_two_view_contrast,
)

__all__ = [
    "relaxed_contrastive_loss",
    "multilevel_relaxed_contrastive_loss",
    "supcon_infonce_loss",
    "logit_calibrated_ce",
    "not_true_distillation",
    "fedntd_loss",
    "decorrelation_loss",
    "model_contrastive_loss",
    "logit_adjusted_ce",
    "label_prior",
    "cluster_contrast_local",
    "cluster_contrast_global",
    "fpl_infonce_loss",
    "fpl_mse_loss",
    "prototype_contrast_loss",
    "prototype_anchor_contrast",
    "prototype_two_view_contrast",
    "proximal_term",
    "RCL_VARIANTS",
    "ZERO_MODES",
]


# ----------------------------------------------------------------------------------------------------
# 6. FedDecorr
# ----------------------------------------------------------------------------------------------------


def decorrelation_loss(features: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    r"""FedDecorr regulariser on a batch of features (B, D), scaled as in the reference code.

    Standardise each dimension over the batch, ``x̂_ia = (x_ia - μ_a)/sqrt(σ²_a + ε)`` (σ² the unbiased
    batch variance, ε = ``eps`` so constant/dead dimensions give 0), ``K = x̂ᵀx̂`` (D×D, = (B-1)·correlation
    matrix), and ``L = (1/B) · (1/(D(D-1))) Σ_{a≠b} K_ab²`` — the mean squared off-diagonal entry divided
    by B. The local objective is ``CE + 0.01·L``. A batch of one sample or D = 1 gives 0.
    """
    eps = _check_positive(eps, "eps")
    _check_float(features, "features", 2)
    _nonempty_batch(features, "features")
    x = _work(features)
    n, d = x.shape
    if n == 1 or d == 1:
        return _zero_like_graph(features)
    x = x - x.mean(dim=0, keepdim=True)
    x = x / torch.sqrt(x.var(dim=0, keepdim=True) + eps)
    k = x.T @ x
    off = ~torch.eye(d, dtype=torch.bool, device=k.device)
    return k.pow(2)[off].mean() / n


# ----------------------------------------------------------------------------------------------------
# 10. FedProx
# ----------------------------------------------------------------------------------------------------


def proximal_term(
    params: Iterable[torch.Tensor], global_params: Iterable[torch.Tensor], mu: float
) -> torch.Tensor:
    r"""FedProx proximal term ``(μ/2)·Σ_k ‖θ_k - θ_g,k‖²`` over matching parameter tensors (θ_g detached)."""
    mu = _check_nonnegative(mu, "mu")
    params = list(params)
    global_params = list(global_params)
    if len(params) == 0:
        raise ValueError("params is empty; proximal_term needs at least one parameter tensor")
    if len(params) != len(global_params):
        raise ValueError(f"params has {len(params)} tensors but global_params has {len(global_params)}")
    sq = []
    for k, (p, g) in enumerate(zip(params, global_params)):
        _check_float(p, f"params[{k}]")
        _check_float(g, f"global_params[{k}]")
        if p.shape != g.shape:
            raise ValueError(f"params[{k}] has shape {_shape(p)} but global_params[{k}] has shape {_shape(g)}")
        sq.append((_work(p) - _work(g).detach().to(device=p.device)).pow(2).sum())
    return 0.5 * mu * torch.stack(sq).sum()
