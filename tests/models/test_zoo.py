"""Tests of the model zoo: shapes, taps, exact split composition, shared parameters, the bench CNN's
bit-exact equivalence with the workload's reference module, FedRCL's ResNet structure, and errors."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedray.models import MODELS, FedModel, build_model, pool_tap

torch.set_num_threads(1)

# (name, options) for every registered model; mlp also with hidden layers, the composite also on resnet10
CASES = [(name, {}) for name in MODELS] + [
    ("mlp", {"hidden": [200]}),
    ("cnn_backbone_mlp", {"backbone": "cnn_taps", "freeze_backbone": True}),
]
IMAGE_GEOMETRIES = [(1, 28, 10), (3, 32, 10), (3, 64, 100)]


def _ids(case):
    name, opts = case
    return name + ("-" + "-".join(f"{k}={v}" for k, v in opts.items()) if opts else "")


def _build(name, opts, c, s, k, seed=0):
    torch.manual_seed(seed)
    return build_model(name, in_channels=c, image_size=s, num_classes=k, **opts)


def _check_model(model: FedModel, x: torch.Tensor, k: int) -> None:
    """Shapes, taps and the exact split/embedding identities of one model on one input (eval mode)."""
    model.eval()
    b = x.shape[0]
    with torch.no_grad():
        y = model(x)
        assert y.shape == (b, k)
        logits, feats = model.forward_features(x)
        assert torch.equal(logits, y)
        assert tuple(feats) == model.feature_taps and "embedding" in feats
        assert all(t.shape[0] == b for t in feats.values())
        emb = model.embed(x)
        assert emb.shape == (b, model.embedding_dim)
        assert torch.equal(emb, feats["embedding"])
        assert torch.equal(model.classifier_head()(emb), y)
        # a subset of taps
        _, one = model.forward_features(x, taps=["embedding"])
        assert list(one) == ["embedding"]
        model_params = {id(p) for p in model.parameters()}
        state = model.state_dict()
        for point in model.split_points:
            client, server = model.split(point)
            a = client(x)
            assert torch.equal(server(a), y), f"split at {point!r} changes the output"
            cp, sp = {id(p) for p in client.parameters()}, {id(p) for p in server.parameters()}
            assert cp and not (cp & sp) and (cp | sp) == model_params, f"split at {point!r}: parameters not shared"
            for part in (client, server):
                for key, t in part.state_dict().items():
                    assert key in state and t.data_ptr() == state[key].data_ptr(), key
    if model.default_split is not None:
        assert model.default_split in model.split_points


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_every_model_on_image_geometries(case):
    name, opts = case
    for c, s, k in IMAGE_GEOMETRIES:
        if s == 64 and name == "resnet18_gn":
            continue  # covered separately with a single split (cost)
        model = _build(name, opts, c, s, k)
        _check_model(model, torch.randn(3, c, s, s), k)


def test_resnet18_64px_100_classes():
    model = _build("resnet18_gn", {}, 3, 64, 100).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        logits, feats = model.forward_features(x)
        assert logits.shape == (2, 100)
        assert feats["l5"].shape == (2, 512, 8, 8)
        client, server = model.split()
        assert torch.equal(server(client(x)), logits)


@pytest.mark.parametrize("opts", [{}, {"hidden": [200]}, {"hidden": [64, 32]}])
def test_mlp_on_vectors(opts):
    torch.manual_seed(0)
    model = build_model("mlp", in_channels=1, image_size=None, num_classes=10, input_dim=60, **opts)
    _check_model(model, torch.randn(4, 60), 10)
    if not opts:
        assert sum(p.numel() for p in model.parameters()) == 60 * 10 + 10
        assert model.split_points == () and model.default_split is None
        with pytest.raises(ValueError, match="no split points"):
            model.split()
    else:
        assert model.default_split == "fc1"
        client, _ = model.split()
        assert client(torch.randn(4, 60)).shape == (4, opts["hidden"][0])


def test_backbone_mlp_on_vectors():
    torch.manual_seed(0)
    model = build_model("cnn_backbone_mlp", in_channels=1, image_size=None, num_classes=5, input_dim=60,
                        backbone="mlp", backbone_options={"hidden": [32]})
    _check_model(model, torch.randn(4, 60), 5)


# ------------------------------------------------------------------------------------ fedavg_cnn
def _reference_fedavg_cnn():
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(1, 32, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(32, 64, 5, padding=2)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", nn.Linear(64 * 7 * 7, 512)), ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(512, 10)),
    ]))


def test_fedavg_cnn_matches_workload_reference_bit_for_bit():
    torch.manual_seed(0)
    model = build_model("fedavg_cnn", in_channels=1, image_size=28, num_classes=10)
    torch.manual_seed(0)
    ref = _reference_fedavg_cnn()
    names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert list(model.state_dict()) == names
    assert [n for n, _ in model.named_parameters()] == names
    assert sum(p.numel() for p in model.parameters()) == 1_663_370
    for (n, p), (rn, rp) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert n == rn and torch.equal(p, rp), n
    # identical forward and gradients
    x = torch.rand(10, 1, 28, 28)
    y = torch.randint(0, 10, (10,))
    out, rout = model(x), ref(x)
    assert torch.equal(out, rout)
    F.cross_entropy(out, y).backward()
    F.cross_entropy(rout, y).backward()
    for (n, p), rp in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, rp.grad), n
    assert model.default_split == "conv2" and {"conv1", "conv2"} <= set(model.split_points)
    client, _ = model.split()
    assert client(x).shape == (10, 64, 7, 7)


# ---------------------------------------------------------------------------------------- ResNets
@pytest.mark.parametrize("name,blocks", [("resnet18_gn", 2), ("resnet10_gn", 1)])
def test_fedrcl_resnet_structure(name, blocks):
    model = _build(name, {}, 3, 32, 10)
    assert model.feature_taps == ("l1", "l2", "l3", "l4", "l5", "embedding")
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 2 for m in norms)
    assert len(norms) == 1 + 4 * blocks * 2 + 3  # stem, two per block, three 1x1 downsample shortcuts
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.MaxPool2d, nn.modules.batchnorm._BatchNorm)) for m in model.modules())
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [blocks] * 4
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        _, f = model.forward_features(x)
    shapes = {k: tuple(v.shape[1:]) for k, v in f.items()}
    assert shapes == {"l1": (64, 32, 32), "l2": (64, 32, 32), "l3": (128, 16, 16), "l4": (256, 8, 8),
                      "l5": (512, 4, 4), "embedding": (512,)}
    for tap in ("l1", "l2", "l3", "l4", "l5"):
        assert f[tap].min() < 0, f"{tap} should be taken before the ReLU"
    assert torch.equal(f["embedding"], pool_tap(F.relu(f["l5"])))
    if name == "resnet18_gn":
        assert sum(p.numel() for p in model.parameters()) == 11_173_962


def test_resnet_batchnorm_option():
    model = _build("resnet10_gn", {"norm": "bn"}, 3, 32, 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert not any(isinstance(m, nn.GroupNorm) for m in model.modules())
    with pytest.raises(ValueError, match="'norm'"):
        _build("resnet10_gn", {"norm": "ln"}, 3, 32, 10)


def test_cnn_taps_is_small_and_has_five_levels():
    model = _build("cnn_taps", {}, 1, 28, 10)
    assert model.feature_taps[:5] == ("l1", "l2", "l3", "l4", "l5")
    assert 100_000 <= sum(p.numel() for p in model.parameters()) <= 300_000
    assert all(m.num_groups == 2 for m in model.modules() if isinstance(m, nn.GroupNorm))


# ------------------------------------------------------------------------------------- alexnet
def test_alexnet_split_client_is_first_six_layers_and_train_mode_split_is_exact():
    model = _build("alexnet_split", {}, 3, 32, 10)
    client, server = model.split()
    assert model.default_split == "block2"
    assert {n.split(".")[0] for n, _ in client.named_parameters()} == {"conv1", "conv2"}
    assert {n.split(".")[0] for n, _ in server.named_parameters()} == {"conv3", "conv4", "conv5", "fc1", "fc2", "fc3"}
    model.train()
    x = torch.randn(4, 3, 32, 32)
    torch.manual_seed(7)
    y = model(x)
    torch.manual_seed(7)
    assert torch.equal(server(client(x)), y)  # dropout masks drawn in the same order
    # gradients flow through both parts into the model's own parameters
    server(client(x)).sum().backward()
    assert model.conv1.weight.grad is not None and model.fc3.weight.grad is not None


# ---------------------------------------------------------------------------- backbone + MLP head
def test_backbone_mlp_freeze_and_weights(tmp_path):
    torch.manual_seed(3)
    donor = build_model("cnn5", in_channels=3, image_size=32, num_classes=7)
    path = tmp_path / "cnn5.pt"
    torch.save(donor.state_dict(), path)
    torch.manual_seed(0)
    model = build_model("cnn_backbone_mlp", in_channels=3, image_size=32, num_classes=10,
                        backbone_weights=str(path), freeze_backbone=True)
    assert all(not p.requires_grad for p in model.backbone.parameters())
    assert all(p.requires_grad for p in model.head.parameters())
    for k, v in model.backbone.state_dict().items():
        assert torch.equal(v, donor.state_dict()[k]), k
    assert "fc3.weight" not in model.backbone.state_dict()  # the backbone's own classifier is dropped
    assert model.classifier_head() is model.head and model.embedding_dim == 128
    client, server = model.split()
    assert all(not p.requires_grad for p in client.parameters())
    # unfrozen by default, trained from scratch without weights
    torch.manual_seed(0)
    free = build_model("cnn_backbone_mlp", in_channels=3, image_size=32, num_classes=10)
    assert all(p.requires_grad for p in free.parameters())


def test_backbone_mlp_weight_errors(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        build_model("cnn_backbone_mlp", in_channels=3, image_size=32, num_classes=10, backbone_weights=str(missing))
    wrong = tmp_path / "wrong.pt"
    torch.save(build_model("cnn4", in_channels=3, image_size=32, num_classes=10).state_dict(), wrong)
    with pytest.raises(ValueError, match="wrong.pt"):
        build_model("cnn_backbone_mlp", in_channels=3, image_size=32, num_classes=10, backbone_weights=str(wrong))
    with pytest.raises(ValueError, match="'backbone'"):
        build_model("cnn_backbone_mlp", in_channels=3, image_size=32, num_classes=10, backbone="vit_huge")


def test_fully_convolutional_models_accept_unknown_image_size():
    model = build_model("cnn_taps", in_channels=3, image_size=None, num_classes=4)
    assert model(torch.randn(1, 3, 20, 24)).shape == (1, 4)


def test_models_pickle_and_deepcopy():
    model = _build("cnn_taps", {}, 1, 28, 10).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        y = model(x)
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert torch.equal(clone(x), y)
            client, server = clone.split("l3")
            assert torch.equal(server(client(x)), y)
