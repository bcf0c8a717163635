"""Signal helpers shared by FedCCL and the prototype baselines (FedProto, FPL, FedPCL, FedProc): the feature
tap a method contrasts and uploads, a client's embeddings, per-class means and FINCH cluster means of them, the
last local epoch's prototypes, and the byte accounting of the vectors exchanged."""

from __future__ import annotations

import numpy as np
import torch

from fedray.algorithms.base import ClientContext
from fedray.config import ConfigError
from fedray.core.params import ParamSpec

__all__ = ["SIGNAL_TAP", "LastEpochPrototypes", "as_tensor", "class_means",
           "clustered_means", "embed_client", "logits_and_features", "resolve_signal_tap", "resolve_tap",
           "sorted_extras"]


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


def as_tensor(a: np.ndarray, device, dtype=None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)


def sorted_extras(extras: list[dict]) -> list[dict]:
    """Client extras in ascending client id: server-side results never depend on arrival or sampling order."""
    return sorted(extras, key=lambda e: int(e["cid"]))


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
