"""Batches in torch: float conversion, tensor-level augmentation and a minimal batch iterator.

Client data arrives as numpy views of the client's rows in a memory-mapped packed partition file (see
:mod:`fedray.data.store` and :mod:`fedray.data.packed`). A batch is gathered with the permutation slice
``perm[i:i+bs]`` (one numpy gather, which copies only the batch), turned into a tensor with
``torch.from_numpy``, converted to float on the target device (``x.float() / 255.0`` for uint8 storage, then
optional per-channel ``(x - mean) / std``) and, for training, augmented as a whole batch with an explicit
``torch.Generator`` so that runs are reproducible without touching global RNG state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .table import DatasetMeta, DataError

__all__ = ["Augment", "RESIDENT_BYTES", "iterate_batches", "to_float", "train_batch", "train_batches"]

_STATS_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _stats(meta: DatasetMeta, channels: int, ndim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` / ``std`` of ``meta`` shaped to broadcast over dim 1 of an ``ndim``-D batch (cached)."""
    key = (meta.mean, meta.std, channels, ndim, str(device))
    hit = _STATS_CACHE.get(key)
    if hit is not None:
        return hit
    if len(meta.mean) != len(meta.std):
        raise DataError(f"{meta.name}: meta.mean has {len(meta.mean)} values but meta.std has {len(meta.std)}")
    if len(meta.mean) not in (1, channels):
        raise DataError(
            f"{meta.name}: normalisation statistics have {len(meta.mean)} channels, the batch has {channels} (dim 1)"
        )
    if any(s <= 0 for s in meta.std):
        raise DataError(f"{meta.name}: meta.std must be > 0, got {meta.std}")
    shape = (1, len(meta.mean)) + (1,) * (ndim - 2)
    mean = torch.tensor(meta.mean, dtype=torch.float32, device=device).reshape(shape)
    std = torch.tensor(meta.std, dtype=torch.float32, device=device).reshape(shape)
    if len(_STATS_CACHE) > 64:
        _STATS_CACHE.clear()
    _STATS_CACHE[key] = (mean, std)
    return mean, std


def to_float(x: torch.Tensor, meta: DatasetMeta, normalize: bool) -> torch.Tensor:
    """Convert a stored batch to float32.

    uint8 input becomes ``x.float() / 255.0`` (this exact expression: results are bit-identical to the
    benchmark's reference loop); float32 input is used as is. With ``normalize`` and statistics in
    ``meta`` (``mean``/``std``, one value or one per channel of dim 1) the result is
    ``(x - mean) / std``; without statistics ``normalize`` is a no-op.
    """
    if x.dtype == torch.uint8:
        x = x.float() / 255.0
    elif x.dtype != torch.float32:
        raise DataError(f"{meta.name}: to_float expects a uint8 or float32 tensor, got {x.dtype}")
    if normalize and meta.mean:
        if x.dim() < 2:
            raise DataError(f"{meta.name}: normalisation needs a batch of shape (B, C, ...), got {tuple(x.shape)}")
        mean, std = _stats(meta, x.shape[1], x.dim(), x.device)
        x = (x - mean) / std
    return x


def train_batch(x: torch.Tensor, meta: DatasetMeta, normalize: bool, device: torch.device, augment=None,
                gen: torch.Generator | None = None) -> torch.Tensor:
    """A stored training batch as float32 on ``device``, augmented if ``augment`` is given.

    With augmentation, conversion and augmentation run on the CPU with the CPU generator ``gen`` (the same
    bits on every device) and the float batch is copied. Without, the stored batch crosses to the device as
    it is (uint8: a quarter of float32's bytes) and :func:`to_float` runs there (IEEE arithmetic: the CPU's
    numbers). The copy is ``non_blocking``: the host queues the next work while it runs."""
    if augment is not None:
        x = augment(to_float(x, meta, normalize), gen)
    if device.type != "cpu":
        x = x.to(device, non_blocking=True)
    if augment is None:
        x = to_float(x, meta, normalize)
    return x


# a client's stored rows up to this size go to an accelerator once, and its batches are gathered there (0: never)
RESIDENT_BYTES = 64 << 20


