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

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

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
    "proximal_term",
    "RCL_VARIANTS",
    "ZERO_MODES",
]

RCL_VARIANTS = ("reference", "paper")
ZERO_MODES = ("clamp", "exclude")


# ----------------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------------


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_float(x, name: str, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {_shape(x)}")
    return x


def _check_labels(labels, name: str, n: int | None, n_name: str = "the batch") -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of integer class ids, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{name} must have an integer dtype (e.g. torch.int64), got {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {_shape(labels)}")
    if n is not None and labels.shape[0] != n:
        raise ValueError(f"{name} has {labels.shape[0]} entries but {n_name} has {n} rows (shape {_shape(labels)})")
    return labels


def _check_label_range(labels: torch.Tensor, name: str, num_classes: int) -> None:
    if labels.numel() == 0:
        return
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes}), got values in [{lo}, {hi}]")


def _check_positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def _check_nonnegative(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return v


def _check_finite(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


def _nonempty_batch(x: torch.Tensor, name: str) -> None:
    if x.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {_shape(x)}); a loss needs at least one sample")


def _work(x: torch.Tensor) -> torch.Tensor:
    """Compute in float32 at least (half/bfloat16 inputs are upcast)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _zero_like_graph(x: torch.Tensor) -> torch.Tensor:
    """A scalar 0 that stays attached to x's graph (so backward() works and gives zero gradients)."""
    return _work(x).sum() * 0.0


def _check_logits_labels(logits, labels, logits_name: str = "logits") -> tuple[torch.Tensor, torch.Tensor]:
    _check_float(logits, logits_name, 2)
    _nonempty_batch(logits, logits_name)
    _check_labels(labels, "labels", logits.shape[0], logits_name)
    _check_label_range(labels, "labels", logits.shape[1])
    return logits, labels


# ----------------------------------------------------------------------------------------------------
# 1. FedRCL: relaxed contrastive loss
# ----------------------------------------------------------------------------------------------------


def _rcl_parts(features: torch.Tensor, labels: torch.Tensor, tau: float, lam: float, variant: str):
    """Per-anchor SCL and penalty terms (each shape (B,)) of the relaxed contrastive loss."""
    z = F.normalize(_work(features), dim=1)
    s = z @ z.T  # (B, B) cosine similarities
    b = s.shape[0]
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(b, dtype=torch.bool, device=s.device)
    other_same = same & ~eye
    zero = s.new_zeros(b)

    if variant == "reference":
        # SCL: hardest positive (lowest same-class similarity, self included) vs the two hardest
        # negatives (highest other-class similarities; absent slots are -inf and drop out).
        s_pos = s.masked_fill(~same, float("inf")).amin(dim=1)
        neg = s.masked_fill(same, float("-inf")).topk(min(2, b), dim=1).values
        logits = torch.cat([s_pos[:, None], neg], dim=1) / tau
        scl = torch.logsumexp(logits, dim=1) - logits[:, 0]
        # Penalty: m_i = lowest similarity to another same-class sample; softplus((m_i - s_ii)/τ) if m_i ≥ λ.
        m = s.masked_fill(~other_same, float("inf")).amin(dim=1)
        active = other_same.any(dim=1) & (m.detach() >= lam)
        s_ii = s.diagonal()
        m_safe = torch.where(active, m, s_ii)  # keeps +inf of empty rows out of the graph
        pen = torch.where(active, F.softplus((m_safe - s_ii) / tau), zero)
        return scl, pen

    # variant == "paper": Eq. (5) read literally.
    if b == 1:  # no k ≠ i exists: no positive, no penalty pair
        return zero + 0.0 * s.sum(), zero + 0.0 * s.sum()
    logits = s / tau
    n_pos = other_same.sum(dim=1)
    lse_all = torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1)  # log Σ_{k≠i} e^{s_ik/τ}
    mean_pos = (logits * other_same).sum(dim=1) / n_pos.clamp(min=1)
    scl = torch.where(n_pos > 0, lse_all - mean_pos, zero)
    above = other_same & (s.detach() > lam)  # P(i)
    inv_tau = 1.0 / tau
    pen_logits = torch.cat([logits.masked_fill(~above, float("-inf")), logits.new_full((b, 1), inv_tau)], dim=1)
    pen = torch.logsumexp(pen_logits, dim=1) - inv_tau
    return scl, pen


