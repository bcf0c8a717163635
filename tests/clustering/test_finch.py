"""Tests for fedray.clustering.finch (FINCH clustering).

The vectorised implementation is checked against a deliberately plain one written here: O(N^2) Python loops
for first neighbours, union-find for the link graph, the reference's dense A = (K + I)(K + I)^T for the
early-exit weights, and the same recursion and stopping rule.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

from fedray.clustering import FinchResult, cluster_means, finch, finch_means, first_neighbors

graph_module = importlib.import_module("fedray.clustering.graph")  # tile sizes and link-graph helpers


# ----------------------------------------------------------------------------------------------------------------
# Plain reference implementation
# ----------------------------------------------------------------------------------------------------------------


def loop_distance(a: np.ndarray, b: np.ndarray, distance: str) -> float:
    if distance == "cosine":
        na, nb = np.sqrt(a @ a), np.sqrt(b @ b)
        sim = 0.0 if na == 0 or nb == 0 else float(a @ b) / (na * nb)
        return min(max(1.0 - sim, 0.0), 2.0)
    return float(np.sqrt(np.sum((a - b) ** 2)))


def loop_distance_matrix(X: np.ndarray, distance: str) -> np.ndarray:
    n = len(X)
    D = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            D[i, j] = loop_distance(X[i], X[j], distance)
    return D


def loop_first_neighbors(D: np.ndarray) -> np.ndarray:
    n = len(D)
    kappa = np.empty(n, dtype=np.int64)
    for i in range(n):
        best, best_j = np.inf, -1
        for j in range(n):
            if j != i and D[i, j] < best:  # strict: ties keep the lowest index
                best, best_j = D[i, j], j
        kappa[i] = best_j
    return kappa


class UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def first_appearance(labels) -> np.ndarray:
    mapping: dict = {}
    return np.array([mapping.setdefault(v, len(mapping)) for v in labels], dtype=np.int64)


def loop_link_counts(kappa: np.ndarray) -> np.ndarray:
    """The reference's A = (K + I)(K + I)^T with a zero diagonal (dense, small n only)."""
    n = len(kappa)
    K = np.eye(n)
    K[np.arange(n), kappa] += 1
    A = K @ K.T
    np.fill_diagonal(A, 0)
    return A


def loop_components(kappa: np.ndarray, D: np.ndarray | None = None, min_sim: float | None = None) -> np.ndarray:
    n = len(kappa)
    uf = UnionFind(n)
    A = loop_link_counts(kappa)
    for i in range(n):
        for j in range(n):
            linked = j == kappa[i] or i == kappa[j] or (i != j and kappa[i] == kappa[j])
            if linked and (min_sim is None or A[i, j] * D[i, j] <= min_sim):
                uf.union(i, j)
    return first_appearance([uf.find(i) for i in range(n)])


def loop_means(X: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.stack([X[labels == c].mean(axis=0) for c in range(labels.max() + 1)])


def loop_finch(X, distance="cosine", ensure_early_exit=False, initial_rank=None):
    X = np.asarray(X, dtype=np.float64)
    n = len(X)
    if n == 1:
        return [np.zeros(1, dtype=np.int64)], [1]
    D = loop_distance_matrix(X, distance)
    kappa = loop_first_neighbors(D) if initial_rank is None else np.asarray(initial_rank)
    labels = loop_components(kappa)
    min_sim = None
    if ensure_early_exit and n > 2:
        min_sim = float(np.max(loop_link_counts(kappa) * D))
    partitions, counts = [labels], [labels.max() + 1]
    while True:
        M = loop_means(X, labels)
        if len(M) == 1:
            break
        DM = loop_distance_matrix(M, distance)
        node = loop_components(loop_first_neighbors(DM), DM, min_sim)
        k_prev, k_new = counts[-1], node.max() + 1
        if k_new == 1 or k_prev - k_new < 1:
            break
        labels = first_appearance(node[labels])
        partitions.append(labels)
        counts.append(k_new)
        if k_prev - k_new == 1:
            break
    return partitions, counts


def loop_merge_to(X: np.ndarray, labels: np.ndarray, k_target: int, distance: str) -> np.ndarray:
    labels = labels.copy()
    while labels.max() + 1 > k_target:
        M = loop_means(X, labels)
        DM = loop_distance_matrix(M, distance)
        np.fill_diagonal(DM, np.inf)
        a, b = np.unravel_index(np.argmin(DM), DM.shape)  # lowest (row, col) among minima
        a, b = min(a, b), max(a, b)
        labels[labels == b] = a
        labels = first_appearance(labels)
    return labels


def blobs(n_per: int, n_blobs: int, dim: int, seed: int, spread: float = 0.05):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_blobs, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    truth = np.repeat(np.arange(n_blobs), n_per)
    X = centers[truth] + spread * rng.standard_normal((n_blobs * n_per, dim))
    perm = rng.permutation(len(X))
    return X[perm], truth[perm]


# ----------------------------------------------------------------------------------------------------------------
# First neighbours
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("block_size", [None, 1, 7, 64])
def test_first_neighbors_match_loops(distance, block_size):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 12)) + 0.5
    expected = loop_first_neighbors(loop_distance_matrix(X, distance))
    np.testing.assert_array_equal(first_neighbors(X, distance, block_size=block_size), expected)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_first_neighbors_near_duplicates_resolved_in_float64(distance):
    # Groups of points differing by ~1e-5 relative: float32 cannot order them, float64 can.
    rng = np.random.default_rng(11)
    base = rng.standard_normal((6, 10))
    X = np.repeat(base, 8, axis=0) + 1e-5 * rng.standard_normal((48, 10))
    expected = loop_first_neighbors(loop_distance_matrix(X, distance))
    np.testing.assert_array_equal(first_neighbors(X, distance, block_size=5), expected)
    np.testing.assert_array_equal(first_neighbors(X, distance), expected)


