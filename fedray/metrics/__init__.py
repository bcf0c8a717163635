"""Evaluation of the global model: accuracy, per-domain accuracy, loss, EMA, and the metrics of
``eval.metrics`` (:mod:`fedray.metrics.registry`).

torch is imported by the functions that evaluate a model, not with this package: a Ray run's driver imports
the metric registry (:mod:`fedray.metrics.registry`, e.g. for a plugin's ``fedray.register_metric``) and no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


#: On CPU an evaluation batch goes through the model in slices of this many examples: a 500-image batch's
#: activations (50 MB after the FedAvg CNN's first convolution) do not stay in cache, 64 images' do, and the
#: forward takes about a third less time (bench/bench_eval.py, docs/benchmarks.md). Each example's logits are
#: the same bits either way on CPU (tests/metrics/test_eval_slices.py); the loss is still summed per
#: evaluation batch. On an accelerator the batch goes through whole.
CPU_FORWARD_SLICE = 64


def _forward(model, xb, return_features: bool):
    """``model(xb)`` (and the embedding tap with ``return_features``), in slices of :data:`CPU_FORWARD_SLICE`
    examples on CPU."""
    step = CPU_FORWARD_SLICE if xb.device.type == "cpu" else len(xb)
    logits, feats = [], []
    for i in range(0, len(xb), max(1, step)):
        if return_features:
            out, taps = model.forward_features(xb[i:i + step], taps=("embedding",))
            feats.append(taps["embedding"].reshape(len(out), -1))
        else:
            out = model(xb[i:i + step])
        logits.append(out)
    one = len(logits) == 1
    if one:
        return logits[0], (feats[0] if feats else None)
    import torch

    return torch.cat(logits), (torch.cat(feats) if feats else None)


def evaluate_batches(model, images: np.ndarray, labels: np.ndarray, start: int, stop: int, *, meta, normalize: bool,
                     batch_size: int = 500, device="cpu", return_features: bool = False,
                     metrics: Sequence[str] = (), domains: np.ndarray | None = None) -> dict:
    """The test examples ``start .. stop-1`` in batches of ``batch_size`` from ``start`` (one shard of
    :func:`evaluate`): each batch's cross-entropy sum (a Python float), each example's correct flag, with
    ``return_features`` its embedding and, per batch, the partial sums of every metric named in ``metrics``
    (``{name: {key: array}}``; their ``domains`` argument from ``domains``, the test split's, when given).
    ``start`` must be a multiple of ``batch_size`` so the batches are the ones :func:`evaluate` forms over the
    whole split. The model's train/eval mode is restored."""
    import torch
    import torch.nn.functional as F

    from fedray.data.loader import to_float

    if start % batch_size:
        raise ValueError(f"evaluate_batches: start {start} is not a multiple of the batch size {batch_size}")
    specs = _metric_specs(metrics)
    was_training = model.training
    model.eval()
    correct = np.zeros(max(0, stop - start), dtype=bool)
    losses: list[float] = []
    feats, sums = [], []
    try:
        with torch.no_grad():
            for i in range(start, stop, batch_size):
                j = min(i + batch_size, stop)
                xb = to_float(torch.from_numpy(np.array(images[i:j])), meta, normalize).to(device)
                yb = torch.from_numpy(np.array(labels[i:j])).to(device)
                logits, emb = _forward(model, xb, return_features)
                if emb is not None:
                    feats.append(emb.cpu())
                losses.append(float(F.cross_entropy(logits, yb, reduction="sum")))
                correct[i - start : j - start] = (logits.argmax(1) == yb).cpu().numpy()
                if specs:
                    db = None if domains is None else torch.from_numpy(np.array(domains[i:j])).to(device)
                    sums.append(_partials(specs, logits, yb, db))
    finally:
        model.train(was_training)
    return {"start": int(start), "stop": int(stop), "losses": losses, "correct": correct,
            "features": torch.cat(feats).numpy() if feats else None, "metrics": sums}


def _metric_specs(names: Sequence[str]) -> list:
    if not names:
        return []
    from fedray.metrics.registry import METRICS

    return [METRICS[n] for n in names]


def _partials(specs: list, logits, labels, domains) -> dict:
    """Every metric's partial sums of one batch, checked (:func:`fedray.metrics.registry.check_partial`)."""
    from fedray.metrics.registry import check_partial

    return {s.name: check_partial(s.name, s.partial(logits, labels, domains)) for s in specs}


def _reduce_metrics(parts: list[dict], names: Sequence[str], batch_size: int | None) -> dict:
    """The metrics.jsonl entries of ``names`` from the shards' per-batch partial sums, added batch by batch
    from the first batch (:func:`fedray.metrics.registry.reduce_metric`)."""
    from fedray.metrics.registry import reduce_metric

    out: dict = {}
    for name in names:
        batches, where = [], []
        for p in parts:
            for b, sums in enumerate(p.get("metrics") or []):
                batches.append(sums[name])
                if batch_size:
                    lo = p["start"] + b * batch_size
                    where.append(f"test examples {lo}-{min(lo + batch_size, p['stop']) - 1}")
        out.update(reduce_metric(name, batches, where))
    return out


def reduce_evaluation(parts: list[dict], labels: np.ndarray, *, meta, domains: np.ndarray | None = None,
                      return_features: bool = False, metrics: Sequence[str] = (),
                      batch_size: int | None = None) -> dict:
    """Accuracy, mean cross-entropy (and per-domain accuracy, embeddings, the ``metrics``' values) from the
    shards of :func:`evaluate_batches` covering the test split in order. The loss is summed batch by batch from
    the first batch on, in float64, and so are the metrics' partial sums, so any cut of the split into
    batch-aligned shards gives the same bits as one shard over the whole split; the correct counts are exact.
    ``batch_size`` only names the batch of a metric error."""
    n = int(labels.shape[0])
    at = 0
    for p in parts:
        if p["start"] != at:
            raise ValueError(f"reduce_evaluation: the shards do not cover the test split in order (a shard starts at "
                             f"{p['start']}, expected {at})")
        at = p["stop"]
    if at != n:
        raise ValueError(f"reduce_evaluation: the shards end at example {at} of {n}")
    loss_sum = 0.0
    for p in parts:
        for x in p["losses"]:
            loss_sum += x
    correct = np.concatenate([p["correct"] for p in parts]) if parts else np.zeros(0, dtype=bool)
    out = {
        "accuracy": float(correct.mean()) if n else math.nan,
        "test_loss": loss_sum / n if n else math.nan,
    }
    if domains is not None and meta.domains:
        per = {}
        for d, name in enumerate(meta.domains):
            m = domains == d
            if m.any():
                per[name] = float(correct[m].mean())
        out["domain_accuracy"] = per
        out["domain_mean_accuracy"] = float(np.mean(list(per.values()))) if per else math.nan
    if return_features:
        feats = [p["features"] for p in parts if p["features"] is not None]
        out["features"] = np.concatenate(feats) if feats else np.zeros((0, 0), np.float32)
    if metrics:
        out.update(_reduce_metrics(parts, metrics, batch_size))
    return out


def evaluate(model, images: np.ndarray, labels: np.ndarray, *, meta, normalize: bool, batch_size: int = 500,
             domains: np.ndarray | None = None, device="cpu", return_features: bool = False,
             metrics: Sequence[str] = ()) -> dict:
    """Top-1 accuracy and mean cross-entropy of ``model`` on a test split (plus per-domain accuracy and the
    ``metrics``' values), in this process: one shard over the whole split (the engine shards it over its
    workers, ``fedray.engine.evaluation``)."""
    part = evaluate_batches(model, images, labels, 0, int(labels.shape[0]), meta=meta, normalize=normalize,
                            batch_size=batch_size, device=device, return_features=return_features,
                            metrics=metrics, domains=domains)
    return reduce_evaluation([part], labels, meta=meta, domains=domains, return_features=return_features,
                             metrics=metrics, batch_size=batch_size)


def ema_update(prev: float | None, value: float, decay: float) -> float:
    """Exponential moving average as the FedRCL tables report it: starts at the first value."""
    if prev is None or (isinstance(prev, float) and math.isnan(prev)):
        return value
    return decay * prev + (1.0 - decay) * value