def _check_rcl_args(tau, lam, beta, variant) -> tuple[float, float, float]:
    if variant not in RCL_VARIANTS:
        raise ValueError(f"variant must be one of {RCL_VARIANTS}, got {variant!r}")
    return _check_positive(tau, "tau"), _check_finite(lam, "lam"), _check_nonnegative(beta, "beta")


def relaxed_contrastive_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    tau: float = 0.05,
    lam: float = 0.7,
    beta: float = 1.0,
    variant: str = "reference",
    return_parts: bool = False,
):
    r"""FedRCL relaxed contrastive loss at one feature level (METHODS.md §1).

    ``features`` (B, D) are L2-normalised here: ``z_i = f_i/‖f_i‖``, ``s_ij = z_i·z_j``, one view per image.

    ``variant="reference"`` (default; what the authors' released code computes), per anchor i:

    * ``SCL_i = -log( e^{s_ip/τ} / (e^{s_ip/τ} + Σ_{n∈N2(i)} e^{s_in/τ}) )`` with ``p = argmin_{j: y_j=y_i} s_ij``
      (the hardest positive, i itself included, so a class singleton is its own positive) and ``N2(i)`` the
      two largest ``s_in`` over ``y_n ≠ y_i`` (fewer if fewer exist; a single-class batch gives 0).
    * ``PEN_i = softplus((m_i - s_ii)/τ)`` if ``m_i ≥ λ`` else 0, with ``m_i = min_{j≠i, y_j=y_i} s_ij``
      (0 when i has no other same-class sample). The penalty fires only when all of i's in-batch
      class-mates have cosine ≥ λ; for a collapsed class (identical features) it equals log 2.

    ``variant="paper"`` (Eq. 5 read literally), with ``Pos(i) = {j ≠ i : y_j = y_i}`` and
    ``P(i) = {k ≠ i : y_k = y_i, s_ik > λ}``:

    * ``SCL_i = mean_{j∈Pos(i)} -log( e^{s_ij/τ} / Σ_{k≠i} e^{s_ik/τ} )`` (0 if Pos(i) is empty);
    * ``PEN_i = log( Σ_{k∈P(i)} e^{s_ik/τ} + e^{1/τ} ) - 1/τ`` (the -1/τ makes it exactly 0 when P(i) is
      empty and changes no gradient; ``log(|P(i)|+1)`` for a collapsed class).

    Result: ``mean_i SCL_i + β·mean_i PEN_i`` (mean over all B anchors; anchors without a term count 0).
    With ``return_parts=True`` returns ``(mean_i SCL_i, mean_i PEN_i)`` instead (penalty *not* multiplied
    by β) so that callers can combine levels as ``CE + mean_l SCL_l + β·mean_l PEN_l``.
    Membership tests (``m_i ≥ λ``, ``s_ik > λ``) select pairs and carry no gradient.
    """
    tau, lam, beta = _check_rcl_args(tau, lam, beta, variant)
    _check_float(features, "features", 2)
    _nonempty_batch(features, "features")
    _check_labels(labels, "labels", features.shape[0], "features")
    scl, pen = _rcl_parts(features, labels, tau, lam, variant)
    if return_parts:
        return scl.mean(), pen.mean()
    return scl.mean() + beta * pen.mean()


