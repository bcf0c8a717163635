"""Every partitioner's partition hash, pinned: the hash covers every client's size and its rows in order, so any
change of a partition's content or row order fails here (the values were computed by the partitioners before they
were rewritten for a lower peak at ten million clients: int32 temporaries, a counting sort by owner in passes,
iid and shards without an owner array). Also the counting sort (``group_stable``) and the numpy facts the rewrite
leans on, checked against the plain numpy expressions they replace."""

from __future__ import annotations

import numpy as np
import pytest

import fedray.data.client_index as client_index
import fedray.data.draws as draws
import fedray.data.partition as partition
from fedray.data.client_index import ClientIndex, group_stable, rows_by_class
from fedray.data.partition import partition_indices
from fedray.data.spec_hash import partition_hash, resolve_spec
from fedray.data.table import DataError

PINNED = [
    ("iid", 300, {}, "f0697da54fbc66b3"),
    ("iid", 300, {"remainder": "spread"}, "58c6891625b58981"),
    ("iid", 7, {"remainder": "spread"}, "7614bafc31527135"),
    ("dirichlet", 300, {}, "1e74cfbdc0405fd5"),
    ("dirichlet", 300, {"alpha": 0.05}, "7c619749d2c326dd"),
    ("dirichlet", 9000, {"alpha": 0.3}, "b824478ef397a85a"),  # more clients than rows: empty clients
    ("dirichlet", 40, {"alpha": 1.0, "self_balancing": True, "min_partition_size": 20}, "4738f47999d2ee62"),
    ("shards", 300, {}, "81b9f45c0f317334"),
    ("shards", 250, {"shards_per_client": 3}, "3dc1964f7a67f232"),
    ("classes_per_client", 300, {}, "f280efc2cb0940e5"),
    ("classes_per_client", 300, {"classes": 3, "assignment": "random"}, "0a62c057af3405b9"),
    ("classes_per_client", 300, {"classes": 2, "assignment": "deterministic"}, "d4447b580611e7a8"),
    ("dirichlet_sizes", 300, {}, "592fb7a5a6695972"),
    ("balanced_dirichlet", 40, {}, "6dd4bff507591a21"),
    ("domain", 30, {"clients_per_domain": 10}, "06d4874879dc5a2d"),
    ("natural", 500, {}, "0e53748d397c191a"),
    ("natural", 123, {}, "68f9deb4df80333d"),
]
PINNED_UNSORTED_NATURAL = {500: "34158c0cf18e29dd", 123: "8e1aafa7a31621d8"}  # the ids reversed: the sorting path


def _data():
    rng = np.random.default_rng(30)
    labels = rng.integers(0, 10, 4000)
    labels[labels == 7] = 3  # a class absent
    domains = rng.integers(0, 3, 4000)
    natural = np.repeat(np.arange(500), rng.multinomial(4000 - 500, np.ones(500) / 500) + 1)
    return labels, domains, natural


@pytest.fixture(params=[None, 7], ids=["one-pass", "passes-of-7"])
def pass_rows(request, monkeypatch):
    """The partitioners as they run (a pass holds every row here), and with passes of 7 rows (every chunked loop
    and the counting sort take many passes, as at ten million clients)."""
    if request.param is not None:
        for mod in (client_index, draws, partition):
            monkeypatch.setattr(mod, "PASS_ROWS", request.param)
        monkeypatch.setattr(client_index, "CHUNK_ROWS", 5)
    return request.param


@pytest.mark.parametrize("name,n,params,pinned", PINNED, ids=[f"{p[0]}-{p[1]}-{i}" for i, p in enumerate(PINNED)])
def test_every_partitioner_keeps_its_pinned_hash(name, n, params, pinned, pass_rows):
    labels, domains, natural = _data()
    kw = {"domains": domains} if name == "domain" else {"natural": natural} if name == "natural" else {}
    ix = partition_indices(name, labels, num_clients=n, seed=3, **kw, **params)
    spec = resolve_spec({"name": name, "num_clients": n, "seed": 3, **params})
    assert partition_hash("pin", spec, ix) == pinned
    assert isinstance(ix, ClientIndex) and ix.offsets.dtype == np.int64
    # the big partitioners keep their rows as int32 below 2^31 rows (4 bytes a row off a writer's peak); what the
    # index hands out is int64 and hashes as before
    big = name in ("iid", "dirichlet", "shards", "classes_per_client", "natural")
    assert ix.rows.dtype == np.int32 if big else ix.rows.dtype in (np.int32, np.int64)
    assert all(p.dtype == np.int64 for p in ix) and ix[0].dtype == ix.rows_of(0, len(ix)).dtype == np.int64
    assert all(np.all(np.diff(p) > 0) for p in ix)  # every client's rows ascending, as the hash pins them
    if name == "natural":
        ix = partition_indices(name, labels, num_clients=n, seed=3, natural=natural[::-1].copy(), **params)
        assert partition_hash("pin", spec, ix) == PINNED_UNSORTED_NATURAL[n]


