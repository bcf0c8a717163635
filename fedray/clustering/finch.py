"""FINCH: parameter-free hierarchical clustering by first-neighbour relations.

Implements the algorithm of Sarfraz et al. (CVPR 2019) as the reference implementation
(``ssarfraz/FINCH-Clustering``, ``finch/finch.py``) runs it, and as FedCCL (Eq. 8-15) and FPL use it:

1. **First neighbours.** For every point i, kappa(i) is its exact nearest other point (cosine distance by
   default, ``distance="euclidean"`` optional; the point itself is excluded).
2. **Links.** Points i and j are linked when j = kappa(i), i = kappa(j) or kappa(i) = kappa(j).
3. **Partition.** The connected components of the link graph form the first (finest) partition.
4. **Recursion.** Each cluster is replaced by the mean of its *original* points; first neighbours are found
   among those means, linked and merged the same way, giving the next, coarser partition.
5. **Stopping rule (the reference's).** With n_prev and n_curr the cluster counts of two consecutive levels:
   a level that gives one cluster, or no reduction, is discarded and the recursion stops; a level that reduces
   the count by exactly one is kept and the recursion stops; otherwise it continues.  Consequently the last
   partition has at least two clusters, unless the first partition is already a single cluster, and two or
   three points always give one cluster (every point is linked to its first neighbour, so no component can
   be a singleton).

Options mirroring the reference: ``initial_rank`` (user-provided first neighbours for the first level),
``req_clust`` (an extra partition with exactly that many clusters, obtained by repeatedly merging the closest
pair of cluster means, starting from the coarsest partition that still has at least ``req_clust`` clusters;
a ``req_clust`` above the first partition's cluster count cannot be reached by merging: like the official
code, a warning is issued and the first partition is returned)
and ``ensure_early_exit`` (the reference's link pruning; off by default here because FPL, whose behaviour
FedCCL reproduces, passes ``ensure_early_exit=False``).

Exactness, determinism and ties
-------------------------------
First neighbours are exact.  Candidate neighbours are scored with blocked float32 matrix products (torch when
available, numpy otherwise) over symmetric tiles of bounded size, so memory stays at a few tens of MB even for
50 000 points; every row whose best and second-best float32 scores are closer than a rigorous float32
rounding-error bound is re-scored in float64.  The result is therefore the float64 first neighbour, whatever
the float32 rounding.  Scores that agree within float64 rounding (about 1e-13 relative, e.g. exact duplicate
points) are ties and resolve to the **lowest index**.  Cluster labels of every partition are numbered 0..k-1
in order of first appearance (the cluster of point 0 is 0, the next new cluster met scanning the points in
order is 1, ...), which is also the order the reference's connected-components labelling produces.  The
function has no randomness: the same input always gives the same output.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from . import graph
from .graph import _components, _first_neighbors_scored, _max_link_weight, _pruned_components, _relabel, _Scorer

__all__ = ["FinchResult", "finch", "finch_means", "first_neighbors", "cluster_means"]

DISTANCES = ("cosine", "euclidean")


# --------------------------------------------------------------------------------------------------------------
# Result type
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinchResult:
    """Output of :func:`finch`.

    Attributes:
        partitions: one ``(N,)`` int64 label array per level, finest first; labels are ``0..k-1`` in order of
            first appearance and each partition is a coarsening of the previous one.
        num_clusters: the number of clusters of each partition (strictly decreasing).
        req_partition: the partition with exactly ``req_clust`` clusters when ``req_clust`` was given, else None.
        req_clust: the requested number of clusters, or None.
        distance: the metric used (``"cosine"`` or ``"euclidean"``).
    """

    partitions: list[np.ndarray]
    num_clusters: list[int]
    req_partition: np.ndarray | None = None
    req_clust: int | None = None
    distance: str = "cosine"

    @property
    def num_points(self) -> int:
        """Number of clustered points N."""
        return int(self.partitions[0].shape[0])

    def chosen(self, mode: str | int = "last") -> np.ndarray:
        """Return one partition's ``(N,)`` labels.

        Args:
            mode: ``"last"`` (coarsest kept partition, what FPL and FedCCL use), ``"first"`` (finest),
                ``"req"`` (the ``req_clust`` partition) or an int index into :attr:`partitions`
                (negative indices count from the end).
        """
        if isinstance(mode, str):
            if mode == "last":
                return self.partitions[-1]
            if mode == "first":
                return self.partitions[0]
            if mode == "req":
                if self.req_partition is None:
                    raise ValueError(
                        "mode='req' needs finch(..., req_clust=k); this result was computed without req_clust"
                    )
                return self.req_partition
            raise ValueError(f"mode must be 'last', 'first', 'req' or an int partition index, got {mode!r}")
        if isinstance(mode, numbers.Integral) and not isinstance(mode, bool):
            p = len(self.partitions)
            if not -p <= int(mode) < p:
                raise ValueError(f"mode={mode} is out of range: this result has {p} partition(s)")
            return self.partitions[int(mode)]
        raise ValueError(f"mode must be 'last', 'first', 'req' or an int partition index, got {mode!r}")

    def means(self, X, labels: np.ndarray | str | int = "last") -> np.ndarray:
        """Cluster means ``(k, D)`` of the *original* points ``X`` under ``labels``.

        Args:
            X: the ``(N, D)`` data that was clustered.
            labels: an ``(N,)`` label array with labels ``0..k-1``, or a ``mode`` accepted by :meth:`chosen`.
        """
        if isinstance(labels, (str, numbers.Integral)) and not isinstance(labels, bool):
            labels = self.chosen(labels)
        return cluster_means(X, labels)


# --------------------------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------------------------


def _as_matrix(X) -> np.ndarray:
    """Validate ``X`` and return it as a float64 ``(N, D)`` array."""
    if hasattr(X, "detach") and hasattr(X, "cpu"):  # torch tensor (possibly requiring grad / on a GPU)
        X = X.detach().cpu().numpy()
    try:
        arr = np.asarray(X)
    except Exception as exc:  # ragged nested sequences and the like
        raise ValueError(f"X must be a 2-D numeric array (n_samples, n_features); could not convert it: {exc}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"X must be a 2-D array of real numbers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"X must be real-valued, got complex dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"X must be a 2-D array (n_samples, n_features), got an array of shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"X must have at least one sample and one feature, got shape {arr.shape}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if not np.isfinite(arr).all():
        bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        raise ValueError(
            f"X contains NaN or infinite values ({bad.size} row(s), first at row {int(bad[0])}); "
            "FINCH needs finite data"
        )
    return arr


def _float_dtype(X) -> np.dtype:
    """Floating dtype of ``X`` (float64 for integer, bool or unknown input)."""
    dtype = getattr(X, "dtype", None)
    if dtype is not None and not isinstance(dtype, np.dtype):  # torch dtype
        dtype = {"torch.float16": np.float16, "torch.float32": np.float32}.get(str(dtype), np.float64)
    dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.float64)
    return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)


def _check_distance(distance) -> str:
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    return distance


def _check_labels(labels, n: int) -> tuple[np.ndarray, int]:
    lab = np.asarray(labels)
    if lab.shape != (n,):
        raise ValueError(f"labels must have shape ({n},) to match X, got shape {lab.shape}")
    if lab.dtype == bool or not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(f"labels must be integers 0..k-1, got dtype {lab.dtype}")
    lab = lab.astype(np.int64, copy=False)
    if lab.min() < 0:
        raise ValueError(f"labels must be integers 0..k-1, got a negative label {int(lab.min())}")
    sizes = np.bincount(lab)
    k = sizes.size
    if sizes.min() == 0:
        missing = int(np.flatnonzero(sizes == 0)[0])
        raise ValueError(f"labels must use every value 0..{k - 1}; cluster {missing} is empty")
    return lab, k


# --------------------------------------------------------------------------------------------------------------
# Cluster means
# --------------------------------------------------------------------------------------------------------------


def _sums_counts(X: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    n = labels.size
    ind = sparse.csr_matrix((np.ones(n), (labels, np.arange(n))), shape=(k, n))
    return np.asarray(ind @ X), np.bincount(labels, minlength=k).astype(np.float64)


def _means(X: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    sums, counts = _sums_counts(X, labels, k)
    return sums / counts[:, None]


def cluster_means(X, labels) -> np.ndarray:
    """Per-cluster means ``(k, D)`` of the points ``X`` (``(N, D)``) under ``labels`` (``(N,)``, values 0..k-1).

    Accumulates in float64; the result has ``X``'s floating dtype (float64 for integer input).
    """
    arr, dtype = _as_matrix(X), _float_dtype(X)
    lab, k = _check_labels(labels, arr.shape[0])
    return _means(arr, lab, k).astype(dtype, copy=False)


# --------------------------------------------------------------------------------------------------------------
# Exact first neighbours (the search itself is graph._first_neighbors_scored)
# --------------------------------------------------------------------------------------------------------------


def first_neighbors(X, distance: str = "cosine", *, block_size: int | None = None) -> np.ndarray:
    """Exact first (nearest other) neighbour of every row of ``X``.

    Args:
        X: ``(N, D)`` data with N >= 2.
        distance: ``"cosine"`` (1 - cosine similarity; an all-zero row has distance 1 to everything) or
            ``"euclidean"``.
        block_size: tile edge for the blocked search (default: balanced tiles of at most 4096 rows, 64 MB).

    Returns:
        ``(N,)`` int64 array ``kappa`` with ``kappa[i] != i``; ties (equal within float64 rounding) go to the
        lowest index.
    """
    arr = _as_matrix(X)
    _check_distance(distance)
    if arr.shape[0] < 2:
        raise ValueError(f"X must have at least 2 rows to have first neighbours, got shape {arr.shape}")
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 1
    ):
        raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
    return _first_neighbors_scored(_Scorer(arr, distance), block_size)


# --------------------------------------------------------------------------------------------------------------
# Exact-number-of-clusters refinement (the reference's req_clust)
# --------------------------------------------------------------------------------------------------------------


def _merge_to(X: np.ndarray, labels: np.ndarray, k_target: int, distance: str) -> np.ndarray:
    """Merge the closest pair of cluster means (means of the original points) until ``k_target`` clusters remain.

    Ties go to the pair with the lowest first index, then the lowest second index.  Keeps, per cluster, its
    nearest active cluster and updates only what a merge changes.
    """
    k = int(labels.max()) + 1
    if distance == "euclidean":
        X = X - X.mean(axis=0)  # translation-invariant; limits cancellation in the expanded squared distances
    sums, counts = _sums_counts(X, labels, k)
    active = np.ones(k, dtype=bool)
    rep = np.arange(k)

    def vectors() -> np.ndarray:
        M = sums / counts[:, None]
        if distance == "cosine":
            norm = np.linalg.norm(M, axis=1, keepdims=True)
            return np.divide(M, norm, out=np.zeros_like(M), where=norm > 0)
        return M

    V = vectors()
    sqn = (V * V).sum(axis=1)

    def dist_rows(rows: np.ndarray) -> np.ndarray:
        G = V[rows] @ V.T
        if distance == "cosine":
            D = 1.0 - G
        else:
            D = np.maximum(sqn[rows, None] + sqn[None, :] - 2.0 * G, 0.0)  # squared: same order as euclidean
        D[:, ~active] = np.inf
        D[np.arange(rows.size), rows] = np.inf
        return D

    nn = np.empty(k, dtype=np.int64)
    nnd = np.empty(k)
    step = max(1, graph._TILE_BYTES // (8 * k))
    for s in range(0, k, step):
        rows = np.arange(s, min(s + step, k))
        D = dist_rows(rows)
        nn[rows] = D.argmin(axis=1)
        nnd[rows] = D[np.arange(rows.size), nn[rows]]

    for _ in range(k - k_target):
        i = int(np.argmin(nnd))
        j = int(nn[i])
        a, b = min(i, j), max(i, j)
        sums[a] += sums[b]
        counts[a] += counts[b]
        active[b] = False
        nnd[b] = np.inf
        rep[rep == b] = a
        row = sums[a] / counts[a]
        if distance == "cosine":
            nrm = np.linalg.norm(row)
            row = row / nrm if nrm > 0 else np.zeros_like(row)
        V[a] = row
        sqn[a] = row @ row
        da = dist_rows(np.array([a]))[0]
        nn[a] = int(da.argmin())
        nnd[a] = da[nn[a]]
        stale = active & ((nn == a) | (nn == b))
        stale[a] = False
        others = active.copy()
        others[a] = False
        others &= ~stale
        closer = others & ((da < nnd) | ((da == nnd) & (a < nn)))
        nn[closer] = a
        nnd[closer] = da[closer]
        stale_rows = np.flatnonzero(stale)
        for s in range(0, stale_rows.size, step):
            rows = stale_rows[s : s + step]
            D = dist_rows(rows)
            nn[rows] = D.argmin(axis=1)
            nnd[rows] = D[np.arange(rows.size), nn[rows]]
    return _relabel(rep[labels])[0]


# --------------------------------------------------------------------------------------------------------------
# FINCH
# --------------------------------------------------------------------------------------------------------------


def _check_positive_int(name: str, value, upper: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name}={value} exceeds the number of points ({upper})")
    return int(value)


def _check_initial_rank(initial_rank, n: int) -> np.ndarray:
    rank = np.asarray(initial_rank)
    if rank.shape != (n,):
        raise ValueError(f"initial_rank must have shape ({n},) (one first neighbour per row of X), got {rank.shape}")
    if rank.dtype == bool or not np.issubdtype(rank.dtype, np.integer):
        raise ValueError(f"initial_rank must hold integer row indices, got dtype {rank.dtype}")
    rank = rank.astype(np.int64)
    if n > 1 and ((rank < 0) | (rank >= n)).any():
        raise ValueError(f"initial_rank values must lie in [0, {n - 1}], got min {rank.min()} and max {rank.max()}")
    selfref = np.flatnonzero(rank == np.arange(n))
    if n > 1 and selfref.size:
        raise ValueError(
            f"initial_rank[{int(selfref[0])}] == {int(selfref[0])}: a point cannot be its own first neighbour "
            "(drop the self column of a k-NN result)"
        )
    return rank


def finch(
    X,
    *,
    distance: str = "cosine",
    initial_rank=None,
    req_clust: int | None = None,
    max_partitions: int | None = None,
    ensure_early_exit: bool = False,
) -> FinchResult:
    """Cluster the rows of ``X`` with FINCH (see the module docstring for the exact algorithm and tie rules).

    Args:
        X: ``(N, D)`` finite real data (numpy array, array-like or CPU/GPU torch tensor), N >= 1.
        distance: ``"cosine"`` (default, as the reference, FPL and FedCCL) or ``"euclidean"``.
        initial_rank: optional ``(N,)`` integer first neighbours for the first level (no self references).
        req_clust: optional exact number of clusters for :attr:`FinchResult.req_partition`
            (1 <= req_clust <= N); above the first partition's cluster count a ``UserWarning`` is issued and
            :attr:`FinchResult.req_partition` is the first partition (as the official code does).
        max_partitions: optional cap on the number of partitions computed (the recursion stops early).
        ensure_early_exit: the reference's pruning: after the first level, links whose
            (link multiplicity x distance) exceeds the largest such value of the first level are removed.
            Default False, as FPL calls it; the reference defaults to True.

    Returns:
        :class:`FinchResult` with the partitions finest first, their cluster counts and, if requested,
        the ``req_clust`` partition.

    Raises:
        ValueError: naming the offending argument (non-2-D, empty or non-finite ``X``, unknown ``distance``,
            bad ``initial_rank``, ``req_clust`` or ``max_partitions``).
    """
    arr = _as_matrix(X)
    _check_distance(distance)
    n = arr.shape[0]
    req = _check_positive_int("req_clust", req_clust, upper=n)
    cap = _check_positive_int("max_partitions", max_partitions)
    if not isinstance(ensure_early_exit, (bool, np.bool_)):
        raise ValueError(f"ensure_early_exit must be a bool, got {ensure_early_exit!r}")
    rank = _check_initial_rank(initial_rank, n) if initial_rank is not None else None

    if n == 1:
        labels = np.zeros(1, dtype=np.int64)
        return FinchResult([labels], [1], labels.copy() if req is not None else None, req, distance)

    # First level.
    sc = _Scorer(arr, distance) if (rank is None or ensure_early_exit) else None
    kappa = rank if rank is not None else _first_neighbors_scored(sc)
    labels, k = _components(n, np.arange(n), kappa)
    if req is not None and req > k:
        warnings.warn(f"finch: req_clust={req} exceeds the {k} clusters of the first partition (FINCH can only "
                      "merge clusters); returning the first partition as req_partition", UserWarning, stacklevel=2)
    min_sim = _max_link_weight(sc, kappa) if (ensure_early_exit and n > 2) else None
    partitions, counts = [labels], [k]

    # Recursion on cluster means of the original points, with the reference's stopping rule.
    while k > 1 and (cap is None or len(partitions) < cap):
        msc = _Scorer(_means(arr, labels, k), distance)
        mk = _first_neighbors_scored(msc)
        if min_sim is None:
            node_labels, k_new = _components(k, np.arange(k), mk)
        else:
            node_labels, k_new = _pruned_components(msc, mk, min_sim)
        if k_new == 1 or k - k_new < 1:
            break  # level discarded
        labels, _ = _relabel(node_labels[labels])
        partitions.append(labels)
        counts.append(k_new)
        reduced_by_one = k - k_new == 1
        k = k_new
        if reduced_by_one:
            break  # level kept, recursion stops (the reference's `while exit_clust > 1`)

    return FinchResult(partitions, counts, _requested(arr, partitions, counts, req, distance), req, distance)


def _requested(arr: np.ndarray, partitions: list, counts: list, req: int | None, distance: str):
    """The ``req_clust`` partition: the first one when ``req`` exceeds its clusters, the partition with exactly
    ``req`` clusters when there is one, else the coarsest partition above ``req`` merged down to it."""
    if req is None:
        return None
    if req > counts[0]:
        return partitions[0].copy()
    if req in counts:
        return partitions[counts.index(req)].copy()
    start = max(i for i, c in enumerate(counts) if c >= req)
    return _merge_to(arr, partitions[start], req, distance)


def finch_means(
    X,
    mode: str | int = "last",
    *,
    distance: str = "cosine",
    req_clust: int | None = None,
    ensure_early_exit: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster ``X`` with :func:`finch` and return ``(means, labels)`` of the partition picked by ``mode``.

    This is the FedCCL step "cluster one class's embeddings, keep the cluster means" (Eq. 8-10 locally,
    Eq. 13-14 on the server), with FPL's choice ``mode="last"`` (coarsest partition) by default.
    ``means`` is ``(k, D)`` (means of the original rows, ``X``'s floating dtype), ``labels`` is ``(N,)``.
    A single row gives ``means == X`` and ``labels == [0]``.
    """
    result = finch(X, distance=distance, req_clust=req_clust, ensure_early_exit=ensure_early_exit)
    labels = result.chosen(mode)
    return result.means(X, labels), labels
