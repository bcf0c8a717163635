"""fedray.data.store: the partition store (manifest + memory-mapped shards)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fedray.data.store as store_mod
from fedray.data.partition import label_stats
from fedray.data.store import PartitionStore, build_partition
from fedray.data.table import DataError, DatasetMeta, images_of, meta_of
from tests.data.bundles import N_ROWS, toy_bundle as _bundle


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


# ---------------------------------------------------------------------------------------- integrity
def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "overwritten":  # same size, image bytes in the middle changed: only a checksum sees it
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes(255 - b for b in data[mid : mid + 64]) + data[mid + 64 :])
    else:
        path.unlink()


def test_manifest_records_the_crc32_of_every_shard(tmp_path, bundle):
    import zlib

    st = build_partition(bundle, {"name": "dirichlet", "num_clients": 20, "seed": 0}, tmp_path)
    crcs = st.manifest.column("shard_crc32").to_pylist()
    assert crcs == [zlib.crc32(st.client_path(c).read_bytes()) for c in range(20)]
    assert json.loads((st.path / "meta.json").read_text())["layout"] == store_mod.LAYOUT_VERSION == 2
    # the hash (directory name, run.json) is the one pinned before checksums existed: FORMAT_VERSION stays 1
    assert build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path).hash == "dec688399a769a41"
    assert store_mod.FORMAT_VERSION == 1


@pytest.mark.parametrize("how", ["truncated", "overwritten", "missing"])
def test_damaged_shard_in_cache_is_detected_and_rebuilt(tmp_path, bundle, how):
    spec = {"name": "dirichlet", "num_clients": 20, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    path = st.client_path(7)
    good = path.read_bytes()
    other = os.stat(st.client_path(3)).st_mtime_ns
    _damage(path, how)
    lines = []
    st2 = build_partition(bundle, spec, tmp_path, log=lines.append)
    assert st2.hash == st.hash and st2.path == st.path
    assert len(lines) == 1 and "client 7" in lines[0] and str(path) in lines[0] and "rebuilding" in lines[0]
    assert path.read_bytes() == good  # rebuilt from the source, byte for byte
    assert os.stat(st.client_path(3)).st_mtime_ns >= other
    PartitionStore.open(st.path, verify=True)
    assert _no_tmp(tmp_path)
    lines.clear()
    build_partition(bundle, spec, tmp_path, log=lines.append)  # intact now: reused silently
    assert lines == []


def test_open_verify_and_reads_name_the_damaged_client_and_file(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 6, "seed": 0}, tmp_path)
    for cid in (4, 2):
        _damage(st.client_path(cid), "overwritten")
    with pytest.raises(DataError, match=rf"client 2: {st.client_path(2)}: CRC-32 .*2 damaged shards: clients 2, 4"):
        PartitionStore.open(st.path, verify=True)
    with pytest.raises(DataError, match=rf"{st.client_path(4)} of client 4: CRC-32"):
        st.client_arrays(4)  # a worker's read checks the checksum too
    PartitionStore.open(st.path, check_reads=False).client_arrays(4)  # size check only: reads
    _damage(st.client_path(3), "truncated")
    with pytest.raises(DataError, match=r"client 2: .*3 damaged shards"):
        st.verify_shards(workers=2)
    with pytest.raises(DataError, match=rf"{st.client_path(3)} of client 3: \d+ bytes"):
        st.read_client(3)


def test_cache_written_without_checksums_is_rebuilt(tmp_path, bundle):
    spec = {"name": "iid", "num_clients": 5, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    # what an older fedray wrote: no shard_crc32 column, no "layout" in meta.json
    man = st.path / "manifest.parquet"
    pq.write_table(pq.read_table(man).drop_columns(["shard_crc32"]), str(man), compression="zstd")
    doc = json.loads((st.path / "meta.json").read_text())
    del doc["layout"]
    (st.path / "meta.json").write_text(json.dumps(doc))
    old = PartitionStore.open(st.path)  # still readable (size checks only) ...
    assert old.read_client(1).num_rows == st.sizes[1]
    with pytest.raises(DataError, match="older fedray without shard checksums"):
        PartitionStore.open(st.path, verify=True)  # ... but cannot be verified
    lines = []
    st2 = build_partition(bundle, spec, tmp_path, log=lines.append)
    assert st2.hash == st.hash and len(lines) == 1 and "without shard checksums" in lines[0]
    assert "shard_crc32" in pq.read_table(man).column_names
    assert json.loads((st.path / "meta.json").read_text())["layout"] == 2
    PartitionStore.open(st.path, verify=True)
