"""fedray.models.registry: model_for_meta, name/option errors, the listing."""

from __future__ import annotations

import pytest
import torch

from fedray.data.table import DatasetMeta
from fedray.models import MODELS, build_model, list_models, model_for_meta

torch.set_num_threads(1)


def test_model_for_meta():
    img = DatasetMeta(name="mnist", num_classes=10, shape=(1, 28, 28))
    vec = DatasetMeta(name="synthetic", num_classes=10, shape=(60,), dtype="float32")
    torch.manual_seed(0)
    a = model_for_meta("fedavg_cnn", img)
    torch.manual_seed(0)
    b = build_model("fedavg_cnn", in_channels=1, image_size=28, num_classes=10)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert model_for_meta("mlp", vec, hidden=[200])(torch.randn(2, 60)).shape == (2, 10)
    with pytest.raises(ValueError, match="needs image inputs"):
        model_for_meta("cnn4", vec)
    with pytest.raises(ValueError, match="neither"):
        model_for_meta("mlp", DatasetMeta(name="odd", num_classes=2, shape=(4, 4)))


# --------------------------------------------------------------------------------------- errors
def test_bad_names_and_options_raise_value_errors():
    with pytest.raises(ValueError, match=r"'resnet99'.*fedavg_cnn"):
        build_model("resnet99", in_channels=1, image_size=28, num_classes=10)
    with pytest.raises(ValueError, match=r"\['widht'\].*embed_dim"):
        build_model("cnn4", in_channels=1, image_size=28, num_classes=10, widht=3)
    with pytest.raises(ValueError, match="'embed_dim'"):
        build_model("cnn4", in_channels=1, image_size=28, num_classes=10, embed_dim=0)
    with pytest.raises(ValueError, match="image_size"):
        build_model("fedavg_cnn", in_channels=1, image_size=None, num_classes=10)
    with pytest.raises(ValueError, match="too small"):
        build_model("cnn4", in_channels=1, image_size=8, num_classes=10)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("cnn4", in_channels=1, image_size=28, num_classes=0)
    with pytest.raises(ValueError, match="'dropout'"):
        build_model("alexnet_split", in_channels=3, image_size=32, num_classes=10, dropout=1.5)
    model = build_model("cnn4", in_channels=1, image_size=28, num_classes=10)
    with pytest.raises(ValueError, match=r"'nope'.*conv2"):
        model.split("nope")
    with pytest.raises(ValueError, match=r"nope.*embedding"):
        model.forward_features(torch.randn(1, 1, 28, 28), taps=["nope"])


def test_list_models():
    listed = dict(list_models())
    assert set(listed) == set(MODELS) >= {"fedavg_cnn", "cnn4", "cnn5", "cnn_taps", "resnet18_gn", "resnet10_gn",
                                          "alexnet_split", "mlp", "cnn_backbone_mlp"}
    assert all(isinstance(d, str) and d for d in listed.values())
