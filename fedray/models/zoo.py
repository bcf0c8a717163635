"""The fedray model zoo: every architecture the three papers and their baselines use, as :class:`FedModel` s.

| name               | paper / use                                 | taps                              | split points (default) |
|--------------------|---------------------------------------------|-----------------------------------|------------------------|
| ``fedavg_cnn``     | FedAvg MNIST CNN, bench workload            | conv1, conv2, fc1 = embedding     | every tap (conv2)      |
| ``cnn4``           | FedCCL MNIST/FMNIST 4-layer CNN             | conv1, conv2, embedding           | every tap (conv2)      |
| ``cnn5``           | FedCCL CIFAR-10 5-layer CNN (MOON layout)   | conv1, conv2, fc1, embedding      | every tap (conv2)      |
| ``cnn_taps``       | CPU-scale FedRCL: stem + 4 GN residual stages | l1..l5, embedding               | every tap (l2)         |
| ``resnet18_gn``    | FedRCL ResNet-18, GroupNorm(2)              | l1..l5, embedding                 | every tap (l2)         |
| ``resnet10_gn``    | same with BasicBlocks [1,1,1,1] (FPL's depth) | l1..l5, embedding               | every tap (l2)         |
| ``alexnet_split``  | SCALA's AlexNet-style CNN                   | block1, block2, conv3..5, fc1, fc2 = embedding | every tap (block2) |
| ``mlp``            | vector data (FedProx Synthetic)             | fc1..fcN, embedding               | hidden layers (fc1)    |
| ``cnn_backbone_mlp`` | FedCCL inter-domain: backbone + 2-layer MLP head | backbone taps, head_hidden  | every tap (embedding)  |

All weights use PyTorch's default initialisation, created in declaration order, so
``torch.manual_seed(s)`` followed by :func:`fedray.models.build_model` is reproducible. No model uses
BatchNorm unless asked (``norm="bn"`` on the ResNets): batch statistics make federated averaging and
bit-exact reproduction harder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedray.models.base import FedModel, Segment, relu_post

__all__ = [
    "InputSpec",
    "FedAvgCNN",
    "CNN4",
    "CNN5",
    "BasicBlock",
    "ResNetGN",
    "CNNTaps",
    "AlexNetSplit",
    "MLP",
    "BackboneMLP",
]


@dataclass(frozen=True)
class InputSpec:
    """What a model is built for: images (C, H, W) or vectors (D,)."""

    model: str
    in_channels: int
    height: int | None = None
    width: int | None = None
    input_dim: int | None = None

    @property
    def is_image(self) -> bool:
        return self.height is not None

    def image_hw(self) -> tuple[int, int]:
        """(H, W); raises ``ValueError`` if the model was not given an image size."""
        if self.height is None or self.width is None:
            got = f"vector input_dim={self.input_dim}" if self.input_dim is not None else "image_size=None"
            raise ValueError(f"model {self.model!r} needs image inputs with a known image_size (H, W); got {got}")
        return self.height, self.width

    @property
    def flat_dim(self) -> int:
        if self.input_dim is not None:
            return self.input_dim
        h, w = self.image_hw()
        return self.in_channels * h * w


# ------------------------------------------------------------------------------------ option helpers
def _int_opt(model: str, key: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"model {model!r}: option {key!r} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _ints_opt(model: str, key: str, value: Any, length: int | None = None, allow_empty: bool = False) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise ValueError(f"model {model!r}: option {key!r} must be a list of positive integers, got {value!r}")
    if length is not None and len(value) != length:
        raise ValueError(f"model {model!r}: option {key!r} needs exactly {length} values, got {len(value)} ({list(value)})")
    if not value and not allow_empty:
        raise ValueError(f"model {model!r}: option {key!r} must not be empty")
    return tuple(int(v) for v in value)


def _spatial_after(model: str, hw: tuple[int, int], steps: Sequence[Callable[[int], int]]) -> tuple[int, int]:
    """Apply the size arithmetic of each layer to H and W; reject sizes that vanish."""
    out = []
    for size in hw:
        s = size
        for step in steps:
            s = step(s)
            if s < 1:
                raise ValueError(f"model {model!r}: image size {hw[0]}x{hw[1]} is too small (a feature map vanishes)")
        out.append(s)
    return out[0], out[1]


def _valid_conv(k: int) -> Callable[[int], int]:
    return lambda s: s - k + 1


def _pool(k: int, stride: int | None = None) -> Callable[[int], int]:
    stride = stride or k
    return lambda s: (s - k) // stride + 1


# --------------------------------------------------------------------------- segment functions (picklable)
def _conv_relu_pool(conv: str, ns: Any, x: Tensor) -> Tensor:
    return F.max_pool2d(F.relu(getattr(ns, conv)(x)), 2)


def _conv_relu(conv: str, ns: Any, x: Tensor) -> Tensor:
    return F.relu(getattr(ns, conv)(x))


def _conv_relu_pool3s2(conv: str, ns: Any, x: Tensor) -> Tensor:
    return F.max_pool2d(F.relu(getattr(ns, conv)(x)), kernel_size=3, stride=2)


def _flatten_linear_relu(fc: str, ns: Any, x: Tensor) -> Tensor:
    return F.relu(getattr(ns, fc)(x.flatten(1)))


def _linear_relu(fc: str, ns: Any, x: Tensor) -> Tensor:
    return F.relu(getattr(ns, fc)(x))


def _linear(fc: str, ns: Any, x: Tensor) -> Tensor:
    return getattr(ns, fc)(x)


def _flatten(ns: Any, x: Tensor) -> Tensor:
    return x.flatten(1)


def _module_post(name: str, ns: Any, t: Tensor) -> Tensor:
    return getattr(ns, name)(t)


def _stem(ns: Any, x: Tensor) -> Tensor:
    return ns.bn1(ns.conv1(x))


def _res_stage(layer: str, ns: Any, x: Tensor) -> Tensor:
    blocks = getattr(ns, layer)
    n = len(blocks)
    for i, block in enumerate(blocks):
        x = block(x) if i < n - 1 else block.forward_pre(x)
    return x


def _gap(ns: Any, x: Tensor) -> Tensor:
    return F.adaptive_avg_pool2d(x, 1).flatten(1)


def _path_relu(path: str, ns: Any, x: Tensor) -> Tensor:
    return F.relu(ns.get_submodule(path)(x))


def _path(path: str, ns: Any, x: Tensor) -> Tensor:
    return ns.get_submodule(path)(x)


def _in_sub(prefix: str, fn: Callable, ns: Any, x: Tensor) -> Tensor:
    return fn(getattr(ns, prefix), x)


# ------------------------------------------------------------------------------------------ models
class FedAvgCNN(FedModel):
    """The FedAvg paper's MNIST CNN (shared/bench/WORKLOAD.md §3), 1,663,370 parameters at 1x28x28/10.

    Conv2d(C,32,5,p=2) -> ReLU -> MaxPool2d(2) -> Conv2d(32,64,5,p=2) -> ReLU -> MaxPool2d(2) -> Flatten
    -> Linear(64*(H//4)*(W//4), hidden) -> ReLU -> Linear(hidden, classes). Parameters are created in this
    order with the default init and named ``conv1, conv2, fc1, fc2``, and the forward uses exactly the
    ops of the equivalent ``nn.Sequential``, so the bench workload is reproduced bit for bit.
    Taps: ``conv1`` / ``conv2`` (after each pool), ``fc1`` = ``embedding`` (after its ReLU).
    """

    def __init__(self, inp: InputSpec, num_classes: int, hidden: int = 512):
        super().__init__()
        h, w = _spatial_after(inp.model, inp.image_hw(), [_pool(2), _pool(2)])
        self.conv1 = nn.Conv2d(inp.in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * h * w, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)
        self._finish(
            [
                Segment("conv1", ("conv1",), partial(_conv_relu_pool, "conv1"), ("conv1",)),
                Segment("conv2", ("conv2",), partial(_conv_relu_pool, "conv2"), ("conv2",)),
                Segment("fc1", ("fc1",), partial(_flatten_linear_relu, "fc1"), ("fc1", "embedding")),
                Segment("logits", ("fc2",), partial(_linear, "fc2")),
            ],
            split_points=("conv1", "conv2", "fc1", "embedding"),
            default_split="conv2",
            classifier="fc2",
            embedding_dim=hidden,
        )


class CNN4(FedModel):
    """FedCCL's "4-layer CNN" for MNIST / Fashion-MNIST: 2 conv + 2 fully connected layers.

    Conv2d(C,c1,5) -> ReLU -> MaxPool(2) -> Conv2d(c1,c2,5) -> ReLU -> MaxPool(2) -> Flatten
    -> Linear(., embed_dim) -> ReLU [= embedding, f] -> Linear(embed_dim, classes) [= g].
    The paper gives only "4 layers" and "decision-making layers of dimension 128"; channel widths
    (32, 64) and unpadded 5x5 kernels are fedray's choice (options ``channels``, ``embed_dim``).
    """

    def __init__(self, inp: InputSpec, num_classes: int, channels: Sequence[int] = (32, 64), embed_dim: int = 128):
        super().__init__()
        c1, c2 = channels
        h, w = _spatial_after(inp.model, inp.image_hw(), [_valid_conv(5), _pool(2), _valid_conv(5), _pool(2)])
        self.conv1 = nn.Conv2d(inp.in_channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        self.fc1 = nn.Linear(c2 * h * w, embed_dim)
        self.fc2 = nn.Linear(embed_dim, num_classes)
        self._finish(
            [
                Segment("conv1", ("conv1",), partial(_conv_relu_pool, "conv1"), ("conv1",)),
                Segment("conv2", ("conv2",), partial(_conv_relu_pool, "conv2"), ("conv2",)),
                Segment("embedding", ("fc1",), partial(_flatten_linear_relu, "fc1"), ("embedding",)),
                Segment("logits", ("fc2",), partial(_linear, "fc2")),
            ],
            split_points=("conv1", "conv2", "embedding"),
            default_split="conv2",
            classifier="fc2",
            embedding_dim=embed_dim,
        )


class CNN5(FedModel):
    """FedCCL's "5-layer CNN" for CIFAR-10, in the layout of MOON's SimpleCNN (which FedCCL cites).

    Conv2d(C,6,5) -> ReLU -> MaxPool(2) -> Conv2d(6,16,5) -> ReLU -> MaxPool(2) -> Flatten
    -> Linear(., 120) -> ReLU -> Linear(120, embed_dim=128) -> ReLU [= embedding] -> Linear(128, classes).
    2 conv + 3 fully connected = 5 weight layers; the 128-d layer before the classifier is FedCCL's
    "decision-making dimension". Widths are options (``channels``, ``hidden``, ``embed_dim``).
    """

    def __init__(self, inp: InputSpec, num_classes: int, channels: Sequence[int] = (6, 16), hidden: int = 120,
                 embed_dim: int = 128):
        super().__init__()
        c1, c2 = channels
        h, w = _spatial_after(inp.model, inp.image_hw(), [_valid_conv(5), _pool(2), _valid_conv(5), _pool(2)])
        self.conv1 = nn.Conv2d(inp.in_channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        self.fc1 = nn.Linear(c2 * h * w, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)
        self.fc3 = nn.Linear(embed_dim, num_classes)
        self._finish(
            [
                Segment("conv1", ("conv1",), partial(_conv_relu_pool, "conv1"), ("conv1",)),
                Segment("conv2", ("conv2",), partial(_conv_relu_pool, "conv2"), ("conv2",)),
                Segment("fc1", ("fc1",), partial(_flatten_linear_relu, "fc1"), ("fc1",)),
                Segment("embedding", ("fc2",), partial(_linear_relu, "fc2"), ("embedding",)),
                Segment("logits", ("fc3",), partial(_linear, "fc3")),
            ],
            split_points=("conv1", "conv2", "fc1", "embedding"),
            default_split="conv2",
            classifier="fc3",
            embedding_dim=embed_dim,
        )


def _norm_factory(model: str, norm: str, gn_groups: int) -> Callable[[int], nn.Module]:
    if norm == "gn":
        def make(c: int) -> nn.Module:
            if c % gn_groups:
                raise ValueError(f"model {model!r}: gn_groups={gn_groups} does not divide {c} channels")
            return nn.GroupNorm(gn_groups, c)
        return make
    if norm == "bn":
        return nn.BatchNorm2d
    raise ValueError(f"model {model!r}: option 'norm' must be 'gn' or 'bn', got {norm!r}")


class BasicBlock(nn.Module):
    """ResNet BasicBlock: conv3x3-norm-ReLU-conv3x3-norm + shortcut (1x1 conv + norm when the shape changes).

    ``forward_pre`` returns the sum *before* the final ReLU (FedRCL's tap), ``forward`` applies it.
    """

    def __init__(self, in_planes: int, planes: int, stride: int, norm: Callable[[int], nn.Module]):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), norm(planes))
        else:
            self.downsample = nn.Identity()

    def forward_pre(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return out + self.downsample(x)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.forward_pre(x))


class _StagedResNet(FedModel):
    """Stem (conv + norm, tap ``l1`` before ReLU), four BasicBlock stages (taps ``l2..l5`` before the
    final ReLU of each stage's last block), global average pool (``embedding``), linear classifier."""

    def _build(self, inp: InputSpec, num_classes: int, stem_width: int, widths: Sequence[int],
               blocks: Sequence[int], norm: Callable[[int], nn.Module]) -> None:
        self.conv1 = nn.Conv2d(inp.in_channels, stem_width, 3, stride=1, padding=1, bias=False)
        self.bn1 = norm(stem_width)
        in_planes = stem_width
        segments = [Segment("l1", ("conv1", "bn1"), _stem, ("l1",), relu_post)]
        for i, (width, n, stride) in enumerate(zip(widths, blocks, (1, 2, 2, 2))):
            layer = nn.Sequential(
                *[BasicBlock(in_planes if j == 0 else width, width, stride if j == 0 else 1, norm) for j in range(n)]
            )
            in_planes = width
            name = f"layer{i + 1}"
            self.add_module(name, layer)
            segments.append(Segment(f"l{i + 2}", (name,), partial(_res_stage, name), (f"l{i + 2}",), relu_post))
        self.fc = nn.Linear(in_planes, num_classes)
        segments += [
            Segment("embedding", (), _gap, ("embedding",)),
            Segment("logits", ("fc",), partial(_linear, "fc")),
        ]
        self._finish(segments, split_points=("l1", "l2", "l3", "l4", "l5", "embedding"), default_split="l2",
                     classifier="fc", embedding_dim=in_planes)


class ResNetGN(_StagedResNet):
    """FedRCL's ResNet (``ResNet18_base``): 3x3 stride-1 stem conv (no bias), no max-pool, BasicBlock
    stages with widths ``width * (1, 2, 4, 8)`` and strides (1, 2, 2, 2), GroupNorm(2) everywhere
    (stem, both convs of every block, 1x1 downsample), global average pool, Linear(8*width, classes).

    ``blocks=(2,2,2,2)`` is ResNet-18 (``resnet18_gn``), ``(1,1,1,1)`` ResNet-10 (``resnet10_gn``).
    Taps ``l1..l5`` are taken before ReLU, as in FedRCL's released code; ``embedding`` is the pooled
    ReLU(l5), i.e. FedRCL's ``feature``. ``norm="bn"`` swaps in BatchNorm2d (e.g. FPL's ResNet-10).
    Fully convolutional: any image size works.
    """

    def __init__(self, inp: InputSpec, num_classes: int, blocks: Sequence[int] = (2, 2, 2, 2), norm: str = "gn",
                 gn_groups: int = 2, width: int = 64):
        super().__init__()
        make_norm = _norm_factory(inp.model, norm, gn_groups)
        self._build(inp, num_classes, width, [width * m for m in (1, 2, 4, 8)], blocks, make_norm)


class CNNTaps(_StagedResNet):
    """A small FedRCL-shaped CNN for CPU-scale runs: same structure as :class:`ResNetGN` (stem conv +
    GroupNorm, four stages of one BasicBlock each, taps ``l1..l5`` before the final ReLU, pooled
    ``embedding``, linear head) with narrow widths (default stem 16, stages 16/32/64/96, ~220k
    parameters at 1x28x28/10)."""

    def __init__(self, inp: InputSpec, num_classes: int, widths: Sequence[int] = (16, 32, 64, 96),
                 gn_groups: int = 2):
        super().__init__()
        make_norm = _norm_factory(inp.model, "gn", gn_groups)
        self._build(inp, num_classes, widths[0], widths, (1, 1, 1, 1), make_norm)


class AlexNetSplit(FedModel):
    """SCALA's AlexNet-style CNN, adapted to 28x28 / 32x32 (any size >= 8) and 1 or 3 channels.

    Layers (widths as in the one public SCALA re-implementation; the paper's figure is not available):

        client:  1 conv3x3(C,32) 2 ReLU 3 MaxPool2 | 4 conv3x3(32,64) 5 ReLU 6 MaxPool2
        server:  conv3x3(64,128) ReLU  conv3x3(128,256) ReLU  conv3x3(256,256) ReLU  MaxPool(3, s2)
                 | classifier: Linear(256*3*3, 1024) ReLU Dropout  Linear(1024, 512) ReLU Dropout  Linear(512, classes)

    "First 6 layers on the client, last 8 on the server" (SCALA §5) is read the way a torchvision-style
    AlexNet counts modules: the client gets ``features[0:6]`` (two conv-ReLU-pool blocks) and the server
    the remaining 7 feature layers plus the classifier block (7 + 1 = 8). This cut is the split point
    ``block2`` (the default); the other taps are split points too, for SCALA's split-depth ablation.
    Dropout (default 0.5, option ``dropout``) is applied after the taps ``fc1`` / ``fc2``, so taps are
    dropout-free; in train mode seed the global torch RNG to reproduce the dropout masks.
    """

    def __init__(self, inp: InputSpec, num_classes: int, channels: Sequence[int] = (32, 64, 128, 256, 256),
                 fc: Sequence[int] = (1024, 512), dropout: float = 0.5):
        super().__init__()
        c1, c2, c3, c4, c5 = channels
        f1, f2 = fc
        h, w = _spatial_after(inp.model, inp.image_hw(), [_pool(2), _pool(2), _pool(3, 2)])
        self.conv1 = nn.Conv2d(inp.in_channels, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        self.conv4 = nn.Conv2d(c3, c4, 3, padding=1)
        self.conv5 = nn.Conv2d(c4, c5, 3, padding=1)
        self.fc1 = nn.Linear(c5 * h * w, f1)
        self.drop1 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(f1, f2)
        self.drop2 = nn.Dropout(dropout)
        self.fc3 = nn.Linear(f2, num_classes)
        self._finish(
            [
                Segment("block1", ("conv1",), partial(_conv_relu_pool, "conv1"), ("block1",)),
                Segment("block2", ("conv2",), partial(_conv_relu_pool, "conv2"), ("block2",)),
                Segment("conv3", ("conv3",), partial(_conv_relu, "conv3"), ("conv3",)),
                Segment("conv4", ("conv4",), partial(_conv_relu, "conv4"), ("conv4",)),
                Segment("conv5", ("conv5",), partial(_conv_relu_pool3s2, "conv5"), ("conv5",)),
                Segment("fc1", ("fc1", "drop1"), partial(_flatten_linear_relu, "fc1"), ("fc1",),
                        partial(_module_post, "drop1")),
                Segment("fc2", ("fc2", "drop2"), partial(_linear_relu, "fc2"), ("fc2", "embedding"),
                        partial(_module_post, "drop2")),
                Segment("logits", ("fc3",), partial(_linear, "fc3")),
            ],
            split_points=("block1", "block2", "conv3", "conv4", "conv5", "fc1", "fc2", "embedding"),
            default_split="block2",
            classifier="fc3",
            embedding_dim=f2,
        )
        # He initialisation (fan-in, ReLU gain) and zero biases: with PyTorch's default init (variance
        # 1/(3 fan_in)) the signal shrinks ~6x in variance per ReLU layer, and this 8-layer plain network
        # sat at chance for hundreds of SGD steps on MNIST (lr 0.01-0.05); with He init it learns at once.
        # The classifier keeps PyTorch's smaller default init so the first logits stay near uniform.
        for mod in (self.conv1, self.conv2, self.conv3, self.conv4, self.conv5, self.fc1, self.fc2):
            nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(mod.bias)


class MLP(FedModel):
    """Fully connected network for vector data (or flattened images).

    ``hidden=()`` (default) is multinomial logistic regression, FedProx's model for Synthetic(α, β):
    one Linear(D, classes); its ``embedding`` is the (flattened) input and it has no split point.
    ``hidden=(200,)`` etc. adds Linear+ReLU layers ``fc1..fcN``; the last hidden activation is the
    ``embedding`` and every hidden layer is a split point (default ``fc1``).
    """

    def __init__(self, inp: InputSpec, num_classes: int, hidden: Sequence[int] = ()):
        super().__init__()
        dims = [inp.flat_dim, *hidden]
        segments: list[Segment] = []
        if not hidden:
            segments.append(Segment("input", (), _flatten, ("embedding",)))
        for i in range(len(hidden)):
            name = f"fc{i + 1}"
            self.add_module(name, nn.Linear(dims[i], dims[i + 1]))
            taps = (name, "embedding") if i == len(hidden) - 1 else (name,)
            fn = partial(_flatten_linear_relu, name) if i == 0 else partial(_linear_relu, name)
            segments.append(Segment(name, (name,), fn, taps))
        out = f"fc{len(hidden) + 1}"
        self.add_module(out, nn.Linear(dims[-1], num_classes))
        segments.append(Segment("logits", (out,), partial(_linear, out)))
        points = tuple(f"fc{i + 1}" for i in range(len(hidden))) + (("embedding",) if hidden else ())
        self._finish(segments, split_points=points, default_split="fc1" if hidden else None, classifier=out,
                     embedding_dim=dims[-1])


class BackboneMLP(FedModel):
    """FedCCL's inter-domain model: a feature extractor f (the backbone) and a 2-layer MLP head g.

    ``backbone`` is any registered model name (default ``cnn5``), built for the same input with
    ``backbone_options``; its own classifier is dropped (replaced by ``nn.Identity``) and its
    ``embedding`` (dim E) feeds ``head = Sequential(Linear(E, hidden), ReLU, Linear(hidden, classes))``.
    The paper uses a pre-trained Tiny-ViT (E = 192) with hidden 128; fedray has no such weights, so by
    default the backbone is **trained from scratch**. ``backbone_weights`` loads a local ``.pt``
    state_dict (the backbone's own keys, or a saved ``cnn_backbone_mlp`` whose ``backbone.`` keys are
    used; the backbone's classifier keys are ignored) with ``torch.load(weights_only=True)``; ``freeze_backbone`` sets ``requires_grad=False``
    on every backbone parameter (FedPCL-style frozen extractor). Taps: the backbone's taps (``embedding``
    = backbone output, f(x)) and ``head_hidden``; ``classifier_head()`` is the whole MLP head g.
    """

    def __init__(self, backbone: FedModel, num_classes: int, hidden: int = 128, freeze_backbone: bool = False):
        super().__init__()
        dim = backbone.embedding_dim
        if "." in backbone._classifier_path:
            raise ValueError(f"backbone {getattr(backbone, 'model_name', '?')!r} cannot be used: nested classifier "
                             f"{backbone._classifier_path!r}")
        # the backbone's own classifier is never used: drop it so it holds no parameters
        setattr(backbone, backbone._classifier_path, nn.Identity())
        self.backbone = backbone
        self.head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        if freeze_backbone:
            for p in self.backbone.parameters():
                p.requires_grad_(False)
        segments = []
        for seg in backbone.segments[: backbone._embed_stop]:
            if not seg.modules:  # reads no submodule (e.g. pooling): runs in any namespace unchanged
                segments.append(seg)
                continue
            segments.append(
                Segment(
                    seg.name,
                    tuple(f"backbone.{m}" for m in seg.modules),
                    partial(_in_sub, "backbone", seg.fn),
                    seg.taps,
                    partial(_in_sub, "backbone", seg.post) if seg.post is not None else None,
                )
            )
        segments += [
            Segment("head_hidden", ("head.0",), partial(_path_relu, "head.0"), ("head_hidden",)),
            Segment("logits", ("head.2",), partial(_path, "head.2")),
        ]
        points = tuple(p for p in backbone.split_points) + ("head_hidden",)
        default = "embedding" if "embedding" in points else "head_hidden"  # e.g. backbone mlp with hidden=[]
        self._finish(segments, split_points=points, default_split=default, classifier="head", embedding_dim=dim)

    def load_backbone(self, path: str | os.PathLike) -> None:
        """Load backbone weights from a local ``.pt`` state_dict file (see the class docstring)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"backbone_weights: no such file {path!r}")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # unpickling errors, foreign formats
            raise ValueError(f"backbone_weights: cannot read {path!r} as a torch state_dict: {exc}") from exc
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ValueError(f"backbone_weights: {path!r} does not hold a state_dict (got {type(state).__name__})")
        if any(k.startswith("backbone.") for k in state):  # a saved cnn_backbone_mlp: keep its backbone
            state = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
        cls = self.backbone._classifier_path + "."
        state = {k: v for k, v in state.items() if not k.startswith(cls)}
        own = self.backbone.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            parts = [f"{label} keys {keys[:8]}{' ...' if len(keys) > 8 else ''}"
                     for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
            raise ValueError(f"backbone_weights: {path!r} does not match backbone "
                             f"{getattr(self.backbone, 'model_name', '?')!r}: {', '.join(parts)}")
        bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
        if bad:
            raise ValueError(
                f"backbone_weights: {path!r} has wrong shapes for {bad[:8]} "
                f"(e.g. {bad[0]}: file {tuple(state[bad[0]].shape)}, model {tuple(own[bad[0]].shape)})"
            )
        self.backbone.load_state_dict(state, strict=True)
