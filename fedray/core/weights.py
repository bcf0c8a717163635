"""Flat float32 weight vectors: the only form model weights take on the wire.

``FlatParams`` re-binds every floating-point parameter and buffer of a module to a view into one
contiguous float32 tensor, so loading a global model is one ``copy_`` and reading the trained weights
is one ``numpy()`` copy, with no per-tensor Python work in the hot path. The order of the vector is the
``state_dict`` order of the floating-point entries, so it is stable across processes and machines.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

# Broadcast weights arrive as read-only numpy views of the object store; fedray only ever copies *from*
# them (``FlatParams.load``), so torch's warning about non-writable arrays does not apply.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


@dataclass(frozen=True)
class WeightLayout:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    size: int

    def slices(self):
        for name, shape, off in zip(self.names, self.shapes, self.offsets):
            yield name, shape, off, int(np.prod(shape)) if shape else 1


def _float_entries(module: torch.nn.Module):
    """(name, tensor, is_param) for every floating-point parameter/buffer in state_dict order."""
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    out = []
    for name in module.state_dict().keys():
        t: torch.Tensor | None = params.get(name)
        is_param = t is not None
        if t is None:
            t = buffers.get(name)
        if t is None or not torch.is_floating_point(t):
            continue
        out.append((name, t, is_param))
    return out


def layout_of(module: torch.nn.Module) -> WeightLayout:
    names, shapes, offsets = [], [], []
    off = 0
    for name, t, _ in _float_entries(module):
        names.append(name)
        shapes.append(tuple(t.shape))
        offsets.append(off)
        off += t.numel()
    return WeightLayout(tuple(names), tuple(shapes), tuple(offsets), off)


def flatten(module: torch.nn.Module) -> np.ndarray:
    """A fresh float32 copy of the module's floating-point state as one vector."""
    parts = [t.detach().reshape(-1).to("cpu", torch.float32) for _, t, _ in _float_entries(module)]
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return torch.cat(parts).numpy()


def load_flat(module: torch.nn.Module, flat: np.ndarray) -> None:
    """Copy a flat vector into a module that is not bound with :class:`FlatParams`."""
    layout = layout_of(module)
    if flat.shape != (layout.size,):
        raise ValueError(f"weight vector has shape {flat.shape}, model needs ({layout.size},)")
    src = torch.from_numpy(np.asarray(flat, dtype=np.float32))
    with torch.no_grad():
        for (name, t, _), (_, shape, off, n) in zip(_float_entries(module), layout.slices()):
            t.copy_(src[off : off + n].view(shape))


class FlatParams:
    """Binds a module's floating-point parameters and buffers to views of one flat buffer."""

    def __init__(self, module: torch.nn.Module, device: torch.device | str = "cpu"):
        self.module = module
        self.layout = layout_of(module)
        self.device = torch.device(device)
        self.flat = torch.zeros(self.layout.size, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for (name, t, is_param), (_, shape, off, n) in zip(_float_entries(module), self.layout.slices()):
                view = self.flat[off : off + n].view(shape)
                view.copy_(t.detach().to(self.device, torch.float32))
                if is_param:
                    t.data = view
                else:
                    _set_buffer(module, name, view)
        module.to(self.device)

    def load(self, weights: np.ndarray) -> None:
        if weights.shape != (self.layout.size,):
            raise ValueError(f"weight vector has shape {weights.shape}, model needs ({self.layout.size},)")
        with torch.no_grad():
            self.flat.copy_(torch.from_numpy(weights), non_blocking=False)

    def read(self) -> np.ndarray:
        """A fresh numpy copy of the current weights (safe to hand to Ray)."""
        return self.flat.detach().to("cpu").numpy().copy()

    def view(self) -> torch.Tensor:
        return self.flat


def _set_buffer(module: torch.nn.Module, dotted: str, value: torch.Tensor) -> None:
    *path, leaf = dotted.split(".")
    m = module
    for p in path:
        m = getattr(m, p)
    m._buffers[leaf] = value


def weights_hash(layout: WeightLayout, flat: np.ndarray) -> str:
    """sha256 over sorted parameter names and their float32 bytes, first 16 hex chars
    (the ``weights_hash`` of shared/bench/WORKLOAD.md)."""
    h = hashlib.sha256()
    items = {name: (off, n) for name, _, off, n in layout.slices()}
    for name in sorted(items):
        off, n = items[name]
        h.update(name.encode())
        h.update(np.ascontiguousarray(flat[off : off + n], dtype=np.float32).tobytes())
    return h.hexdigest()[:16]
