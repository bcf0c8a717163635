"""Prototype baselines of the FedCCL comparison: FedProto, FPL and FedPCL (METHODS.md §2), plus the
signal helpers FedCCL shares with them (client embeddings, per-class means / FINCH clusters, byte
accounting of the exchanged vectors).

Notation: f(x) the model's feature tap (``embedding`` by default: the vector the classifier reads),
``cos`` cosine similarity, ``B`` the batch size, ``D`` the feature dimension, ``C`` the classes.

* **FedProto** (``fedproto``; Tan et al. 2022, "under FedAvg" as in the FedCCL paper): client k's prototype
  of class c is the mean of f(x) over its class-c samples seen in the **last local epoch** (train mode,
  on the fly, as RethinkFL); the coordinator averages the prototypes of the round's clients per class
  without weights, p_c = mean_k p_c^k; local loss ``CE + μ·(1/B)Σ_i (1/D)‖f(x_i) − p_{y_i}‖²`` (rows
  whose class has no prototype give 0); models are averaged as FedAvg (sample-weighted).
* **FPL** (``fpl``; Huang et al. 2023): same local prototypes; per class the coordinator runs FINCH (cosine,
  no early exit, coarsest partition) over the round's client prototypes (a single prototype is kept
  as is) and averages within each cluster (each client prototype counts once) -> cluster prototypes
  P(c); the unbiased prototype ū_c is the plain mean of P(c). Local loss
  ``CE + (1/B)Σ_i −log(Σ_{p∈P(y_i)} e^{cos(f_i,p)/T} / Σ_{a∈∪_c P(c)} e^{cos(f_i,a)/T}) + (1/B)Σ_i (1/D)‖f_i − ū_{y_i}‖²``
  with T = 0.02 (RethinkFL).
* **FedPCL** (``fedpcl``; Tan et al. 2022): meant for a frozen (pre-trained) backbone with a trainable head
  (model ``cnn_backbone_mlp`` with ``freeze_backbone: true``); its features are the head's hidden layer
  (``tap: auto`` picks ``head_hidden`` when the model has it, else ``embedding``). After training each
  client embeds its data in eval mode and sends one prototype per class; the coordinator keeps every
  client's latest prototypes, fills each client's missing classes with the global average prototype
  p̄_c = mean_k p_c^k, and sends all sets back. Local loss, summed over the prototype sets s
  (``set_reduction: sum`` as the reference; ``mean`` divides by their number), τ = 0.07:

  - ``views: 2`` (default; the released code's ``ConLoss``, the paper's Eq. 5-6 in its code form): every
    batch is augmented twice with ``view_augment`` (2B rows r, row r of class y_r), features are
    L2-normalised (the reference head normalises them) and the client prototypes are the raw class means of
    those normalised features. Row r's anchor is the raw prototype p^s_{y_r}; with logits
    ``l_rk = p^s_{y_r}·f_k / τ`` (dot products) over the 2B rows, the row's own column masked:
    ``L^s = (1/2B) Σ_r −(1/|P(r)|) Σ_{k∈P(r)} [ l_rk − log Σ_{k'≠r} e^{l_rk'} ]``, P(r) = {k ≠ r: y_k = y_r}
    (never empty: the other view); ``ce_weight·CE`` on both views.
  - ``views: 1`` (option, the older one-view form): cosine similarities, one view, no mask:
    ``ce_weight·CE + Σ_s (1/B)Σ_i [ −(1/n_{y_i}) Σ_{j: y_j=y_i} log( e^{cos(p^s_{y_i}, f_j)/τ} / Σ_k e^{cos(p^s_{y_i}, f_k)/τ} ) ]``. ``ce_weight`` defaults to 1: the FedCCL paper evaluates FedPCL "with model parameter
  averaging" through the classifier, which must then be trained; the reference's prototype-only
  objective is ``ce_weight: 0``.

Every method uses CE only while no prototype exists (the first round). Round metrics add
``bytes_signals`` (prototype bytes broadcast + uploaded) next to the weight bytes of the coordinator.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate, local_sgd, register
from fedray.config import ConfigError
from fedray.core.params import ParamSpec

# --------------------------------------------------------------------------------------------------------
# shared helpers (also used by fedray.algorithms.fedccl)
# --------------------------------------------------------------------------------------------------------


def resolve_tap(model, tap: str) -> str:
    """``auto`` -> ``head_hidden`` when the model has that tap (a backbone + MLP head), else ``embedding``."""
    taps = tuple(getattr(model, "feature_taps", ()))
    if tap == "auto":
        return "head_hidden" if "head_hidden" in taps else "embedding"
    if tap not in taps:
        raise ConfigError(f"algorithm.params.tap: model has no feature tap {tap!r} (taps: {', '.join(taps)})")
    return tap


def resolve_signal_tap(model, tap: str) -> str:
    """The tap whose features FedCCL, FedProto and FPL contrast and upload. ``auto`` -> ``head_hidden`` when
    the model is a backbone + MLP head whose backbone is frozen (``freeze_backbone: true``, the papers'
    pre-trained extractor: only the head trains, so a loss on the frozen ``embedding`` would have no
    gradient), else ``embedding`` (the vector the classifier reads, FedCCL's f(x))."""
    if tap == "auto":
        backbone = getattr(model, "backbone", None)
        frozen = backbone is not None and not any(p.requires_grad for p in backbone.parameters())
        return "head_hidden" if frozen and "head_hidden" in tuple(getattr(model, "feature_taps", ())) else "embedding"
    return resolve_tap(model, tap)


# the tap must exist on the model, so the name is checked when a client resolves it (resolve_signal_tap)
SIGNAL_TAP = ParamSpec("auto", "feature tap whose features are contrasted and uploaded ('auto': head_hidden with a "
                       "frozen backbone, else embedding)", str)


def logits_and_features(model, x: torch.Tensor, tap: str = "embedding") -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass returning the logits and the (pooled, (B, D)) feature tap."""
    from fedray.models import pool_tap

    logits, taps = model.forward_features(x, taps=(tap,))
    return logits, pool_tap(taps[tap])


@torch.no_grad()
def embed_client(ctx: ClientContext, tap: str = "embedding", batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Features of all of the client's samples with the current (trained) model in eval mode, no augmentation.

    Returns ``(features (n, D) float32, labels (n,) int64)`` in storage order; restores the model's mode.
    """
    from fedray.data.loader import to_float

    model = ctx.model
    was_training = model.training
    model.eval()
    out = []
    try:
        for i in range(0, ctx.num_samples, batch_size):
            xb = to_float(torch.from_numpy(np.array(ctx.images[i : i + batch_size])), ctx.meta, ctx.normalize)
            xb = xb.to(ctx.device)
            _, f = logits_and_features(model, xb, tap)
            out.append(f.float().cpu())
    finally:
        model.train(was_training)
    feats = torch.cat(out).numpy() if out else np.zeros((0, 0), np.float32)
    return np.ascontiguousarray(feats, dtype=np.float32), np.asarray(ctx.labels, dtype=np.int64)


def class_means(feats: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One mean vector per class present, classes ascending: ``(means (k, D) float32, classes (k,) int64)``."""
    labels = np.asarray(labels, dtype=np.int64)
    classes = np.unique(labels)
    if classes.size == 0:
        return np.zeros((0, feats.shape[1] if feats.ndim == 2 else 0), np.float32), classes
    sums = np.zeros((classes.size, feats.shape[1]), np.float64)
    np.add.at(sums, np.searchsorted(classes, labels), feats.astype(np.float64))
    counts = np.bincount(np.searchsorted(classes, labels), minlength=classes.size).astype(np.float64)
    return (sums / counts[:, None]).astype(np.float32), classes


def clustered_means(feats: np.ndarray, labels: np.ndarray, mode: str = "clustered") -> tuple[np.ndarray, np.ndarray]:
    """Per class (ascending), the cluster means of that class's rows: FINCH (cosine, no early exit, the
    coarsest partition it keeps; means of the original rows, Eq. 8-10 / 13-14) for ``mode="clustered"``,
    the plain class mean for ``mode="averaged"``. A class with one row gives that row.

    Returns ``(vectors (m, D) float32, their classes (m,) int64)``.
    """
    from fedray.clustering import finch_means

    if mode == "averaged":
        return class_means(feats, labels)
    labels = np.asarray(labels, dtype=np.int64)
    vecs, labs = [], []
    for c in np.unique(labels):
        x = np.ascontiguousarray(feats[labels == c], dtype=np.float32)
        means, _ = finch_means(x, "last", distance="cosine", ensure_early_exit=False)
        vecs.append(np.asarray(means, dtype=np.float32))
        labs.append(np.full(means.shape[0], c, dtype=np.int64))
    if not vecs:
        return np.zeros((0, feats.shape[1] if feats.ndim == 2 else 0), np.float32), np.zeros(0, np.int64)
    return np.ascontiguousarray(np.concatenate(vecs)), np.concatenate(labs)


def arrays_nbytes(obj) -> int:
    """Bytes of every numpy array inside a (nested) dict / list / tuple payload."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(arrays_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(arrays_nbytes(v) for v in obj)
    return 0


def as_tensor(a: np.ndarray, device, dtype=None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)


def sorted_extras(extras: list[dict]) -> list[dict]:
    """Client extras in ascending client id: server-side results never depend on arrival or sampling order."""
    return sorted(extras, key=lambda e: int(e["cid"]))


class SignalAccounting:
    """Mix-in: record the signal bytes of a round in the server state and report them.

    ``after_aggregate`` of the algorithm calls :meth:`_record_bytes` with the payload bytes one client
    received this round and the bytes the clients uploaded; the coordinator calls :meth:`round_metrics`
    (``num_sampled`` clients received the broadcast) and merges the result into the round report.
    """

    def payload_nbytes(self, state: dict) -> int:
        return arrays_nbytes(self.broadcast(0, None, state))

    @staticmethod
    def _record_bytes(state: dict, rnd: int, per_client: int, upload: int) -> None:
        state["bytes"] = {"round": int(rnd), "broadcast_per_client": int(per_client), "upload": int(upload)}

    def round_metrics(self, rnd: int, state: dict, num_sampled: int) -> dict:
        b = state.get("bytes") or {}
        if b.get("round") == rnd:
            per_client, upload = int(b["broadcast_per_client"]), int(b["upload"])
        else:  # nothing aggregated this round (every client dropped): the state was broadcast, nothing came back
            per_client, upload = self.payload_nbytes(state), 0
        bcast = per_client * int(num_sampled)
        return {"bytes_signals": bcast + upload, "bytes": {"signals_broadcast": bcast, "signals_upload": upload}}


class LastEpochPrototypes:
    """Accumulates per-class feature sums over the last local epoch (RethinkFL's on-the-fly prototypes).

    ``local_sgd`` visits ``ceil(n / bs)`` batches per epoch (``floor`` with ``drop_last``); the batches of
    the last epoch are the last ``per_epoch`` calls (with ``train.local_steps = T``: the last
    ``min(T, per_epoch)`` steps, one epoch's worth).
    """

    def __init__(self, ctx: ClientContext, num_classes: int):
        t = ctx.train
        n, bs = ctx.num_samples, int(t.batch_size)
        per_epoch = n // bs if t.drop_last else -(-n // bs)
        steps = getattr(t, "local_steps", None)
        total = int(t.local_epochs) * per_epoch if steps is None else int(steps)
        self.first_batch = max(0, total - per_epoch)
        self.calls = 0
        self.sums: torch.Tensor | None = None
        self.counts = torch.zeros(num_classes, dtype=torch.float64)

    def add(self, feats: torch.Tensor, y: torch.Tensor) -> None:
        if self.calls >= self.first_batch:
            f = feats.detach().to("cpu", torch.float64)
            if self.sums is None:
                self.sums = torch.zeros(self.counts.shape[0], f.shape[1], dtype=torch.float64)
            yc = y.detach().cpu()
            self.sums.index_add_(0, yc, f)
            self.counts += torch.bincount(yc, minlength=self.counts.shape[0]).double()
        self.calls += 1

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self.sums is None:
            return np.zeros((0, 0), np.float32), np.zeros(0, np.int64)
        present = torch.nonzero(self.counts > 0).flatten()
        protos = (self.sums[present] / self.counts[present, None]).float().numpy()
        return np.ascontiguousarray(protos), present.numpy().astype(np.int64)


def _check_extras(extras: list[dict], key: str) -> None:
    for e in extras:
        if key not in e:
            raise RuntimeError(f"client {e.get('cid')} returned no {key!r} in its extras")


# --------------------------------------------------------------------------------------------------------
# FedProto and FPL
# --------------------------------------------------------------------------------------------------------


class _RoundPrototypes(SignalAccounting, Algorithm):
    """Shared server/client skeleton of FedProto and FPL: last-epoch prototypes of the round's clients.

    Subclasses define ``server_prototypes(protos, classes) -> payload dict`` (coordinator, from the round's
    client prototypes in ascending client order) and ``regulariser(feats, y, tensors) -> loss`` (client,
    added to CE once a payload exists).
    """

    model_needs = ("features",)

    def init_state(self, weights):
        return {"global": None, "bytes": None}

    def broadcast(self, rnd, weights, state):
        return dict(state["global"]) if state.get("global") else {}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        per_client = self.payload_nbytes(state)
        _check_extras(extras, "protos")
        ex = [e for e in sorted_extras(extras) if e["protos"].shape[0] > 0]
        upload = sum(arrays_nbytes([e["protos"], e["proto_classes"]]) for e in extras)
        new = dict(state)
        if ex:
            protos = np.concatenate([e["protos"] for e in ex]).astype(np.float32)
            classes = np.concatenate([e["proto_classes"] for e in ex]).astype(np.int64)
            new["global"] = self.server_prototypes(protos, classes)
        self._record_bytes(new, rnd, per_client, upload)
        return weights, new

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        tensors = {k: as_tensor(v, ctx.device) for k, v in payload.items() if isinstance(v, np.ndarray)}
        active = bool(tensors)
        acc = LastEpochPrototypes(ctx, ctx.num_classes)
        tap = resolve_signal_tap(ctx.model, self.params["tap"])

        def loss_fn(model, x, y):
            logits, feats = logits_and_features(model, x, tap)
            acc.add(feats, y)
            loss = F.cross_entropy(logits, y)
            if active:
                loss = loss + self.regulariser(feats, y, tensors)
            return loss

        loss = local_sgd(ctx, loss_fn)
        protos, classes = acc.result()
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss,
                            extras={"protos": protos, "proto_classes": classes})


