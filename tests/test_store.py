"""Partition store (manifest + memory-mapped shards), batch loader and partition statistics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import fedray.data.store as store_mod
from fedray.data.loader import Augment, iterate_batches, to_float
from fedray.data.partition import label_stats
from fedray.data.stats import format_summary, partition_summary, plot_label_distribution
from fedray.data.store import PartitionStore, build_partition
from fedray.data.table import DataBundle, DataError, DatasetMeta, Split, images_of, make_table, meta_of

N_ROWS = 1200


def _bundle(n=N_ROWS, *, with_domain=True, natural=False, fingerprint="toy-v1", seed=0) -> DataBundle:
    rng = np.random.default_rng(seed)
    meta = DatasetMeta(
        "toy", 10, (1, 28, 28), mean=(0.13,), std=(0.31,), domains=("a", "b", "c") if with_domain else ()
    )
    x = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, n)
    d = (np.arange(n) % 3).astype(np.int32) if with_domain else None
    table = make_table(x, y, meta, d)
    if natural:
        table = table.append_column("client", pa.array((np.arange(n) % 7).astype(np.int64)))
    train = Split(table, meta)
    test = Split(make_table(x[:20], y[:20], meta, None if d is None else d[:20]), meta)
    return DataBundle(train, test, meta, fingerprint=fingerprint)


@pytest.fixture(scope="module")
def bundle() -> DataBundle:
    return _bundle()


def _no_tmp(root: Path) -> bool:
    return not [p for p in Path(root).iterdir() if p.name.startswith((".tmp-", ".old-"))]


@pytest.mark.parametrize("spec", [
    {"name": "iid", "num_clients": 13, "seed": 1},
    {"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.3},
    {"name": "domain", "num_clients": 6, "seed": 0, "clients_per_domain": 2},
])
def test_round_trip_lossless(tmp_path, bundle, spec):
    st = build_partition(bundle, spec, tmp_path)
    assert st.path == tmp_path / st.hash and len(st.hash) == 16
    assert st.num_clients == spec["num_clients"] and st.meta == bundle.meta
    assert st.spec["name"] == spec["name"]
    if spec["name"] == "dirichlet":
        assert st.spec["min_partition_size"] == 0  # defaults are recorded
    src_images = bundle.train.images()
    src_labels = bundle.train.labels
    src_dom = bundle.train.domains
    m = st.manifest
    assert m.schema.field("row_ids").type == pa.list_(pa.int64())
    assert m.schema.field("class_counts").type == pa.list_(pa.int64())
    assert m.schema.field("domain").type == pa.int32()
    seen = []
    for cid in range(st.num_clients):
        rows = st.row_ids(cid)
        seen.append(rows)
        table = st.read_client(cid)
        assert table.column_names == ["image", "label", "domain", "row_id"]
        assert meta_of(table) == bundle.meta  # a shard decodes on its own
        assert np.array_equal(table.column("row_id").to_numpy(), rows)
        images, labels = st.client_arrays(cid)
        assert images.shape == (len(rows), 1, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
        assert np.array_equal(images, src_images[rows])
        assert np.array_equal(labels, src_labels[rows])
        assert np.array_equal(table.column("domain").to_numpy(), src_dom[rows])
        if len(rows):
            assert st.domains[cid] == np.bincount(src_dom[rows]).argmax()
    assert np.array_equal(st.sizes, [len(r) for r in seen])
    assert np.array_equal(st.class_counts(), label_stats(src_labels, seen, 10))
    if spec["name"] == "domain":
        assert np.array_equal(st.domains, [0, 0, 1, 1, 2, 2])
    PartitionStore.open(st.path, verify=True)
    assert _no_tmp(tmp_path)


def test_meta_json_and_open(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    doc = json.loads((st.path / "meta.json").read_text())
    assert doc["hash"] == st.hash and doc["source_fingerprint"] == "toy-v1"
    assert doc["spec"] == {"name": "iid", "num_clients": 4, "seed": 0, "remainder": "drop"}
    assert DatasetMeta(**doc["meta"]) == bundle.meta
    again = PartitionStore.open(st.path)
    assert again.hash == st.hash and again.spec == st.spec
    with pytest.raises(DataError, match="out of range"):
        again.read_client(4)
    with pytest.raises(DataError, match="does not exist"):
        PartitionStore.open(tmp_path / "nope")


def test_reading_is_zero_copy(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 2, "seed": 0}, tmp_path)  # 600 rows, 470 KB each
    st.client_arrays(0)  # warm up lazily allocated pyarrow state
    before = pa.total_allocated_bytes()
    images, labels = st.client_arrays(1)
    table = st.read_client(1)
    grown = pa.total_allocated_bytes() - before
    assert grown < 1 << 20, grown
    assert images.nbytes > 400_000
    assert not images.flags.writeable and not labels.flags.writeable
    assert not images.flags.owndata  # a view, not a copy
    buf = table.column("image").chunk(0).buffers()[-1]
    assert not buf.is_mutable  # backed by the read-only memory map
    view = images_of(table, st.meta)
    assert view.__array_interface__["data"][0] == buf.address  # numpy points straight into the mapping


def test_reuse_does_not_rewrite(tmp_path, bundle):
    spec = {"name": "dirichlet", "num_clients": 20, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    files = [st.path / "manifest.parquet", st.path / "meta.json", st.client_path(3)]
    mtimes = [os.stat(f).st_mtime_ns for f in files]
    # same spec spelled differently (explicit default, numpy int) -> same directory, untouched
    st2 = build_partition(bundle, {**spec, "alpha": 0.3, "num_clients": np.int64(20)}, tmp_path)
    assert st2.path == st.path
    assert [os.stat(f).st_mtime_ns for f in files] == mtimes
    assert len([p for p in tmp_path.iterdir()]) == 1
    # different seed, params or data -> different hash
    assert build_partition(bundle, {**spec, "seed": 1}, tmp_path).hash != st.hash
    assert build_partition(bundle, {**spec, "alpha": 0.5}, tmp_path).hash != st.hash
    assert build_partition(_bundle(seed=1, fingerprint="toy-v2"), spec, tmp_path).hash != st.hash
    # overwrite rewrites in place (new files) with the same hash
    st3 = build_partition(bundle, spec, tmp_path, overwrite=True)
    assert st3.hash == st.hash and os.stat(st3.client_path(3)).st_mtime_ns >= mtimes[2]
    PartitionStore.open(st3.path, verify=True)
    assert _no_tmp(tmp_path)


def test_bundle_without_fingerprint_uses_content(tmp_path):
    a = build_partition(_bundle(fingerprint=""), {"name": "iid", "num_clients": 3, "seed": 0}, tmp_path)
    b = build_partition(_bundle(fingerprint="", seed=5), {"name": "iid", "num_clients": 3, "seed": 0}, tmp_path)
    assert a.hash != b.hash and a.source_fingerprint.startswith("content:")


def test_corrupt_shard_names_file(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    path = st.client_path(2)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(DataError, match=str(path)):
        st.read_client(2)
    path.write_bytes(data[:-16] + b"\0" * 16)  # same size, footer destroyed
    with pytest.raises(DataError, match=str(path)):
        st.client_arrays(2)
    with pytest.raises(DataError, match=str(path)):
        PartitionStore.open(st.path, verify=True)
    path.unlink()
    with pytest.raises(DataError, match=str(path)):
        st.read_client(2)
    st.read_client(1)  # the others still read


def test_corrupt_manifest_or_meta_names_file(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    man = st.path / "manifest.parquet"
    man.write_bytes(man.read_bytes()[:100])
    with pytest.raises(DataError, match="manifest.parquet"):
        PartitionStore.open(st.path)
    # a corrupt directory under the right hash is rebuilt, not reused
    st2 = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    assert st2.path == st.path and pq.read_table(man).num_rows == 4
    (st.path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="meta.json"):
        PartitionStore.open(st.path)
    (st.path / "_COMPLETE").unlink()
    with pytest.raises(DataError, match="incomplete"):
        PartitionStore.open(st.path)


def test_failed_build_leaves_existing_output_intact(tmp_path, bundle, monkeypatch):
    spec = {"name": "dirichlet", "num_clients": 30, "seed": 0}
    good = build_partition(bundle, spec, tmp_path)
    before = {p: p.read_bytes() for p in sorted(good.path.rglob("*")) if p.is_file()}
    real = store_mod._write_shard
    calls = {"n": 0}

    def flaky(path, table):
        calls["n"] += 1
        if calls["n"] == 10:
            raise OSError("disk full (injected)")
        return real(path, table)

    monkeypatch.setattr(store_mod, "_write_shard", flaky)
    with pytest.raises(OSError, match="injected"):
        build_partition(bundle, spec, tmp_path, overwrite=True)
    after = {p: p.read_bytes() for p in sorted(good.path.rglob("*")) if p.is_file()}
    assert after == before
    calls["n"] = 0
    other = {"name": "iid", "num_clients": 30, "seed": 0}
    with pytest.raises(OSError, match="injected"):
        build_partition(bundle, other, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.hash]  # no half-written <hash>, no temp dirs
    monkeypatch.setattr(store_mod, "_write_shard", real)
    assert build_partition(bundle, other, tmp_path).num_clients == 30


def test_empty_clients_and_natural_ids(tmp_path):
    small = _bundle(n=30)
    st = build_partition(small, {"name": "dirichlet", "num_clients": 60, "seed": 0}, tmp_path)
    empty = int(np.flatnonzero(st.sizes == 0)[0])
    assert st.read_client(empty).num_rows == 0
    images, labels = st.client_arrays(empty)
    assert images.shape == (0, 1, 28, 28) and images.dtype == np.uint8 and labels.shape == (0,)
    assert st.domains[empty] == -1
    nat = _bundle(natural=True, with_domain=False)
    st = build_partition(nat, {"name": "natural", "num_clients": 7, "seed": 0}, tmp_path)
    for cid in range(7):
        assert np.array_equal(st.row_ids(cid), np.flatnonzero(np.arange(N_ROWS) % 7 == cid))
    assert st.read_client(0).column_names == ["image", "label", "row_id"]
    assert np.all(st.domains == -1)


def test_spec_errors(tmp_path, bundle):
    with pytest.raises(DataError, match="'seed'"):
        build_partition(bundle, {"name": "iid", "num_clients": 3}, tmp_path)
    with pytest.raises(DataError, match="'beta'"):
        build_partition(bundle, {"name": "iid", "num_clients": 3, "seed": 0, "beta": 1}, tmp_path)
    with pytest.raises(DataError, match="domain column"):
        build_partition(_bundle(with_domain=False), {"name": "domain", "num_clients": 3, "seed": 0}, tmp_path)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# loader


def test_to_float_bit_exact_and_normalize():
    meta = DatasetMeta("toy", 10, (1, 4, 4), mean=(0.5,), std=(0.25,))
    x = np.arange(256, dtype=np.uint8).reshape(16, 1, 4, 4)
    got = to_float(torch.from_numpy(x), meta, normalize=False)
    ref = x.astype(np.float32) / np.float32(255.0)
    assert got.dtype == torch.float32 and np.array_equal(got.numpy().view(np.uint32), ref.view(np.uint32))
    norm = to_float(torch.from_numpy(x), meta, normalize=True)
    assert torch.allclose(norm, (torch.from_numpy(ref) - 0.5) / 0.25)
    f = torch.rand(3, 1, 4, 4)
    assert to_float(f, meta, normalize=False) is f
    rgb = DatasetMeta("rgb", 10, (3, 4, 4), mean=(0.5, 0.4), std=(0.2, 0.2))
    with pytest.raises(DataError, match="channels"):
        to_float(torch.zeros(2, 3, 4, 4), rgb, normalize=True)


def test_iterate_batches_order_and_sizes():
    meta = DatasetMeta("toy", 10, (1, 2, 2))
    images = np.arange(23 * 4, dtype=np.uint8).reshape(23, 1, 2, 2)
    labels = np.arange(23, dtype=np.int64) % 10
    perm = np.random.default_rng([0, 1, 2]).permutation(23)
    batches = list(iterate_batches(images, labels, perm, 10, meta=meta, normalize=False))
    assert [len(y) for _, y in batches] == [10, 10, 3]
    for i, (x, y) in enumerate(batches):
        idx = perm[i * 10 : (i + 1) * 10]
        assert y.dtype == torch.int64 and torch.equal(y, torch.from_numpy(labels[idx]))
        assert torch.equal(x, torch.from_numpy(images[idx]).float() / 255.0)
    assert [len(y) for _, y in iterate_batches(images, labels, perm, 10, meta=meta, normalize=False, drop_last=True)] == [10, 10]
    with pytest.raises(DataError, match="generator"):
        next(iterate_batches(images, labels, perm, 10, meta=meta, normalize=False, augment=Augment(flip=True)))


def test_augment_deterministic_and_correct():
    x = torch.rand(8, 3, 12, 10)
    aug = Augment(crop_pad=3, flip=True, rotate_deg=15)
    a = aug(x, torch.Generator().manual_seed(5))
    b = aug(x, torch.Generator().manual_seed(5))
    c = aug(x, torch.Generator().manual_seed(6))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    # crop only: every output is a window of the zero-padded input at the drawn offsets
    g = torch.Generator().manual_seed(1)
    crop = Augment(crop_pad=2)(x, g)
    off = torch.randint(0, 5, (2, 8), generator=torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(8):
        assert torch.equal(crop[i], padded[i, :, off[0, i] : off[0, i] + 12, off[1, i] : off[1, i] + 10])
    # flip only: each image is either unchanged or mirrored, and both happen
    fl = Augment(flip=True)(x, torch.Generator().manual_seed(0))
    same = [torch.equal(fl[i], x[i]) for i in range(8)]
    assert all(s or torch.equal(fl[i], x[i].flip(-1)) for i, s in enumerate(same)) and 0 < sum(same) < 8
    # a near-zero rotation is the identity up to rounding
    rot = Augment(rotate_deg=1e-6)(x, torch.Generator().manual_seed(0))
    assert torch.allclose(rot, x, atol=1e-5)
    assert Augment()(x, torch.Generator()) is x


def test_augment_from_spec():
    assert Augment.from_spec(["crop", "flip", "rotate"]) == Augment(4, True, 10.0)
    assert Augment.from_spec({"crop": 2, "flip": True, "rotate": 5}) == Augment(2, True, 5.0)
    assert Augment.from_spec("crop,flip") == Augment(4, True, 0.0)
    assert not Augment.from_spec(None) and not Augment.from_spec("none") and not Augment.from_spec([])
    with pytest.raises(DataError, match="'cutout'"):
        Augment.from_spec(["crop", "cutout"])
    with pytest.raises(DataError, match="'blur'"):
        Augment.from_spec({"blur": 1})
    with pytest.raises(DataError, match="crop"):
        Augment.from_spec({"crop": -1})


# ---------------------------------------------------------------------------------------------
# statistics


def test_summary_and_plot(tmp_path, bundle):
    st = build_partition(bundle, {"name": "balanced_dirichlet", "num_clients": 12, "seed": 0, "alpha": 0.1}, tmp_path / "p")
    s = partition_summary(st)
    assert s["num_clients"] == 12 and s["size_min"] == s["size_max"] == N_ROWS // 12 and s["empty_clients"] == 0
    assert s["name"] == "balanced_dirichlet" and s["hash"] == st.hash
    assert 0 < s["mean_class_entropy"] < np.log(10)
    text = format_summary(s)
    assert "balanced_dirichlet" in text and "empty clients" in text
    out = plot_label_distribution(st, tmp_path / "plots" / "labels.png", max_clients=5)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["labels.png"]
    wide = np.random.default_rng(0).integers(0, 5, (30, 40))
    assert plot_label_distribution(wide, tmp_path / "wide.png").stat().st_size > 0
    with pytest.raises(DataError, match="counts"):
        partition_summary(np.array([1, 2, 3]))