def test_first_neighbors_ties_go_to_lowest_index():
    X = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    # 0,1,2 are duplicates; 3 and the zero row 4 are at cosine distance 1 from everything.
    np.testing.assert_array_equal(first_neighbors(X, "cosine"), [1, 0, 0, 0, 0])
    Y = np.array([[0.0], [1.0], [2.0], [3.0]])  # 1 is equidistant from 0 and 2, 2 from 1 and 3
    np.testing.assert_array_equal(first_neighbors(Y, "euclidean"), [1, 0, 1, 2])


# ----------------------------------------------------------------------------------------------------------------
# FINCH against the loop implementation
# ----------------------------------------------------------------------------------------------------------------


def assert_same(result: FinchResult, expected):
    partitions, counts = expected
    assert result.num_clusters == [int(c) for c in counts]
    assert len(result.partitions) == len(partitions)
    for got, want in zip(result.partitions, partitions):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("n,dim,seed", [(9, 3, 0), (40, 5, 1), (120, 8, 2), (230, 16, 3)])
def test_finch_matches_loop_implementation(distance, n, dim, seed):
    X = np.random.default_rng(seed).standard_normal((n, dim))
    assert_same(finch(X, distance=distance), loop_finch(X, distance))


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("seed", [4, 5])
def test_finch_matches_loop_on_clustered_data_with_tiny_tiles(monkeypatch, distance, seed):
    X, _ = blobs(30, 6, 10, seed, spread=0.2)
    expected = loop_finch(X, distance)
    monkeypatch.setattr(graph_module, "_TILE_BYTES", 4 * 16 * 16)  # 16x16 tiles, many chunks in every pass
    assert_same(finch(X, distance=distance), expected)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("seed", [6, 7, 8])
def test_early_exit_matches_reference_weights(distance, seed):
    X, _ = blobs(25, 5, 6, seed, spread=0.3)
    assert_same(finch(X, distance=distance, ensure_early_exit=True), loop_finch(X, distance, ensure_early_exit=True))


@pytest.mark.parametrize("pair_chunk", [7, 1 << 21])
def test_shared_neighbor_pairs_cover_every_pair_once(monkeypatch, pair_chunk):
    monkeypatch.setattr(graph_module, "_PAIR_CHUNK", pair_chunk)
    rng = np.random.default_rng(0)
    kappa = np.concatenate([np.zeros(150, dtype=np.int64), rng.integers(150, 400, 250)])  # one hub of 150
    got = [tuple(sorted(pq)) for p, q in graph_module._shared_neighbor_pairs(kappa) for pq in zip(p, q)]
    want = [(i, j) for i in range(400) for j in range(i + 1, 400) if kappa[i] == kappa[j]]
    assert len(got) == len(set(got)) and sorted(got) == want


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_early_exit_with_a_hub(distance):
    # A centre with 90 points at distance 0.1 along orthogonal axes (so the centre is the first neighbour of all
    # of them: a hub of in-degree 90) plus a second, farther group.
    rng = np.random.default_rng(5)
    centre = np.full((1, 100), 3.0)
    star = centre + 0.1 * np.eye(100)[:90] + 1e-4 * rng.standard_normal((90, 100))
    X = np.vstack([centre, star, -1.0 + 0.3 * rng.standard_normal((40, 100))])
    assert np.bincount(first_neighbors(X, distance)).max() > 64
    assert_same(finch(X, distance=distance, ensure_early_exit=True), loop_finch(X, distance, ensure_early_exit=True))


