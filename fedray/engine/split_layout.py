"""What both sides of the split program share: per-round plans and the split of the flat weight vector.

The coordinator's :mod:`fedray.engine.programs.split` and the workers' :mod:`fedray.engine.client.split`
both import this module and nothing of each other. See ``docs/engine.md`` for the split round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.core.weights import layout_of

__all__ = ["Entry", "SplitLayout", "SplitPlan", "assign_clients", "batch_plan", "batch_sizes", "client_output_shape",
           "has_dropout", "param_entries", "params_vector", "views"]


# ------------------------------------------------------------------------------------------- plans
def batch_sizes(sizes, batch_size: int) -> np.ndarray:
    """SCALA Eq. 3: ``B_k = max(1, floor(B * |D_k| / sum_j |D_j|))`` over the participating clients,
    capped at ``|D_k|`` (a client cannot contribute more distinct samples than it has). The sizes sum to
    at most ``B`` (when no cap applies) and at least ``B - K`` (floors), and grow with ``|D_k|``."""
    n = np.asarray(sizes, dtype=np.int64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError(f"sizes must be a non-empty 1-D array of client data sizes, got shape {n.shape}")
    if (n <= 0).any():
        raise ValueError(f"every participating client needs data; got sizes {n.tolist()}")
    if isinstance(batch_size, bool) or int(batch_size) < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    bk = (int(batch_size) * n) // int(n.sum())
    return np.minimum(np.maximum(bk, 1), n)


def batch_plan(rng: np.random.Generator, n: int, bk: int, iters: int) -> list[np.ndarray]:
    """The row indices of a client's ``iters`` minibatches of size ``bk`` from its ``n`` samples.

    Consecutive slices of a permutation drawn from ``rng``; when fewer than ``bk`` rows remain, a fresh
    permutation starts (an epoch boundary; the remainder is skipped, like ``drop_last``)."""
    bk = int(min(bk, n))
    if bk < 1:
        raise ValueError(f"a client with {n} samples cannot form minibatches of size {bk}")
    out = []
    perm, pos = rng.permutation(n), 0
    for _ in range(int(iters)):
        if pos + bk > n:
            perm, pos = rng.permutation(n), 0
        out.append(perm[pos : pos + bk])
        pos += bk
    return out


def assign_clients(bks, num_workers: int) -> dict[int, list[int]]:
    """Pin the round's clients (positions in sampled order) to workers: largest ``B_k`` first onto the
    least-loaded worker (ties by index). Only used for load balance; results never depend on it."""
    bks = [int(b) for b in bks]
    w = max(1, min(int(num_workers), len(bks)))
    loads = [0] * w
    out: dict[int, list[int]] = {i: [] for i in range(w)}
    for pos in sorted(range(len(bks)), key=lambda p: (-bks[p], p)):
        i = min(range(w), key=lambda j: (loads[j], j))
        out[i].append(pos)
        loads[i] += bks[pos]
    return {i: sorted(v) for i, v in out.items() if v}



def has_dropout(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in module.modules())



# ------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    offset: int  # within its side's vector
    numel: int


def views(vec: torch.Tensor, entries, base: int = 0) -> dict[str, torch.Tensor]:
    return {e.name: vec[base + e.offset : base + e.offset + e.numel].view(e.shape) for e in entries}


def param_entries(module: nn.Module) -> tuple[tuple[Entry, ...], int]:
    """Entries of a module's parameters (in ``named_parameters`` order); it must hold no float buffers."""
    if any(torch.is_floating_point(b) for b in module.buffers()):
        raise ValueError(f"{type(module).__name__}: an auxiliary head must not have floating-point buffers")
    out, off = [], 0
    for name, p in module.named_parameters():
        out.append(Entry(name, tuple(p.shape), off, p.numel()))
        off += p.numel()
    return tuple(out), off


def params_vector(module: nn.Module) -> np.ndarray:
    parts = [p.detach().reshape(-1).to("cpu", torch.float32) for p in module.parameters()]
    return torch.cat(parts).numpy().copy() if parts else np.zeros(0, np.float32)


