"""On-disk partition store: a manifest, an index of blocks and a few large packed Arrow IPC files.

Layout of one partition (``root/<hash>/``, ``hash`` = 16 hex characters; layout 4, "packed")::

    _COMPLETE              the hash; written last, its presence marks a finished directory
    meta.json              format and layout versions, hash, spec, DatasetMeta, source fingerprint, counts,
                           files: [{"name": "data/part-00000.arrows", "bytes": ...}, ...],
                           clients: {"name": "clients.arrow", "bytes": ..., "crc32": ...}
    clients.arrow          the client index every reader maps: num_samples int64, block int32, block_row int32
                           [, domain int32] per client (one uncompressed Arrow IPC batch; :mod:`fedray.data.manifest`)
    manifest.parquet       one row per client, by client id: client_id int64, num_samples int64,
                           class_counts list<int64>, domain int32 (majority domain, -1 if none/empty),
                           block int64 (the record batch holding the client's rows, -1 if empty),
                           block_row int64 (the client's first row in that batch); for people, tools and summaries
    blocks.parquet         one row per block of the packed files: file int32 (index into meta.json files),
                           offset int64, nbytes int64, rows int64, crc32 uint32 (CRC-32 of the block's bytes)
    data/part-NNNNN.arrows the rows of every client, client 0 first, each client's rows in its partitioner's
                           order: image, label, [domain], row_id int64, in record batches of whole clients

The format of the packed files and of their blocks is :mod:`fedray.data.packed`'s. Client ``c``'s rows are
rows ``[block_row, block_row + num_samples)`` of record batch ``block``: a reader maps the file once and
slices them without a copy.

The hash is a sha256 over the canonical JSON of (format, source fingerprint, resolved spec) and the
resulting index arrays (:mod:`fedray.data.spec_hash`), so an unchanged dataset and spec always find the
same directory again and any change of data, parameters or partitioner code that changes the split gets a
new one. The layout is not hashed: a partition keeps its hash, and every client the same rows in the same
order, in every layout.

Writes are atomic: everything is built in ``root/.tmp-<hash>-<pid>-<token>`` and renamed into place;
an existing complete, intact directory is reused without being rewritten, and a failed build removes
its temporary directory and leaves every existing output untouched. Writing streams (bounded memory,
see :func:`fedray.data.packed.write_packed`).

Integrity: each block's CRC-32 is computed as it is written. Before reusing a cached directory,
:func:`build_partition` checks every file's size and every block's CRC-32
(:meth:`PartitionStore.verify_blocks`); a missing, truncated or altered file or block is logged in one
line naming the file, the block and its clients, and the directory is rebuilt from the source, so a
damaged block is never trained on. Workers check the file's size and the CRC-32 of the block again on
every read, and the client index's size and CRC-32 when they map it. A directory of an older layout (1 and 2:
one Arrow file per client under ``clients/``; 3: packed, with the client index only in ``manifest.parquet``) is
never read: it is rebuilt once in this layout, with a one-line notice. ``FORMAT_VERSION`` enters the
hash (stays 1); ``LAYOUT_VERSION`` (meta.json ``layout``, absent = 1) does not.

Memory: the partitioner's result is a :class:`~fedray.data.client_index.ClientIndex` (two flat arrays), the
manifest is written and read a row group of clients at a time, and readers map ``clients.arrow``: a process
that opens a partition of ten million clients holds no per-client array of its own.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .client_index import ClientIndex, counts_of
from .manifest import (
    CLIENTS_FILE,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    ClientTable,
    check_manifest,
    file_entry,
    iter_class_counts,
    write_clients,
    write_manifest,
)
from .packed import BLOCK_BYTES, BLOCKS_SCHEMA, DATA_DIR, FILE_BYTES, BlockRef, PackedFiles, write_packed
from .partition import partition_indices
from .spec_hash import FORMAT_VERSION, content_fingerprint, partition_hash, resolve_spec
from .table import META_KEY, DataBundle, DatasetMeta, DataError, Split, images_of
from fedray.reporting.progress import ProgressBar

__all__ = ["FORMAT_VERSION", "LAYOUT_VERSION", "OldLayoutError", "PartitionStore", "build_partition",
           "content_fingerprint", "partition_hash", "resolve_spec"]

# meta.json "layout"; not hashed. 1, 2: one file per client (2: with CRC-32s); 3: packed; 4: packed + clients.arrow
LAYOUT_VERSION = 4
COMPLETE_MARKER = "_COMPLETE"
META_FILE = "meta.json"
BLOCKS_FILE = "blocks.parquet"


class OldLayoutError(DataError):
    """A partition directory in a layout this fedray does not read (an older one): rebuild it."""


# ----------------------------------------------------------------------------------------------
# writing


def _natural_ids(split: Split) -> np.ndarray | None:
    if "client" not in split.table.column_names:
        return None
    return split.table.column("client").to_numpy()


def _source_table(split: Split) -> pa.Table:
    """The train table restricted to the columns that are written (a zero-copy selection), its schema
    metadata the split's DatasetMeta."""
    table = split.table
    for col in ("image", "label"):
        if col not in table.column_names:
            raise DataError(f"{split.meta.name}: train table has no {col!r} column (columns: {table.column_names})")
    cols = ["image", "label"] + (["domain"] if "domain" in table.column_names else [])
    return table.select(cols).replace_schema_metadata({META_KEY: split.meta.to_json().encode()})