def test_initial_rank_is_used_for_first_level():
    rng = np.random.default_rng(9)
    X = rng.standard_normal((60, 4))
    np.testing.assert_array_equal(finch(X, initial_rank=first_neighbors(X)).partitions[0], finch(X).partitions[0])
    rank = (np.arange(60) + 1 + rng.integers(0, 5, 60)) % 60  # arbitrary, never self
    assert_same(finch(X, initial_rank=rank), loop_finch(X, initial_rank=rank))


# ----------------------------------------------------------------------------------------------------------------
# Behaviour
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_well_separated_blobs_recovered_exactly(distance, seed):
    X, truth = blobs(40, 5, 16, seed)
    want = first_appearance(truth)
    # With the reference's early exit, cross-blob links are pruned and the blobs come out exactly.
    pruned = finch(X, distance=distance, ensure_early_exit=True)
    assert any(np.array_equal(p, want) for p in pruned.partitions), pruned.num_clusters
    # Without it (FPL's setting) no level mixes blobs while they are still split, but once a blob is whole its
    # mean links to the nearest other blob: the last partition can be coarser than the truth (documented
    # reference behaviour, e.g. counts [4, 2] instead of [4, 3]).
    plain = finch(X, distance=distance)
    for p, k in zip(plain.partitions, plain.num_clusters):
        if k >= 5:
            assert all(np.unique(truth[p == c]).size == 1 for c in range(k))
    assert plain.num_clusters[0] == pruned.num_clusters[0]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_two_or_three_points_give_one_cluster(n, distance):
    for seed in range(20):
        X = np.random.default_rng(seed).standard_normal((n, 4))
        result = finch(X, distance=distance)
        assert result.num_clusters == [1]
        assert len(result.partitions) == 1
        np.testing.assert_array_equal(result.chosen(), np.zeros(n))


