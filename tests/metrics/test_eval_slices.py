"""fedray.metrics: an evaluation batch goes through the model in slices of CPU_FORWARD_SLICE examples on CPU
(faster: the activations stay in cache). That must not move a bit: every registered model's logits (and
embedding) are the same whether a batch goes through whole or sliced, and evaluate_batches gives the loss
and the correct flags of the unsliced computation, per evaluation batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedray import metrics
from fedray.data.loader import to_float
from fedray.data.table import DatasetMeta
from fedray.models import build_model, list_models

#: image shape per model for a quick forward (channels, side); vector models get 20 features
SHAPES = {"cnn5": (3, 32), "resnet18_gn": (3, 32), "resnet10_gn": (3, 32), "alexnet_split": (3, 32),
          "cnn_backbone_mlp": (3, 32), "cnn_taps": (3, 32)}


def _model(name: str):
    torch.manual_seed(0)
    if name == "mlp":
        return build_model(name, in_channels=1, image_size=None, num_classes=10, input_dim=20).eval(), (20,)
    c, side = SHAPES.get(name, (1, 28))
    return build_model(name, in_channels=c, image_size=side, num_classes=10).eval(), (c, side, side)


@pytest.mark.parametrize("name", [n for n, _ in list_models()])
def test_sliced_forward_gives_the_same_logits(name):
    """Each example's logits (and embedding, where the model has the tap) are the same bits whole or sliced."""
    model, shape = _model(name)
    n = 2 * metrics.CPU_FORWARD_SLICE + 17  # two full slices and a short one
    x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(x)
        sliced, _ = metrics._forward(model, x, False)
        assert torch.equal(whole, sliced)
        if hasattr(model, "forward_features"):
            try:
                logits, taps = model.forward_features(x, taps=("embedding",))
            except (KeyError, ValueError, NotImplementedError):
                return  # no embedding tap on this model
            got_logits, got_emb = metrics._forward(model, x, True)
            assert torch.equal(logits, got_logits)
            assert torch.equal(taps["embedding"].reshape(n, -1), got_emb)


def test_evaluate_batches_equals_the_unsliced_computation():
    """Loss per evaluation batch and correct flags as a whole-batch forward computes them."""
    model, shape = _model("fedavg_cnn")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(300, 1, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=300).astype(np.int64)
    meta = DatasetMeta(name="img", num_classes=10, shape=(1, 28, 28), dtype="uint8", mean=(0.13,), std=(0.31,))
    got = metrics.evaluate_batches(model, images, labels, 0, 300, meta=meta, normalize=True, batch_size=250)
    want_losses, want_correct = [], []
    with torch.no_grad():
        for i in range(0, 300, 250):
            xb = to_float(torch.from_numpy(np.array(images[i:i + 250])), meta, True)
            yb = torch.from_numpy(labels[i:i + 250])
            logits = model(xb)
            want_losses.append(float(F.cross_entropy(logits, yb, reduction="sum")))
            want_correct.append((logits.argmax(1) == yb).numpy())
    assert got["losses"] == want_losses
    assert np.array_equal(got["correct"], np.concatenate(want_correct))
