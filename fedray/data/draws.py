"""Many of numpy's ``Generator.choice(pop, size=k, replace=False)`` calls as one, with the very same draws.

``classes_per_client`` draws a class set per client, one ``rng.choice`` call each: at ten million clients that
is ten million Python calls. :func:`sorted_choices` gives the same sets, and leaves the generator in the same
state, from one vectorised draw, so a partition keeps its hash.

What numpy's ``Generator.choice(pop, size=k, replace=False)`` (no ``p``) does for ``pop <= 10000`` (the
population where it always takes Floyd's algorithm; above it the result is ``None`` and the caller makes the
calls one by one): for j = pop - k, ..., pop - 1 it draws ``v = bounded(0, j)`` and keeps v, or j when v was
kept before; then it shuffles the k kept values (Fisher-Yates, i = k - 1, ..., 1, drawing ``bounded(0, i)``).
Every ``bounded(0, r)`` is Lemire's rejection method on 32-bit outputs, no draw at all for r = 0, exactly what
``Generator.integers(0, high)`` with an array ``high`` draws element by element. So one ``integers`` call over
the concatenated bounds of n calls consumes the stream as the n calls do; the sets follow from the Floyd
draws (the shuffle's draws only order a set that is sorted anyway). ``tests/data/test_draws.py`` checks
sets and generator state against the calls themselves over many populations, sizes and seeds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FLOYD_MAX_POP", "sorted_choices"]

FLOYD_MAX_POP = 10000  # numpy's choice takes Floyd's algorithm for any size at or below this population
_DRAWS_PER_PASS = 1 << 22  # bounded draws per integers() call (memory: 8 bytes each)


def sorted_choices(rng: np.random.Generator, pop: int, k: int, n: int) -> np.ndarray | None:
    """``(n, k)`` int64 whose row i is ``sorted(rng.choice(pop, size=k, replace=False))`` of the i-th of n
    consecutive calls, with ``rng`` advanced as those calls advance it; ``None`` (nothing drawn) when
    ``pop > FLOYD_MAX_POP``."""
    if not 0 <= k <= pop:
        raise ValueError(f"sorted_choices: need 0 <= k <= pop, got k={k}, pop={pop}")
    if pop > FLOYD_MAX_POP:
        return None
    out = np.empty((n, k), dtype=np.int64)
    if k == 0 or n == 0:
        return out
    highs = np.concatenate([np.arange(pop - k, pop) + 1, np.arange(k - 1, 0, -1) + 1]).astype(np.int64)
    per = max(1, _DRAWS_PER_PASS // highs.size)
    for lo in range(0, n, per):
        m = min(n, lo + per) - lo
        draws = rng.integers(0, np.tile(highs, m)).reshape(m, highs.size)
        chosen = out[lo:lo + m]
        for t in range(k):  # Floyd: the t-th draw, or j = pop - k + t when it was drawn before
            val = draws[:, t]
            if t:
                dup = (chosen[:, :t] == val[:, None]).any(axis=1)
                val = np.where(dup, pop - k + t, val)
            chosen[:, t] = val
        chosen.sort(axis=1)
    return out