def test_one_point_is_one_cluster():
    result = finch(np.array([[0.3, -1.0, 2.0]]))
    assert result.num_clusters == [1]
    np.testing.assert_array_equal(result.chosen("last"), [0])
    point = np.array([[0.3, -1.0, 2.0]], dtype=np.float32)
    means, labels = finch_means(point)
    np.testing.assert_array_equal(means, point)
    assert means.dtype == np.float32
    np.testing.assert_array_equal(labels, [0])
    assert finch(np.ones((1, 2)), req_clust=1).chosen("req").tolist() == [0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_partition_structure_and_stopping_rule(seed):
    X = np.random.default_rng(seed).standard_normal((300, 8))
    result = finch(X)
    counts = result.num_clusters
    assert all(a > b for a, b in zip(counts, counts[1:]))
    assert counts[-1] >= 2 or len(counts) == 1
    for p, k in zip(result.partitions, counts):
        assert p.dtype == np.int64 and p.shape == (300,)
        np.testing.assert_array_equal(p, first_appearance(p))  # labels 0..k-1 in order of first appearance
        assert p.max() + 1 == k
    for fine, coarse in zip(result.partitions, result.partitions[1:]):
        for c in range(fine.max() + 1):
            assert np.unique(coarse[fine == c]).size == 1  # each partition coarsens the previous one
    # the recursion stopped for one of the reference's reasons: a reduction by exactly one, or the next level
    # would have given one cluster / no reduction (checked via max_partitions-free recomputation on the means)
    if len(counts) > 1 and counts[-2] - counts[-1] != 1:
        M = cluster_means(X, result.partitions[-1])
        nxt = finch(M, max_partitions=1).num_clusters[0]
        assert nxt == 1 or nxt == counts[-1]


def test_deterministic_and_independent_of_tiling(monkeypatch):
    X, _ = blobs(50, 8, 12, 21, spread=0.25)
    a, b = finch(X), finch(X.copy())
    monkeypatch.setattr(graph_module, "_TILE_BYTES", 4 * 23 * 23)
    c = finch(X)
    for other in (b, c):
        assert other.num_clusters == a.num_clusters
        for p, q in zip(a.partitions, other.partitions):
            np.testing.assert_array_equal(p, q)


def test_means_are_per_cluster_means_of_original_points():
    X, _ = blobs(30, 4, 7, 5, spread=0.3)
    X = X.astype(np.float32)
    result = finch(X)
    for mode in ("first", "last", 0, -1):
        labels = result.chosen(mode)
        got = result.means(X, labels)
        assert got.dtype == np.float32 and got.shape == (labels.max() + 1, 7)
        np.testing.assert_allclose(got, loop_means(X.astype(np.float64), labels), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(result.means(X, mode), got)
    means, labels = finch_means(X)
    np.testing.assert_array_equal(labels, result.chosen("last"))
    np.testing.assert_allclose(means, loop_means(X.astype(np.float64), labels), rtol=1e-6, atol=1e-6)


def test_torch_input_matches_numpy():
    X, _ = blobs(20, 3, 5, 2)
    t = torch.tensor(X, dtype=torch.float32, requires_grad=True)
    a, b = finch(t), finch(X.astype(np.float32))
    assert a.num_clusters == b.num_clusters
    means, _ = finch_means(t)
    assert means.dtype == np.float32


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_req_clust(distance):
    X, _ = blobs(20, 6, 5, 13, spread=0.35)
    full = finch(X, distance=distance)
    for k in full.num_clusters:
        req = finch(X, distance=distance, req_clust=k).chosen("req")
        np.testing.assert_array_equal(req, full.partitions[full.num_clusters.index(k)])
    missing = [k for k in range(1, full.num_clusters[0] + 1) if k not in full.num_clusters]
    for k in missing[:: max(1, len(missing) // 6)]:
        req = finch(X, distance=distance, req_clust=k).chosen("req")
        start = max(i for i, c in enumerate(full.num_clusters) if c >= k)
        np.testing.assert_array_equal(req, loop_merge_to(X, full.partitions[start], k, distance))
        assert req.max() + 1 == k


def test_max_partitions_truncates():
    X = np.random.default_rng(4).standard_normal((400, 6))
    full = finch(X)
    assert len(full.partitions) >= 3
    capped = finch(X, max_partitions=2)
    assert capped.num_clusters == full.num_clusters[:2]
    np.testing.assert_array_equal(capped.partitions[1], full.partitions[1])


def test_chosen_modes():
    result = finch(np.random.default_rng(0).standard_normal((100, 4)))
    assert result.chosen() is result.partitions[-1]
    assert result.chosen("first") is result.partitions[0]
    assert result.chosen(0) is result.partitions[0]
    with pytest.raises(ValueError, match="req_clust"):
        result.chosen("req")
    with pytest.raises(ValueError, match="mode"):
        result.chosen("middle")
    with pytest.raises(ValueError, match="out of range"):
        result.chosen(len(result.partitions))


# ----------------------------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(5),
        np.zeros((2, 3, 4)),
        np.zeros((0, 4)),
        np.zeros((4, 0)),
        np.array([[1.0, np.nan], [0.0, 1.0]]),
        np.array([[1.0, np.inf], [0.0, 1.0]]),
        np.array([[1 + 1j, 0], [0, 1]]),
        np.array([["a", "b"], ["c", "d"]]),
        [[1.0, 2.0], [3.0]],
    ],
    ids=["1d", "3d", "no-rows", "no-cols", "nan", "inf", "complex", "strings", "ragged"],
)
def test_bad_X_raises_value_error_naming_X(bad):
    with pytest.raises(ValueError, match=r"\bX\b"):
        finch(bad)
    with pytest.raises(ValueError, match=r"\bX\b"):
        finch_means(bad)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"distance": "manhattan"}, "distance"),
        ({"req_clust": 0}, "req_clust"),
        ({"req_clust": 2.5}, "req_clust"),
        ({"req_clust": 1000}, "req_clust"),
        ({"max_partitions": 0}, "max_partitions"),
        ({"initial_rank": np.zeros(3, dtype=int)}, "initial_rank"),
        ({"initial_rank": np.arange(30)}, "initial_rank"),
        ({"initial_rank": np.full(30, 40)}, "initial_rank"),
        ({"ensure_early_exit": "yes"}, "ensure_early_exit"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    X = np.random.default_rng(0).standard_normal((30, 3))
    with pytest.raises(ValueError, match=name):
        finch(X, **kwargs)


def test_req_clust_above_the_first_partition_warns_and_returns_it():
    """As the official code: a req_clust FINCH cannot reach by merging gives a warning and the first partition."""
    X = np.random.default_rng(1).standard_normal((50, 3))
    plain = finch(X)
    k0 = plain.num_clusters[0]
    with pytest.warns(UserWarning, match=rf"req_clust={k0 + 1} exceeds the {k0} clusters of the first partition"):
        res = finch(X, req_clust=k0 + 1)
    np.testing.assert_array_equal(res.chosen("req"), plain.partitions[0])
    assert [p.tolist() for p in res.partitions] == [p.tolist() for p in plain.partitions]
    with pytest.warns(UserWarning, match="req_clust=2 exceeds the 1 clusters"):  # two points: one cluster
        assert finch(np.array([[1.0, 0.0], [0.9, 0.1]]), req_clust=2).chosen("req").tolist() == [0, 0]


def test_cluster_means_validates_labels():
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match="labels"):
        cluster_means(X, [0, 1, 1])
    with pytest.raises(ValueError, match="labels"):
        cluster_means(X, [0, 2, 2, 0])  # cluster 1 empty
    with pytest.raises(ValueError, match="labels"):
        cluster_means(X, [0.0, 1.0, 1.0, 0.0])
