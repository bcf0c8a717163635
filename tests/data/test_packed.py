"""The packed partition layout's integrity: block checksums, a damaged block or file detected and rebuilt,
caches of the older per-client-file layout rebuilt once, and a partition larger than the memory a process
may use, written and read by slices (fedray/data/packed.py, fedray/data/store.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fedray.data.store as store_mod
from fedray.data.checksum import check_file_blocks
from fedray.data.packed import plan_blocks
from fedray.data.store import OldLayoutError, PartitionStore, build_partition
from fedray.data.table import DataError
from tests.helpers import ROOT

SMALL = {"block_bytes": 20_000, "file_bytes": 150_000}


def _no_tmp(root: Path) -> bool:
    return not [p for p in Path(root).iterdir() if p.name.startswith((".tmp-", ".old-"))]


def _damage(st: PartitionStore, cid: int, how: str) -> Path:
    """Damage the block holding client ``cid`` (or its whole file); returns the file."""
    ref = st.block_of(cid)
    assert ref is not None
    data = ref.path.read_bytes()
    if how == "truncated":
        ref.path.write_bytes(data[: ref.offset + ref.nbytes // 2])
    elif how == "overwritten":  # same size, image bytes in the middle of the block changed: only a checksum sees it
        mid = ref.offset + ref.nbytes // 2
        ref.path.write_bytes(data[:mid] + bytes(255 - b for b in data[mid : mid + 64]) + data[mid + 64 :])
    else:
        ref.path.unlink()
    return ref.path


def test_plan_blocks_keeps_clients_whole_and_in_order():
    sizes = np.array([3, 0, 5, 2, 0, 9, 1, 1, 0])
    first, block, row = plan_blocks(sizes, 4)
    # non-empty clients 0, 2, 3, 5, 6, 7 start at rows 0, 3, 8, 10, 19, 20: windows of 4 rows 0, 0, 2, 2, 4, 5
    assert first.tolist() == [0, 3, 6, 7]
    assert block.tolist() == [0, -1, 0, 1, -1, 1, 2, 3, -1]
    assert row.tolist() == [0, 0, 3, 0, 0, 2, 0, 0, 0]  # batch 1: client 3's 2 rows, then client 5's 9
    first, block, row = plan_blocks(np.zeros(3, np.int64), 4)
    assert first.tolist() == [] and block.tolist() == [-1, -1, -1]


def test_plan_blocks_a_pass_at_a_time_equals_the_whole_plan():
    """The plan made a few clients at a time (carrying the last window and batch) is the one-pass plan."""

    def whole(sizes, rpb):
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        nonempty = np.flatnonzero(sizes > 0)
        window = starts[nonempty] // rpb
        new = np.ones(len(nonempty), dtype=bool)
        new[1:] = window[1:] != window[:-1]
        batch_of = np.cumsum(new) - 1
        block, row = np.full(len(sizes), -1), np.zeros(len(sizes), dtype=np.int64)
        block[nonempty] = batch_of
        row[nonempty] = starts[nonempty] - starts[nonempty[new]][batch_of]
        return nonempty[new], block, row

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 120))
        sizes = rng.integers(0, 6, n) * (rng.random(n) < rng.random())
        rpb, per_pass = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        got = plan_blocks(sizes, rpb, clients_per_pass=per_pass)
        assert all(np.array_equal(a, b) for a, b in zip(got, whole(sizes, rpb))), (sizes.tolist(), rpb, per_pass)
        offsets = np.concatenate([[0], np.cumsum(sizes)])  # what the writer passes: no sizes array
        assert all(np.array_equal(a, b) for a, b in zip(plan_blocks(None, rpb, offsets, per_pass), got))


def test_index_records_the_crc32_of_every_block(tmp_path, bundle):
    st = build_partition(bundle, {"name": "dirichlet", "num_clients": 20, "seed": 0}, tmp_path, **SMALL)
    doc = json.loads((st.path / "meta.json").read_text())
    assert doc["layout"] == store_mod.LAYOUT_VERSION == 4
    assert [f["name"] for f in doc["files"]] == [f"data/part-{i:05d}.arrows" for i in range(len(st.files))]
    assert [f["bytes"] for f in doc["files"]] == [p.stat().st_size for p in st.files]
    blocks = pq.read_table(st.path / "blocks.parquet").to_pylist()
    data = [p.read_bytes() for p in st.files]
    assert len(blocks) > 2 * len(data)
    for b in blocks:
        assert b["crc32"] == zlib.crc32(data[b["file"]][b["offset"] : b["offset"] + b["nbytes"]])
    # the hash (directory name, run.json) is the one pinned before checksums and packing: FORMAT_VERSION stays 1
    assert build_partition(bundle, {"name": "iid", "num_clients": 4, "seed": 0}, tmp_path).hash == "dec688399a769a41"
    assert store_mod.FORMAT_VERSION == 1


def test_check_file_blocks_streams_blocks_across_reads(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()  # blocks that straddle the 1 MiB reads
    nbytes = [1, 700_000, 1 << 20, (3 << 20) - 1 - 700_000 - (1 << 20)]
    offsets = np.concatenate([[0], np.cumsum(nbytes)])
    crcs = [zlib.crc32(data[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]
    path = tmp_path / "f"
    path.write_bytes(data)
    assert check_file_blocks(path, len(data), nbytes, crcs) == []
    for at, block in ((600_000, 1), (1_500_000, 2)):  # block 1 ends in the first read, block 2 spans the second
        path.write_bytes(data[:at] + bytes([255 - data[at]]) + data[at + 1 :])
        (k, problem), = check_file_blocks(path, len(data), nbytes, crcs)
        assert k == block and "CRC-32" in problem
    path.write_bytes(data[:-1])
    assert check_file_blocks(path, len(data), nbytes, crcs) == [(-1, f"{len(data) - 1} bytes, the index records "
                                                                      f"{len(data)} (truncated or overwritten)")]
    path.unlink()
    assert check_file_blocks(path, len(data), nbytes, crcs) == [(-1, "missing")]


@pytest.mark.parametrize("how", ["truncated", "overwritten", "missing"])
def test_damaged_block_in_cache_is_detected_and_rebuilt(tmp_path, bundle, how):
    spec = {"name": "dirichlet", "num_clients": 20, "seed": 0}
    st = build_partition(bundle, spec, tmp_path, **SMALL)
    good = {p: p.read_bytes() for p in st.files}
    ref = st.block_of(7)
    path = _damage(st, 7, how)
    if how == "overwritten":  # a worker reading client 7 sees it; clients in the file's other blocks still read
        with pytest.raises(DataError, match=rf"corrupt block {ref.index} of {path} \(client 7\): CRC-32"):
            PartitionStore.open(st.path).client_arrays(7)
        other = next(c for c in range(20) if st.block_of(c) and st.block_of(c).path == path and st.block_of(c) != ref)
        PartitionStore.open(st.path).client_arrays(other)
    lines: list[str] = []
    st2 = build_partition(bundle, spec, tmp_path, log=lines.append, **SMALL)
    assert st2.hash == st.hash and st2.path == st.path
    assert len(lines) == 1 and "partition cache damaged, rebuilding" in lines[0] and str(path) in lines[0]
    if how == "overwritten":
        assert f"damaged block {ref.index} of {path} (bytes {ref.offset}..{ref.offset + ref.nbytes}, client" in lines[0]
        assert "7" in lines[0].split("client")[1]
    else:
        assert f"damaged packed file {path}: " in lines[0]
    assert {p: p.read_bytes() for p in st2.files} == good  # rebuilt from the source, byte for byte
    PartitionStore.open(st.path, verify=True)
    assert _no_tmp(tmp_path)
    lines.clear()
    build_partition(bundle, spec, tmp_path, log=lines.append)  # intact now: reused silently
    assert lines == []


def test_verify_and_reads_name_the_damaged_blocks_and_files(tmp_path, bundle):
    st = build_partition(bundle, {"name": "iid", "num_clients": 6, "seed": 0}, tmp_path)  # a batch per client
    for cid in (4, 2):
        _damage(st, cid, "overwritten")
    b2, b4 = st.block_of(2), st.block_of(4)
    with pytest.raises(DataError, match=rf"damaged block {b2.index} of {b2.path} .*client 2\): CRC-32 .*2 damaged"):
        PartitionStore.open(st.path, verify=True)
    with pytest.raises(DataError, match=rf"block {b4.index} of {b4.path} \(client 4\): CRC-32"):
        st.client_arrays(4)  # a worker's read checks the checksum too
    PartitionStore.open(st.path, check_reads=False).client_arrays(3)  # size check only: reads
    header = st.files[0].read_bytes()
    st.files[0].write_bytes(header[:100] + bytes(255 - b for b in header[100:110]) + header[110:])
    with pytest.raises(DataError, match=rf"damaged block 0 of {st.files[0]} \(bytes 0\.\.\d+, the schema message\)"):
        st.verify_blocks(workers=2)
    with pytest.raises(DataError, match=f"corrupt schema block of packed file {st.files[0]}"):
        PartitionStore.open(st.path).read_client(0)  # checked when a process maps the file


def test_verify_checks_the_rows_give_the_partition_hash(tmp_path, bundle):
    """A block rewritten with a valid checksum but other rows (client 1 given row 0's id) passes the block
    checks and fails the deep check that the row ids still give the directory's hash."""
    st = build_partition(bundle, {"name": "iid", "num_clients": 3, "seed": 0}, tmp_path)
    ref = st.block_of(1)
    batch = st._packed.batch(ref.index, "test")
    ids = batch.column("row_id").to_numpy().copy()
    ids[0] = st.row_ids(0)[0]
    body = batch.set_column(batch.schema.get_field_index("row_id"), "row_id", pa.array(ids)).serialize().to_pybytes()
    assert len(body) == ref.nbytes
    data = ref.path.read_bytes()
    ref.path.write_bytes(data[: ref.offset] + body + data[ref.offset + ref.nbytes :])
    blocks = pq.read_table(st.path / "blocks.parquet")
    crcs = blocks.column("crc32").to_numpy().copy()
    crcs[ref.index] = zlib.crc32(body)
    pq.write_table(blocks.set_column(4, "crc32", pa.array(crcs, pa.uint32())), str(st.path / "blocks.parquet"))
    PartitionStore.open(st.path).verify_blocks()
    with pytest.raises(DataError, match="do not give the partition hash"):
        PartitionStore.open(st.path, verify=True)


def _as_old_layout(st: PartitionStore, layout: int) -> None:
    """Turn ``st``'s directory into what fedray wrote before packed partitions: one Arrow file per client under
    clients/, the manifest with row_ids (and, layout 2, shard sizes and CRC-32s), no data/. Every client file
    holds client 0's rows, so a reader of this layout would train on wrong data."""
    rows0 = st.read_client(0)
    (st.path / "clients").mkdir()
    nbytes, crcs = [], []
    for cid in range(st.num_clients):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, rows0.schema) as writer:
            writer.write_table(rows0)
        buf = sink.getvalue().to_pybytes()
        (st.path / "clients" / f"{cid:06d}.arrow").write_bytes(buf)
        nbytes.append(len(buf))
        crcs.append(zlib.crc32(buf))
    n = st.num_clients
    cols = {"client_id": pa.array(np.arange(n)), "num_samples": pa.array(st.sizes),
            "row_ids": pa.array([st.row_ids(0).tolist()] * n, pa.list_(pa.int64())),
            "class_counts": st.manifest.column("class_counts"), "domain": pa.array(st.domains),
            "shard_bytes": pa.array(nbytes, pa.int64())}
    if layout == 2:
        cols["shard_crc32"] = pa.array(crcs, pa.uint32())
    for name in ("blocks.parquet", "manifest.parquet"):
        (st.path / name).unlink()
    for p in st.files:
        p.unlink()
    (st.path / "data").rmdir()
    pq.write_table(pa.table(cols), str(st.path / "manifest.parquet"))
    doc = json.loads((st.path / "meta.json").read_text())
    del doc["files"]
    if layout == 2:
        doc["layout"] = 2
    else:
        del doc["layout"]
    (st.path / "meta.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("layout", [1, 2])
def test_cache_in_the_per_client_file_layout_is_rebuilt_once_with_a_notice(tmp_path, bundle, layout):
    spec = {"name": "dirichlet", "num_clients": 12, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    want = [st.row_ids(c).copy() for c in range(12)]
    _as_old_layout(st, layout)
    with pytest.raises(OldLayoutError, match=rf"layout {layout} \(one Arrow file per client under clients/"):
        PartitionStore.open(st.path)  # never read: not by a worker, not for training
    lines: list[str] = []
    st2 = build_partition(bundle, spec, tmp_path, log=lines.append)
    assert len(lines) == 1 and f"partition cache in an older layout, rebuilding {st.path} once in the packed layout" in lines[0]
    assert st2.path == st.path and st2.hash == st.hash
    assert sorted(p.name for p in st.path.iterdir()) == ["_COMPLETE", "blocks.parquet", "clients.arrow", "data", "manifest.parquet", "meta.json"]
    assert all(np.array_equal(st2.row_ids(c), want[c]) for c in range(12))
    PartitionStore.open(st.path, verify=True)
    lines.clear()
    build_partition(bundle, spec, tmp_path, log=lines.append)
    assert lines == [] and _no_tmp(tmp_path)


def test_cache_of_packed_layout_3_is_rebuilt_once_with_a_notice(tmp_path, bundle):
    """Layout 3 kept the client index only in manifest.parquet: never read, rebuilt with clients.arrow."""
    spec = {"name": "dirichlet", "num_clients": 12, "seed": 0}
    st = build_partition(bundle, spec, tmp_path)
    want = [st.row_ids(c).copy() for c in range(12)]
    (st.path / "clients.arrow").unlink()
    doc = json.loads((st.path / "meta.json").read_text())
    doc["layout"] = 3
    del doc["clients"], doc["manifest"]
    (st.path / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(OldLayoutError, match=r"layout 3 \(packed, the client index only in manifest.parquet"):
        PartitionStore.open(st.path)
    lines: list[str] = []
    st2 = build_partition(bundle, spec, tmp_path, log=lines.append)
    assert len(lines) == 1 and "partition cache in an older layout" in lines[0]
    assert st2.hash == st.hash and (st.path / "clients.arrow").is_file()
    assert all(np.array_equal(st2.row_ids(c), want[c]) for c in range(12))
    lines.clear()
    build_partition(bundle, spec, tmp_path, log=lines.append)
    assert lines == []


_BOUNDED = textwrap.dedent("""
    import re, resource, sys
    import numpy as np
    from fedray.data.store import PartitionStore, build_partition
    from fedray.data.table import DataBundle, DatasetMeta, Split, make_table
    import pyarrow as pa

    def vm_data():
        return int(re.search(r"VmData:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10

    assert pa.default_memory_pool().backend_name == "system"
    rows, dim, budget = 65_536, 256, 16 << 20  # 64 MiB of float32 rows, 16 MiB of memory to spare
    meta = DatasetMeta("wide", 10, (dim,), dtype="float32")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    y = rng.integers(0, 10, rows)
    table = make_table(x, y, meta)
    table = pa.Table.from_batches(table.to_batches(max_chunksize=4096))  # a chunked source, as generators give
    bundle = DataBundle(Split(table, meta), Split(make_table(x[:10], y[:10], meta), meta), meta, fingerprint="wide")
    row_sums = x.sum(axis=1, dtype=np.float64)
    del x
    # warm up: the same code on a small partition starts Arrow's threads and parquet readers before the limit
    warm = build_partition(DataBundle(Split(table.slice(0, 2000), meta), bundle.test, meta, fingerprint="warm"),
                           {"name": "iid", "num_clients": 20, "seed": 0}, sys.argv[1])
    warm.verify()
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + budget, resource.RLIM_INFINITY))
    try:  # the limit holds: a copy of the partition cannot be made
        np.ones(rows * dim, np.float32)
        sys.exit("RLIMIT_DATA is not enforced here")
    except MemoryError:
        pass
    spec = {"name": "dirichlet", "num_clients": 500, "seed": 0, "alpha": 0.5}
    st = build_partition(bundle, spec, sys.argv[1], file_bytes=24 << 20)
    assert len(st.files) >= 3, st.files
    st = PartitionStore.open(st.path)
    seen = 0
    for cid in range(st.num_clients):
        images, labels = st.client_arrays(cid)
        rows_c = st.row_ids(cid)
        assert np.allclose(images.sum(axis=1, dtype=np.float64), row_sums[rows_c]), cid
        seen += len(rows_c)
    st.verify_blocks()
    print("ok", seen, sum(p.stat().st_size for p in st.files))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is enforced by Linux")
def test_partition_larger_than_memory_is_written_and_read_by_slices(tmp_path):
    """A 64 MiB partition (chunked source, 500 clients, 3 files) written, checked and read client by client in
    a process that may grow its private memory by 16 MiB only (RLIMIT_DATA): writing gathers bounded groups,
    reading slices the memory-mapped files (shared file pages, not private memory) without copies.

    Arrow allocates from the system allocator here, with large blocks always mmap'ed and a single malloc
    arena, so that the limit sees what is allocated: mimalloc (Arrow's default) reserves a large arena up
    front, inside which allocations never reach the limit. A writer that gathered the whole chunked table, or
    a reader that copied the clients' rows, fails this test (checked by hand: MemoryError at 64 MiB and at the
    first ~130 KiB copies past the budget)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "1",
           "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", _BOUNDED, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ok, seen, on_disk = out.stdout.split()
    assert ok == "ok" and int(seen) == 65_536 and int(on_disk) > 64 << 20


def _vm_flags(path: Path) -> list[set[str]]:
    """The ``VmFlags`` of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    flags, current = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split(" ", 1)[0]:
            current = line.rstrip().endswith(str(path))
        elif current and line.startswith("VmFlags:"):
            flags.append(set(line.split()[1:]))
    return flags


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc/self/smaps shows the advice")
def test_packed_files_are_mapped_for_random_reads(tmp_path, bundle):
    """A round reads scattered clients: the mappings carry MADV_RANDOM ("rr"), so an evicted block costs its own
    pages, not the device's read-ahead window (docs/scaling.md, the page cache at ten million clients)."""
    st = build_partition(bundle, {"name": "dirichlet", "num_clients": 20, "seed": 0}, tmp_path, **SMALL)
    images, labels = st.client_arrays(3)
    assert len(labels) > 0
    mapped = [p for p in st.files if _vm_flags(p.resolve())]
    assert mapped, "no packed file is mapped after a client's read"
    for p in mapped:
        assert all("rr" in f for f in _vm_flags(p.resolve())), (p, _vm_flags(p.resolve()))
