"""Argument checks and numeric helpers shared by the losses of :mod:`fedray.losses`.

Every check raises :class:`ValueError` naming the offending argument.
"""

from __future__ import annotations

import torch

from fedray.core.params import ParamSpec, check_value



def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_float(x, name: str, ndim: int | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {_shape(x)}")
    return x


def _check_labels(labels, name: str, n: int | None, n_name: str = "the batch") -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of integer class ids, got {type(labels).__name__}")
    if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
        raise ValueError(f"{name} must have an integer dtype (e.g. torch.int64), got {labels.dtype}")
    if labels.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {_shape(labels)}")
    if n is not None and labels.shape[0] != n:
        raise ValueError(f"{name} has {labels.shape[0]} entries but {n_name} has {n} rows (shape {_shape(labels)})")
    return labels


def _check_label_range(labels: torch.Tensor, name: str, num_classes: int) -> None:
    if labels.numel() == 0:
        return
    lo, hi = torch.stack([labels.min(), labels.max()]).tolist()  # one read from the device, not two
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes}), got values in [{lo}, {hi}]")


_POSITIVE = ParamSpec(None, "a positive finite number", float, gt=0)
_NON_NEGATIVE = ParamSpec(None, "a non-negative finite number", float, ge=0)
_FINITE = ParamSpec(None, "a finite number", float)
_UNIT = ParamSpec(None, "a number in [0, 1]", float, ge=0, le=1)
_OPEN_UNIT = ParamSpec(None, "a number in (0, 1)", float, gt=0, lt=1)


def _number(value, name: str, spec: ParamSpec) -> float:
    """A scalar hyper-parameter as a float checked against ``spec`` (ValueError ``"<name> must be ..."``)."""
    return check_value(value, spec, name, ValueError, strict=False, sep=" ")


def _check_positive(value, name: str) -> float:
    return _number(value, name, _POSITIVE)


def _check_nonnegative(value, name: str) -> float:
    return _number(value, name, _NON_NEGATIVE)


def _check_finite(value, name: str) -> float:
    return _number(value, name, _FINITE)


def _nonempty_batch(x: torch.Tensor, name: str) -> None:
    if x.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {_shape(x)}); a loss needs at least one sample")


def _work(x: torch.Tensor) -> torch.Tensor:
    """Compute in float32 at least (half/bfloat16 inputs are upcast)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _zero_like_graph(x: torch.Tensor) -> torch.Tensor:
    """A scalar 0 that stays attached to x's graph (so backward() works and gives zero gradients)."""
    return _work(x).sum() * 0.0


def _check_logits_labels(logits, labels, logits_name: str = "logits") -> tuple[torch.Tensor, torch.Tensor]:
    _check_float(logits, logits_name, 2)
    _nonempty_batch(logits, logits_name)
    _check_labels(labels, "labels", logits.shape[0], logits_name)
    _check_label_range(labels, "labels", logits.shape[1])
    return logits, labels
