"""On-disk partition store: a manifest, an index of blocks and a few large packed Arrow IPC files.

Layout of one partition (``root/<hash>/``, ``hash`` = 16 hex characters; layout 3, "packed")::

    _COMPLETE              the hash; written last, its presence marks a finished directory
    meta.json              format and layout versions, hash, spec, DatasetMeta, source fingerprint, counts,
                           files: [{"name": "data/part-00000.arrows", "bytes": ...}, ...]
    manifest.parquet       one row per client, by client id: client_id int64, num_samples int64,
                           class_counts list<int64>, domain int32 (majority domain, -1 if none/empty),
                           block int64 (the record batch holding the client's rows, -1 if empty),
                           block_row int64 (the client's first row in that batch)
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
every read. A directory of an older layout (1 and 2: one Arrow file per client under ``clients/``) is
never read: it is rebuilt once in this layout, with a one-line notice. ``FORMAT_VERSION`` enters the
hash (stays 1); ``LAYOUT_VERSION`` (meta.json ``layout``, absent = 1) does not.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .packed import BLOCK_BYTES, BLOCKS_SCHEMA, DATA_DIR, FILE_BYTES, BlockRef, PackedFiles, write_packed
from .partition import label_stats, partition_indices
from .spec_hash import FORMAT_VERSION, content_fingerprint, partition_hash, resolve_spec
from .table import META_KEY, DataBundle, DatasetMeta, DataError, Split, images_of

__all__ = ["FORMAT_VERSION", "LAYOUT_VERSION", "OldLayoutError", "PartitionStore", "build_partition",
           "content_fingerprint", "partition_hash", "resolve_spec"]

LAYOUT_VERSION = 3  # meta.json "layout"; not hashed. 1, 2: one file per client (2: with CRC-32s); 3: packed
COMPLETE_MARKER = "_COMPLETE"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.parquet"
BLOCKS_FILE = "blocks.parquet"
PARTITION_KEY = b"fedray.partition"

_MANIFEST_SCHEMA = pa.schema(
    [
        ("client_id", pa.int64()),
        ("num_samples", pa.int64()),
        ("class_counts", pa.list_(pa.int64())),
        ("domain", pa.int32()),
        ("block", pa.int64()),
        ("block_row", pa.int64()),
    ]
)
_INDEX_COLUMNS = ["client_id", "num_samples", "domain", "block", "block_row"]  # what a reader loads


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


def _build_manifest(sizes: np.ndarray, counts: np.ndarray, domain: np.ndarray, block: np.ndarray,
                    block_row: np.ndarray, h: str) -> pa.Table:
    n = len(sizes)
    c = counts.shape[1]
    cc_offsets = (np.arange(n + 1, dtype=np.int64) * c).astype(np.int32)
    arrays = [
        pa.array(np.arange(n, dtype=np.int64)),
        pa.array(sizes, type=pa.int64()),
        pa.ListArray.from_arrays(pa.array(cc_offsets), pa.array(counts.reshape(-1).astype(np.int64))),
        pa.array(domain, type=pa.int32()),
        pa.array(block, type=pa.int64()),
        pa.array(block_row, type=pa.int64()),
    ]
    table = pa.Table.from_arrays(arrays, schema=_MANIFEST_SCHEMA)
    return table.replace_schema_metadata({PARTITION_KEY: h.encode()})


def _write_partition(
    tmp: Path, split: Split, parts: list[np.ndarray], spec: dict, h: str, fingerprint: str,
    domains: np.ndarray | None, block_bytes: int, file_bytes: int,
) -> None:
    meta = split.meta
    (tmp / DATA_DIR).mkdir(parents=True)
    index = write_packed(tmp, _source_table(split), parts, block_bytes=block_bytes, file_bytes=file_bytes)
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    counts = label_stats(split.labels, parts, meta.num_classes)
    manifest = _build_manifest(sizes, counts, _majority_domain(domains, parts), index.client_block, index.client_row, h)
    pq.write_table(manifest, str(tmp / MANIFEST_FILE), compression="zstd")
    pq.write_table(index.blocks, str(tmp / BLOCKS_FILE), compression="zstd")
    doc = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT_VERSION,
        "hash": h,
        "spec": spec,
        "meta": asdict(meta),
        "source_fingerprint": fingerprint,
        "num_clients": len(parts),
        "num_rows": int(split.table.num_rows),
        "assigned_rows": int(sizes.sum()),
        "files": index.files,
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
    block_bytes: int = BLOCK_BYTES, file_bytes: int = FILE_BYTES,
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
    against power loss.
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
        _write_partition(tmp, split, parts, resolved, h, fingerprint, domains, block_bytes, file_bytes)
        _install(tmp, final, overwrite or existed)  # a damaged one is replaced even if it has a marker
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PartitionStore.open(final)


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
    if layout in (1, 2):
        raise OldLayoutError(f"{meta_path} records layout {layout} (one Arrow file per client under clients/, "
                             f"an older fedray); this fedray reads the packed layout {LAYOUT_VERSION}")
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


def _check_clients(man_path: Path, n: int, index: pa.Table, packed: PackedFiles) -> None:
    """The manifest's client index against the blocks: ids 0..n-1, sizes >= 0, every non-empty client's
    rows inside its block, clients in order (sorted by client, as written)."""
    if index.num_rows != n:
        raise DataError(f"partition manifest {man_path} has {index.num_rows} rows, meta.json says {n} clients")
    if not np.array_equal(index.column("client_id").to_numpy(), np.arange(n)):
        raise DataError(f"partition manifest {man_path}: client_id is not 0..{n - 1}")
    sizes = index.column("num_samples").to_numpy()
    block = index.column("block").to_numpy()
    row = index.column("block_row").to_numpy()
    if sizes.size and sizes.min() < 0:
        raise DataError(f"partition manifest {man_path}: negative num_samples")
    full = sizes > 0
    b, r, s = block[full], row[full], sizes[full]
    if np.any(block[~full] != -1) or np.any(b < 0) or np.any(b >= len(packed.rows)) or np.any(r < 0):
        raise DataError(f"partition manifest {man_path}: a client's block is outside {packed.root / BLOCKS_FILE}")
    if np.any(r + s > packed.rows[b]):
        raise DataError(f"partition manifest {man_path}: a client's rows run past the end of its block")
    step = np.diff(b)
    same = step == 0
    if np.any(step < 0) or np.any(r[1:][same] < (r + s)[:-1][same]):
        raise DataError(f"partition manifest {man_path}: clients are not stored in client order, without overlap")


class PartitionStore:
    """A finished partition directory, opened read-only. Use :meth:`open`."""

    def __init__(self, path: Path, doc: dict, index: pa.Table, packed: PackedFiles):
        self._path = path
        self._doc = doc
        self._packed = packed
        self._meta = DatasetMeta(**doc["meta"])
        self._sizes = index.column("num_samples").to_numpy().astype(np.int64)
        self._block = index.column("block").to_numpy().astype(np.int64)
        self._row = index.column("block_row").to_numpy().astype(np.int64)
        self._domains = index.column("domain").to_numpy().astype(np.int32)
        self._manifest: pa.Table | None = None

    # -- opening / validation ------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, verify: bool = False, check_reads: bool = True) -> "PartitionStore":
        """Open ``path`` (a ``root/<hash>`` directory) after checking the completion marker, ``meta.json``,
        ``manifest.parquet`` and ``blocks.parquet`` (schemas, and that the blocks tile every file and every
        client lies inside its block); with ``verify`` also check every block's CRC-32 and that the rows
        give the partition its hash (:meth:`verify`). Raises :class:`DataError` naming the offending file,
        :class:`OldLayoutError` for a directory of an older layout (never read: rebuild it).
        ``check_reads=False`` skips the CRC-32 check of each read's block (the file size check stays)."""
        path = Path(path)
        if not path.is_dir():
            raise DataError(f"partition directory {path} does not exist")
        doc = _read_meta(path)
        man_path = path / MANIFEST_FILE
        index = _read_parquet(man_path, _MANIFEST_SCHEMA, _INDEX_COLUMNS)
        packed = PackedFiles(path, doc["files"], _read_parquet(path / BLOCKS_FILE, BLOCKS_SCHEMA), check_reads)
        packed.check_index(str(path / BLOCKS_FILE))
        _check_clients(man_path, int(doc["num_clients"]), index, packed)
        store = cls(path, doc, index, packed)
        if verify:
            store.verify()
        return store

    def verify_blocks(self, workers: int | None = None) -> None:
        """Check every packed file's size and every block's CRC-32 against ``blocks.parquet`` (streamed,
        ``workers`` threads over the files: default 1 below 4 cores). Raises :class:`DataError` naming the
        first damaged file and block, the clients it holds and how many blocks are damaged."""
        self._packed.verify(self._describe_block, workers)

    def verify(self) -> None:
        """:meth:`verify_blocks`, then decode every client's rows and check that their row ids give this
        directory's partition hash and their labels the manifest's class counts."""
        self.verify_blocks()
        parts = [self.row_ids(cid) for cid in range(self.num_clients)]
        if partition_hash(self.source_fingerprint, self.spec, parts) != self.hash:
            raise DataError(f"partition {self._path}: the rows in {DATA_DIR}/ do not give the partition hash {self.hash}")
        counts = self.class_counts()
        for cid in range(self.num_clients):
            labels = self.client_arrays(cid)[1]
            if not np.array_equal(np.bincount(labels, minlength=self._meta.num_classes), counts[cid]):
                raise DataError(f"partition {self._path}: client {cid}'s labels differ from {MANIFEST_FILE}")

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
    def files(self) -> list[Path]:
        """The packed data files, in order."""
        return [self._packed.path(f) for f in range(len(self._packed.names))]

    @property
    def manifest(self) -> pa.Table:
        """The whole ``manifest.parquet`` (read on first use; :meth:`open` reads only the client index)."""
        if self._manifest is None:
            self._manifest = _read_parquet(self._path / MANIFEST_FILE, _MANIFEST_SCHEMA)
        return self._manifest

    @property
    def domains(self) -> np.ndarray:
        """Majority domain of every client (int32; -1 for single-domain data or an empty client)."""
        return self._domains.copy()

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
        """Per-client class counts, an ``(num_clients, num_classes)`` int64 array."""
        col = _read_parquet(self._path / MANIFEST_FILE, _MANIFEST_SCHEMA, ["class_counts"]).column(0).combine_chunks()
        flat = col.flatten().to_numpy() if len(col) else np.zeros(0, np.int64)
        return flat.astype(np.int64).reshape(self.num_clients, self._meta.num_classes)