def train_batches(images: np.ndarray, labels: np.ndarray, schedule, meta: DatasetMeta, normalize: bool,
                  device: torch.device, augment=None, gen: torch.Generator | None = None,
                  resident: bool | None = None):
    """``(x, y)`` on ``device`` for each index array of ``schedule``: the batches :func:`train_batch` makes of
    ``images[idx]``, ``labels[idx]``, the same values.

    On an accelerator without augmentation, a client whose rows hold at most :data:`RESIDENT_BYTES` is copied to
    the device once (as stored: uint8 stays uint8), with every index of the schedule in one more copy, and each
    batch is gathered and converted there, as a plain PyTorch loop that moves a client's data once does: no
    copy from pageable host memory (which the host waits for) at every step. Otherwise each batch is gathered on
    the host and copied (:func:`train_batch`). ``resident`` forces the one way or the other (tests)."""
    on_device = device.type != "cpu"
    if resident is None:
        resident = on_device and augment is None and 0 < images.nbytes <= RESIDENT_BYTES
    if resident and augment is not None:
        raise ValueError("train_batches: augmented batches are made on the host (the CPU generator's bits)")
    if resident:
        steps = [np.asarray(idx, dtype=np.int64) for idx in schedule]
        if not steps:
            return
        x_dev = torch.from_numpy(np.array(images)).to(device)  # np.array: a writable copy of the mapped rows
        y_dev = torch.from_numpy(np.array(labels)).to(device)
        all_idx = torch.from_numpy(np.concatenate(steps)).to(device)
        at = 0
        for idx in steps:
            sel = all_idx[at:at + idx.size]
            at += idx.size
            yield to_float(x_dev.index_select(0, sel), meta, normalize), y_dev.index_select(0, sel)
        return
    for idx in schedule:
        xb = train_batch(torch.from_numpy(images[idx]), meta, normalize, device, augment, gen)
        yb = torch.from_numpy(labels[idx])
        yield xb, (yb.to(device, non_blocking=True) if on_device else yb)