def _write_partition(
    tmp: Path, split: Split, handed: list[ClientIndex], spec: dict, h: str, fingerprint: str,
    domains: np.ndarray | None, block_bytes: int, file_bytes: int, progress: bool,
) -> None:
    """Write the partition ``handed.pop()`` (the caller hands its only reference over, so the rows, 8 bytes a
    row, are freed once the packed files and the manifest are written, before the client index)."""
    meta = split.meta
    parts = handed.pop()
    n, assigned = len(parts), parts.num_rows
    (tmp / DATA_DIR).mkdir(parents=True)
    pool = pa.default_memory_pool()
    with ProgressBar(assigned, "rows", f"partition {h}: rows", enabled=progress and assigned >= 1 << 20) as bar:
        index = write_packed(tmp, _source_table(split), parts, block_bytes=block_bytes, file_bytes=file_bytes,
                             progress=bar.update)
    pool.release_unused()  # Arrow's allocator keeps freed buffers: give the gathered groups back
    with ProgressBar(n, "clients", f"partition {h}: manifest", enabled=progress and n >= 1 << 17) as bar:
        majority = write_manifest(tmp / MANIFEST_FILE, split.labels, parts, meta.num_classes, domains,
                                  index.client_block, index.client_row, h, progress=bar.update)
    pool.release_unused()
    offsets = parts.offsets
    del parts  # the last reference: the rows go before the client index is written
    sizes = np.diff(offsets)
    del offsets
    clients = write_clients(tmp / CLIENTS_FILE, sizes, index.client_block, index.client_row, majority)
    del index.client_block, index.client_row, majority, sizes
    pq.write_table(index.blocks, str(tmp / BLOCKS_FILE), compression="zstd")
    doc = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT_VERSION,
        "hash": h,
        "spec": spec,
        "meta": asdict(meta),
        "source_fingerprint": fingerprint,
        "num_clients": n,
        "num_rows": int(split.table.num_rows),
        "assigned_rows": assigned,
        "files": index.files,
        "clients": clients,
        "manifest": file_entry(tmp / MANIFEST_FILE, MANIFEST_FILE),
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
    """The cached partition at ``final`` if it opens and its blocks check out, else ``None`` (one line logged:
    a damaged cache, or one in an older layout)."""
    say = log or logging.getLogger(__name__).warning
    try:
        store = PartitionStore.open(final)
        store.verify_blocks()
        return store
    except OldLayoutError as e:
        say(f"[fedray] partition cache in an older layout, rebuilding {final} once in the packed layout: {e}")
    except DataError as e:
        say(f"[fedray] partition cache damaged, rebuilding {final} from the source: {e}")
    return None


