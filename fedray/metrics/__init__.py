"""Evaluation of the global model: accuracy, per-domain accuracy, loss, EMA."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(model, images: np.ndarray, labels: np.ndarray, *, meta, normalize: bool, batch_size: int = 500,
             domains: np.ndarray | None = None, device="cpu", return_features: bool = False) -> dict:
    """Top-1 accuracy and mean cross-entropy of ``model`` on a test split (plus per-domain accuracy)."""
    from fedray.data.loader import to_float

    model.eval()
    n = int(labels.shape[0])
    correct = np.zeros(n, dtype=bool)
    loss_sum = 0.0
    feats = []
    for i in range(0, n, batch_size):
        xb = to_float(torch.from_numpy(np.array(images[i : i + batch_size])), meta, normalize).to(device)
        yb = torch.from_numpy(np.array(labels[i : i + batch_size])).to(device)
        if return_features:
            logits, taps = model.forward_features(xb, taps=("embedding",))
            feats.append(taps["embedding"].reshape(len(yb), -1).cpu())
        else:
            logits = model(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct[i : i + batch_size] = (logits.argmax(1) == yb).cpu().numpy()
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
        out["features"] = torch.cat(feats).numpy() if feats else np.zeros((0, 0), np.float32)
    return out


def ema_update(prev: float | None, value: float, decay: float) -> float:
    """Exponential moving average as the FedRCL tables report it: starts at the first value."""
    if prev is None or (isinstance(prev, float) and math.isnan(prev)):
        return value
    return decay * prev + (1.0 - decay) * value
