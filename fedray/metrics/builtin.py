"""The built-in evaluation metrics of ``eval.metrics`` (registered in :mod:`fedray.metrics.registry`).

Each is a pair ``partial(logits, labels, domains) -> {key: array}`` / ``reduce(sums) -> {name: float}``: the
partial sums of one evaluation batch are counts (int64) and float64 sums of a shape fixed by the number of
classes, so the sums over the batches of a test split, added in batch order, reduce to the same bits however the
split is cut into shards (docs/engine.md, "Evaluation").

- ``balanced_accuracy``: the mean per-class recall over the classes present in the test set (scikit-learn's
  ``balanced_accuracy_score``);
- ``macro_f1``: the unweighted mean of per-class F1 over the classes that occur as a label or a prediction
  (``f1_score(average="macro")``);
- ``per_class_accuracy``: each present class's recall, as ``per_class_accuracy/<class index>``;
- ``ece``: expected calibration error of the top-1 softmax confidence in 15 equal-width bins
  ``(b/15, (b+1)/15]``: ``sum_b |acc_b - conf_b| * n_b / N`` (Guo et al., 2017);
- ``top5_accuracy``: the label among the ``k = min(5, C)`` largest logits (``top_k_accuracy_score``).

torch is imported inside the functions: this module is imported where metrics are only named (a Ray run's
driver imports no torch).
"""

from __future__ import annotations

import numpy as np

ECE_BINS = 15
TOP_K = 5


def _numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def class_counts(logits, labels, domains=None) -> dict[str, np.ndarray]:
    """Per class (length C): ``support`` (examples of the class), ``predicted`` (examples predicted as it),
    ``hits`` (examples of the class predicted right); int64."""
    c = int(logits.shape[1])
    y = _numpy(labels).astype(np.int64, copy=False)
    pred = _numpy(logits.argmax(1)).astype(np.int64, copy=False)
    if y.size and (y.min() < 0 or y.max() >= c):
        raise ValueError(f"labels must be class indices in [0, {c}) for logits of {c} classes, "
                         f"got {y.min()}..{y.max()}")
    return {"support": np.bincount(y, minlength=c), "predicted": np.bincount(pred, minlength=c),
            "hits": np.bincount(y[pred == y], minlength=c)}


def _recalls(sums: dict) -> tuple[np.ndarray, np.ndarray]:
    support, hits = np.asarray(sums["support"]), np.asarray(sums["hits"])
    present = support > 0
    return np.flatnonzero(present), hits[present] / support[present]


def balanced_accuracy(sums: dict) -> dict[str, float]:
    _, rec = _recalls(sums)
    return {"balanced_accuracy": float(np.mean(rec)) if rec.size else float("nan")}


def per_class_accuracy(sums: dict) -> dict[str, float]:
    classes, rec = _recalls(sums)
    return {str(int(c)): float(r) for c, r in zip(classes, rec)}


def macro_f1(sums: dict) -> dict[str, float]:
    denom = np.asarray(sums["support"]) + np.asarray(sums["predicted"])
    seen = denom > 0
    f1 = 2.0 * np.asarray(sums["hits"])[seen] / denom[seen]
    return {"macro_f1": float(np.mean(f1)) if f1.size else float("nan")}


def confidence_bins(logits, labels, domains=None) -> dict[str, np.ndarray]:
    """Per confidence bin (length :data:`ECE_BINS`): ``count`` and ``hits`` (int64), ``confidence`` (the float64
    sum of the top-1 softmax probabilities, computed in float64)."""
    import torch

    probs = torch.softmax(logits.detach().to(torch.float64), dim=1)
    conf_t, pred_t = probs.max(1)
    conf, pred, y = _numpy(conf_t), _numpy(pred_t), _numpy(labels)
    edges = np.linspace(0.0, 1.0, ECE_BINS + 1)
    b = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, ECE_BINS - 1)  # conf in (edges[b], edges[b+1]]
    return {"count": np.bincount(b, minlength=ECE_BINS),
            "hits": np.bincount(b[pred == y], minlength=ECE_BINS),
            "confidence": np.bincount(b, weights=conf, minlength=ECE_BINS).astype(np.float64, copy=False)}


def ece(sums: dict) -> dict[str, float]:
    count, hits = np.asarray(sums["count"]), np.asarray(sums["hits"])
    conf = np.asarray(sums["confidence"], dtype=np.float64)
    n = int(count.sum())
    if n == 0:
        return {"ece": float("nan")}
    total = 0.0
    for b in np.flatnonzero(count):
        total += abs(hits[b] / count[b] - conf[b] / count[b]) * (count[b] / n)
    return {"ece": float(total)}


def top_k_hits(logits, labels, domains=None) -> dict[str, np.ndarray]:
    """``hits``: examples whose label is among the ``min(5, C)`` largest logits; ``count``: examples (int64)."""
    k = min(TOP_K, int(logits.shape[1]))
    top = logits.topk(k, dim=1).indices
    hit = (top == labels.reshape(-1, 1).to(top.device)).any(1)
    return {"hits": np.int64(int(hit.sum())), "count": np.int64(int(labels.shape[0]))}


def top5_accuracy(sums: dict) -> dict[str, float]:
    n = int(sums["count"])
    return {"top5_accuracy": int(sums["hits"]) / n if n else float("nan")}


#: name -> (partial, reduce, description)
BUILTIN = {
    "balanced_accuracy": (class_counts, balanced_accuracy,
                          "mean per-class recall over the classes present in the test set"),
    "macro_f1": (class_counts, macro_f1, "unweighted mean of per-class F1 (classes seen as a label or a prediction)"),
    "per_class_accuracy": (class_counts, per_class_accuracy,
                           "recall of each class present in the test set, as per_class_accuracy/<class>"),
    "ece": (confidence_bins, ece, f"expected calibration error of the top-1 confidence, {ECE_BINS} equal-width bins"),
    "top5_accuracy": (top_k_hits, top5_accuracy, f"label among the min({TOP_K}, classes) largest logits"),
}