class SplitLayout:
    """Where the client-side and server-side parts of a model sit in its flat weight vector.

    Entries are split by side (the split part holding the tensor) and kind: *train* (parameters with
    ``requires_grad``) and *fixed* (floating-point buffers and frozen parameters). ``client_train`` etc.
    are index arrays into the full vector (:mod:`fedray.core.weights` order). A client's vector on the
    wire (:class:`SplitPlan`) is ``[client train | auxiliary head | client fixed]``.
    """

    def __init__(self, model, point: str):
        self.point = point
        client, server = model.split(point)
        client_names = set(client.state_dict().keys())
        server_names = set(server.state_dict().keys())
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        idx: dict[str, list] = {k: [] for k in ("ct", "cf", "st", "sf")}
        ent: dict[str, list] = {k: [] for k in idx}
        size = {k: 0 for k in idx}
        for name, shape, off, n in layout_of(model).slices():
            if name in client_names:
                side = "c"
            elif name in server_names:
                side = "s"
            else:
                raise ValueError(f"split point {point!r}: weight {name!r} belongs to neither part")
            key = side + ("t" if name in trainable else "f")
            idx[key].append(np.arange(off, off + n, dtype=np.int64))
            ent[key].append(Entry(name, tuple(shape), size[key], n))
            size[key] += n
        cat = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in idx.items()}
        self.client_train, self.client_fixed = cat["ct"], cat["cf"]
        self.server_train, self.server_fixed = cat["st"], cat["sf"]
        self.ct_entries, self.cf_entries = tuple(ent["ct"]), tuple(ent["cf"])
        self.st_entries, self.sf_entries = tuple(ent["st"]), tuple(ent["sf"])
        self.size = int(layout_of(model).size)

    def server_vectors(self, full: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return full[self.server_train].copy(), full[self.server_fixed].copy()


def client_output_shape(model, point: str, meta) -> tuple[int, ...]:
    """Per-sample shape of the client-side part's output (the activation shape) for ``meta.shape`` input."""
    client, _ = model.split(point)
    modes = [m.training for m in client.modules()]
    dev = next(iter(model.parameters())).device
    client.eval()
    try:
        with torch.no_grad():
            out = client(torch.zeros((1, *tuple(int(s) for s in meta.shape)), device=dev))
    finally:
        for m, t in zip(client.modules(), modes):
            m.training = t
    return tuple(int(s) for s in out.shape[1:])


# --------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class SplitPlan:
    """What the coordinator's split program and every worker's split runtime derive alike from the model and
    the algorithm, built by one function (:meth:`build`) on both sides: the cut point, the layout of the flat
    vector, the per-sample activation shape, the auxiliary client head of methods without gradient returns
    (``aux``: a module built from the global torch generator, used for its shape and, on the workers, its
    forward; its initial weights come from :meth:`fedray.engine.programs.split.SplitProgram.init_aux`) and
    the wire format of a client's vector, ``[client train | auxiliary head | client fixed]``."""

    shape: Any  # the algorithm's SplitShape
    point: str
    layout: SplitLayout
    act_shape: tuple[int, ...]
    num_classes: int
    aux: nn.Module | None
    aux_entries: tuple[Entry, ...]
    aux_size: int

    @classmethod
    def build(cls, algorithm, model, meta) -> SplitPlan:
        point = algorithm.split_point_for(model)
        layout = SplitLayout(model, point)
        act_shape = client_output_shape(model, point, meta)
        num_classes = int(meta.num_classes)
        aux, size = None, 0
        entries: tuple[Entry, ...] = ()
        if not algorithm.shape.returns_gradients:
            aux = algorithm.aux_head(act_shape, num_classes)
            if aux is None:
                raise ValueError(f"algorithm {algorithm.name!r} returns no gradients but defines no auxiliary head")
            entries, size = param_entries(aux)
        return cls(algorithm.shape, point, layout, act_shape, num_classes, aux, entries, size)

    @property
    def num_train(self) -> int:
        """Length of the trainable head of a client vector: client-side parameters, then the auxiliary head."""
        return int(self.layout.client_train.size) + self.aux_size

    def client_vector(self, full: np.ndarray, aux: np.ndarray | None) -> np.ndarray:
        """The round's client vector (wire format) from the global vector and the auxiliary head's weights."""
        lay = self.layout
        aux = np.zeros(0, np.float32) if aux is None or not self.aux_size else np.asarray(aux, np.float32)
        return np.concatenate([full[lay.client_train], aux, full[lay.client_fixed]]).astype(np.float32, copy=False)

    def unpack(self, vec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A client vector's trainable part ``[client train | aux]`` and its fixed part."""
        return vec[: self.num_train], vec[self.num_train :]

    def write(self, full: np.ndarray, client_vec: np.ndarray, server_train: np.ndarray,
              server_fixed: np.ndarray) -> np.ndarray:
        """Put a client vector (wire format) and the server vectors into ``full`` (in place); returns the
        auxiliary part of the client vector."""
        lay, nct = self.layout, int(self.layout.client_train.size)
        full[lay.client_train] = client_vec[:nct]
        full[lay.client_fixed] = client_vec[nct + self.aux_size :]
        full[lay.server_train] = server_train
        full[lay.server_fixed] = server_fixed
        return client_vec[nct : nct + self.aux_size].copy()
