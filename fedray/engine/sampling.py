"""Which clients take part in a round: drawn from ``default_rng([seed, round])``, nothing else.

Cost: O(k), whatever the population P. numpy's ``Generator.choice(P, k, replace=False)`` takes Floyd's
algorithm for k <= P / 50 above P = 10,000 (a hash set of k entries; no arange of P) and a partial shuffle of
an arange of P otherwise; the sizes are read at the k sampled clients only (``bench/bench_scale_partition.py``
measures a round's sampling at ten million clients)."""

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
    if isinstance(sizes, np.ndarray):
        return sampled[sizes[sampled] > 0].tolist()
    return [int(c) for c in sampled if sizes[c] > 0]
