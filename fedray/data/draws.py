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

Also here: the class sets of ``classes_per_client`` (:func:`class_sets`) and the cut of a Dirichlet draw into
owners (:func:`cuts_owner`, :func:`assign_cuts`: the latter a pass of rows at a time, with one
``num_clients``-long array less).
"""

from __future__ import annotations

import numpy as np

from .client_index import PASS_ROWS

__all__ = ["FLOYD_MAX_POP", "assign_cuts", "class_sets", "cuts_owner", "sorted_choices"]

FLOYD_MAX_POP = 10000  # numpy's choice takes Floyd's algorithm for any size at or below this population
_DRAWS_PER_PASS = 1 << 22  # bounded draws per integers() call (memory: 8 bytes each)


def sorted_choices(rng: np.random.Generator, pop: int, k: int, n: int, dtype=np.int64) -> np.ndarray | None:
    """``(n, k)`` ``dtype`` (int64 unless given: it must hold ``pop - 1``) whose row i is ``sorted(rng.choice(pop,
    size=k, replace=False))`` of the i-th of n consecutive calls, with ``rng`` advanced as those calls advance it;
    ``None`` (nothing drawn) when ``pop > FLOYD_MAX_POP``."""
    if not 0 <= k <= pop:
        raise ValueError(f"sorted_choices: need 0 <= k <= pop, got k={k}, pop={pop}")
    if pop > FLOYD_MAX_POP:
        return None
    out = np.empty((n, k), dtype=dtype)
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


def class_sets(rng, n: int, c_count: int, classes: int, assignment: str) -> np.ndarray:
    """Every client's class set for ``classes_per_client`` (:mod:`fedray.data.partition`), an ``(n, classes)`` array
    (a row in any order).

    The random draws are those of one ``rng.choice`` per client, client 0 first, made at once by
    :func:`sorted_choices` (the same draws, the generator left in the same state); numpy
    takes another algorithm above its population limit, and there the calls are made one by one."""
    dtype = np.int16 if c_count < (1 << 14) else np.int64  # holds i mod C + j < 2 C: every temporary in dtype
    if assignment == "deterministic":
        return (((np.arange(n, dtype=np.int64) % c_count).astype(dtype)[:, None] + np.arange(classes, dtype=dtype))
                % c_count).astype(dtype, copy=False)
    if assignment == "first-deterministic":
        first = (np.arange(n, dtype=np.int64) % c_count).astype(dtype)
        idx = sorted_choices(rng, c_count - 1, classes - 1, n, dtype)
        if idx is None:
            every = np.arange(c_count)
            others = np.array([rng.choice(every[every != f], size=classes - 1, replace=False) for f in first.tolist()],
                              dtype=dtype)
        else:
            idx += idx >= first[:, None]  # the idx-th class other than the client's first
            others = idx
        return np.concatenate([first[:, None], others.reshape(n, classes - 1)], axis=1)
    sets = sorted_choices(rng, c_count, classes, n, dtype)
    if sets is None:
        sets = np.array([rng.choice(c_count, size=classes, replace=False) for _ in range(n)], dtype=dtype)
    return sets.reshape(n, classes)


def cuts_owner(n: int, proportions: np.ndarray) -> np.ndarray:
    """Owner of each of ``n`` positions when they are cut at ``floor(cumsum(p) * n)[:-1]``.

    This is exactly ``np.split(x, (np.cumsum(p) * n).astype(int)[:-1])`` expressed as "position j
    goes to section k": k = number of cuts <= j.
    """
    return np.searchsorted(_cuts(n, np.array(proportions, dtype=np.float64)), np.arange(n), side="right")


def _cuts(n: int, proportions: np.ndarray) -> np.ndarray:
    """``(np.cumsum(p) * n).astype(int)[:-1]``, computed in ``proportions`` (overwritten: one array less)."""
    x = np.cumsum(proportions, out=proportions)
    x *= n
    return x[:-1].astype(int)


def assign_cuts(owner: np.ndarray, idx: np.ndarray, proportions: np.ndarray) -> None:
    """``owner[idx] = cuts_owner(len(idx), proportions)``, a pass of positions at a time (``proportions`` is
    overwritten). Position j's owner, the number of cuts ``int(x_k) <= j`` (``x = cumsum(p) * n``), is the
    number of ``x_k < j + 1``: for finite ``x_k >= 0``, ``int`` truncates to ``floor`` and ``floor(x) <= j`` iff
    ``x < j + 1``; so the float ``x`` is searched and no integer copy of the cuts (one ``num_clients``-long
    array) is made. Other ``x`` (not met: a Dirichlet draw is finite and >= 0) take the integer cuts."""
    n = idx.shape[0]
    x = np.cumsum(proportions, out=proportions)
    x *= n
    x = x[:-1]
    exact = bool(np.all(np.isfinite(x))) and (not x.size or float(x[0]) >= 0.0)  # cumsum of p >= 0: x ascending
    cuts = x if exact else x.astype(int)
    for lo in range(0, n, PASS_ROWS):
        hi = min(n, lo + PASS_ROWS)
        if exact:
            owner[idx[lo:hi]] = np.searchsorted(cuts, np.arange(lo + 1, hi + 1, dtype=np.float64), side="left")
        else:
            owner[idx[lo:hi]] = np.searchsorted(cuts, np.arange(lo, hi), side="right")