def test_a_changed_row_order_changes_the_hash():
    """What the pins rest on: the same rows of a client in another order give another hash."""
    labels, _, _ = _data()
    ix = partition_indices("iid", labels, num_clients=300, seed=3)
    rows = ix.rows.copy()
    rows[[0, 1]] = rows[[1, 0]]
    spec = resolve_spec({"name": "iid", "num_clients": 300, "seed": 3})
    assert partition_hash("pin", spec, ClientIndex(rows, ix.offsets)) != partition_hash("pin", spec, ix)


def _stable_ref(keys, at=None):
    k = keys if at is None else keys[at]
    order = np.argsort(k, kind="stable")
    order = order[k[order] >= 0]
    return order if at is None else at[order]


@pytest.mark.parametrize("num_keys", [1, 3, 200, 300, 70_000, 3_000_000])  # radix on 8 and 16 bits, (key, place)
@pytest.mark.parametrize("pass_rows", [1, 7, 1 << 20])
def test_group_stable_is_the_stable_argsort(num_keys, pass_rows):
    rng = np.random.default_rng([num_keys, pass_rows])
    for m, low, dtype, with_at in [(0, 0, np.int64, False), (1, 0, np.int64, False), (2000, -1, np.int64, False),
                                   (2000, 0, np.int32, False), (2000, -1, np.int32, True), (2000, 0, np.int64, True)]:
        keys = rng.integers(low, num_keys, m).astype(dtype)
        if m and num_keys > 3:
            keys[: m // 3] = keys[0]  # long runs of one key across passes
        at = rng.permutation(m)[: m // 2].astype(np.int32) if with_at else None
        grouped, offsets = group_stable(keys, num_keys, at=at, pass_rows=pass_rows)
        want = _stable_ref(keys, at)
        counted = keys if at is None else keys[at]
        assert np.array_equal(grouped, want) and grouped.dtype == (np.int32 if at is not None or m < 2**31 else np.int64)
        assert np.array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(counted[counted >= 0],
                                                                                    minlength=num_keys))]))
    with pytest.raises(DataError, match=r"must lie in \[-1, 3\), found \[-2, 1\]"):
        group_stable(np.array([0, -2, 1]), 3)


def test_rows_by_class_is_flatnonzero_per_class_present():
    rng = np.random.default_rng(4)
    for labels in (rng.integers(0, 10, 3000), rng.choice(np.array([2, 9, 10**7, 3 * 10**9]), 3000), np.zeros(5, int)):
        classes, rows, offsets = rows_by_class(labels)
        assert np.array_equal(classes, np.unique(labels))
        for i, c in enumerate(classes.tolist()):
            assert np.array_equal(rows[offsets[i]:offsets[i + 1]], np.flatnonzero(labels == c))


def test_the_numpy_draws_the_partitioners_rely_on():
    """``rng.permutation(k)`` is ``np.arange(k)`` shuffled, and ``rng.shuffle`` draws the same for int32 and int64
    arrays (the partitioners shuffle int32 row numbers below 2^31 rows); ``np.cumsum(p, out=p) * n`` is
    ``np.cumsum(p) * n`` bit for bit."""
    for m in (1, 2, 17, 4097):
        a, b = np.random.default_rng(m), np.random.default_rng(m)
        perm = a.permutation(m)
        small = np.arange(m, dtype=np.int32)
        b.shuffle(small)
        assert np.array_equal(perm, small) and a.bit_generator.state == b.bit_generator.state
    p = np.random.default_rng(1).dirichlet(0.3 * np.ones(1000))
    cuts = draws._cuts(777, p.copy())
    assert np.array_equal(cuts, (np.cumsum(p) * 777).astype(int)[:-1])
    owner = np.full(777, -1, dtype=np.int32)
    idx = np.random.default_rng(2).permutation(777)
    draws.assign_cuts(owner, idx, p.copy())
    assert np.array_equal(owner[idx], draws.cuts_owner(777, p)) and np.array_equal(
        draws.cuts_owner(777, p), np.searchsorted((np.cumsum(p) * 777).astype(int)[:-1], np.arange(777), side="right"))