@register
class FedProto(_RoundPrototypes):
    """FedProto with model averaging: ``CE + μ·(1/B)Σ_i (1/D)‖f_i − p_{y_i}‖²``, p_c = unweighted mean of the
    round's client prototypes of class c (module docstring). μ = 1 (FedProto's λ; MarsFL uses 2)."""

    name = "fedproto"
    params_spec = {"mu": ParamSpec(1.0, "mu: weight of the MSE to the global class prototypes", float, ge=0),
                   "tap": SIGNAL_TAP}
    description = "FedProto under FedAvg: MSE to the mean class prototypes of the round's clients"

    def server_prototypes(self, protos, classes):
        means, cls = class_means(protos, classes)
        return {"protos": means, "proto_classes": cls}

    def regulariser(self, feats, y, t):
        from fedray.losses import fpl_mse_loss

        return float(self.params["mu"]) * fpl_mse_loss(feats, y, t["protos"], t["proto_classes"])


@register
class FPL(_RoundPrototypes):
    """FPL: ``CE + InfoNCE over FINCH cluster prototypes (T = 0.02) + MSE to their unbiased mean``
    (module docstring)."""

    name = "fpl"
    params_spec = {"tau": ParamSpec(0.02, "T: temperature of the cluster-prototype InfoNCE", float, gt=0),
                   "tap": SIGNAL_TAP}
    description = "FPL: server FINCH over class prototypes, cluster-prototype InfoNCE + MSE to their mean"

    def server_prototypes(self, protos, classes):
        cluster, cluster_labels = clustered_means(protos, classes, "clustered")
        unbiased, ucls = class_means(cluster, cluster_labels)
        return {"cluster_protos": cluster, "cluster_labels": cluster_labels, "unbiased": unbiased,
                "unbiased_classes": ucls}

    def regulariser(self, feats, y, t):
        from fedray.losses import fpl_infonce_loss, fpl_mse_loss

        nce = fpl_infonce_loss(feats, y, t["cluster_protos"], t["cluster_labels"], tau=float(self.params["tau"]))
        return nce + fpl_mse_loss(feats, y, t["unbiased"], t["unbiased_classes"])


