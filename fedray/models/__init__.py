"""fedray's model zoo: models with named feature taps and named split points.

>>> import torch
>>> from fedray.models import build_model, pool_tap
>>> m = build_model("resnet18_gn", in_channels=3, image_size=32, num_classes=10)
>>> logits, feats = m.forward_features(torch.zeros(2, 3, 32, 32))          # feats: l1..l5, embedding
>>> client, server = m.split("l2")                                           # server(client(x)) == m(x)

See :mod:`fedray.models.base` for the contract and :mod:`fedray.models.zoo` for the architectures.
"""

from fedray.models.base import FedModel, ProjectedModel, Segment, SplitPart, pool_tap
from fedray.models.registry import MODELS, ModelSpec, build_model, list_models, model_for_meta

__all__ = [
    "MODELS",
    "ModelSpec",
    "FedModel",
    "Segment",
    "SplitPart",
    "ProjectedModel",
    "build_model",
    "model_for_meta",
    "list_models",
    "pool_tap",
]
