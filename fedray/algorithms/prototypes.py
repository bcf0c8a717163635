"""Prototype baselines of the FedCCL comparison: FedProto, FPL and FedPCL (METHODS.md §2). The signal helpers
they share with FedCCL (client embeddings, per-class means / FINCH clusters, byte accounting of the exchanged
vectors) are in :mod:`fedray.algorithms.signals`; FedPCL's losses in :mod:`fedray.losses.prototypes`.

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

Every method uses CE only while no prototype exists (the first round). The engine measures the prototype
bytes broadcast and uploaded (``bytes_signals`` of the round's row) next to the weight bytes.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate
from fedray.algorithms.registry import register
from fedray.algorithms.training import local_sgd
from fedray.algorithms.signals import (  # noqa: F401  (SIGNAL_TAP, resolve_signal_tap: the signal helpers' home)
    SIGNAL_TAP,
    LastEpochPrototypes,
    _check_extras,
    as_tensor,
    class_means,
    clustered_means,
    embed_client,
    logits_and_features,
    resolve_signal_tap,
    resolve_tap,
    sorted_extras,
)
from fedray.core.params import ParamSpec
from fedray.losses import prototype_anchor_contrast, prototype_two_view_contrast

# --------------------------------------------------------------------------------------------------------
# FedProto and FPL
# --------------------------------------------------------------------------------------------------------


class _RoundPrototypes(Algorithm):
    """Shared server/client skeleton of FedProto and FPL: last-epoch prototypes of the round's clients.

    Subclasses define ``server_prototypes(protos, classes) -> payload dict`` (coordinator, from the round's
    client prototypes in ascending client order) and ``regulariser(feats, y, tensors) -> loss`` (client,
    added to CE once a payload exists).
    """

    model_needs = ("features",)

    def init_state(self, weights):
        return {"global": None}

    def broadcast(self, rnd, weights, state):
        return dict(state["global"]) if state.get("global") else {}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        _check_extras(extras, "protos")
        ex = [e for e in sorted_extras(extras) if e["protos"].shape[0] > 0]
        new = dict(state)
        if ex:
            protos = np.concatenate([e["protos"] for e in ex]).astype(np.float32)
            classes = np.concatenate([e["proto_classes"] for e in ex]).astype(np.int64)
            new["global"] = self.server_prototypes(protos, classes)
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


@register
class FedPCL(Algorithm):
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
        return {"clients": {}, "sets": None}

    def broadcast(self, rnd, weights, state):
        return dict(state["sets"]) if state.get("sets") else {}

    def after_aggregate(self, rnd, weights, extras, state, *, broadcast=None):
        _check_extras(extras, "protos")
        clients = dict(state["clients"])
        for e in extras:
            if e["protos"].shape[0] > 0:
                clients[int(e["cid"])] = {"protos": e["protos"], "proto_classes": e["proto_classes"]}
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
