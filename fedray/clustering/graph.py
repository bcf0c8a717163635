"""FINCH's graph machinery: exact first neighbours by blocked float32 scoring with float64 re-scoring,
the first-neighbour link graph (with the reference's optional early-exit pruning) and its connected
components. The exactness and tie rules are those described in :mod:`fedray.clustering.finch`."""

from __future__ import annotations

from typing import Iterator

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

# Bytes allowed for one score tile (float32) or one float64 re-scoring block.
_TILE_BYTES = 64 * 2**20
# Largest number of node pairs handled at once when weighing shared-neighbour links (early exit).
_PAIR_CHUNK = 1 << 21
_EPS32 = float(np.finfo(np.float32).eps)
_EPS64 = float(np.finfo(np.float64).eps)

try:  # torch's CPU sgemm is markedly faster than the BLAS bundled with numpy wheels.
    import torch as _torch
except ImportError:  # pragma: no cover - torch is a fedray dependency, numpy is the fallback
    _torch = None


# --------------------------------------------------------------------------------------------------------------
# Small numeric building blocks
# --------------------------------------------------------------------------------------------------------------


def _use_torch() -> bool:
    return _torch is not None and _torch.get_float32_matmul_precision() == "highest"


def _mm_t(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b.T`` for C-contiguous arrays of the same float dtype, written into ``out`` (numpy-allocated)."""
    if out is None:
        out = np.empty((a.shape[0], b.shape[0]), dtype=a.dtype)
    if _use_torch():
        _torch.mm(_torch.from_numpy(a), _torch.from_numpy(b).t(), out=_torch.from_numpy(out))
        return out
    return np.matmul(a, b.T, out=out)


def _relabel(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber ``labels`` to 0..k-1 in order of first appearance."""
    uniq, first = np.unique(labels, return_index=True)
    mapping = np.empty(int(uniq.max()) + 1 if uniq.size else 0, dtype=np.int64)
    mapping[uniq[np.argsort(first, kind="stable")]] = np.arange(uniq.size, dtype=np.int64)
    return mapping[labels], int(uniq.size)


def _components(n: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, int]:
    """Weakly connected components of the graph on ``n`` nodes with edges ``src[e] - dst[e]``."""
    graph = sparse.csr_matrix(
        (np.ones(src.size, dtype=np.int8), (src.astype(np.int64), dst.astype(np.int64))), shape=(n, n)
    )
    _, lab = connected_components(graph, directed=True, connection="weak", return_labels=True)
    return _relabel(lab)



# --------------------------------------------------------------------------------------------------------------
# Exact first neighbours
# --------------------------------------------------------------------------------------------------------------


class _Scorer:
    """Score representation of a point set: ``score(i, j) = left[i] . right[j]``, larger = closer.

    cosine:    left = right = x / |x| (zero rows stay zero: similarity 0 with every point, as sklearn does);
               score = cosine similarity.
    euclidean: with z the centred points scaled to norm <= 1 and n = |z|^2,
               left = [z, n, 1], right = [2z, -1, -n]; score = -|z_i - z_j|^2 (symmetric in i, j).
    ``err32[i]`` bounds the float32 rounding error of any score in row i; ``tie64[i]`` is the float64 tie width.
    ``raw`` holds what :meth:`distance` needs: unit rows (cosine) or the unscaled points (euclidean).
    """

    def __init__(self, X: np.ndarray, distance: str):
        n, d = X.shape
        self.n, self.distance = n, distance
        if distance == "cosine":
            scale = np.abs(X).max(axis=1, keepdims=True)  # pre-scaling keeps tiny/huge rows out of under/overflow
            U = np.divide(X, scale, out=np.zeros_like(X), where=scale > 0)
            norm = np.linalg.norm(U, axis=1, keepdims=True)
            np.divide(U, norm, out=U, where=norm > 0)
            self.left64 = self.right64 = U
            self.raw = U
            self.err32 = np.full(n, (d + 4) * _EPS32)
            self.tie64 = np.full(n, 2 * (d + 4) * _EPS64)
        else:
            Z = X - X.mean(axis=0)
            zmax = float(np.sqrt((Z * Z).sum(axis=1).max()))
            if zmax > 0:
                Z /= zmax
            sq = (Z * Z).sum(axis=1)
            self.left64 = np.ascontiguousarray(np.column_stack([Z, sq, np.ones(n)]))
            self.right64 = np.ascontiguousarray(np.column_stack([2.0 * Z, -np.ones(n), -sq]))
            self.raw = X
            bound = sq + sq.max()
            self.err32 = (d + 6) * _EPS32 * bound
            self.tie64 = 2 * (d + 6) * _EPS64 * bound
        self.left32 = np.ascontiguousarray(self.left64, dtype=np.float32)
        self.right32 = (
            self.left32 if self.right64 is self.left64 else np.ascontiguousarray(self.right64, dtype=np.float32)
        )

    def distance_pairs(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """float64 distances (1 - cosine, clipped to [0, 2], or euclidean) between nodes ``i[e]`` and ``j[e]``."""
        out = np.empty(i.size)
        d = self.raw.shape[1]
        step = max(1, _TILE_BYTES // (16 * d))
        for s in range(0, i.size, step):
            a, b = self.raw[i[s : s + step]], self.raw[j[s : s + step]]
            if self.distance == "cosine":
                out[s : s + step] = np.clip(1.0 - np.einsum("ij,ij->i", a, b), 0.0, 2.0)
            else:
                diff = a - b
                out[s : s + step] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        return out


def _tile_size(n: int, block_size: int | None) -> int:
    if block_size is not None:
        return max(1, min(int(block_size), n))
    cap = int(np.sqrt(_TILE_BYTES / 4))  # 4096 for 64 MB of float32
    nblocks = -(-n // cap)
    return -(-n // nblocks)  # balanced blocks of at most `cap`


def _update_best(best1, best2, best_blk, rows: slice, vals: np.ndarray, blk: int) -> None:
    cur1 = best1[rows]
    better = vals > cur1
    best2[rows] = np.where(better, cur1, np.maximum(best2[rows], vals))
    best1[rows] = np.where(better, vals, cur1)
    best_blk[rows] = np.where(better, blk, best_blk[rows])


def _first_neighbors_scored(sc: _Scorer, block_size: int | None = None) -> np.ndarray:
    """Exact first neighbour of every node of ``sc`` (needs at least two nodes)."""
    n = sc.n
    b = _tile_size(n, block_size)
    starts = list(range(0, n, b))
    nb = len(starts)
    L, R = sc.left32, sc.right32

    # Pass 1: best and second-best *block* maxima per row over symmetric tiles (each tile serves rows and columns).
    best1 = np.full(n, -np.inf)
    best2 = np.full(n, -np.inf)
    best_blk = np.zeros(n, dtype=np.int64)
    # One float32 work buffer serves every tile of passes 1 and 2 (at most _TILE_BYTES).
    buf = np.empty(max(b * b, min(n * b, _TILE_BYTES // 4)), dtype=np.float32)

    def tile(rows: int, cols: int) -> np.ndarray:
        return buf[: rows * cols].reshape(rows, cols)

    for bi in range(nb):
        ri = slice(starts[bi], min(starts[bi] + b, n))
        for bj in range(bi, nb):
            rj = slice(starts[bj], min(starts[bj] + b, n))
            hi, wj = ri.stop - ri.start, rj.stop - rj.start
            T = _mm_t(L[ri], R[rj], out=tile(hi, wj))
            if bi == bj:
                np.fill_diagonal(T, -np.inf)
            _update_best(best1, best2, best_blk, ri, T.max(axis=1), bj)
            if bi != bj:
                _update_best(best1, best2, best_blk, rj, T.max(axis=0), bi)

    # Pass 2: argmax inside each row's winning block, and an ambiguity flag from a rounding-error bound.
    kappa = np.empty(n, dtype=np.int64)
    flagged = np.zeros(n, dtype=bool)
    order = np.argsort(best_blk, kind="stable")
    bounds = np.searchsorted(best_blk[order], np.arange(nb + 1))
    for bj in range(nb):
        rows_all = order[bounds[bj] : bounds[bj + 1]]
        if rows_all.size == 0:
            continue
        c0, c1 = starts[bj], min(starts[bj] + b, n)
        step = max(1, _TILE_BYTES // (4 * (c1 - c0)))
        for s in range(0, rows_all.size, step):
            rows = rows_all[s : s + step]
            Q = _mm_t(np.ascontiguousarray(L[rows]), R[c0:c1], out=tile(rows.size, c1 - c0))
            loc = np.arange(rows.size)
            own = (rows >= c0) & (rows < c1)
            Q[loc[own], rows[own] - c0] = -np.inf
            a = Q.argmax(axis=1)
            v = Q[loc, a].astype(np.float64)
            Q[loc, a] = -np.inf
            second = Q.max(axis=1).astype(np.float64) if Q.shape[1] > 1 else np.full(rows.size, -np.inf)
            kappa[rows] = c0 + a
            competitor = np.maximum(second, best2[rows])
            # Unflagged rows have a float32 winner whose true margin exceeds the float64 tie width.
            flagged[rows] = competitor >= v - 2.0 * sc.err32[rows] - sc.tie64[rows]

    # Pass 3: float64 re-scoring of ambiguous rows; near-equal scores are ties resolved to the lowest index.
    idx = np.flatnonzero(flagged)
    if idx.size:
        step = max(1, _TILE_BYTES // (8 * n))
        for s in range(0, idx.size, step):
            rows = idx[s : s + step]
            S = _mm_t(np.ascontiguousarray(sc.left64[rows]), sc.right64)
            loc = np.arange(rows.size)
            S[loc, rows] = -np.inf
            top = S.max(axis=1)
            kappa[rows] = np.argmax(S >= (top - sc.tie64[rows])[:, None], axis=1)
    return kappa


# --------------------------------------------------------------------------------------------------------------
# Link graph, with the reference's optional early-exit pruning
# --------------------------------------------------------------------------------------------------------------


def _shared_neighbor_pairs(kappa: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield, in bounded chunks, all pairs (p, q), p != q, with kappa[p] == kappa[q] (each unordered pair once)."""
    order = np.argsort(kappa, kind="stable")
    ks = kappa[order]
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    sizes = np.diff(np.r_[starts, ks.size])
    for g in np.unique(sizes[sizes >= 2]):
        g = int(g)
        group_starts = starts[sizes == g]
        if g <= 64:
            ti, tj = np.triu_indices(g, 1)
            per_batch = max(1, _PAIR_CHUNK // ti.size)
            for s in range(0, group_starts.size, per_batch):
                members = order[group_starts[s : s + per_batch, None] + np.arange(g)]
                yield members[:, ti].ravel(), members[:, tj].ravel()
        else:
            rows_per = max(1, _PAIR_CHUNK // g)
            pos = np.arange(g)
            for gs in group_starts:
                members = order[gs : gs + g]
                for r0 in range(0, g - 1, rows_per):
                    first, second = np.nonzero(pos[None, :] > pos[r0 : r0 + rows_per, None])
                    yield members[r0 + first], members[second]


def _direct_link_weights(sc: _Scorer, kappa: np.ndarray) -> np.ndarray:
    """Reference weight A_ij * D_ij of each direct link (i, kappa[i]); A_ij = 2 for mutual first neighbours."""
    i = np.arange(kappa.size)
    mutual = kappa[kappa] == i
    return sc.distance_pairs(i, kappa) * np.where(mutual, 2.0, 1.0)


def _max_link_weight(sc: _Scorer, kappa: np.ndarray) -> float:
    """Reference ``min_sim``: the largest A_ij * D_ij over all linked pairs (direct and shared-neighbour)."""
    best = float(_direct_link_weights(sc, kappa).max())
    for p, q in _shared_neighbor_pairs(kappa):
        best = max(best, float(sc.distance_pairs(p, q).max()))
    return best


def _pruned_components(sc: _Scorer, kappa: np.ndarray, min_sim: float) -> tuple[np.ndarray, int]:
    """Components of the link graph after dropping links whose A_ij * D_ij exceeds ``min_sim``."""
    n = kappa.size
    keep = _direct_link_weights(sc, kappa) <= min_sim
    src = [np.flatnonzero(keep)]
    dst = [kappa[keep]]
    for p, q in _shared_neighbor_pairs(kappa):
        # p and q are already connected through their shared neighbour when both direct links survive.
        need = ~(keep[p] & keep[q])
        if not need.any():
            continue
        p, q = p[need], q[need]
        ok = sc.distance_pairs(p, q) <= min_sim
        src.append(p[ok])
        dst.append(q[ok])
    return _components(n, np.concatenate(src), np.concatenate(dst))
