"""The model registry: names -> :class:`ModelSpec`, and the builders the engine calls.

``build_model(name, in_channels=, image_size=, num_classes=, input_dim=, **options)`` validates the name
and every option (an unknown one is a ``ValueError`` that names it and lists the known ones), builds the
model with PyTorch's default initialisation in declaration order (so ``torch.manual_seed(s)`` right before
the call fixes the initial weights) and records ``model.model_name`` / ``model.model_options``.
``model_for_meta(name, meta, **options)`` does the same from a :class:`fedray.data.table.DatasetMeta`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from fedray.core.registry import Registry, RegistryError, caller_module, first_line, register_function
from fedray.models.base import FedModel
from fedray.models.zoo import (
    CNN4,
    CNN5,
    MLP,
    AlexNetSplit,
    BackboneMLP,
    CNNTaps,
    FedAvgCNN,
    InputSpec,
    ResNetGN,
    _int_opt,
    _ints_opt,
)

__all__ = ["ModelSpec", "MODELS", "build_model", "model_for_meta", "list_models", "register_model"]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model.

    name:        registry key.
    description: one line for ``list_models`` / ``fedray`` CLI listings.
    builder:     ``builder(inp: InputSpec, num_classes: int, **options) -> FedModel``.
    options:     every accepted option with its default (the only keyword arguments ``build_model`` takes).
    inputs:      ``"image"`` (needs (C, H, W) input), ``"vector"`` or ``"any"`` (images are flattened).
    """

    name: str
    description: str
    builder: Callable[..., FedModel]
    options: dict[str, Any] = field(default_factory=dict)
    inputs: str = "image"


def _b_fedavg_cnn(inp: InputSpec, nc: int, hidden: int) -> FedModel:
    return FedAvgCNN(inp, nc, hidden=_int_opt(inp.model, "hidden", hidden))


def _b_cnn4(inp: InputSpec, nc: int, channels, embed_dim) -> FedModel:
    return CNN4(inp, nc, channels=_ints_opt(inp.model, "channels", channels, 2),
                embed_dim=_int_opt(inp.model, "embed_dim", embed_dim))


def _b_cnn5(inp: InputSpec, nc: int, channels, hidden, embed_dim) -> FedModel:
    return CNN5(inp, nc, channels=_ints_opt(inp.model, "channels", channels, 2),
                hidden=_int_opt(inp.model, "hidden", hidden), embed_dim=_int_opt(inp.model, "embed_dim", embed_dim))


def _b_cnn_taps(inp: InputSpec, nc: int, widths, gn_groups) -> FedModel:
    return CNNTaps(inp, nc, widths=_ints_opt(inp.model, "widths", widths, 4),
                   gn_groups=_int_opt(inp.model, "gn_groups", gn_groups))


def _b_resnet(blocks: tuple[int, ...]) -> Callable[..., FedModel]:
    def build(inp: InputSpec, nc: int, norm, gn_groups, width) -> FedModel:
        return ResNetGN(inp, nc, blocks=blocks, norm=norm, gn_groups=_int_opt(inp.model, "gn_groups", gn_groups),
                        width=_int_opt(inp.model, "width", width))
    return build


def _b_alexnet(inp: InputSpec, nc: int, channels, fc, dropout) -> FedModel:
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"model {inp.model!r}: option 'dropout' must be a number in [0, 1), got {dropout!r}")
    return AlexNetSplit(inp, nc, channels=_ints_opt(inp.model, "channels", channels, 5),
                        fc=_ints_opt(inp.model, "fc", fc, 2), dropout=float(dropout))


def _b_mlp(inp: InputSpec, nc: int, hidden) -> FedModel:
    return MLP(inp, nc, hidden=_ints_opt(inp.model, "hidden", hidden, allow_empty=True))


