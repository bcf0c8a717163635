"""fedray.data.store: the partition store (manifest, block index, packed memory-mapped files); its integrity
checks (checksums, damaged blocks, older layouts, bounded memory) are in tests/data/test_packed.py."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fedray.data.packed as packed_mod
from fedray.data.partition import label_stats, partition_indices
from fedray.data.store import PartitionStore, build_partition
from fedray.data.table import DataError, DatasetMeta, images_of, meta_of
from tests.data.bundles import N_ROWS, toy_bundle as _bundle


def _no_tmp(root: Path) -> bool:
    return not [p for p in Path(root).iterdir() if p.name.startswith((".tmp-", ".old-"))]


SMALL = {"block_bytes": 20_000, "file_bytes": 150_000}  # 25-row batches, files of about 190 rows: many of both


@pytest.mark.parametrize("spec, sizes", [
    ({"name": "iid", "num_clients": 13, "seed": 1}, {}),
    ({"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.3}, {}),
    ({"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.3}, SMALL),
    ({"name": "domain", "num_clients": 6, "seed": 0, "clients_per_domain": 2}, SMALL),
])
def test_round_trip_lossless(tmp_path, bundle, spec, sizes):
    st = build_partition(bundle, spec, tmp_path, **sizes)
    assert st.path == tmp_path / st.hash and len(st.hash) == 16
    assert st.num_clients == spec["num_clients"] and st.meta == bundle.meta
    assert st.spec["name"] == spec["name"]
    if spec["name"] == "dirichlet":
        assert st.spec["min_partition_size"] == 0  # defaults are recorded
    src_images = bundle.train.images()
    src_labels = bundle.train.labels
    src_dom = bundle.train.domains
    m = st.manifest
    assert m.column_names == ["client_id", "num_samples", "class_counts", "domain", "block", "block_row"]
    assert m.schema.field("class_counts").type == pa.list_(pa.int64())
    assert m.schema.field("domain").type == pa.int32()
    parts = partition_indices(st.spec["name"], src_labels, num_clients=st.num_clients, seed=st.spec["seed"],
                              domains=src_dom, **{k: v for k, v in st.spec.items() if k not in ("name", "num_clients", "seed")})
    seen = []
    for cid in range(st.num_clients):
        rows = st.row_ids(cid)
        assert np.array_equal(rows, parts[cid])  # the partitioner's rows, in its order
        seen.append(rows)
        table = st.read_client(cid)
        assert table.column_names == ["image", "label", "domain", "row_id"]
        assert meta_of(table) == bundle.meta  # a client's rows decode on their own
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
    assert sorted(p.name for p in st.path.iterdir()) == ["_COMPLETE", "blocks.parquet", "clients.arrow", "data", "manifest.parquet", "meta.json"]
    assert len(st.files) == 1 if not sizes else len(st.files) >= 2


def test_files_hold_every_client_in_order_in_batches_of_whole_clients(tmp_path, bundle):
    spec = {"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.3}
    st = build_partition(bundle, spec, tmp_path, **SMALL)
    assert 3 <= len(st.files) <= 12 and not (st.path / "clients").exists()
    # read the files on their own, as any Arrow reader would: the rows of client 0, 1, 2, ... one after another
    batches = [b for f in st.files for b in pa.ipc.open_stream(str(f))]
    got = np.concatenate([b.column("row_id").to_numpy() for b in batches])
    assert np.array_equal(got, np.concatenate([st.row_ids(c) for c in range(40)]))
    assert max(b.nbytes for b in batches) < 20_000 + int(st.sizes.max()) * 800
    # every non-empty client is a slice of one batch, at the index's row; its batch holds whole clients
    blocks = pq.read_table(st.path / "blocks.parquet")
    rows = blocks.column("rows").to_numpy()
    batch_of_block = np.cumsum(rows > 0) - 1
    starts = np.concatenate([[0], np.cumsum([b.num_rows for b in batches])])
    for cid in np.flatnonzero(st.sizes):
        ref = st.block_of(cid)
        first = starts[batch_of_block[ref.index]] + st.manifest.column("block_row")[cid].as_py()
        assert np.array_equal(got[first : first + st.sizes[cid]], st.row_ids(cid))
        assert ref.rows == batches[batch_of_block[ref.index]].num_rows and ref.path in st.files
    assert all(st.block_of(int(c)) is None for c in np.flatnonzero(st.sizes == 0))
    # each file: schema block, record batches, end-of-stream block, tiling the file exactly
    file_of = blocks.column("file").to_numpy()
    for f, path in enumerate(st.files):
        off = blocks.column("offset").to_numpy()[file_of == f]
        nb = blocks.column("nbytes").to_numpy()[file_of == f]
        assert off[0] == 0 and np.array_equal(off[1:], (off + nb)[:-1]) and (off + nb)[-1] == path.stat().st_size
        assert rows[file_of == f][0] == 0 and rows[file_of == f][-1] == 0 and nb[-1] == 8


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


@pytest.mark.parametrize("spec", [
    {"name": "iid", "num_clients": 2, "seed": 0},  # 600 rows, 470 KB each: a batch of its own
    {"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.3},  # some clients sharing a batch
])
def test_reading_is_zero_copy(tmp_path, bundle, spec):
    st = build_partition(bundle, spec, tmp_path)
    row = st.manifest.column("block_row").to_numpy()
    cid = int(np.flatnonzero(row > 0)[0]) if spec["name"] == "dirichlet" else 1  # one in the middle of a batch
    st.client_arrays(0)  # warm up lazily allocated pyarrow state
    before = pa.total_allocated_bytes()
    images, labels = st.client_arrays(cid)
    table = st.read_client(cid)
    grown = pa.total_allocated_bytes() - before
    assert grown == 0, grown
    assert images.nbytes == st.sizes[cid] * 784 and np.array_equal(images, bundle.train.images()[st.row_ids(cid)])
    assert not images.flags.writeable and not labels.flags.writeable
    assert not images.flags.owndata  # a view, not a copy
    col = table.column("image").chunk(0)
    buf = col.buffers()[-1]
    assert not buf.is_mutable  # backed by the read-only memory map
    view = images_of(table, st.meta)
    ptr = view.__array_interface__["data"][0]
    assert ptr == buf.address + col.offset * 784  # numpy points straight into the batch ...
    mapping = st._packed._map(0).buf  # ... which lies inside the mapping of the packed file
    assert mapping.address <= ptr and ptr + images.nbytes <= mapping.address + mapping.size


def test_reuse_does_not_rewrite(tmp_path, bundle):
    spec = {"name": "dirichlet", "num_clients": 20, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    files = [st.path / "manifest.parquet", st.path / "meta.json", st.path / "blocks.parquet", st.files[0]]
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
    assert st3.hash == st.hash and os.stat(st3.files[0]).st_mtime_ns >= mtimes[3]
    PartitionStore.open(st3.path, verify=True)
    assert _no_tmp(tmp_path)


def test_bundle_without_fingerprint_uses_content(tmp_path):
    a = build_partition(_bundle(fingerprint=""), {"name": "iid", "num_clients": 3, "seed": 0}, tmp_path)
    b = build_partition(_bundle(fingerprint="", seed=5), {"name": "iid", "num_clients": 3, "seed": 0}, tmp_path)
    assert a.hash != b.hash and a.source_fingerprint.startswith("content:")


def test_corrupt_packed_file_names_file(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)  # a batch per client
    path = st.block_of(2).path
    assert st.block_of(1).path == path and st.block_of(1).index != st.block_of(2).index
    st.read_client(1)  # the file is mapped now
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated under the mapping
    with pytest.raises(DataError, match=rf"{path} \(client 2\): \d+ bytes"):
        st.read_client(2)
    ref = st.block_of(2)
    mid = ref.offset + ref.nbytes // 2
    path.write_bytes(data[:mid] + b"\0" * 16 + data[mid + 16 :])  # same size, client 2's batch changed
    with pytest.raises(DataError, match=rf"block {ref.index} of {path} \(client 2\): CRC-32"):
        st.client_arrays(2)
    assert st.read_client(1).num_rows == 300  # the file's other blocks still read
    with pytest.raises(DataError, match=str(path)):
        PartitionStore.open(st.path, verify=True)
    path.unlink()
    with pytest.raises(DataError, match=f"missing packed file {path}"):
        PartitionStore.open(st.path).read_client(2)


def test_corrupt_manifest_or_meta_names_file(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    man = st.path / "manifest.parquet"
    good_man = man.read_bytes()
    man.write_bytes(good_man[:100])
    with pytest.raises(DataError, match="manifest.parquet"):
        PartitionStore.open(st.path)
    # a corrupt directory under the right hash is rebuilt, not reused
    st2 = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    assert st2.path == st.path and pq.read_table(man).num_rows == 4
    good_man = man.read_bytes()
    man.write_bytes(good_man[:-60] + bytes(255 - b for b in good_man[-60:-40]) + good_man[-40:])
    with pytest.raises(DataError, match="damaged partition manifest .*manifest.parquet: CRC-32"):
        PartitionStore.open(st.path).verify_blocks()  # what a reuse checks: every byte of the manifest
    man.write_bytes(good_man)
    blocks = st.path / "blocks.parquet"
    good = blocks.read_bytes()
    blocks.write_bytes(good[:-40])
    with pytest.raises(DataError, match="blocks.parquet"):
        PartitionStore.open(st.path)
    blocks.write_bytes(good)
    clients = st.path / "clients.arrow"
    good_clients = clients.read_bytes()
    clients.write_bytes(good_clients[:-8] + bytes(8))
    with pytest.raises(DataError, match="corrupt partition client index .*clients.arrow"):
        PartitionStore.open(st.path)
    clients.write_bytes(good_clients)
    # an index (with a matching checksum) that puts client 3's rows past the end of its batch
    _rewrite_clients(st, block_row=lambda r: np.where(np.arange(4) == 3, 1, r))
    with pytest.raises(DataError, match="clients.arrow: a client's rows run past the end of its block"):
        PartitionStore.open(st.path)
    (st.path / "meta.json").write_text("{not json")
    with pytest.raises(DataError, match="meta.json"):
        PartitionStore.open(st.path)
    (st.path / "_COMPLETE").unlink()
    with pytest.raises(DataError, match="incomplete"):
        PartitionStore.open(st.path)


def _rewrite_clients(st: PartitionStore, **change) -> None:
    """Rewrite ``st``'s clients.arrow with ``change[column](values)`` and give meta.json its size and CRC-32."""
    path = st.path / "clients.arrow"
    batch = pa.ipc.open_file(pa.py_buffer(path.read_bytes())).get_batch(0)
    for name, fn in change.items():
        i = batch.schema.get_field_index(name)
        batch = batch.set_column(i, name, pa.array(fn(batch.column(name).to_numpy()).astype(np.int32 if i else np.int64)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    path.write_bytes(sink.getvalue().to_pybytes())
    doc = json.loads((st.path / "meta.json").read_text())
    doc["clients"].update(bytes=path.stat().st_size, crc32=zlib.crc32(path.read_bytes()))
    (st.path / "meta.json").write_text(json.dumps(doc))


def test_client_index_checks_span_chunks_of_clients(tmp_path, bundle, monkeypatch):
    import fedray.data.store as store_mod

    monkeypatch.setattr(store_mod, "_CHECK_CLIENTS", 3)  # clients 2 and 3 in different chunks of the check
    st = build_partition(bundle, {"name": "iid", "num_clients": 8, "seed": 0}, tmp_path, block_bytes=1 << 30)
    assert set(st._block.tolist()) == {1}  # one batch: client c starts at row c * size
    PartitionStore.open(st.path)
    _rewrite_clients(st, block_row=lambda r: np.where(np.arange(8) == 3, r - 1, r))  # overlaps client 2's last row
    with pytest.raises(DataError, match="clients are not stored in client order, without overlap"):
        PartitionStore.open(st.path)
    _rewrite_clients(st, block_row=lambda r: np.where(np.arange(8) == 3, r + 1, r),  # shifted, sizes add up
                     num_samples=lambda s: np.where(np.arange(8) == 2, s + 1, np.where(np.arange(8) == 7, s - 1, s)))
    with pytest.raises(DataError, match="clients are not stored in client order, without overlap"):
        PartitionStore.open(st.path)


def test_failed_build_leaves_existing_output_intact(tmp_path, bundle, monkeypatch):
    spec = {"name": "dirichlet", "num_clients": 30, "seed": 0}
    good = build_partition(bundle, spec, tmp_path)
    before = {p: p.read_bytes() for p in sorted(good.path.rglob("*")) if p.is_file()}
    real = packed_mod._write_all
    calls = {"n": 0}

    def flaky(fd, data):
        calls["n"] += 1
        if calls["n"] == 10:  # in the middle of the second file
            raise OSError("disk full (injected)")
        return real(fd, data)

    monkeypatch.setattr(packed_mod, "_write_all", flaky)
    with pytest.raises(OSError, match="injected"):
        build_partition(bundle, spec, tmp_path, overwrite=True, **SMALL)
    after = {p: p.read_bytes() for p in sorted(good.path.rglob("*")) if p.is_file()}
    assert after == before
    calls["n"] = 0
    other = {"name": "iid", "num_clients": 30, "seed": 0}
    with pytest.raises(OSError, match="injected"):
        build_partition(bundle, other, tmp_path, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.hash]  # no half-written <hash>, no temp dirs
    monkeypatch.setattr(packed_mod, "_write_all", real)
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


def _index_column_offset(path: Path, name: str) -> int:
    """Byte offset in ``clients.arrow`` of column ``name``'s values."""
    mm = pa.memory_map(str(path))
    buf = mm.read_buffer()
    at = pa.ipc.open_file(buf).get_batch(0).column(name).buffers()[1].address - buf.address
    mm.close()
    return at


@pytest.mark.parametrize("column, width", [("num_samples", 8), ("block", 4), ("block_row", 4)])
def test_a_client_index_changed_in_place_after_it_was_mapped_fails_the_check(tmp_path, bundle, column, width):
    """The mapping shows the file as it is now: an in-place change of ``clients.arrow`` after the store opened
    changes ``sizes`` (and the rows a client reads) under the process; ``check_clients`` / ``recheck_client``
    find it, naming the file and the clients around the changed entry; other chunks still pass."""
    from fedray.data.manifest import CHECK_CHUNK

    n = 2 * CHECK_CHUNK + 10
    st = build_partition(bundle, {"name": "iid", "num_clients": n, "seed": 0}, tmp_path)
    st.check_clients(range(n), "all")  # intact
    st.recheck_client(3)
    cid = CHECK_CHUNK + 7  # in the second chunk
    path = st.path / "clients.arrow"
    before = int(st.sizes[cid])
    with open(path, "r+b") as f:
        f.seek(_index_column_offset(path, column) + cid * width)
        f.write((0 if column == "num_samples" else 1).to_bytes(width, "little"))
    if column == "num_samples":
        assert int(st.sizes[cid]) == 0 != before  # the mapped view changed with the file
    with pytest.raises(DataError, match=rf"{path} changed on disk after it was checked \(clients "
                                        rf"{CHECK_CHUNK}\.\.{2 * CHECK_CHUNK - 1}, round 2's clients\)"):
        st.check_clients([0, cid], "round 2's clients")
    with pytest.raises(DataError, match="changed on disk"):
        st.recheck_client(cid)
    st.check_clients([0, 1, 2 * CHECK_CHUNK + 9], "other chunks")  # the chunks around them are intact
    with pytest.raises(DataError, match="corrupt partition client index"):
        PartitionStore.open(st.path)  # a new process's check of the whole file


def test_a_block_changed_in_place_while_its_rows_were_in_use_fails_the_recheck(tmp_path, bundle):
    """A client's rows are zero-copy views of its block in the mapping: bytes of the block overwritten in place
    after the read changed them while in use; ``recheck_client`` (after the client's update) finds it."""
    st = build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path)
    images, _ = st.client_arrays(2)
    first = images.copy()
    st.recheck_client(2)  # unchanged so far
    ref = st.block_of(2)
    data = ref.path.read_bytes()
    mid = ref.offset + ref.nbytes // 2
    with open(ref.path, "r+b") as f:
        f.seek(mid)
        f.write(bytes(255 - b for b in data[mid:mid + 64]))
    assert not np.array_equal(images, first)  # the view changed under the reader
    with pytest.raises(DataError, match=rf"block {ref.index} of {ref.path} \(client 2, after its rows were used\): "
                                        r"CRC-32"):
        st.recheck_client(2)
    assert st.block_of(1).path == ref.path and st.block_of(1).index != ref.index
    st.recheck_client(1)  # another block of the same file: intact
