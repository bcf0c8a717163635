"""Which clients take part in a round: drawn from ``default_rng([seed, round])``, nothing else."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["sample_clients"]


def sample_clients(sizes, clients_per_round: int, seed: int, rnd: int, over_selection: float = 0.0) -> list[int]:
    """The round's clients in sampled order (clients without data are left out). ``over_selection``
    samples ``ceil(k * (1 + over_selection))`` clients, of which the first k to finish are kept."""
    n = len(sizes)
    k = int(clients_per_round)
    if over_selection > 0:
        k = min(n, int(math.ceil(k * (1.0 + over_selection))))
    sampled = np.random.default_rng([int(seed), rnd]).choice(n, size=k, replace=False)
    return [int(c) for c in sampled if sizes[c] > 0]
