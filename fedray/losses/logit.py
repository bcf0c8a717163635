"""Losses on logits: FedLC's calibrated cross-entropy, FedNTD's not-true distillation and the logit
adjustment of SCALA / FedLogit (conventions in :mod:`fedray.losses`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import (
    _OPEN_UNIT,
    _UNIT,
    _check_float,
    _check_label_range,
    _check_labels,
    _check_logits_labels,
    _check_nonnegative,
    _check_positive,
    _number,
    _shape,
    _work,
)

ZERO_MODES = ("clamp", "exclude")


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
    lam = _number(lam, "lam", _UNIT)
    ntd = not_true_distillation(logits, global_logits, labels, tau=tau)
    return (1.0 - lam) * F.cross_entropy(_work(logits), labels) + lam * ntd



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
    eps = _number(eps, "eps", _OPEN_UNIT)
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
    total = p.sum(dim=-1, keepdim=True)
    # both checks in one read from the device (on a GPU each read is a synchronisation)
    negative, not_finite, no_mass = torch.stack([(p < 0).any(), ~torch.isfinite(p).all(), (total <= 0).any()]).tolist()
    if negative or not_finite:
        raise ValueError("prior must be finite and non-negative")
    if no_mass:
        raise ValueError("every row of prior must have a positive sum (a distribution over classes)")
    p = p / total
    adj = torch.log(p.clamp(min=eps))
    if zero_mode == "exclude":
        adj = adj.expand(b, c)
        own = F.one_hot(labels.long(), c).bool()
        drop = (p.expand(b, c) == 0) & ~own
        adj = adj.masked_fill(drop, float("-inf"))
    return F.cross_entropy(z + adj, labels)
