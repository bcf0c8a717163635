"""Contrast against clustered signals and prototypes: FedCCL's local and global clustered-signal
contrasts, FPL's prototype InfoNCE and alignment, FedProc's prototype contrast (conventions in
:mod:`fedray.losses`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .checks import _check_float, _check_labels, _check_positive, _nonempty_batch, _shape, _work, _zero_like_graph


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
# 10. FedPCL: prototype-anchored supervised contrast (one view and the released two-view form)
# ----------------------------------------------------------------------------------------------------


def prototype_anchor_contrast(features: torch.Tensor, labels: torch.Tensor, proto_sets: torch.Tensor,
                              proto_classes: torch.Tensor, tau: float = 0.07, reduction: str = "sum") -> torch.Tensor:
    r"""FedPCL's prototype-anchored supervised contrast, vectorised over prototype sets.

    ``proto_sets`` (S, K, D) holds S prototype sets over the K classes ``proto_classes`` (K,). For set s and a
    sample i of class c = y_i with a prototype:
    ``L_i^s = −(1/n_c) Σ_{j: y_j=c} [ cos(p^s_c, f_j)/τ − log Σ_k e^{cos(p^s_c, f_k)/τ} ]``
    (n_c = samples of class c in the batch, k over the whole batch). The loss is ``Σ_s (1/B) Σ_i L_i^s``
    (``reduction="sum"``) or its mean over sets (``"mean"``); samples whose class has no prototype give 0.
    Prototypes are detached (coordinator values).
    """
    if features.dim() != 2 or features.shape[0] == 0:
        raise ValueError(f"features must be a non-empty (B, D) tensor, got shape {tuple(features.shape)}")
    if proto_sets.dim() != 3 or proto_sets.shape[2] != features.shape[1]:
        raise ValueError(f"proto_sets must be (S, K, {features.shape[1]}), got shape {tuple(proto_sets.shape)}")
    if proto_classes.shape != (proto_sets.shape[1],):
        raise ValueError(f"proto_classes must be ({proto_sets.shape[1]},), got shape {tuple(proto_classes.shape)}")
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if proto_sets.shape[0] == 0 or proto_sets.shape[1] == 0:
        return features.sum() * 0.0
    f = F.normalize(features.float(), dim=1)
    p = F.normalize(proto_sets.detach().to(f.dtype), dim=2)
    logits = torch.einsum("skd,bd->skb", p, f) / tau  # (S, K, B)
    member = (labels[None, :] == proto_classes[:, None]).to(f.dtype)  # (K, B)
    n = member.sum(dim=1)  # (K,)
    pos_mean = (logits * member[None]).sum(dim=2) / n.clamp(min=1)[None]  # (S, K)
    per_class = torch.logsumexp(logits, dim=2) - pos_mean  # (S, K); only classes with n > 0 are used below
    weight = n / features.shape[0]  # (1/B) Σ_i over the n_c rows of class c
    per_set = (per_class * weight[None]).sum(dim=1)  # (S,)
    return per_set.sum() if reduction == "sum" else per_set.mean()


def prototype_two_view_contrast(features: torch.Tensor, labels: torch.Tensor, proto_sets: torch.Tensor,
                                proto_classes: torch.Tensor, tau: float = 0.07, reduction: str = "sum") -> torch.Tensor:
    r"""FedPCL's released two-view loss (module docstring, ``views: 2``), vectorised over prototype sets.

    ``features`` (2B, D): view 1 of the B samples then view 2 (already normalised by the caller),
    ``labels`` (B,). Row r's anchor is the raw prototype of its class in set s; logits are dot products / τ
    against all 2B rows with the row's own entry masked; positives are the other rows of its class. Rows
    whose class has no prototype count 0. ``Σ_s`` (``"sum"``) or the mean over sets (``"mean"``)."""
    if features.dim() != 2 or features.shape[0] == 0 or features.shape[0] != 2 * labels.shape[0]:
        raise ValueError(f"features must be (2B, D) for {labels.shape[0]} labels, got {tuple(features.shape)}")
    if proto_sets.dim() != 3 or proto_sets.shape[2] != features.shape[1]:
        raise ValueError(f"proto_sets must be (S, K, {features.shape[1]}), got shape {tuple(proto_sets.shape)}")
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    if proto_sets.shape[0] == 0 or proto_sets.shape[1] == 0:
        return features.sum() * 0.0
    f = features.float()
    y = torch.cat([labels, labels])
    n = y.shape[0]
    slot = (y[:, None] == proto_classes[None, :])  # (2B, K)
    has = slot.any(dim=1)
    anchors = proto_sets.detach().to(f.dtype)[:, slot.float().argmax(dim=1)]  # (S, 2B, D)
    logits = torch.einsum("srd,kd->srk", anchors, f) / tau  # (S, 2B, 2B)
    eye = torch.eye(n, dtype=torch.bool, device=f.device)
    log_den = torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=2, keepdim=True)
    pos = ((y[:, None] == y[None, :]) & ~eye).to(f.dtype)  # (2B, 2B)
    per_row = -((logits - log_den) * pos).sum(dim=2) / pos.sum(dim=1).clamp(min=1)  # (S, 2B)
    per_set = (per_row * has.to(f.dtype)).sum(dim=1) / n
    return per_set.sum() if reduction == "sum" else per_set.mean()
