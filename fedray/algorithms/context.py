"""What a client's update receives and returns: :class:`ClientContext` (built by the worker for one round and
client), :class:`ClientUpdate`, and the server's :class:`ClientHints` for every client's local training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from fedray.config import round_lr
from fedray.core.seeds import PURPOSES

__all__ = ["ClientContext", "ClientHints", "ClientUpdate"]


@dataclass(frozen=True)
class ClientHints:
    """What the server side tells every client's local training besides the payload, typed.

    ``prox_mu``: weight of the proximal term ``prox_mu/2 ||theta - theta_broadcast||^2`` that
    :func:`local_sgd` (and multi-client training) adds to the local loss; the anchor is the broadcast
    weights. FedProx sets it from its ``mu``, FedACG's server optimizer from its ``beta``; hints of the
    algorithm and of the server optimizer add up (:meth:`merge`)."""

    prox_mu: float = 0.0

    def merge(self, other: "ClientHints") -> "ClientHints":
        return ClientHints(prox_mu=float(self.prox_mu) + float(other.prox_mu))


def _entropy(key: list[int]):
    """``key`` as SeedSequence entropy: a uint32 array when every entry fits 32 bits, which SeedSequence reads as
    the same words as the list (an int below 2^32 is one word) in half the time (a few us of every client
    update); the list itself otherwise (wider ints are several words, negative ones an error, as before)."""
    if all(0 <= k <= 0xFFFFFFFF for k in key):
        return np.array(key, dtype=np.uint32)
    return key


@dataclass
class ClientContext:
    """Everything a client update may use. Built by the worker for one (round, client)."""

    cid: int
    rnd: int
    seed: int
    model: torch.nn.Module  # holds the broadcast weights on entry
    flat: Any  # fedray.core.weights.FlatParams bound to ``model``
    global_weights: np.ndarray  # the broadcast weights (read-only view)
    images: np.ndarray  # this client's images (zero-copy from its shard)
    labels: np.ndarray
    meta: Any  # DatasetMeta
    train: Any  # TrainConfig
    device: torch.device
    normalize: bool
    augment: Any = None  # fedray.data.loader.Augment or None
    state: dict | None = None  # this client's persisted state (stateful algorithms), None at first visit
    num_classes: int = 0
    model_factory: Callable[[], torch.nn.Module] | None = None  # builds another replica (e.g. MOON's global copy)
    # ClientHints.prox_mu of the round (FedProx's mu, FedACG's beta): local_sgd adds
    # prox_mu/2 * ||theta - theta_broadcast||^2 to every algorithm's loss (0 = off)
    prox_mu: float = 0.0

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def rng(self, purpose: str, *extra: int) -> np.random.Generator:
        """numpy generator keyed by (seed, round, client, purpose[, extra]). ``order`` keeps the exact
        key [seed, round, client] of the benchmark workload."""
        key = [self.seed, self.rnd, self.cid] if purpose == "order" and not extra else \
            [self.seed, self.rnd, self.cid, 1000 + PURPOSES[purpose], *extra]
        return np.random.default_rng(_entropy(key))

    def torch_generator(self, purpose: str, *extra: int) -> torch.Generator:
        g = torch.Generator(device="cpu")
        g.manual_seed(int(self.rng(purpose, *extra).integers(0, 2**63 - 1)))
        return g

    def lr(self) -> float:
        return round_lr(self.train, self.rnd)


@dataclass
class ClientUpdate:
    """What a client returns. ``weights`` is the trained flat float32 vector."""

    weights: np.ndarray
    num_samples: int
    loss: float
    extras: dict = field(default_factory=dict)  # small per-client payloads for after_aggregate
    state: dict | None = None  # new client state to persist (stateful algorithms)