def build_partition(
    bundle: DataBundle, spec: dict, root: str | Path, *, overwrite: bool = False, log: Callable[[str], None] | None = None,
    block_bytes: int = BLOCK_BYTES, file_bytes: int = FILE_BYTES, progress: bool = True,
) -> "PartitionStore":
    """Partition ``bundle.train`` with ``spec`` and materialise it under ``root/<hash>/``.

    ``spec`` is ``{"name": ..., "num_clients": ..., "seed": ..., **params}``; defaults are filled in
    before hashing. A complete existing ``root/<hash>`` is reused as is (nothing rewritten) unless
    ``overwrite`` is true, after checking every file's size and every block's CRC-32; an incomplete or
    damaged one, or one in an older layout, is rebuilt and replaced, with one line to ``log`` (default:
    this module's logger, WARNING) naming the first damaged file and block. The partitioner receives the
    train split's ``domain`` column (``domains``) and ``client`` column (``natural``) when present.
    Bundles without a ``fingerprint`` are fingerprinted by content. ``block_bytes`` and ``file_bytes`` set
    the size of record batches and files (:mod:`fedray.data.packed`; not hashed, a cache written with other
    sizes is reused). Files are not fsync'ed: the rename makes a build atomic against process crashes, not
    against power loss. ``progress``: bars over the rows and clients written when stderr is a terminal
    (:mod:`fedray.reporting.progress`), for partitions of a million rows or 131,072 clients and more.
    """
    resolved = resolve_spec(spec)
    split = bundle.train
    parts = _partition(split, resolved)
    fingerprint = bundle.fingerprint or content_fingerprint(split)
    h = partition_hash(fingerprint, resolved, parts)
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create partition root {root}: {e}") from e
    final = root / h
    existed = final.exists()
    if existed and not overwrite:
        del parts  # not held while the cache is checked (ten million clients: 16 bytes a row and 8 a client)
        if (store := _reuse(final, log)) is not None:
            return store  # complete and intact: reuse without rewriting anything
        parts = _partition(split, resolved)
    tmp = root / f".tmp-{h}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        handed = [parts]
        del parts  # _write_partition holds the only reference and frees the rows as soon as it can
        _write_partition(tmp, split, handed, resolved, h, fingerprint, split.domains, block_bytes, file_bytes, progress)
        _install(tmp, final, overwrite or existed)  # a damaged one is replaced even if it has a marker
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pa.default_memory_pool().release_unused()  # what Arrow's allocator kept of the writer's buffers
    return PartitionStore.open(final)


def _partition(split: Split, resolved: dict) -> ClientIndex:
    params = {k: v for k, v in resolved.items() if k not in ("name", "num_clients", "seed")}
    return partition_indices(resolved["name"], split.labels, num_clients=resolved["num_clients"],
                             seed=resolved["seed"], domains=split.domains, natural=_natural_ids(split), **params)


# ----------------------------------------------------------------------------------------------
# reading


def _read_meta(path: Path) -> dict:
    """``meta.json`` of the directory ``path``, checked against the completion marker and this fedray's
    format and layout (:class:`OldLayoutError` for an older layout)."""
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
    if layout in (1, 2, 3):
        what = "packed, the client index only in manifest.parquet" if layout == 3 else "one Arrow file per client under clients/"
        raise OldLayoutError(f"{meta_path} records layout {layout} ({what}, an older fedray); this fedray reads the "
                             f"packed layout {LAYOUT_VERSION} with its mapped client index ({CLIENTS_FILE})")
    if layout != LAYOUT_VERSION:
        raise DataError(f"partition metadata {meta_path}: layout {layout!r}, this fedray reads {LAYOUT_VERSION}")
    if marker.read_text().strip() != doc["hash"]:
        raise DataError(f"partition marker {marker} does not match the hash {doc['hash']!r} in {meta_path}")
    try:
        DatasetMeta(**doc["meta"])
    except (TypeError, ValueError) as e:
        raise DataError(f"partition metadata {meta_path}: invalid dataset meta: {e}") from e
    files = doc.get("files")
    if not isinstance(files, list) or not files or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("bytes"), int) for f in files
    ):
        raise DataError(f"partition metadata {meta_path}: 'files' must list the packed files (name, bytes)")
    return doc


