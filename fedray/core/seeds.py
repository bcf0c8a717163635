"""Keyed randomness: every random draw of a run comes from a generator keyed by what it is for.

Client draws use ``[seed, round, client id, 1000 + PURPOSES[purpose], ...]`` (fedray.algorithms.base.
ClientContext.rng); server-side draws of the split program use ``[seed, round, SERVER_STREAM, ...]``,
which never collides with a client key (client ids are far below 2**40). Adding a purpose never shifts
another draw.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

__all__ = ["PURPOSES", "SERVER_STREAM", "seed_of", "seeded"]

# Purposes of random draws: part of every generator key, so adding a draw never shifts another.
PURPOSES = {"order": 0, "augment": 1, "dropout": 2, "algorithm": 3, "eval": 4, "sample": 5}

# Generator keys of server-side draws: [seed, round, SERVER_STREAM, purpose, ...].
SERVER_STREAM = 1 << 40


def seed_of(key) -> int:
    """A 63-bit torch seed drawn from a numpy generator or from the generator keyed by ``key``."""
    rng = key if isinstance(key, np.random.Generator) else np.random.default_rng(key)
    return int(rng.integers(0, 2**63 - 1))


@contextmanager
def seeded(enabled: bool, seed: int, device: torch.device):
    """Run the body with the torch RNG seeded to ``seed`` (dropout masks), restoring the state after."""
    if not enabled:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
