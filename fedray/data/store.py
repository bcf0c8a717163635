"""On-disk partition store: a manifest plus one memory-mappable Arrow IPC file per client.

Layout of one partition (``root/<hash>/``, ``hash`` = 16 hex characters)::

    _COMPLETE              the hash; written last, its presence marks a finished directory
    meta.json              format and layout versions, hash, spec, DatasetMeta, source fingerprint, counts
    manifest.parquet       one row per client: client_id int64, num_samples int64, row_ids list<int64>,
                           class_counts list<int64>, domain int32 (majority domain, -1 if none/empty),
                           shard_bytes int64 (size of the client's shard file, checked on every read),
                           shard_crc32 uint32 (CRC-32 of the shard file, see :mod:`fedray.data.checksum`)
    clients/<cid:06d>.arrow
                           Arrow IPC *file* (uncompressed) with that client's rows of the train table:
                           image, label, [domain], row_id int64 -- ascending row_id order

The hash is a sha256 over the canonical JSON of (format, source fingerprint, resolved spec) and the
resulting index arrays, so an unchanged dataset and spec always find the same directory again and any
change of data, parameters or partitioner code that changes the split gets a new one.

Writes are atomic: everything is built in ``root/.tmp-<hash>-<pid>-<token>`` and renamed into place;
an existing complete, intact directory is reused without being rewritten, and a failed build removes
its temporary directory and leaves every existing output untouched.

Integrity: a shard's CRC-32 is computed as it is written. Before reusing a cached directory,
:func:`build_partition` checks every shard's size and CRC-32 (:meth:`PartitionStore.verify_shards`);
a missing, truncated or altered shard, or a manifest without checksums (layout 1, an older fedray),
is logged in one line naming the client and file and the directory is rebuilt from the source, so a
damaged shard is never trained on. Workers check size and CRC-32 again on every read. ``FORMAT_VERSION``
enters the hash (stays 1); ``LAYOUT_VERSION`` (meta.json ``layout``, absent = 1) does not.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .checksum import buffer_crc32, check_shards
from .partition import label_stats, partition_indices
from .spec_hash import FORMAT_VERSION, content_fingerprint, partition_hash, resolve_spec
from .table import META_KEY, DataBundle, DatasetMeta, DataError, Split, images_of

__all__ = ["FORMAT_VERSION", "LAYOUT_VERSION", "PartitionStore", "build_partition", "content_fingerprint", "partition_hash", "resolve_spec"]

LAYOUT_VERSION = 2  # meta.json "layout"; not hashed. 1: no shard checksums, 2: manifest shard_crc32
COMPLETE_MARKER = "_COMPLETE"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.parquet"
CLIENTS_DIR = "clients"
PARTITION_KEY = b"fedray.partition"

_LAYOUT1_SCHEMA = pa.schema(
    [
        ("client_id", pa.int64()),
        ("num_samples", pa.int64()),
        ("row_ids", pa.list_(pa.int64())),
        ("class_counts", pa.list_(pa.int64())),
        ("domain", pa.int32()),
        ("shard_bytes", pa.int64()),
    ]
)
_MANIFEST_SCHEMA = _LAYOUT1_SCHEMA.append(pa.field("shard_crc32", pa.uint32()))


# ----------------------------------------------------------------------------------------------
# writing


def _natural_ids(split: Split) -> np.ndarray | None:
    if "client" not in split.table.column_names:
        return None
    return split.table.column("client").to_numpy()


def _shard_base_table(split: Split) -> pa.Table:
    """The train table restricted to the shard columns plus ``row_id``, as one contiguous chunk."""
    table = split.table
    for col in ("image", "label"):
        if col not in table.column_names:
            raise DataError(f"{split.meta.name}: train table has no {col!r} column (columns: {table.column_names})")
    cols = ["image", "label"] + (["domain"] if "domain" in table.column_names else [])
    base = table.select(cols)
    base = base.append_column("row_id", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    base = base.combine_chunks()
    return base.replace_schema_metadata({META_KEY: split.meta.to_json().encode()})


def _write_shard(path: str | Path, table: pa.Table) -> tuple[int, int]:
    """Write one uncompressed Arrow IPC file (serialised in memory, then one ``write``); returns its
    size and the CRC-32 of the buffer written.

    ``O_EXCL`` makes a stale file in a reused temporary directory an error instead of a silent mix.
    """
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    buf = sink.getvalue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(buf)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return buf.size, buffer_crc32(buf)


def _auto_workers(n: int, mean_bytes: float) -> int:
    """Threads for shard writing. Small shards are bound by per-file Python and filesystem overhead
    that threads only contend on (measured slower with 2+ threads), so they are written by one thread;
    large shards (>= 256 KiB on average) on machines with >= 4 cores use up to 4 threads."""
    cores = os.cpu_count() or 1
    if cores < 4 or mean_bytes < 256 * 1024 or n < 8:
        return 1
    return min(4, cores // 2, n)


def _client_groups(sizes: np.ndarray, row_bytes: float, group_bytes: int = 64 << 20) -> list[tuple[int, int]]:
    """Consecutive client ranges ``[lo, hi)`` whose rows total about ``group_bytes`` (at least one client)."""
    groups = []
    lo, acc = 0, 0.0
    for cid, size in enumerate(sizes.tolist()):
        acc += size * row_bytes
        if acc >= group_bytes:
            groups.append((lo, cid + 1))
            lo, acc = cid + 1, 0.0
    if lo < len(sizes):
        groups.append((lo, len(sizes)))
    return groups


def _write_shards(clients_dir: Path, base: pa.Table, parts: list[np.ndarray], workers: int | None = None):
    """Write every client's shard; returns the file sizes and their CRC-32s.

    Clients are handled in groups of about 64 MiB of rows: one ``take`` gathers a whole group's rows
    (client after client), then each client's shard is a zero-copy slice of it, serialised and written
    with one ``write``. This keeps the per-client work to a slice and a file write (the file creation
    itself dominates for small shards) and the extra memory to one group.
    """
    n = len(parts)
    nbytes = np.zeros(n, dtype=np.int64)
    crcs = np.zeros(n, dtype=np.uint32)
    schema_md = base.schema.metadata
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=n)
    row_bytes = base.nbytes / max(1, base.num_rows)
    if workers is None:
        workers = _auto_workers(n, row_bytes * sizes.sum() / max(1, n))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    prefix = os.path.join(str(clients_dir), "")

    def work(lo: int, hi: int) -> None:
        idx = np.concatenate(parts[lo:hi]) if offsets[hi] > offsets[lo] else np.zeros(0, np.int64)
        group = base.take(pa.array(idx, type=pa.int64())).combine_chunks()
        if group.schema.metadata != schema_md:
            group = group.replace_schema_metadata(schema_md)
        for cid in range(lo, hi):
            sub = group.slice(int(offsets[cid] - offsets[lo]), int(sizes[cid]))
            nbytes[cid], crcs[cid] = _write_shard(f"{prefix}{cid:06d}.arrow", sub)

    groups = _client_groups(sizes, row_bytes)
    if workers <= 1 or len(groups) == 1:
        for lo, hi in groups:
            work(lo, hi)
        return nbytes, crcs
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fedray-shards") as pool:
        futures = [pool.submit(work, lo, hi) for lo, hi in groups]
        for f in futures:
            f.result()  # re-raises the first failure
    return nbytes, crcs


def _majority_domain(domains: np.ndarray | None, parts: list[np.ndarray]) -> np.ndarray:
    n = len(parts)
    if domains is None:
        return np.full(n, -1, dtype=np.int32)
    dom = np.asarray(domains, dtype=np.int64)
    d = int(dom.max()) + 1 if dom.size else 1
    counts = label_stats(dom, parts, d)
    out = counts.argmax(axis=1).astype(np.int32)
    out[counts.sum(axis=1) == 0] = -1
    return out


def _build_manifest(parts: list, counts: np.ndarray, domain: np.ndarray, nbytes: np.ndarray, crcs: np.ndarray, h: str):
    n = len(parts)
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    rows = np.concatenate(parts).astype(np.int64) if n and sizes.sum() else np.zeros(0, np.int64)
    c = counts.shape[1]
    cc_offsets = (np.arange(n + 1, dtype=np.int64) * c).astype(np.int32)
    arrays = [
        pa.array(np.arange(n, dtype=np.int64)),
        pa.array(sizes),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows, type=pa.int64())),
        pa.ListArray.from_arrays(pa.array(cc_offsets), pa.array(counts.reshape(-1).astype(np.int64))),
        pa.array(domain, type=pa.int32()),
        pa.array(nbytes, type=pa.int64()),
        pa.array(crcs, type=pa.uint32()),
    ]
    table = pa.Table.from_arrays(arrays, schema=_MANIFEST_SCHEMA)
    return table.replace_schema_metadata({PARTITION_KEY: h.encode()})


def _write_partition(
    tmp: Path,
    split: Split,
    parts: list[np.ndarray],
    spec: dict,
    h: str,
    fingerprint: str,
    domains: np.ndarray | None,
    workers: int | None = None,
) -> None:
    meta = split.meta
    clients_dir = tmp / CLIENTS_DIR
    clients_dir.mkdir(parents=True)
    base = _shard_base_table(split)
    nbytes, crcs = _write_shards(clients_dir, base, parts, workers)
    counts = label_stats(split.labels, parts, meta.num_classes)
    manifest = _build_manifest(parts, counts, _majority_domain(domains, parts), nbytes, crcs, h)
    pq.write_table(manifest, str(tmp / MANIFEST_FILE), compression="zstd")
    doc = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT_VERSION,
        "hash": h,
        "spec": spec,
        "meta": asdict(meta),
        "source_fingerprint": fingerprint,
        "num_clients": len(parts),
        "num_rows": int(split.table.num_rows),
        "assigned_rows": int(sum(len(p) for p in parts)),
    }
    (tmp / META_FILE).write_text(json.dumps(doc, indent=1, sort_keys=True))
    (tmp / COMPLETE_MARKER).write_text(h)


def _install(tmp: Path, final: Path, overwrite: bool) -> None:
    """Move a finished ``tmp`` directory to ``final`` atomically (see module docstring)."""
    try:
        os.rename(tmp, final)
        return
    except OSError:
        if not final.exists():
            raise
    # ``final`` exists: either a concurrent builder finished first, or we replace an old/invalid one
    if not overwrite and _is_complete(final):
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = final.parent / f".old-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)  # put the previous output back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _is_complete(path: Path) -> bool:
    try:
        PartitionStore.open(path)
        return True
    except DataError:
        return False


def _reuse(final: Path, log: Callable[[str], None] | None) -> "PartitionStore | None":
    """The cached partition at ``final`` if it opens and its shards check out, else ``None`` (logged)."""
    try:
        store = PartitionStore.open(final)
        store.verify_shards()
        return store
    except DataError as e:
        (log or logging.getLogger(__name__).warning)(f"[fedray] partition cache damaged, rebuilding {final} from the source: {e}")
        return None


def build_partition(
    bundle: DataBundle, spec: dict, root: str | Path, *, overwrite: bool = False, workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> "PartitionStore":
    """Partition ``bundle.train`` with ``spec`` and materialise it under ``root/<hash>/``.

    ``spec`` is ``{"name": ..., "num_clients": ..., "seed": ..., **params}``; defaults are filled in
    before hashing. A complete existing ``root/<hash>`` is reused as is (nothing rewritten) unless
    ``overwrite`` is true, after checking every shard's size and CRC-32; an incomplete or damaged one
    (or one without checksums) is rebuilt and replaced, with one line to ``log`` (default: this module's
    logger, WARNING) naming the first damaged client and file. The partitioner receives the train
    split's ``domain`` column (``domains``) and ``client`` column (``natural``) when present. Bundles
    without a ``fingerprint`` are fingerprinted by content. ``workers`` sets the shard-writing threads
    (default: chosen from the core count and shard size). Files are not fsync'ed: the rename makes a
    build atomic against process crashes, not against power loss.
    """
    resolved = resolve_spec(spec)
    params = {k: v for k, v in resolved.items() if k not in ("name", "num_clients", "seed")}
    split = bundle.train
    domains = split.domains
    parts = partition_indices(
        resolved["name"],
        split.labels,
        num_clients=resolved["num_clients"],
        seed=resolved["seed"],
        domains=domains,
        natural=_natural_ids(split),
        **params,
    )
    fingerprint = bundle.fingerprint or content_fingerprint(split)
    h = partition_hash(fingerprint, resolved, parts)
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create partition root {root}: {e}") from e
    final = root / h
    existed = final.exists()
    if existed and not overwrite and (store := _reuse(final, log)) is not None:
        return store  # complete and intact: reuse without rewriting anything
    tmp = root / f".tmp-{h}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        _write_partition(tmp, split, parts, resolved, h, fingerprint, domains, workers)
        _install(tmp, final, overwrite or existed)  # a damaged one is replaced even if it has a marker
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PartitionStore.open(final)


# ----------------------------------------------------------------------------------------------
# reading


class PartitionStore:
    """A finished partition directory, opened read-only. Use :meth:`open`."""

    def __init__(self, path: Path, doc: dict, manifest: pa.Table, check_reads: bool = True):
        self._path = path
        self._doc = doc
        self._manifest = manifest
        self._meta = DatasetMeta(**doc["meta"])
        self._sizes = manifest.column("num_samples").to_numpy().astype(np.int64)
        self._shard_bytes = manifest.column("shard_bytes").to_numpy().astype(np.int64)
        self._crcs = manifest.column("shard_crc32").to_numpy() if "shard_crc32" in manifest.column_names else None
        self._check_reads = bool(check_reads) and self._crcs is not None

    # -- opening / validation ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, verify: bool = False, check_reads: bool = True) -> "PartitionStore":
        """Open ``path`` (a ``root/<hash>`` directory) after checking the completion marker,
        ``meta.json`` and ``manifest.parquet``; with ``verify`` also check every shard's size and CRC-32
        and its row count and ids. Raises :class:`DataError` naming the offending file (and client).
        ``check_reads=False`` skips the CRC-32 check of :meth:`read_client` (its size check stays)."""
        path = Path(path)
        if not path.is_dir():
            raise DataError(f"partition directory {path} does not exist")
        marker = path / COMPLETE_MARKER
        if not marker.is_file():
            raise DataError(f"partition directory {path} is incomplete: no {COMPLETE_MARKER} marker")
        meta_path = path / META_FILE
        try:
            doc = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read partition metadata {meta_path}: {e}") from e
        missing = [k for k in ("format", "hash", "spec", "meta", "num_clients", "num_rows") if k not in doc]
        if missing:
            raise DataError(f"partition metadata {meta_path} lacks fields {missing}")
        if doc["format"] != FORMAT_VERSION:
            raise DataError(f"partition metadata {meta_path}: format {doc['format']!r}, this fedray reads {FORMAT_VERSION}")
        layout = doc.get("layout", 1)
        if layout not in (1, LAYOUT_VERSION):
            raise DataError(f"partition metadata {meta_path}: layout {layout!r}, this fedray reads 1..{LAYOUT_VERSION}")
        if marker.read_text().strip() != doc["hash"]:
            raise DataError(f"partition marker {marker} does not match the hash {doc['hash']!r} in {meta_path}")
        try:
            DatasetMeta(**doc["meta"])
        except (TypeError, ValueError) as e:
            raise DataError(f"partition metadata {meta_path}: invalid dataset meta: {e}") from e
        man_path = path / MANIFEST_FILE
        try:
            manifest = pq.read_table(str(man_path))
        except (OSError, pa.ArrowException, ValueError) as e:
            raise DataError(f"corrupt or unreadable partition manifest {man_path}: {e}") from e
        expected = _MANIFEST_SCHEMA if layout == LAYOUT_VERSION else _LAYOUT1_SCHEMA
        if not manifest.schema.remove_metadata().equals(expected):
            raise DataError(f"partition manifest {man_path} has schema {manifest.schema}, expected (layout {layout}) {expected}")
        n = int(doc["num_clients"])
        if manifest.num_rows != n:
            raise DataError(f"partition manifest {man_path} has {manifest.num_rows} rows, meta.json says {n} clients")
        ids = manifest.column("client_id").to_numpy()
        if not np.array_equal(ids, np.arange(n)):
            raise DataError(f"partition manifest {man_path}: client_id is not 0..{n - 1}")
        sizes = manifest.column("num_samples").to_numpy()
        if sizes.size and sizes.min() < 0:
            raise DataError(f"partition manifest {man_path}: negative num_samples")
        store = cls(path, doc, manifest, check_reads)
        if verify:
            store.verify()
        return store

    def verify_shards(self, workers: int | None = None) -> None:
        """Check every shard's size and CRC-32 against the manifest (:func:`~fedray.data.checksum.check_shards`).
        Raises :class:`DataError` naming the first damaged client and file, or a store without checksums."""
        if self._crcs is None:
            raise DataError(f"partition {self._path} was written by an older fedray without shard checksums "
                            f"({self._path / MANIFEST_FILE} has no shard_crc32)")
        prefix = os.path.join(str(self._path / CLIENTS_DIR), "")
        check_shards(lambda cid: f"{prefix}{cid:06d}.arrow", self._shard_bytes, self._crcs, workers)

    def verify(self) -> None:
        """:meth:`verify_shards`, then open every shard and check its row count and row ids."""
        self.verify_shards()
        row_ids = self._manifest.column("row_ids")
        for cid in range(self.num_clients):
            table = self.read_client(cid)
            expect = row_ids[cid].values.to_numpy() if self._sizes[cid] else np.zeros(0, np.int64)
            got = table.column("row_id").to_numpy() if table.num_rows else np.zeros(0, np.int64)
            if not np.array_equal(got, expect):
                raise DataError(f"shard {self.client_path(cid)} holds rows that differ from the manifest")

    # -- properties ----------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def hash(self) -> str:
        return str(self._doc["hash"])

    @property
    def num_clients(self) -> int:
        return int(self._doc["num_clients"])

    def __len__(self) -> int:
        return self.num_clients

    @property
    def sizes(self) -> np.ndarray:
        """Samples per client (int64, length ``num_clients``)."""
        return self._sizes.copy()

    @property
    def meta(self) -> DatasetMeta:
        return self._meta

    @property
    def spec(self) -> dict:
        """The resolved partition spec (defaults filled in)."""
        return dict(self._doc["spec"])

    @property
    def source_fingerprint(self) -> str:
        return str(self._doc.get("source_fingerprint", ""))

    @property
    def manifest(self) -> pa.Table:
        return self._manifest

    @property
    def domains(self) -> np.ndarray:
        """Majority domain of every client (int32; -1 for single-domain data or an empty client)."""
        return self._manifest.column("domain").to_numpy().astype(np.int32)

    def __repr__(self) -> str:
        return f"PartitionStore({str(self._path)!r}, {self.spec['name']}, {self.num_clients} clients)"

    # -- per-client access ---------------------------------------------------------------------
    def _check_cid(self, cid: int) -> int:
        if isinstance(cid, bool) or not isinstance(cid, (int, np.integer)) or not 0 <= cid < self.num_clients:
            raise DataError(f"client id {cid!r} out of range [0, {self.num_clients}) for partition {self._path}")
        return int(cid)

    def client_path(self, cid: int) -> Path:
        """Path of client ``cid``'s shard file."""
        return self._path / CLIENTS_DIR / f"{self._check_cid(cid):06d}.arrow"

    def row_ids(self, cid: int) -> np.ndarray:
        """Train-row indices of client ``cid`` (sorted int64), from the manifest."""
        cid = self._check_cid(cid)
        if not self._sizes[cid]:
            return np.zeros(0, dtype=np.int64)
        return self._manifest.column("row_ids")[cid].values.to_numpy()

    def read_client(self, cid: int) -> pa.Table:
        """Client ``cid``'s rows as an Arrow table backed by a memory map of its shard (zero-copy)."""
        path = self.client_path(cid)
        cid = int(cid)
        try:
            source = pa.memory_map(str(path), "r")
        except FileNotFoundError as e:
            raise DataError(f"missing shard {path} of client {cid} of partition {self.hash}") from e
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"cannot open shard {path}: {e}") from e
        # closing the file after reading is safe: the table's buffers keep the mapping alive, and no
        # file descriptor stays open per table a caller holds on to
        with source:
            size = source.size()
            if size != self._shard_bytes[cid]:
                raise DataError(f"corrupt or truncated shard {path} of client {cid}: {size} bytes, the manifest records "
                                f"{self._shard_bytes[cid]}")
            if self._check_reads and buffer_crc32(buf := source.read_buffer(size)) != self._crcs[cid]:
                raise DataError(f"corrupt shard {path} of client {cid}: CRC-32 {buffer_crc32(buf):08x}, the manifest "
                                f"records {int(self._crcs[cid]):08x} (content changed since it was written)")
            try:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
            except (OSError, pa.ArrowException, ValueError) as e:
                raise DataError(f"corrupt shard {path}: {e}") from e
        if table.num_rows != self._sizes[cid] or "image" not in table.column_names or "label" not in table.column_names:
            raise DataError(
                f"corrupt shard {path}: {table.num_rows} rows with columns {table.column_names}, "
                f"the manifest records {self._sizes[cid]} rows of image/label/row_id"
            )
        return table

    def client_arrays(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s ``(images, labels)``: images a read-only (n, *shape) view of the memory
        map in the storage dtype, labels int64 (also a view)."""
        table = self.read_client(cid)
        meta = self._meta
        if table.num_rows == 0:
            return np.empty((0, *meta.shape), dtype=meta.dtype), np.empty(0, dtype=np.int64)
        table = table.combine_chunks() if table.column("image").num_chunks > 1 else table
        images = images_of(table, meta)
        labels = table.column("label").chunk(0).to_numpy(zero_copy_only=True)
        return images, labels

    def class_counts(self) -> np.ndarray:
        """Per-client class counts, an ``(num_clients, num_classes)`` int64 array."""
        col = self._manifest.column("class_counts").combine_chunks()
        flat = col.flatten().to_numpy() if len(col) else np.zeros(0, np.int64)
        return flat.astype(np.int64).reshape(self.num_clients, self._meta.num_classes)