# --------------------------------------------------------------------------------------------------------
# FedPCL
# --------------------------------------------------------------------------------------------------------


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


@register
class FedPCL(SignalAccounting, Algorithm):
    """FedPCL with model averaging (module docstring): ``ce_weight·CE + prototype-anchored contrast`` over every
    client's latest class prototypes (missing classes filled with the global average), τ = 0.07."""

    name = "fedpcl"
    model_needs = ("features",)
    params_spec = {
        "tau": ParamSpec(0.07, "tau: temperature of the prototype-anchored contrast", float, gt=0),
        "ce_weight": ParamSpec(1.0, "weight of the cross-entropy term (0: the reference's prototype-only objective)",
                               float, ge=0),
        "tap": ParamSpec("auto", "feature tap of the prototypes ('auto': head_hidden when the model has it, "
                         "else embedding)", str),
        "set_reduction": ParamSpec("sum", "'sum' (the reference) or 'mean' of the loss over the prototype sets",
                                   str, choices=("sum", "mean")),
        "views": ParamSpec(2, "2: the released code's two-view contrast (normalised features, raw prototypes, dot "
                           "products, self-masked); 1: one view, cosine similarities", int, choices=(1, 2)),
        "view_augment": ParamSpec(["rotate", "crop", "flip"], "augmentations drawing the two views (train.augment "
                                  "form; at least one; views: 2 only)"),
    }

    def validate(self):
        from fedray.algorithms.fedrcl import view_augmenter

        self._views = view_augmenter(self.params["view_augment"]) if self.params["views"] == 2 else None
    description = "FedPCL: prototype-anchored contrast over all clients' prototypes (frozen-backbone head training)"

    def init_state(self, weights):
        return {"clients": {}, "sets": None, "bytes": None}

    def broadcast(self, rnd, weights, state):
        return dict(state["sets"]) if state.get("sets") else {}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        per_client = self.payload_nbytes(state)
        _check_extras(extras, "protos")
        clients = dict(state["clients"])
        for e in extras:
            if e["protos"].shape[0] > 0:
                clients[int(e["cid"])] = {"protos": e["protos"], "proto_classes": e["proto_classes"]}
        upload = sum(arrays_nbytes([e["protos"], e["proto_classes"]]) for e in extras)
        new = {**state, "clients": clients}
        if clients:
            cids = sorted(clients)
            all_p = np.concatenate([clients[c]["protos"] for c in cids])
            all_c = np.concatenate([clients[c]["proto_classes"] for c in cids])
            avg, classes = class_means(all_p, all_c)  # global average prototype per class (unweighted)
            sets = np.repeat(avg[None], len(cids), axis=0)
            for s, c in enumerate(cids):
                sets[s, np.searchsorted(classes, clients[c]["proto_classes"])] = clients[c]["protos"]
            new["sets"] = {"proto_sets": np.ascontiguousarray(sets, dtype=np.float32), "proto_classes": classes}
        self._record_bytes(new, rnd, per_client, upload)
        return weights, new

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        tap = resolve_tap(ctx.model, self.params["tap"])
        active = "proto_sets" in payload
        if active:
            sets = as_tensor(payload["proto_sets"], ctx.device)
            pcls = as_tensor(payload["proto_classes"], ctx.device)
        w_ce, tau, red = float(self.params["ce_weight"]), float(self.params["tau"]), self.params["set_reduction"]
        views = self._views
        gen = ctx.torch_generator("algorithm") if views is not None else None

        def one_view(model, x, y):
            logits, feats = logits_and_features(model, x, tap)
            loss = w_ce * F.cross_entropy(logits, y)
            if active:
                loss = loss + prototype_anchor_contrast(feats, y, sets, pcls, tau=tau, reduction=red)
            return loss

        def two_views(model, x, y):
            v = torch.cat([views(x, gen), views(x, gen)], dim=0)
            logits, feats = logits_and_features(model, v, tap)
            loss = w_ce * F.cross_entropy(logits, torch.cat([y, y], dim=0))
            if active:
                loss = loss + prototype_two_view_contrast(F.normalize(feats, dim=1), y, sets, pcls, tau=tau,
                                                          reduction=red)
            return loss

        loss = local_sgd(ctx, one_view if views is None else two_views)
        feats, labels = embed_client(ctx, tap)
        if views is not None:  # the two-view form's prototypes: raw means of the normalised features
            feats = F.normalize(torch.from_numpy(feats), dim=1).numpy()
        protos, classes = class_means(feats, labels)
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss,
                            extras={"protos": protos, "proto_classes": classes})