def _read_parquet(path: Path, schema: pa.Schema, columns: list[str] | None = None) -> pa.Table:
    """``columns`` of the Parquet file ``path`` after checking that its schema is ``schema``."""
    try:
        got = pq.read_schema(str(path))
        if not got.remove_metadata().equals(schema):
            raise DataError(f"partition file {path} has schema {got}, expected {schema}")
        return pq.read_table(str(path), columns=columns)
    except (OSError, pa.ArrowException, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"corrupt or unreadable partition file {path}: {e}") from e


def _check_clients(where: Path, n: int, doc: dict, clients: ClientTable, packed: PackedFiles) -> None:
    """The client index against the blocks: sizes >= 0 adding up to meta.json's assigned rows and to the rows of
    the blocks, every non-empty client's rows inside its block, clients in order without overlap (as written).
    A chunk of clients at a time: a few MB whatever the population."""
    sizes = clients.sizes
    if sizes.size and sizes.min() < 0:
        raise DataError(f"partition client index {where}: negative num_samples")
    total = int(sizes.sum())
    if total != int(packed.rows.sum()) or total != int(doc.get("assigned_rows", total)):
        raise DataError(f"partition client index {where}: {total} rows for the clients, the blocks hold "
                        f"{int(packed.rows.sum())}, meta.json records {doc.get('assigned_rows')}")
    last = (-1, 0)  # block and end row of the last non-empty client of the chunks before
    for lo in range(0, n, _CHECK_CLIENTS):
        last = _check_client_chunk(where, clients, packed, lo, min(n, lo + _CHECK_CLIENTS), last)


_CHECK_CLIENTS = 1 << 18


def _check_client_chunk(where: Path, clients: ClientTable, packed: PackedFiles, lo: int, hi: int,
                        last: tuple[int, int]) -> tuple[int, int]:
    sizes, block, row = clients.sizes[lo:hi], clients.block[lo:hi], clients.block_row[lo:hi]
    full = sizes > 0
    b, r, s = block[full].astype(np.int64), row[full].astype(np.int64), sizes[full]
    if np.any(block[~full] != -1) or np.any(b < 0) or np.any(b >= len(packed.rows)) or np.any(r < 0):
        raise DataError(f"partition client index {where}: a client's block is outside {packed.root / BLOCKS_FILE}")
    if np.any(r + s > packed.rows[b]):
        raise DataError(f"partition client index {where}: a client's rows run past the end of its block")
    if not b.size:
        return last
    b = np.concatenate([[last[0]], b])
    step = np.diff(b)
    same = step == 0
    ends = np.concatenate([[last[1]], r + s])
    if np.any(step < 0) or np.any(r[same] < ends[:-1][same]):
        raise DataError(f"partition client index {where}: clients are not stored in client order, without overlap")
    return int(b[-1]), int(ends[-1])