def _pool_level(f, idx: int) -> torch.Tensor:
    name = f"feature_list[{idx}]"
    _check_float(f, name)
    if f.dim() == 4:
        return f.mean(dim=(2, 3))  # global average pooling of an (B, C, H, W) map
    if f.dim() == 2:
        return f
    raise ValueError(f"{name} must be a (B, C, H, W) feature map or (B, D) vectors, got shape {_shape(f)}")


def multilevel_relaxed_contrastive_loss(
    feature_list: Sequence[torch.Tensor],
    labels: torch.Tensor,
    *,
    tau: float = 0.05,
    lam: float = 0.7,
    beta: float = 1.0,
    variant: str = "reference",
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Multi-level FedRCL terms: ``(mean_l SCL_l, mean_l PEN_l)`` over the L feature taps.

    Each entry of ``feature_list`` is a (B, C, H, W) map (globally average-pooled here) or (B, D)
    vectors; each level is L2-normalised and scored by :func:`relaxed_contrastive_loss` with
    ``return_parts=True``. The local objective is ``CE + scl + beta * pen`` with the returned pair; the
    penalty is returned *unweighted*. ``beta`` is validated and, when it is 0 (FedSCL), the penalty is
    not computed at all and a zero is returned for it.
    """
    tau, lam, beta = _check_rcl_args(tau, lam, beta, variant)
    if isinstance(feature_list, torch.Tensor) or not isinstance(feature_list, Sequence):
        raise ValueError(f"feature_list must be a list/tuple of tensors, got {type(feature_list).__name__}")
    if len(feature_list) == 0:
        raise ValueError("feature_list is empty; at least one feature level is required")
    pooled = [_pool_level(f, i) for i, f in enumerate(feature_list)]
    b = pooled[0].shape[0]
    for i, p in enumerate(pooled):
        if p.shape[0] != b:
            raise ValueError(
                f"feature_list[{i}] has batch size {p.shape[0]} but feature_list[0] has {b} "
                f"(shapes {_shape(feature_list[i])} vs {_shape(feature_list[0])})"
            )
    _nonempty_batch(pooled[0], "feature_list[0]")
    _check_labels(labels, "labels", b, "feature_list[0]")
    scls, pens = [], []
    for p in pooled:
        scl, pen = _rcl_parts(p, labels, tau, lam, variant)
        scls.append(scl.mean())
        pens.append(pen.mean())
    scl = torch.stack(scls).mean()
    pen = torch.stack(pens).mean() if beta > 0 else scl.new_zeros(())
    return scl, pen


# ----------------------------------------------------------------------------------------------------
# 3. FedCL: self-supervised InfoNCE (SimCLR NT-Xent) with two views
# ----------------------------------------------------------------------------------------------------


def supcon_infonce_loss(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
    r"""Self-supervised InfoNCE with two views (SimCLR NT-Xent), used by FedCL.

    ``u = normalize([z1; z2])`` (2B, D), ``s_ij = u_i·u_j``; the positive of row i is its other view
    ``a(i) = i ± B``; every other row of the 2B is a negative:
    ``L = (1/2B) Σ_i -log( e^{s_{i,a(i)}/τ} / Σ_{k≠i} e^{s_ik/τ} )``.
    """
    tau = _check_positive(tau, "tau")
    _check_float(z1, "z1", 2)
    _check_float(z2, "z2", 2)
    if z1.shape != z2.shape:
        raise ValueError(f"z1 and z2 must have the same shape, got {_shape(z1)} and {_shape(z2)}")
    _nonempty_batch(z1, "z1")
    b = z1.shape[0]
    u = F.normalize(torch.cat([_work(z1), _work(z2)], dim=0), dim=1)
    logits = (u @ u.T) / tau
    eye = torch.eye(2 * b, dtype=torch.bool, device=logits.device)
    logits = logits.masked_fill(eye, float("-inf"))
    idx = torch.arange(2 * b, device=logits.device)
    target = (idx + b) % (2 * b)
    return F.cross_entropy(logits, target)


# ----------------------------------------------------------------------------------------------------
# 4. FedLC: logit calibration
# ----------------------------------------------------------------------------------------------------


def logit_calibrated_ce(
    logits: torch.Tensor, labels: torch.Tensor, class_counts: torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    r"""FedLC calibrated cross-entropy (replaces CE in FedLC's local objective).

    ``L = mean_i -log softmax(z_i - τ·n^{-1/4})_{y_i}``, ``n_c`` the client's raw local count of class c.
    Zero counts: as in the reference code, a class with ``n_c = 0`` gets ``-∞`` (``0^{-1/4} = ∞``), i.e. it
    is removed from the softmax. A label whose class has a zero count would make the loss infinite and
    is rejected with a ValueError (counts must be the counts of the data the labels come from).
    """
    tau = _check_nonnegative(tau, "tau")
    _check_logits_labels(logits, labels)
    if not isinstance(class_counts, torch.Tensor):
        class_counts = torch.as_tensor(class_counts)
    if class_counts.dim() != 1 or class_counts.shape[0] != logits.shape[1]:
        raise ValueError(
            f"class_counts must have shape ({logits.shape[1]},) to match logits {_shape(logits)}, "
            f"got {_shape(class_counts)}"
        )
    z = _work(logits)
    counts = class_counts.to(device=z.device, dtype=z.dtype)
    if bool((counts < 0).any()) or not bool(torch.isfinite(counts).all()):
        raise ValueError(f"class_counts must be finite and non-negative, got {class_counts.tolist()}")
    if bool((counts[labels] == 0).any()):
        bad = sorted(set(labels[counts[labels] == 0].tolist()))
        raise ValueError(f"labels contain classes {bad} whose class_counts entry is 0")
    present = counts > 0
    shift = torch.where(present, tau * counts.clamp(min=1e-30).pow(-0.25), torch.zeros_like(counts))
    calibrated = (z - shift).masked_fill(~present, float("-inf"))
    return F.cross_entropy(calibrated, labels)


# ----------------------------------------------------------------------------------------------------
# 5. FedNTD: not-true distillation
# ----------------------------------------------------------------------------------------------------


def _not_true(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    b, c = logits.shape
    keep = torch.ones(b, c, dtype=torch.bool, device=logits.device)
    keep[torch.arange(b, device=logits.device), labels] = False
    return logits[keep].view(b, c - 1)


def not_true_distillation(
    logits: torch.Tensor, global_logits: torch.Tensor, labels: torch.Tensor, tau: float = 1.0
) -> torch.Tensor:
    r"""FedNTD not-true distillation: ``τ²·(1/B) Σ_i KL( q̃^g_i ‖ q̃_i )``.

    ``q̃_i = softmax(z̃_i/τ)`` over the C-1 *not-true* classes of the local logits (true class removed),
    ``q̃^g_i`` the same for the (detached) global model's logits. The τ² factor keeps gradient scales
    comparable across temperatures; at the default τ = 1 it is the reference code's batchmean KL exactly.
    """
    tau = _check_positive(tau, "tau")
    _check_logits_labels(logits, labels)
    _check_float(global_logits, "global_logits", 2)
    if global_logits.shape != logits.shape:
        raise ValueError(f"global_logits must have the shape of logits {_shape(logits)}, got {_shape(global_logits)}")
    if logits.shape[1] < 2:
        raise ValueError(f"not-true distillation needs at least 2 classes, logits have shape {_shape(logits)}")
    local_nt = _not_true(_work(logits), labels) / tau
    global_nt = _not_true(_work(global_logits).detach(), labels) / tau
    log_q = F.log_softmax(local_nt, dim=1)
    log_qg = F.log_softmax(global_nt, dim=1)
    return F.kl_div(log_q, log_qg, reduction="batchmean", log_target=True) * (tau * tau)


def fedntd_loss(
    logits: torch.Tensor,
    global_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    lam: float = 0.3,
    tau: float = 1.0,
) -> torch.Tensor:
    r"""FedNTD local objective ``(1-λ)·CE(z, y) + λ·NTD(z, z_g, y)`` (METHODS.md: 0.7·CE + 0.3·KL, τ = 1)."""
    lam = _check_finite(lam, "lam")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam!r}")
    ntd = not_true_distillation(logits, global_logits, labels, tau=tau)
    return (1.0 - lam) * F.cross_entropy(_work(logits), labels) + lam * ntd


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
# 7. MOON
# ----------------------------------------------------------------------------------------------------


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, T: float = 0.5
) -> torch.Tensor:
    r"""MOON model-contrastive loss, mean over the batch:

    ``L = mean_i -log( e^{cos(z_i, zg_i)/T} / (e^{cos(z_i, zg_i)/T} + e^{cos(z_i, zp_i)/T}) )``,
    ``zg`` the global model's and ``zp`` the previous local model's representation of the same input
    (both detached). Local objective: ``CE + μ·L`` (μ = 1, T = 0.5).
    """
    T = _check_positive(T, "T")
    _check_float(z, "z", 2)
    _nonempty_batch(z, "z")
    for name, other in (("z_glob", z_glob), ("z_prev", z_prev)):
        _check_float(other, name, 2)
        if other.shape != z.shape:
            raise ValueError(f"{name} must have the shape of z {_shape(z)}, got {_shape(other)}")
    zw = _work(z)
    pos = F.cosine_similarity(zw, _work(z_glob).detach(), dim=1, eps=1e-8)
    neg = F.cosine_similarity(zw, _work(z_prev).detach(), dim=1, eps=1e-8)
    logits = torch.stack([pos, neg], dim=1) / T
    return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


# ----------------------------------------------------------------------------------------------------
# 8. SCALA / FedLogit: logit adjustment
# ----------------------------------------------------------------------------------------------------


def label_prior(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Empirical label distribution ``P_c = #{i : y_i = c} / B`` as a float32 (C,) tensor."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    _check_labels(labels, "labels", None)
    if labels.numel() == 0:
        raise ValueError("labels is empty; the label prior of an empty batch is undefined")
    _check_label_range(labels, "labels", num_classes)
    counts = torch.bincount(labels.long(), minlength=num_classes).to(torch.float32)
    return counts / counts.sum()


def logit_adjusted_ce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    prior: torch.Tensor,
    *,
    eps: float = 1e-9,
    zero_mode: str = "clamp",
) -> torch.Tensor:
    r"""Logit-adjusted cross-entropy (SCALA Eq. 14/15, FedLogit): ``mean_i -log softmax(z_i + log P_i)_{y_i}``.

    ``prior`` is a (C,) label distribution shared by all rows or a (B, C) per-row distribution (row i uses
    the prior of the client sample i came from). Rows are normalised to sum to 1, so counts work too.
    Zero frequencies:

    * ``zero_mode="clamp"`` (default): ``log P`` is taken of ``max(P, eps)``, i.e. ``log(1e-9) ≈ -20.7``.
    * ``zero_mode="exclude"``: classes with ``P = 0`` are removed from the softmax (adjusted logit -∞).
      Exception, so the loss stays finite: if the row's *own* label has ``P = 0``, that class stays in the
      softmax with the clamped adjustment ``log(eps)`` (the other zero-prior classes are still excluded).
    """
    eps = _check_positive(eps, "eps")
    if not eps < 1.0:
        raise ValueError(f"eps must lie in (0, 1), got {eps!r}")
    if zero_mode not in ZERO_MODES:
        raise ValueError(f"zero_mode must be one of {ZERO_MODES}, got {zero_mode!r}")
    _check_logits_labels(logits, labels)
    b, c = logits.shape
    if not isinstance(prior, torch.Tensor) or prior.dtype == torch.bool or prior.is_complex():
        raise ValueError(f"prior must be a real-valued torch.Tensor, got {type(prior).__name__}"
                         + (f" of dtype {prior.dtype}" if isinstance(prior, torch.Tensor) else ""))
    if prior.shape not in ((c,), (b, c)):
        raise ValueError(
            f"prior must have shape ({c},) or ({b}, {c}) to match logits {_shape(logits)}, got {_shape(prior)}"
        )
    z = _work(logits)
    p = prior.detach().to(device=z.device, dtype=z.dtype)
    if bool((p < 0).any()) or not bool(torch.isfinite(p).all()):
        raise ValueError("prior must be finite and non-negative")
    total = p.sum(dim=-1, keepdim=True)
    if bool((total <= 0).any()):
        raise ValueError("every row of prior must have a positive sum (a distribution over classes)")
    p = p / total
    adj = torch.log(p.clamp(min=eps))
    if zero_mode == "exclude":
        adj = adj.expand(b, c)
        own = F.one_hot(labels.long(), c).bool()
        drop = (p.expand(b, c) == 0) & ~own
        adj = adj.masked_fill(drop, float("-inf"))
    return F.cross_entropy(z + adj, labels)


# ----------------------------------------------------------------------------------------------------
# 9. FedCCL, FPL, FedProc: contrast against clustered signals / prototypes
# ----------------------------------------------------------------------------------------------------


def _signal_contrast(
    features, labels, anchors, anchor_labels, tau, names: tuple[str, str]
) -> torch.Tensor:
    r"""``(1/B) Σ_{i: P(y_i)≠∅} -log( Σ_{a∈P(y_i)} e^{cos(f_i,a)/τ} / Σ_{a∈A} e^{cos(f_i,a)/τ} )``."""
    a_name, al_name = names
    tau = _check_positive(tau, "tau")
    _check_float(features, "features", 2)
    _nonempty_batch(features, "features")
    _check_labels(labels, "labels", features.shape[0], "features")
    _check_float(anchors, a_name, 2)
    if anchors.shape[1] != features.shape[1]:
        raise ValueError(
            f"{a_name} must have feature dimension {features.shape[1]} like features {_shape(features)}, "
            f"got shape {_shape(anchors)}"
        )
    _check_labels(anchor_labels, al_name, anchors.shape[0], a_name)
    if anchors.shape[0] == 0:
        return _zero_like_graph(features)
    f = F.normalize(_work(features), dim=1)
    a = F.normalize(_work(anchors).detach().to(f.dtype), dim=1)
    sim = (f @ a.T) / tau  # (B, M)
    pos = labels[:, None] == anchor_labels[None, :]
    has = pos.any(dim=1)
    # rows without a positive keep all entries (finite, zero result) so no NaN reaches the backward pass
    num = torch.logsumexp(sim.masked_fill(~pos & has[:, None], float("-inf")), dim=1)
    den = torch.logsumexp(sim, dim=1)
    per = torch.where(has, den - num, torch.zeros_like(den))
    return per.mean()


def cluster_contrast_local(
    features: torch.Tensor,
    labels: torch.Tensor,
    signals: torch.Tensor,
    signal_labels: torch.Tensor,
    tau: float = 0.07,
) -> torch.Tensor:
    r"""FedCCL local clustered-signal contrast (Eq. 16), mean over the batch:

    ``L_i = -log( Σ_{Z∈P(y_i)} e^{sim(ξ_i,Z)/τ} / Σ_{Z∈A} e^{sim(ξ_i,Z)/τ} )`` with ``P(c)`` the local signals of
    class c and ``A`` all local signals,
    ``sim`` the cosine similarity, ``signals`` (M, D) the collected local clustered signals of all clients
    with their classes ``signal_labels`` (M,). Samples whose class has no signal contribute 0 (and still
    count in the mean over B); M = 0 (first round) gives 0.
    """
    return _signal_contrast(features, labels, signals, signal_labels, tau, ("signals", "signal_labels"))


def cluster_contrast_global(
    features: torch.Tensor,
    labels: torch.Tensor,
    global_signals: torch.Tensor,
    signal_classes: torch.Tensor,
    tau: float = 0.07,
) -> torch.Tensor:
    r"""FedCCL global clustered-signal contrast (Eq. 17), mean over the batch:

    ``L_i = -log( e^{sim(ξ_i,G_{y_i})/τ} / Σ_c e^{sim(ξ_i,G_c)/τ} )`` over the global signals (K, D) with
    classes ``signal_classes`` (K,) (one per class in METHODS.md; if a class had several signals they
    would all enter the numerator, as in the paper's Eq. 17). Samples whose class has no signal give 0.
    """
    return _signal_contrast(features, labels, global_signals, signal_classes, tau, ("global_signals", "signal_classes"))


def fpl_infonce_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    cluster_protos: torch.Tensor,
    proto_labels: torch.Tensor,
    tau: float = 0.02,
) -> torch.Tensor:
    r"""FPL cluster-prototype InfoNCE (RethinkFL; T = 0.02 there, 0.2 in MarsFL), divided by the full B:

    ``L_i = -log( Σ_{p∈P(y_i)} e^{cos(f_i,p)/T} / Σ_{a∈A} e^{cos(f_i,a)/T} )``, P(c) all cluster prototypes of
    class c, A all cluster prototypes of all classes; samples without a prototype of their class give 0.
    """
    return _signal_contrast(features, labels, cluster_protos, proto_labels, tau, ("cluster_protos", "proto_labels"))


def fpl_mse_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    unbiased_protos: torch.Tensor,
    proto_classes: torch.Tensor,
) -> torch.Tensor:
    r"""FPL alignment to the unbiased prototype: ``(1/B) Σ_{i: ū_{y_i} exists} (1/D)‖f_i - ū_{y_i}‖²``.

    ``unbiased_protos`` (K, D) holds ū_c (mean of class c's cluster prototypes) for the distinct classes
    ``proto_classes`` (K,). Features are not normalised (as in FPL).
    """
    _check_float(features, "features", 2)
    _nonempty_batch(features, "features")
    _check_labels(labels, "labels", features.shape[0], "features")
    _check_float(unbiased_protos, "unbiased_protos", 2)
    if unbiased_protos.shape[1] != features.shape[1]:
        raise ValueError(
            f"unbiased_protos must have feature dimension {features.shape[1]} like features "
            f"{_shape(features)}, got shape {_shape(unbiased_protos)}"
        )
    _check_labels(proto_classes, "proto_classes", unbiased_protos.shape[0], "unbiased_protos")
    if proto_classes.numel() != torch.unique(proto_classes).numel():
        raise ValueError(f"proto_classes must be distinct, got {proto_classes.tolist()}")
    if unbiased_protos.shape[0] == 0:
        return _zero_like_graph(features)
    f = _work(features)
    protos = _work(unbiased_protos).detach().to(f.dtype)
    match = labels[:, None] == proto_classes[None, :]  # (B, K), at most one True per row
    has = match.any(dim=1)
    target = protos[match.to(torch.int8).argmax(dim=1)]
    per = (f - target).pow(2).mean(dim=1)
    return torch.where(has, per, torch.zeros_like(per)).mean()


def prototype_contrast_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    proto_classes: torch.Tensor,
    tau: float = 1.0,
) -> torch.Tensor:
    r"""FedProc prototype contrast (temperature 1 as in the reference), mean over the batch:

    ``L_i = -log( e^{cos(f_i,p_{y_i})/τ} / Σ_c e^{cos(f_i,p_c)/τ} )`` with one global prototype p_c per class
    in ``proto_classes``; samples whose class has no prototype give 0. FedProc's objective is
    ``α·L + (1-α)·CE`` with α = 1 - r/(R-1).
    """
    return _signal_contrast(features, labels, prototypes, proto_classes, tau, ("prototypes", "proto_classes"))


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
