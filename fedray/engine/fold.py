"""The ordered fold: a weighted mean of float32 vectors, in sampled order, whatever order they arrive in.

``new = a_1 w_1``, then ``new += a_k w_k`` for k = 2, 3, ... in float32, with ``a_k = weight_k / total``.
Results that arrive early wait in a buffer until every position before them is folded or skipped (a
dropped client), so the sum, and with it the global model, is bit-identical for any number of workers,
any completion order, the Ray and in-process backends, and after a resume. Used by the federated
program (client models), the split program (client-side models) and the split server (per-client server
copies). With ``engine.fold_group: g`` the workers compute the same sum over g consecutive positions
(``a_k`` from :meth:`OrderedFold.coefficient`) and the coordinator folds these partial sums in order
(``scaled=True``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["OrderedFold"]


class OrderedFold:
    """Fold vectors given by position ``0 .. n-1`` in position order.

    ``weights[p]`` is position p's unnormalised weight; ``total`` (default: their sum) normalises them.
    :meth:`add` and :meth:`skip` may come in any order; each returns the ``(position, item)`` pairs folded
    by that call, in position order (so per-client statistics can be accumulated in the same order).
    If positions were skipped, :meth:`result` rescales the sum by ``total / folded weight``.
    ``scaled``: the vectors arrive already multiplied by their coefficients (partial sums of ``engine.fold_group``)
    and are added as they are: ``acc = v_0``, ``acc += v_k``; :meth:`add`'s ``weight`` then gives the weight a
    partial sum actually holds (its members' weights without the dropped ones)."""

    def __init__(self, weights: Sequence[float], total: float | None = None, *, scaled: bool = False):
        self.weights = [float(w) for w in weights]
        self.total = float(sum(self.weights)) if total is None else float(total)
        self.scaled = bool(scaled)
        self._kept_of: dict[int, float] = {}
        self.next = 0  # the first position not folded or skipped yet
        self.kept = 0.0  # sum of the weights folded so far
        self.acc: np.ndarray | None = None
        self._waiting: dict[int, tuple[np.ndarray | None, Any]] = {}

    def __len__(self) -> int:
        return len(self.weights)

    @property
    def waiting(self) -> int:
        """Results held in the reorder buffer."""
        return len(self._waiting)

    @property
    def complete(self) -> bool:
        return self.next >= len(self.weights)

    def coefficient(self, pos: int) -> float:
        """``a_pos = weight_pos / total``, the factor position ``pos`` is folded with."""
        return self.weights[pos] / self.total

    def add(self, pos: int, vec: np.ndarray, item: Any = None, weight: float | None = None) -> list[tuple[int, Any]]:
        self._waiting[int(pos)] = (vec, item)
        if weight is not None:
            self._kept_of[int(pos)] = float(weight)
        return self._drain()

    def skip(self, pos: int) -> list[tuple[int, Any]]:
        """Position ``pos`` contributes nothing (its client was dropped)."""
        self._waiting[int(pos)] = (None, None)
        return self._drain()

    def _drain(self) -> list[tuple[int, Any]]:
        done = []
        while self.next in self._waiting:
            vec, item = self._waiting.pop(self.next)
            if vec is not None:
                if self.scaled:
                    if self.acc is None:
                        self.acc = np.array(vec, dtype=np.float32, copy=True)
                    else:
                        self.acc += vec
                else:
                    a = self.weights[self.next] / self.total
                    if self.acc is None:
                        self.acc = vec * a
                    else:
                        self.acc += vec * a
                self.kept += self._kept_of.pop(self.next, self.weights[self.next])
                done.append((self.next, item))
            self.next += 1
        return done

    def result(self) -> np.ndarray | None:
        """The weighted mean (None when nothing was folded), renormalised if positions were skipped."""
        acc = self.acc
        if acc is not None and self.kept != self.total:
            acc *= np.float32(self.total / self.kept)
        return acc