class PartitionStore:
    """A finished partition directory, opened read-only. Use :meth:`open`."""

    def __init__(self, path: Path, doc: dict, clients: ClientTable, packed: PackedFiles):
        self._path = path
        self._doc = doc
        self._packed = packed
        self._meta = DatasetMeta(**doc["meta"])
        self._clients = clients  # mapped: read-only views, no per-client memory of this process
        self._sizes, self._block, self._row = clients.sizes, clients.block, clients.block_row
        self._manifest: pa.Table | None = None

    # -- opening / validation ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, verify: bool = False, check_reads: bool = True) -> "PartitionStore":
        """Open ``path`` (a ``root/<hash>`` directory) after checking the completion marker, ``meta.json``,
        ``clients.arrow`` (size, CRC-32) and ``blocks.parquet`` (schemas, and that the blocks tile every file and
        every client lies inside its block); with ``verify`` also check every block's CRC-32 and that the rows
        give the partition its hash (:meth:`verify`). Raises :class:`DataError` naming the offending file,
        :class:`OldLayoutError` for a directory of an older layout (never read: rebuild it).
        ``check_reads=False`` skips the CRC-32 check of each read's block (the file size check stays)."""
        path = Path(path)
        if not path.is_dir():
            raise DataError(f"partition directory {path} does not exist")
        doc = _read_meta(path)
        n = int(doc["num_clients"])
        clients = ClientTable(path, doc.get("clients"), n)
        packed = PackedFiles(path, doc["files"], _read_parquet(path / BLOCKS_FILE, BLOCKS_SCHEMA), check_reads)
        packed.check_index(str(path / BLOCKS_FILE))
        _check_clients(path / CLIENTS_FILE, n, doc, clients, packed)
        check_manifest(path, doc, n, contents=False)
        store = cls(path, doc, clients, packed)
        if verify:
            store.verify()
        return store

    def verify_blocks(self, workers: int | None = None) -> None:
        """Check the manifest's size and CRC-32 against ``meta.json``, then every packed file's size and every
        block's CRC-32 against ``blocks.parquet`` (streamed, ``workers`` threads over the files: default 1 below
        4 cores). Raises :class:`DataError` naming the damaged manifest, or the first damaged file and block,
        the clients it holds and how many blocks are damaged."""
        check_manifest(self._path, self._doc, self.num_clients, contents=True)
        self._packed.verify(self._describe_block, workers)

    def verify(self) -> None:
        """:meth:`verify_blocks`, then decode every block and check that the rows' ids give this directory's
        partition hash and their labels the manifest's class counts (a block at a time; the row ids and labels
        of all clients, 16 bytes a row, are held at once)."""
        self.verify_blocks()
        n_rows = int(self._sizes.sum())
        rows = np.empty(n_rows, dtype=np.int64)
        labels = np.empty(n_rows, dtype=np.int64)
        at = 0
        for b in np.flatnonzero(self._packed.rows > 0).tolist():
            batch = self._packed.batch(b, f"block {b}")
            rows[at:at + batch.num_rows] = batch.column("row_id").to_numpy()
            labels[at:at + batch.num_rows] = batch.column("label").to_numpy()
            at += batch.num_rows
        index = ClientIndex.from_sizes(rows, self._sizes)
        if partition_hash(self.source_fingerprint, self.spec, index) != self.hash:
            raise DataError(f"partition {self._path}: the rows in {DATA_DIR}/ do not give the partition hash {self.hash}")
        at_rows = ClientIndex(np.arange(n_rows, dtype=np.int64), index.offsets)
        for lo, counts in self.iter_class_counts():
            hi = lo + counts.shape[0]
            bad = np.flatnonzero(np.any(counts_of(labels, at_rows, lo, hi, self._meta.num_classes) != counts, axis=1))
            if bad.size:
                raise DataError(f"partition {self._path}: client {lo + int(bad[0])}'s labels differ from {MANIFEST_FILE}")

    def _describe_block(self, b: int) -> str:
        """What block ``b`` holds, for error messages."""
        if self._packed.rows[b] == 0:
            return "the schema message" if self._packed.offset[b] == 0 else "the end-of-stream marker"
        cids = np.flatnonzero(self._block == b)
        return f"client {cids[0]}" if len(cids) == 1 else f"clients {cids[0]}..{cids[-1]}"

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
        """Samples per client (int64, length ``num_clients``): a read-only view of the mapped client index."""
        return self._sizes

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
    def files(self) -> list[Path]:
        """The packed data files, in order."""
        return [self._packed.path(f) for f in range(len(self._packed.names))]

    @property
    def manifest(self) -> pa.Table:
        """The whole ``manifest.parquet`` (read on first use; :meth:`open` reads only the client index)."""
        if self._manifest is None:
            self._manifest = _read_parquet(self._path / MANIFEST_FILE, MANIFEST_SCHEMA)
        return self._manifest

    @property
    def domains(self) -> np.ndarray:
        """Majority domain of every client (int32; -1 for single-domain data or an empty client): a read-only
        view of the mapped client index (a new array of -1 for single-domain data)."""
        dom = self._clients.domain
        return np.full(self.num_clients, -1, dtype=np.int32) if dom is None else dom

    def __repr__(self) -> str:
        return f"PartitionStore({str(self._path)!r}, {self.spec['name']}, {self.num_clients} clients)"

    # -- per-client access ---------------------------------------------------------------------
    def _check_cid(self, cid: int) -> int:
        if isinstance(cid, bool) or not isinstance(cid, (int, np.integer)) or not 0 <= cid < self.num_clients:
            raise DataError(f"client id {cid!r} out of range [0, {self.num_clients}) for partition {self._path}")
        return int(cid)

    def block_of(self, cid: int) -> BlockRef | None:
        """Where client ``cid``'s rows are: its record batch (file, byte range, rows, CRC-32); ``None`` when
        the client has no rows."""
        b = self._block[self._check_cid(cid)]
        return None if b < 0 else self._packed.ref(int(b))

    def read_client(self, cid: int) -> pa.Table:
        """Client ``cid``'s rows as an Arrow table: a zero-copy slice of its record batch in the memory map of
        its packed file, after checking the file's size and the block's CRC-32."""
        cid = self._check_cid(cid)
        n = int(self._sizes[cid])
        if n == 0:
            return self._packed.schema().empty_table()
        batch = self._packed.batch(int(self._block[cid]), f"client {cid}")
        return pa.Table.from_batches([batch.slice(int(self._row[cid]), n)])

    def check_clients(self, clients, where: str) -> None:
        """Raise :class:`DataError` if the client index entries of ``clients`` (sizes, blocks, rows) changed on
        disk since this process checked them (:meth:`ClientTable.check <fedray.data.manifest.ClientTable.check>`):
        the coordinator's check of a round's clients before the round counts."""
        self._clients.check(clients, where)

    def recheck_client(self, cid: int) -> None:
        """After client ``cid``'s rows were used (they are views of the mapped files): raise :class:`DataError`
        if its index entries or its block changed on disk since they were checked, naming the file."""
        cid = self._check_cid(cid)
        self._clients.check(cid, f"client {cid}")
        b = int(self._block[cid])
        if b >= 0:
            self._packed.check_block(b, f"client {cid}, after its rows were used")

    def row_ids(self, cid: int) -> np.ndarray:
        """Train-row indices of client ``cid`` (int64, in the order its partitioner gave them), a read-only
        view of the ``row_id`` column of its rows."""
        table = self.read_client(cid)
        if table.num_rows == 0:
            return np.zeros(0, dtype=np.int64)
        return table.column("row_id").chunk(0).to_numpy(zero_copy_only=True)

    def client_arrays(self, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``cid``'s ``(images, labels)``: images a read-only (n, *shape) view of the memory
        map in the storage dtype, labels int64 (also a view)."""
        table = self.read_client(cid)
        meta = self._meta
        if table.num_rows == 0:
            return np.empty((0, *meta.shape), dtype=meta.dtype), np.empty(0, dtype=np.int64)
        images = images_of(table, meta)
        labels = table.column("label").chunk(0).to_numpy(zero_copy_only=True)
        return images, labels

    def class_counts(self) -> np.ndarray:
        """Per-client class counts, an ``(num_clients, num_classes)`` int64 array (all clients at once: 8 bytes a
        client and class; :meth:`iter_class_counts` gives them a row group at a time)."""
        out = np.zeros((self.num_clients, self._meta.num_classes), dtype=np.int64)
        at = 0
        # the manifest's size and CRC-32 before and after the read: a run uses these counts (the split
        # program's), so a manifest damaged or changed while in use fails here instead of changing them
        check_manifest(self._path, self._doc, self.num_clients, contents=True)
        for lo, counts in self.iter_class_counts():
            out[lo:lo + counts.shape[0]] = counts
            at = lo + counts.shape[0]
        if at != self.num_clients:
            raise DataError(f"partition manifest {self._path / MANIFEST_FILE}: {at} clients, meta.json says {self.num_clients}")
        check_manifest(self._path, self._doc, self.num_clients, contents=True)
        return out

    def iter_class_counts(self) -> "Iterator[tuple[int, np.ndarray]]":
        """``(first client, counts)`` a manifest row group (about a million clients) at a time, counts an
        ``(n, num_classes)`` int64 array, after checking the manifest's schema."""
        path = self._path / MANIFEST_FILE
        try:
            got = pq.read_schema(str(path))
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"corrupt or unreadable partition file {path}: {e}") from e
        if not got.remove_metadata().equals(MANIFEST_SCHEMA):
            raise DataError(f"partition file {path} has schema {got}, expected {MANIFEST_SCHEMA}")
        return iter_class_counts(path, self._meta.num_classes)
