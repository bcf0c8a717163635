"""A partition's per-client tables: ``manifest.parquet`` (for people and tools) and ``clients.arrow`` (for readers).

``manifest.parquet`` has one row per client (client id, samples, class counts, majority domain, block, first row
in the block), written in row groups of :data:`CLIENTS_PER_GROUP` clients, each computed from a chunk of the
client index, so ten million clients never hold ten million rows of class counts (80 bytes a client with 10
classes) in memory at once. It is read only for :meth:`~fedray.data.store.PartitionStore.class_counts` and
summaries, group by group (:func:`iter_class_counts`).

``clients.arrow`` is what every process that reads a client needs: ``num_samples`` int64, ``block`` int32 and
``block_row`` int32 (and ``domain`` int32 for multi-domain data), one Arrow IPC record batch, uncompressed,
memory-mapped by :class:`ClientTable`, its columns zero-copy read-only numpy views. Ten million clients are
160 MB of file pages shared by the coordinator and every worker through the page cache, not 300 MB of private
memory per process. Its size and CRC-32 are recorded in ``meta.json`` and checked when it is mapped.

A mapping shows the file as it is now, not as it was checked: bytes overwritten in place later (a stray writer, a
bad disk block read again after its page was dropped) would change a process's views, and with them which rows a
client reads or how much its update weighs, with nothing to say so. So the mapping's check also records a CRC-32 of
every :data:`CHECK_CHUNK` clients of each column (private memory: 4 bytes per column and 256 clients), and
:meth:`ClientTable.check` checks the chunks of given clients against them: the coordinator for the round's clients
before the round counts, a worker for a client after using its rows (:meth:`PartitionStore.recheck_client
<fedray.data.store.PartitionStore.recheck_client>`), so such a change fails the run, naming the file, instead of
changing its result (issue 34's chaos harness found it: seed 21 schedule 17).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .checksum import buffer_crc32, check_file_blocks
from .client_index import ClientIndex, class_count_chunks, counts_of
from .table import DataError

__all__ = ["CHECK_CHUNK", "CLIENTS_FILE", "CLIENTS_PER_GROUP", "MANIFEST_FILE", "MANIFEST_SCHEMA", "ClientTable",
           "check_manifest", "file_entry", "iter_class_counts", "write_clients", "write_manifest"]

MANIFEST_FILE = "manifest.parquet"
CLIENTS_FILE = "clients.arrow"
CLIENTS_PER_GROUP = 1 << 17  # clients per Parquet row group of the manifest (and per pass writing or reading it)
CHECK_CHUNK = 256  # clients per CRC-32 of ClientTable.check (each column: 1-2 KiB checked per client looked up)
PARTITION_KEY = b"fedray.partition"

MANIFEST_SCHEMA = pa.schema(
    [
        ("client_id", pa.int64()),
        ("num_samples", pa.int64()),
        ("class_counts", pa.list_(pa.int64())),
        ("domain", pa.int32()),
        ("block", pa.int64()),
        ("block_row", pa.int64()),
    ]
)
_CLIENT_FIELDS = [("num_samples", pa.int64()), ("block", pa.int32()), ("block_row", pa.int32())]


def _manifest_group(lo: int, counts: np.ndarray, domain: np.ndarray, block: np.ndarray, block_row: np.ndarray) -> pa.RecordBatch:
    n, c = counts.shape
    cc_offsets = pa.array((np.arange(n + 1, dtype=np.int64) * c).astype(np.int32))
    arrays = [
        pa.array(np.arange(lo, lo + n, dtype=np.int64)),
        pa.array(counts.sum(axis=1), type=pa.int64()),
        pa.ListArray.from_arrays(cc_offsets, pa.array(counts.reshape(-1).astype(np.int64, copy=False))),
        pa.array(domain, type=pa.int32()),
        pa.array(block, type=pa.int64()),
        pa.array(block_row, type=pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=MANIFEST_SCHEMA)


def _majority(domains: np.ndarray, index: ClientIndex, lo: int, hi: int, d: int) -> np.ndarray:
    """The most frequent domain of clients ``lo .. hi - 1`` (-1 for a client without rows)."""
    counts = counts_of(domains, index, lo, hi, d)
    out = counts.argmax(axis=1).astype(np.int32)
    out[counts.sum(axis=1) == 0] = -1
    return out


def write_manifest(path: Path, labels: np.ndarray, index: ClientIndex, num_classes: int, domains: np.ndarray | None,
                   client_block: np.ndarray, client_row: np.ndarray, partition_hash: str,
                   progress: Callable[[int], None] | None = None) -> np.ndarray | None:
    """Write ``manifest.parquet`` (module docstring) group by group; returns every client's majority domain
    (int32, -1 for an empty client), ``None`` without ``domains``. ``progress(clients)`` after each group."""
    n = len(index)
    dom = None if domains is None else np.asarray(domains, dtype=np.int64)
    d = int(dom.max()) + 1 if dom is not None and dom.size else 1
    majority = None if dom is None else np.full(n, -1, dtype=np.int32)
    group = max(1, min(CLIENTS_PER_GROUP, (1 << 30) // max(1, num_classes)))  # list offsets stay int32
    schema = MANIFEST_SCHEMA.with_metadata({PARTITION_KEY: partition_hash.encode()})
    pool = pa.default_memory_pool()
    with pq.ParquetWriter(str(path), schema, compression="zstd") as writer:
        for lo, hi, counts in class_count_chunks(labels, index, num_classes, max_clients=group):
            if majority is not None and dom is not None:
                majority[lo:hi] = _majority(dom, index, lo, hi, d)
            domain = np.full(hi - lo, -1, dtype=np.int32) if majority is None else majority[lo:hi]
            batch = _manifest_group(lo, counts, domain, client_block[lo:hi], client_row[lo:hi])
            writer.write_batch(batch.replace_schema_metadata(schema.metadata), row_group_size=group)
            del batch, counts
            pool.release_unused()  # Arrow's allocator keeps freed pages a while: not ten million clients' worth
            if progress is not None:
                progress(hi - lo)
        if n == 0:
            writer.write_table(schema.empty_table())
    return majority


def write_clients(path: Path, sizes: np.ndarray, client_block: np.ndarray, client_row: np.ndarray,
                  domain: np.ndarray | None) -> dict:
    """Write ``clients.arrow`` (module docstring); returns its ``meta.json`` entry: name, bytes, CRC-32."""
    fields = list(_CLIENT_FIELDS) + ([("domain", pa.int32())] if domain is not None else [])
    arrays = [pa.array(np.asarray(sizes, dtype=np.int64)), pa.array(np.asarray(client_block, dtype=np.int32)),
              pa.array(np.asarray(client_row, dtype=np.int32))]
    arrays += [pa.array(np.asarray(domain, dtype=np.int32))] if domain is not None else []
    batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return file_entry(path, CLIENTS_FILE)


def file_entry(path: Path, name: str) -> dict:
    """``{"name", "bytes", "crc32"}`` of the file at ``path`` (its ``meta.json`` entry), read in 1 MiB pieces (no
    mapping: the pages stay out of the writer's resident memory)."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return {"name": name, "bytes": size, "crc32": crc & 0xFFFFFFFF}


def check_manifest(root: Path, doc: dict, num_clients: int, *, contents: bool) -> None:
    """``manifest.parquet`` against ``meta.json`` (``doc``): its footer (schema, rows); with ``contents`` also its
    size and CRC-32 (streamed). Raises :class:`DataError` naming the file."""
    path = root / MANIFEST_FILE
    entry = doc.get("manifest")
    if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int) or not isinstance(entry.get("crc32"), int):
        raise DataError(f"partition metadata {root / 'meta.json'}: 'manifest' must give {MANIFEST_FILE}'s bytes and crc32")
    if contents:
        found = check_file_blocks(path, entry["bytes"], [entry["bytes"]], [entry["crc32"]])
        if found:
            raise DataError(f"damaged partition manifest {path}: {found[0][1]}")
    try:
        md = pq.read_metadata(str(path))
        schema = md.schema.to_arrow_schema().remove_metadata()
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"corrupt or unreadable partition manifest {path}: {e}") from e
    if not schema.equals(MANIFEST_SCHEMA) or md.num_rows != num_clients:
        raise DataError(f"partition manifest {path}: {md.num_rows} rows of {schema}, expected {num_clients} rows of "
                        f"{MANIFEST_SCHEMA}")


