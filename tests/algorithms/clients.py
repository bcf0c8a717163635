"""Client-side helpers shared by the algorithm tests (not a test file): a tiny ``cnn_taps`` model and a
``ClientContext`` of 12 toy images around it."""

from __future__ import annotations

import numpy as np
import torch

from fedray.algorithms import ClientContext
from fedray.config import TrainConfig
from fedray.core.weights import FlatParams


def toy_context(model, global_w, prox_mu=0.0, state=None, labels=None, rnd=1):
    flat = FlatParams(model)
    flat.load(global_w)
    rng = np.random.default_rng(0)
    labels = np.arange(12) % 3 if labels is None else labels
    images = rng.integers(0, 255, size=(len(labels), 1, 28, 28), dtype=np.uint8)
    from fedray.data.table import DatasetMeta

    meta = DatasetMeta(name="toy", num_classes=10, shape=(1, 28, 28), mean=(0.5,), std=(0.25,))
    return ClientContext(cid=3, rnd=rnd, seed=0, model=model, flat=flat, global_weights=global_w, images=images,
                         labels=labels.astype(np.int64), meta=meta,
                         train=TrainConfig(batch_size=6, lr=0.05), device=torch.device("cpu"), normalize=True,
                         state=state, num_classes=10, model_factory=tiny_taps_model, prox_mu=prox_mu)


def tiny_taps_model():
    from fedray.models import build_model

    torch.manual_seed(0)
    return build_model("cnn_taps", in_channels=1, image_size=28, num_classes=10, widths=[4, 4, 8, 8])