def _b_backbone_mlp(inp: InputSpec, nc: int, backbone, backbone_options, hidden, freeze_backbone,
                    backbone_weights) -> FedModel:
    model = inp.model
    if backbone not in MODELS or backbone == model:
        known = [n for n in MODELS if n != model]
        raise ValueError(f"model {model!r}: option 'backbone' must be one of {known}, got {backbone!r}")
    if not isinstance(backbone_options, dict):
        raise ValueError(f"model {model!r}: option 'backbone_options' must be a mapping, got {backbone_options!r}")
    if not isinstance(freeze_backbone, bool):
        raise ValueError(f"model {model!r}: option 'freeze_backbone' must be true or false, got {freeze_backbone!r}")
    if backbone_weights is not None and not isinstance(backbone_weights, (str, os.PathLike)):
        raise ValueError(f"model {model!r}: option 'backbone_weights' must be a file path, got {backbone_weights!r}")
    if backbone_weights is not None and not os.path.isfile(os.fspath(backbone_weights)):
        raise FileNotFoundError(f"model {model!r}: backbone_weights file not found: {os.fspath(backbone_weights)!r}")
    image_size = (inp.height, inp.width) if inp.height is not None else None
    net = build_model(backbone, in_channels=inp.in_channels, image_size=image_size, num_classes=nc,
                      input_dim=inp.input_dim, **backbone_options)
    out = BackboneMLP(net, nc, hidden=_int_opt(model, "hidden", hidden), freeze_backbone=freeze_backbone)
    if backbone_weights is not None:
        out.load_backbone(backbone_weights)
    return out


MODELS: Registry[ModelSpec] = Registry("model", "fedray.register_model")


def register_model(name, builder=None, *, description: str = "", options: dict | None = None, inputs: str = "any",
                   module: str | None = None):
    """Register a model builder under ``name`` (``model.name``); usable as ``register_model(name, builder)`` or as a
    decorator ``@register_model(name, options={...})``.

    ``builder(inp, num_classes, **options) -> torch.nn.Module``: ``inp`` is an :class:`InputSpec` (``in_channels``,
    ``height``, ``width`` for images, ``input_dim`` for vectors); ``options`` declares every keyword the builder
    accepts with its default (``model.params`` may set them; an unknown one is refused before any work).
    ``inputs``: ``"image"``, ``"vector"`` or ``"any"``. The module must return a ``torch.nn.Module`` whose
    ``forward(x)`` gives the logits; a :class:`~fedray.models.base.FedModel` (or ``FedModel.wrap``) adds the
    feature taps and split points some algorithms need (docs/extending.md). A name another module registered is
    refused, naming both modules."""
    if inputs not in ("image", "vector", "any"):
        raise RegistryError(f"register_model: inputs must be 'image', 'vector' or 'any', got {inputs!r}")
    if options is not None and not isinstance(options, dict):
        raise RegistryError(f"register_model: options must be a mapping of option -> default, got {options!r}")
    return register_function(MODELS, name, builder, module or caller_module(), "register_model",
                             lambda fn: ModelSpec(name, first_line(description, fn), fn, dict(options or {}), inputs))


for _spec in [
    ModelSpec("fedavg_cnn", "FedAvg MNIST CNN (2 conv 5x5 + 2 fc, 1,663,370 params at 1x28x28/10); bench workload",
              _b_fedavg_cnn, {"hidden": 512}),
    ModelSpec("cnn4", "FedCCL 4-layer CNN for MNIST/FMNIST (2 conv + 2 fc, 128-d embedding)",
              _b_cnn4, {"channels": (32, 64), "embed_dim": 128}),
    ModelSpec("cnn5", "FedCCL 5-layer CNN for CIFAR-10 (MOON SimpleCNN layout: 2 conv + 3 fc, 128-d embedding)",
              _b_cnn5, {"channels": (6, 16), "hidden": 120, "embed_dim": 128}),
    ModelSpec("cnn_taps", "small GroupNorm residual CNN with FedRCL's five taps l1..l5 for CPU-scale runs",
              _b_cnn_taps, {"widths": (16, 32, 64, 96), "gn_groups": 2}),
    ModelSpec("resnet18_gn", "FedRCL ResNet-18: GroupNorm(2), 3x3 stride-1 stem, no max-pool, taps l1..l5",
              _b_resnet((2, 2, 2, 2)), {"norm": "gn", "gn_groups": 2, "width": 64}),
    ModelSpec("resnet10_gn", "ResNet-10 (BasicBlocks [1,1,1,1]) with the FedRCL stem/norm/taps",
              _b_resnet((1, 1, 1, 1)), {"norm": "gn", "gn_groups": 2, "width": 64}),
    ModelSpec("alexnet_split", "SCALA AlexNet-style CNN: 5 conv + 3 fc, client = first 6 layers (split 'block2')",
              _b_alexnet, {"channels": (32, 64, 128, 256, 256), "fc": (1024, 512), "dropout": 0.5}),
    ModelSpec("mlp", "MLP for vector data; hidden=[] is multinomial logistic regression (FedProx Synthetic)",
              _b_mlp, {"hidden": ()}, inputs="any"),
    ModelSpec("cnn_backbone_mlp", "FedCCL inter-domain: backbone (default cnn5, from scratch unless "
              "backbone_weights) + 2-layer MLP head", _b_backbone_mlp,
              {"backbone": "cnn5", "backbone_options": {}, "hidden": 128, "freeze_backbone": False,
               "backbone_weights": None}, inputs="any"),
]:
    MODELS.add(_spec.name, _spec, __name__)