class ClientTable:
    """``clients.arrow`` mapped read-only, after checking its size and CRC-32 against ``doc`` (its ``meta.json``
    entry): ``sizes`` int64, ``block`` int32, ``block_row`` int32 and ``domain`` int32 (``None`` without
    domains), each a zero-copy read-only view of the mapping."""

    def __init__(self, root: Path, doc: object, num_clients: int):
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), t) for k, t in (("name", str), ("bytes", int),
                                                                                       ("crc32", int))):
            raise DataError(f"partition metadata {root / 'meta.json'}: 'clients' must give the client index file's "
                            f"name, bytes and crc32")
        path = root / doc["name"]
        try:
            self._mm = pa.memory_map(str(path))
            buf = self._mm.read_buffer()
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"missing or unreadable partition client index {path}: {e}") from e
        if buf.size != doc["bytes"] or buffer_crc32(buf) != doc["crc32"]:
            raise DataError(f"corrupt partition client index {path}: {buf.size} bytes, CRC-32 {buffer_crc32(buf):08x}; "
                            f"meta.json records {doc['bytes']} bytes, CRC-32 {doc['crc32']:08x}")
        try:
            reader = pa.ipc.open_file(buf)
            batch = reader.get_batch(0)
        except (OSError, pa.ArrowException, ValueError) as e:
            raise DataError(f"corrupt partition client index {path}: {e}") from e
        names = batch.schema.names
        if reader.num_record_batches != 1 or names[:3] != [f for f, _ in _CLIENT_FIELDS] or batch.num_rows != num_clients:
            raise DataError(f"partition client index {path}: columns {names}, {batch.num_rows} rows in "
                            f"{reader.num_record_batches} batches; expected one batch of {num_clients} clients")
        cols = {}
        for name, typ in [*_CLIENT_FIELDS, ("domain", pa.int32())]:
            if name in names:
                col = batch.column(name)
                if col.type != typ or col.null_count:
                    raise DataError(f"partition client index {path}: column {name} is {col.type}, expected {typ}")
                cols[name] = col.to_numpy(zero_copy_only=True)
        self.path = path
        self._cols = list(cols.values())
        self._chunk_crcs = [_chunk_crcs(c) for c in self._cols]
        # the chunks' CRC-32s were taken from the mapping after its check: check the file once more, so that
        # bytes changed in between cannot become the reference
        if buffer_crc32(buf) != doc["crc32"]:
            raise DataError(f"corrupt partition client index {path}: its CRC-32 changed while it was being mapped; "
                            f"meta.json records {doc['crc32']:08x}")
        self.sizes: np.ndarray = cols["num_samples"]
        self.block: np.ndarray = cols["block"]
        self.block_row: np.ndarray = cols["block_row"]
        self.domain: np.ndarray | None = cols.get("domain")

    def check(self, clients, where: str) -> None:
        """Raise :class:`DataError` (naming the file, the clients and ``where``) unless every column's bytes for
        ``clients`` (one id, or ids in any iterable; a chunk of :data:`CHECK_CHUNK` around each) are those checked
        when the file was mapped (module docstring)."""
        step = CHECK_CHUNK
        if isinstance(clients, (int, np.integer)) and not isinstance(clients, bool):  # one client: its chunk
            chunks = [int(clients) // step]
        else:
            ids = np.asarray(clients, dtype=np.int64).reshape(-1)
            if not ids.size:
                return
            chunks = np.unique(ids // step).tolist()
        for k in chunks:
            lo = k * step
            for col, ref in zip(self._cols, self._chunk_crcs):
                if zlib.crc32(col[lo:lo + step]) != ref[k]:
                    raise DataError(f"partition client index {self.path} changed on disk after it was checked "
                                    f"(clients {lo}..{min(lo + step, len(col)) - 1}, {where}): what this process "
                                    f"read of it can no longer be trusted; a resumed run checks and rebuilds it")


def _chunk_crcs(col: np.ndarray) -> np.ndarray:
    """The CRC-32 of every :data:`CHECK_CHUNK` entries of ``col`` (uint32, one per chunk)."""
    step = CHECK_CHUNK
    return np.fromiter((zlib.crc32(col[lo:lo + step]) for lo in range(0, len(col), step)), dtype=np.uint32,
                       count=-(-len(col) // step))


def iter_class_counts(path: Path, num_classes: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first client, counts)`` of the manifest at ``path``, a row group at a time (``counts``: an
    ``(n, num_classes)`` int64 array)."""
    try:
        f = pq.ParquetFile(str(path))
        lo = 0
        for batch in f.iter_batches(batch_size=CLIENTS_PER_GROUP, columns=["class_counts"]):
            col = batch.column(0)
            flat = col.flatten().to_numpy() if len(col) else np.zeros(0, np.int64)
            if flat.size != len(col) * num_classes:
                raise DataError(f"partition manifest {path}: class_counts rows do not hold {num_classes} classes each")
            yield lo, flat.astype(np.int64, copy=False).reshape(len(col), num_classes)
            lo += len(col)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"corrupt or unreadable partition manifest {path}: {e}") from e
