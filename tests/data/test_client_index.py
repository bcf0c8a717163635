"""The flat client index (fedray/data/client_index.py) and the draw-identical fast paths of the partitioners: every
result equals what the per-client code gave before (kept here as the reference), so partition hashes hold."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedray.data.client_index import ClientIndex, class_count_chunks, label_stats
from fedray.data.draws import FLOYD_MAX_POP, sorted_choices
from fedray.data.partition import PARTITIONERS, partition_indices, register_partitioner
from fedray.data.spec_hash import partition_hash
from fedray.data.table import DataError


# ------------------------------------------------------------------------------------------------ references
def _split_by_owner_ref(owner, num_clients):
    """The list-of-arrays split every partitioner ended with before ClientIndex."""
    owner = np.asarray(owner, dtype=np.int64)
    assigned = np.flatnonzero(owner >= 0)
    own = owner[assigned]
    rows = assigned[np.argsort(own, kind="stable")]
    return np.split(rows, np.cumsum(np.bincount(own, minlength=num_clients))[:-1])


def _classes_per_client_ref(labels, num_clients, seed, classes, assignment):
    """classes_per_client as it was: one rng.choice per client, holders appended client by client."""
    uniq, inverse = np.unique(labels, return_inverse=True)
    c_count = uniq.shape[0]
    rng = np.random.default_rng(seed)
    holders = [[] for _ in range(c_count)]
    for i in range(num_clients):
        if assignment == "deterministic":
            chosen = [(i + j) % c_count for j in range(classes)]
        elif assignment == "first-deterministic":
            first = i % c_count
            others = np.array([c for c in range(c_count) if c != first])
            chosen = [first] + sorted(int(c) for c in rng.choice(others, size=classes - 1, replace=False))
        else:
            chosen = sorted(int(c) for c in rng.choice(c_count, size=classes, replace=False))
        for c in chosen:
            holders[c].append(i)
    owner = np.full(labels.shape[0], -1, dtype=np.int64)
    for c in range(c_count):
        if not holders[c]:
            continue
        rows = rng.permutation(np.flatnonzero(inverse == c))
        base, rest = divmod(rows.shape[0], len(holders[c]))
        sizes = np.full(len(holders[c]), base, dtype=np.int64)
        sizes[:rest] += 1
        owner[rows] = np.repeat(np.asarray(holders[c], dtype=np.int64), sizes)
    return _split_by_owner_ref(owner, num_clients)


def _natural_ref(natural, num_clients):
    ids, inverse = np.unique(natural, return_inverse=True)
    return _split_by_owner_ref(np.where(inverse < num_clients, inverse, -1), num_clients)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) and np.asarray(x).dtype == np.int64 for x, y in zip(a, b))


# ------------------------------------------------------------------------------------------------ ClientIndex
def test_client_index_is_a_sequence_of_the_clients_rows():
    parts = [np.array([3, 1]), np.zeros(0, np.int64), np.array([0, 7, 9]), np.array([4])]
    ix = ClientIndex.from_parts(parts)
    assert len(ix) == 4 and ix.num_rows == 6 and ix.sizes.tolist() == [2, 0, 3, 1]
    assert _same(list(ix), parts) and _same([ix[c] for c in range(4)], parts) and np.array_equal(ix[-1], [4])
    assert _same(list(ix[1:3]), parts[1:3]) and len(ix[3:1]) == 0
    assert ix.rows_of(1, 3).tolist() == [0, 7, 9] and ix.owners(0, 4).tolist() == [0, 0, 2, 2, 2, 3]
    assert ClientIndex.from_parts(ix) is ix
    with pytest.raises(IndexError):
        ix[4]
    with pytest.raises(DataError, match="non-decreasing"):
        ClientIndex(np.arange(3), np.array([0, 2, 1, 3]))
    with pytest.raises(DataError, match="from 0 to len"):
        ClientIndex(np.arange(3), np.array([0, 2]))
    with pytest.raises(DataError, match=r"owners must lie in \[-1, 2\)"):
        ClientIndex.from_owner(np.array([0, 2]), 2)


@pytest.mark.parametrize("seed", range(6))
def test_from_owner_equals_the_split_of_a_stable_sort(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    owner = rng.integers(-1, n, int(rng.integers(0, 3000)))
    if seed % 2:
        owner = owner.astype(np.int32)
    assert _same(ClientIndex.from_owner(owner, n), _split_by_owner_ref(owner, n))


@pytest.mark.parametrize("rows_per_chunk,max_clients", [(1, None), (7, 3), (1 << 22, None), (50, 1000)])
def test_chunks_cover_every_client_once_and_counts_match(rows_per_chunk, max_clients):
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 9, 300) * (rng.random(300) < 0.8)
    ix = ClientIndex.from_sizes(rng.permutation(int(sizes.sum())), sizes)
    chunks = list(ix.chunks(rows_per_chunk, max_clients))
    assert [c[0] for c in chunks] == [0] + [c[1] for c in chunks[:-1]] and chunks[-1][1] == 300
    assert all(hi > lo and (max_clients is None or hi - lo <= max_clients) for lo, hi in chunks)
    labels = rng.integers(0, 5, int(sizes.sum()))
    want = np.array([np.bincount(labels[p], minlength=5) for p in ix])
    got = np.concatenate([c for _, _, c in class_count_chunks(labels, ix, 5, rows_per_chunk, max_clients or 1 << 20)])
    assert np.array_equal(got, want) and np.array_equal(label_stats(labels, list(ix), 5), want)


def test_partition_hash_of_the_flat_index_feeds_sha256_the_same_bytes(monkeypatch):
    import fedray.data.spec_hash as spec_hash

    spec = {"name": "dirichlet", "num_clients": 40, "seed": 3}
    labels = np.random.default_rng(0).integers(0, 10, 5000)
    ix = partition_indices("dirichlet", labels, num_clients=40, seed=3)
    assert isinstance(ix, ClientIndex)
    as_list = [np.array(p) for p in ix]
    monkeypatch.setattr(spec_hash, "CHUNK_ROWS", 97)  # many sha256 updates: still the same bytes
    assert partition_hash("fp", spec, ix) == partition_hash("fp", spec, as_list)
    h = hashlib.sha256()  # the bytes, spelled out: the JSON, the sizes, the rows (int64 little-endian)
    h.update(spec_hash._canonical_json({"format": spec_hash.FORMAT_VERSION, "fingerprint": "fp", "spec": spec}))
    h.update(np.array([len(p) for p in as_list], dtype="<i8").tobytes())
    for p in as_list:
        h.update(p.astype("<i8").tobytes())
    assert partition_hash("fp", spec, ix) == h.hexdigest()[:16]


def test_a_partitioner_returning_the_wrong_number_of_clients_is_refused():
    register_partitioner("_test_two_clients", lambda labels, n, seed, domains, natural: [np.arange(2), np.arange(2, 4)],
                         module="tests._two_clients")
    try:
        with pytest.raises(DataError, match="returned 2 clients, not num_clients=3"):
            partition_indices("_test_two_clients", np.zeros(10, np.int64), num_clients=3, seed=0)
        ix = partition_indices("_test_two_clients", np.zeros(10, np.int64), num_clients=2, seed=0)
        assert isinstance(ix, ClientIndex) and _same(ix, [np.arange(2), np.arange(2, 4)])
    finally:
        PARTITIONERS._remove_owned_by("tests._two_clients")


# ------------------------------------------------------------------------------------------------ draws
@pytest.mark.parametrize("pop", [1, 2, 3, 9, 10, 33, 100, 1000, FLOYD_MAX_POP])
def test_sorted_choices_draw_what_one_choice_per_call_draws(pop):
    for k in sorted({0, 1, 2, 3, min(pop, 7), min(pop, 19), pop if pop <= 40 else 40}):
        if k > pop:
            continue
        for seed in range(3):
            n = 23
            ref_rng, rng = np.random.default_rng([pop, k, seed]), np.random.default_rng([pop, k, seed])
            want = np.array([sorted(ref_rng.choice(pop, size=k, replace=False)) for _ in range(n)]).reshape(n, k)
            got = sorted_choices(rng, pop, k, n)
            assert got is not None and np.array_equal(got, want), (pop, k, seed)
            assert rng.bit_generator.state == ref_rng.bit_generator.state  # the generator goes on the same


def test_sorted_choices_in_several_passes_and_beyond_numpys_floyd_limit(monkeypatch):
    import fedray.data.draws as draws

    monkeypatch.setattr(draws, "_DRAWS_PER_PASS", 10)  # 5 draws a call: two calls per pass
    ref_rng, rng = np.random.default_rng(5), np.random.default_rng(5)
    want = np.array([sorted(ref_rng.choice(12, size=3, replace=False)) for _ in range(9)])
    assert np.array_equal(sorted_choices(rng, 12, 3, 9), want)
    assert rng.bit_generator.state == ref_rng.bit_generator.state
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert sorted_choices(rng, FLOYD_MAX_POP + 1, 2, 5) is None and rng.bit_generator.state == before


# ------------------------------------------------------------------------------------------------ partitioners
@pytest.mark.parametrize("assignment", ["first-deterministic", "random", "deterministic"])
def test_classes_per_client_equals_the_per_client_draws(assignment):
    for seed, (m, c, n) in enumerate([(300, 3, 1), (2000, 10, 7), (2000, 10, 250), (3001, 7, 64), (1500, 40, 90)]):
        labels = np.random.default_rng([seed, m]).integers(0, c, m)
        if seed == 4:
            labels = labels[labels % 5 != 1]  # classes absent from the data: indices over the classes present
        present = np.unique(labels).size
        for classes in sorted({1, 2, min(3, present), present}):
            got = partition_indices("classes_per_client", labels, num_clients=n, seed=seed, classes=classes,
                                    assignment=assignment)
            assert _same(got, _classes_per_client_ref(labels, n, seed, classes, assignment)), (m, c, n, classes)


@pytest.mark.parametrize("assignment", ["first-deterministic", "random"])
def test_classes_per_client_beyond_numpys_floyd_limit_draws_client_by_client(assignment):
    """10,002 classes: the class sets come from one rng.choice per client, as before (numpy's choice takes
    another algorithm above a population of 10,000)."""
    labels = np.repeat(np.arange(FLOYD_MAX_POP + 2), 2)
    got = partition_indices("classes_per_client", labels, num_clients=5, seed=3, classes=2, assignment=assignment)
    assert _same(got, _classes_per_client_ref(labels, 5, 3, 2, assignment))


def test_natural_without_a_sort_equals_the_sorted_ids_split():
    rng = np.random.default_rng(2)
    ids = np.sort(rng.choice(np.arange(0, 5000, 3), 4000))  # runs, with gaps between the ids
    labels = rng.integers(0, 10, ids.size)
    n_ids = np.unique(ids).size
    for n in (1, 17, n_ids):
        for nat in (ids, ids.astype(np.int32), rng.permutation(ids), ids.astype(str)):
            got = partition_indices("natural", labels, num_clients=n, seed=0, natural=nat)
            assert _same(got, _natural_ref(nat, n))
    with pytest.raises(DataError, match=f"num_clients={n_ids + 1} but the data has {n_ids} natural clients"):
        partition_indices("natural", labels, num_clients=n_ids + 1, seed=0, natural=ids)
    with pytest.raises(DataError, match="set allow_fewer=true"):
        partition_indices("natural", labels, num_clients=3, seed=0, natural=ids, allow_fewer=False)