def _image_size(name: str, image_size: Any) -> tuple[int, int] | None:
    if image_size is None:
        return None
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        hw = (image_size, image_size)
    elif isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        hw = tuple(image_size)
    else:
        raise ValueError(f"model {name!r}: image_size must be an int, an (H, W) pair or None, got {image_size!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in hw):
        raise ValueError(f"model {name!r}: image_size must hold positive integers, got {image_size!r}")
    return int(hw[0]), int(hw[1])


def build_model(name: str, *, in_channels: int, image_size: int | tuple[int, int] | None, num_classes: int,
                input_dim: int | None = None, **kwargs: Any) -> FedModel:
    """Build the registered model ``name`` for the given input and number of classes.

    Image inputs: ``in_channels`` and ``image_size`` (int or (H, W); ``None`` is accepted only by fully
    convolutional models). Vector inputs: ``image_size=None`` and ``input_dim=D``. ``kwargs`` are the
    model's options (see ``MODELS[name].options``). Raises ``ValueError`` naming the bad name, option or
    value, and ``FileNotFoundError`` for a missing ``backbone_weights`` file.
    """
    spec = MODELS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    unknown = sorted(k for k in kwargs if k not in spec.options)
    if unknown:
        raise ValueError(f"model {name!r}: unknown option(s) {unknown}; known options: {sorted(spec.options)}")
    nc = _int_opt(name, "num_classes", num_classes, minimum=1)
    ch = _int_opt(name, "in_channels", in_channels, minimum=1)
    hw = _image_size(name, image_size)
    dim = None if input_dim is None else _int_opt(name, "input_dim", input_dim, minimum=1)
    if hw is not None and dim is not None:
        raise ValueError(f"model {name!r}: give either image_size={image_size!r} or input_dim={input_dim!r}, not both")
    if spec.inputs == "image" and dim is not None:
        raise ValueError(f"model {name!r} needs image inputs (C, H, W); got vector input_dim={dim}")
    if spec.inputs == "vector" and hw is not None:
        raise ValueError(f"model {name!r} needs vector inputs (input_dim); got image_size={image_size!r}")
    inp = InputSpec(name, ch, hw[0] if hw else None, hw[1] if hw else None, dim)
    options = {**spec.options, **kwargs}
    model = spec.builder(inp, nc, **options)
    model.model_name = name
    model.model_options = options
    model.num_classes = nc
    return model


def model_for_meta(name: str, meta: Any, **kwargs: Any) -> FedModel:
    """Build ``name`` for a dataset described by ``meta`` (``DatasetMeta``: ``shape`` (C, H, W) or (D,),
    ``num_classes``)."""
    shape = tuple(int(s) for s in meta.shape)
    if len(shape) == 3:
        return build_model(name, in_channels=shape[0], image_size=(shape[1], shape[2]),
                           num_classes=int(meta.num_classes), **kwargs)
    if len(shape) == 1:
        return build_model(name, in_channels=1, image_size=None, num_classes=int(meta.num_classes),
                           input_dim=shape[0], **kwargs)
    raise ValueError(f"dataset {getattr(meta, 'name', '?')!r}: sample shape {shape} is neither (C, H, W) nor (D,)")


def list_models() -> list[tuple[str, str]]:
    """``(name, description)`` for every registered model, in registration order."""
    return [(spec.name, spec.description) for spec in MODELS.values()]
