"""Contrastive losses on features: FedRCL's relaxed contrastive loss (single- and multi-level), FedCL's
two-view InfoNCE and MOON's model-contrastive loss (conventions in :mod:`fedray.losses`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .checks import (
    _check_finite,
    _check_float,
    _check_labels,
    _check_nonnegative,
    _check_positive,
    _nonempty_batch,
    _shape,
    _work,
)

RCL_VARIANTS = ("reference", "paper")


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