class Augment:
    """Vectorised train-time augmentation of a float batch ``(B, C, H, W)``.

    Applied in the order of FedRCL's reference pipeline: rotation by a uniform angle in
    ``[-rotate_deg, rotate_deg]`` (bilinear, zero fill, via ``affine_grid``/``grid_sample``), random
    crop of the zero-padded image (``crop_pad`` pixels each side, offsets uniform in ``[0, 2*pad]``),
    horizontal flip with probability 0.5. All randomness comes from the given ``torch.Generator``
    (drawn on the generator's device, three draws per batch in a fixed order), so a batch's
    augmentation is a deterministic function of the generator state.
    """

    OPS = ("crop", "flip", "rotate")
    DEFAULTS = {"crop": 4, "flip": True, "rotate": 10.0}

    def __init__(self, crop_pad: int = 0, flip: bool = False, rotate_deg: float = 0.0):
        if isinstance(crop_pad, bool) or not isinstance(crop_pad, (int, np.integer)) or crop_pad < 0:
            raise DataError(f"augment crop: padding must be an integer >= 0, got {crop_pad!r}")
        if not isinstance(flip, (bool, np.bool_)):
            raise DataError(f"augment flip: must be true or false, got {flip!r}")
        if isinstance(rotate_deg, bool) or not isinstance(rotate_deg, (int, float, np.integer, np.floating)):
            raise DataError(f"augment rotate: degrees must be a number, got {rotate_deg!r}")
        if not math.isfinite(rotate_deg) or not 0 <= rotate_deg <= 180:
            raise DataError(f"augment rotate: degrees must lie in [0, 180], got {rotate_deg!r}")
        self.crop_pad = int(crop_pad)
        self.flip = bool(flip)
        self.rotate_deg = float(rotate_deg)

    @property
    def enabled(self) -> bool:
        return self.crop_pad > 0 or self.flip or self.rotate_deg > 0

    def __bool__(self) -> bool:
        return self.enabled

    def __repr__(self) -> str:
        return f"Augment(crop_pad={self.crop_pad}, flip={self.flip}, rotate_deg={self.rotate_deg})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Augment) and (self.crop_pad, self.flip, self.rotate_deg) == (
            other.crop_pad,
            other.flip,
            other.rotate_deg,
        )

    def __hash__(self) -> int:
        return hash((self.crop_pad, self.flip, self.rotate_deg))

    @classmethod
    def from_spec(cls, spec: Any) -> "Augment":
        """Build from config: ``None``/``"none"``/``[]`` (no augmentation), a list of op names
        (``["crop", "flip", "rotate"]``, defaults crop 4, rotate 10 degrees), a comma-separated string
        (``"crop,flip"``) or a mapping (``{"crop": 4, "flip": True, "rotate": 10}``). An unknown op
        raises :class:`DataError` naming it."""
        if spec is None or isinstance(spec, Augment):
            return spec if isinstance(spec, Augment) else cls()
        if isinstance(spec, str):
            text = spec.strip()
            spec = [] if text.lower() in ("", "none", "false") else [s.strip() for s in text.split(",") if s.strip()]
        if isinstance(spec, (list, tuple)):
            values: dict[str, Any] = {}
            for op in spec:
                if not isinstance(op, str) or op not in cls.OPS:
                    raise DataError(f"augment: unknown op {op!r}; known ops: {list(cls.OPS)}")
                values[op] = cls.DEFAULTS[op]
        elif isinstance(spec, dict):
            unknown = [k for k in spec if k not in cls.OPS]
            if unknown:
                raise DataError(f"augment: unknown op {unknown[0]!r}; known ops: {list(cls.OPS)}")
            values = {}
            for op, v in spec.items():
                if v is True and op != "flip":
                    v = cls.DEFAULTS[op]
                elif v is False or v is None:
                    v = False if op == "flip" else 0
                values[op] = v
        else:
            raise DataError(f"augment: expected a list, mapping or string of ops, got {type(spec).__name__}")
        return cls(crop_pad=values.get("crop", 0), flip=values.get("flip", False), rotate_deg=values.get("rotate", 0.0))

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if not self.enabled:
            return x
        if x.dim() != 4:
            raise DataError(f"augment needs image batches (B, C, H, W), got shape {tuple(x.shape)}")
        if not isinstance(generator, torch.Generator):
            raise DataError("augment needs a torch.Generator (pass generator=...) so that runs are reproducible")
        b, _, h, w = x.shape
        if b == 0:
            return x
        gdev = generator.device
        if self.rotate_deg > 0:
            ang = (torch.rand(b, generator=generator, device=gdev) * 2 - 1) * math.radians(self.rotate_deg)
            ang = ang.to(device=x.device, dtype=x.dtype)
            cos, sin = torch.cos(ang), torch.sin(ang)
            zero = torch.zeros_like(ang)
            # rotation in pixel space, expressed in the normalised coordinates of affine_grid
            theta = torch.stack(
                [torch.stack([cos, -sin * (h / w), zero], 1), torch.stack([sin * (w / h), cos, zero], 1)], 1
            )
            grid = F.affine_grid(theta, list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        if self.crop_pad > 0:
            p = self.crop_pad
            off = torch.randint(0, 2 * p + 1, (2, b), generator=generator, device=gdev).to(x.device)
            padded = F.pad(x, (p, p, p, p))
            rows = (off[0][:, None] + torch.arange(h, device=x.device))[:, :, None]  # (B, H, 1)
            cols = (off[1][:, None] + torch.arange(w, device=x.device))[:, None, :]  # (B, 1, W)
            bidx = torch.arange(b, device=x.device)[:, None, None]
            x = padded.permute(0, 2, 3, 1)[bidx, rows, cols].permute(0, 3, 1, 2).contiguous()
        if self.flip:
            mask = (torch.rand(b, generator=generator, device=gdev) < 0.5).to(x.device)
            x = torch.where(mask[:, None, None, None], x.flip(-1), x)
        return x


def iterate_batches(
    images_np: np.ndarray,
    labels_np: np.ndarray,
    perm: np.ndarray,
    batch_size: int,
    *,
    meta: DatasetMeta,
    normalize: bool,
    augment: Augment | None = None,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    drop_last: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(x, y)`` batches in the order ``perm``: ``x`` float32 ``(b, *meta.shape)`` on ``device``,
    ``y`` int64. Batch i holds rows ``perm[i*bs:(i+1)*bs]``; the last, smaller batch is yielded unless
    ``drop_last``. ``augment`` (applied after float conversion) requires ``generator``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DataError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    n = images_np.shape[0]
    if labels_np.shape[0] != n:
        raise DataError(f"{meta.name}: {n} images but {labels_np.shape[0]} labels")
    perm = np.asarray(perm)
    if perm.ndim != 1 or (perm.size and not np.issubdtype(perm.dtype, np.integer)):
        raise DataError(f"perm must be a 1-D integer array, got shape {perm.shape} dtype {perm.dtype}")
    if perm.size and (perm.min() < -n or perm.max() >= n):
        raise DataError(f"perm holds indices outside [0, {n})")
    use_aug = augment is not None and augment.enabled
    if use_aug and generator is None:
        raise DataError("iterate_batches: augment is set but no generator was given")
    device = torch.device(device)
    non_blocking = device.type == "cuda"
    for i in range(0, perm.shape[0], batch_size):
        idx = perm[i : i + batch_size]
        if drop_last and idx.shape[0] < batch_size:
            break
        x = torch.from_numpy(images_np[idx])
        y = torch.from_numpy(labels_np[idx].astype(np.int64, copy=False))
        if device.type != "cpu":
            x = x.to(device, non_blocking=non_blocking)
            y = y.to(device, non_blocking=non_blocking)
        x = to_float(x, meta, normalize)
        if use_aug:
            x = augment(x, generator)
        yield x, y
