"""Packed partition files: every client's rows in a few large Arrow IPC files, found through an index of blocks.

A partition's rows (the train table's ``image``, ``label``, [``domain``] plus ``row_id`` int64) are written
client after client, client 0 first, each client's rows in the order its partitioner gave them, into files
``data/part-00000.arrows``, ``data/part-00001.arrows``, ... Each file is an Arrow IPC *stream* (readable on
its own by ``pyarrow.ipc.open_stream``, schema metadata ``fedray.meta`` included) cut into **blocks**, which
tile the file without gaps::

    block 0            the schema message
    blocks 1 .. k      record batches of consecutive clients (``rows`` >= 1 each)
    block k + 1        the 8-byte end-of-stream marker

A record batch holds whole clients: about ``block_bytes`` of rows (at most ``block_bytes`` plus one client;
a client larger than that is a batch of its own), so a client's rows are one contiguous slice of one batch.
A file is closed after the batch that takes it past ``file_bytes`` and the next batch starts a new file.

The index (``blocks.parquet``, schema :data:`BLOCKS_SCHEMA`) has one row per block, file by file: its file,
byte ``offset`` and ``nbytes``, its ``rows`` (0 for the schema and end-of-stream blocks) and the CRC-32 of its
bytes (computed from the buffer written). The manifest maps each client to ``block`` and ``block_row`` (see
:mod:`fedray.data.store`).

Writing streams with bounded memory: consecutive blocks are gathered from the source table about
``GATHER_BYTES`` at a time (one ``take``; a chunked source is gathered chunk by chunk, never concatenated),
then serialised and written one block at a time. No per-client file and no whole partitioned table exist.

Reading (:class:`PackedFiles`) memory-maps each file once per process and decodes one block's record batch
straight from the mapping (``pyarrow.ipc.read_message`` / ``read_record_batch`` on a slice of it: no copy);
a client's rows are a zero-copy slice of that batch. Every read checks the file's size and, unless turned
off, the CRC-32 of the block it decodes; the schema block is checked when a file is first mapped.

Page cache: a round reads the blocks of the clients it sampled, scattered over the files, so each mapping is
marked ``MADV_RANDOM`` (no read-around on a fault) and a block's pages are asked for at once
(``MADV_WILLNEED`` on its range) before it is read. Without them a block evicted from the page cache cost a
fault that read the device's whole read-ahead window: 7.5 MiB per client at ten million clients on this
project's machines (``read_ahead_kb`` 8192, docs/scaling.md), for a block of about :data:`BLOCK_BYTES`.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from .checksum import buffer_crc32, check_file_blocks
from .client_index import ClientIndex
from .table import DataError

__all__ = ["BLOCKS_SCHEMA", "BLOCK_BYTES", "DATA_DIR", "FILE_BYTES", "PackedFiles", "PackedIndex", "write_packed"]

DATA_DIR = "data"
#: target bytes of rows per record batch: what a read's CRC-32 check covers (twice: at the read and after use).
#: 16 KiB (it was 128 KiB: partitions built then keep their blocks, read as they are):
#: a client of 3 rows (one million such clients) read and re-checked in 28 us of CPU instead of 67 (docs/scaling.md)
BLOCK_BYTES = 16 << 10
FILE_BYTES = 1 << 30  # a file is closed once it holds this much
GATHER_BYTES = 4 << 20  # rows gathered from the source per ``take`` while writing: the writer's extra memory
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC end-of-stream marker

BLOCKS_SCHEMA = pa.schema(
    [
        ("file", pa.int32()),
        ("offset", pa.int64()),
        ("nbytes", pa.int64()),
        ("rows", pa.int64()),
        ("crc32", pa.uint32()),
    ]
)


def file_name(index: int) -> str:
    """The path of packed file ``index`` relative to the partition directory."""
    return f"{DATA_DIR}/part-{index:05d}.arrows"


# ----------------------------------------------------------------------------------------------
# writing


@dataclass
class PackedIndex:
    """Where :func:`write_packed` put every client: ``files`` (``{"name", "bytes"}`` per file), ``blocks``
    (a table of :data:`BLOCKS_SCHEMA`), and per client ``client_block`` (int32, the global block index of its
    record batch, -1 for an empty client) and ``client_row`` (int32, its first row in that batch)."""

    files: list[dict]
    blocks: pa.Table
    client_block: np.ndarray
    client_row: np.ndarray


def plan_blocks(sizes: np.ndarray | None, rows_per_block: int, starts: np.ndarray | None = None,
                clients_per_pass: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut consecutive non-empty clients into record batches of about ``rows_per_block`` rows.

    A client starts a new batch when its first row falls in another window of ``rows_per_block`` rows
    than the previous non-empty client's, so a batch has at most ``rows_per_block`` rows plus one client
    and a client is never split. Returns the first client of every batch (int64), the batch of every client
    (int32, -1 when empty) and each client's first row within its batch (int32). ``starts``: each client's
    first row in the partition (``offsets[:-1]`` of its client index), computed from ``sizes`` when not given;
    ``sizes=None`` takes them from ``starts``, which then holds one more entry (``offsets``, the last the total).
    Computed ``clients_per_pass`` clients at a time: besides the results (8 bytes a client), a pass's arrays."""
    if sizes is None:
        if starts is None:
            raise ValueError("plan_blocks: give sizes, or starts with the total rows as one more entry")
        offsets = np.asarray(starts, dtype=np.int64)
        starts, n = offsets[:-1], len(offsets) - 1
    else:
        sizes = np.asarray(sizes, dtype=np.int64)
        n = len(sizes)
        if starts is None:
            starts = np.zeros(n, dtype=np.int64)
            if n > 1:
                np.cumsum(sizes[:-1], out=starts[1:])
        offsets = np.append(starts, starts[-1] + sizes[-1]) if n else np.zeros(1, dtype=np.int64)
    rpb = max(1, int(rows_per_block))
    client_block = np.full(n, -1, dtype=np.int32)
    client_row = np.zeros(n, dtype=np.int32)
    firsts: list[np.ndarray] = []
    window, batches, batch_start = -1, 0, 0  # the last non-empty client's window, batches so far, its batch's row
    for lo in range(0, n, max(1, int(clients_per_pass))):
        hi = min(n, lo + max(1, int(clients_per_pass)))
        nonempty = lo + np.flatnonzero(offsets[lo + 1:hi + 1] > offsets[lo:hi])
        if not nonempty.size:
            continue
        ne_starts = starts[nonempty]
        win = ne_starts // rpb
        new = np.empty(win.size, dtype=bool)
        new[0] = win[0] != window
        np.not_equal(win[1:], win[:-1], out=new[1:])
        batch_of = np.cumsum(new) + (batches - 1)
        if batch_of.size and int(batch_of[-1]) >= 1 << 31:
            raise DataError(f"packed writer: {int(batch_of[-1]) + 1} record batches do not fit an int32 block number")
        first = nonempty[new]
        firsts.append(first)
        # each client's batch's first row: of this pass's new batches, or (no new batch yet) the carried one
        first_rows = np.concatenate([[batch_start], starts[first]])
        client_block[nonempty] = batch_of
        client_row[nonempty] = ne_starts - first_rows[batch_of - (batches - 1)]
        window, batches, batch_start = int(win[-1]), int(batch_of[-1]) + 1, int(first_rows[-1])
    first_client = np.concatenate(firsts) if firsts else np.zeros(0, dtype=np.int64)
    return first_client.astype(np.int64, copy=False), client_block, client_row


def _write_all(fd: int, data) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _PackSink:
    """Appends blocks to the packed files of one partition, starting a new file past ``file_bytes``."""

    def __init__(self, directory: Path, schema: pa.Schema, file_bytes: int):
        self.directory, self.schema, self.file_bytes = directory, schema, int(file_bytes)
        self.header = schema.serialize()
        self.files: list[dict] = []
        self.blocks: list[tuple[int, int, int, int, int]] = []  # file, offset, nbytes, rows, crc32
        self.fd: int | None = None
        self.pos = 0

    def _block(self, data, rows: int) -> None:
        assert self.fd is not None
        _write_all(self.fd, data)
        n = len(memoryview(data))
        self.blocks.append((len(self.files) - 1, self.pos, n, rows, buffer_crc32(data)))
        self.pos += n

    def _open(self) -> None:
        path = self.directory / file_name(len(self.files))
        # O_EXCL: a stale file in a reused temporary directory is an error, never a silent mix
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.files.append({"name": file_name(len(self.files)), "bytes": 0})
        self.pos = 0
        self._block(self.header, 0)

    def _close(self) -> None:
        if self.fd is None:
            return
        try:
            self._block(EOS, 0)
        finally:
            os.close(self.fd)
            self.fd = None
        self.files[-1]["bytes"] = self.pos

    def add(self, batch: pa.RecordBatch) -> None:
        if self.fd is None:
            self._open()
        self._block(batch.serialize(), batch.num_rows)
        if self.pos >= self.file_bytes:
            self._close()

    def finish(self) -> tuple[list[dict], pa.Table]:
        if not self.files:
            self._open()  # no rows at all: one file with the schema, so every reader knows it
        self._close()
        cols = list(zip(*self.blocks))
        arrays = [pa.array(np.asarray(c, dtype=f.type.to_pandas_dtype()), type=f.type) for c, f in zip(cols, BLOCKS_SCHEMA)]
        return self.files, pa.Table.from_arrays(arrays, schema=BLOCKS_SCHEMA)

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Gatherer:
    """``take`` of source rows into one record batch, chunk by chunk for a chunked source (a ``take`` on a
    chunked table would first concatenate the whole table)."""

    def __init__(self, source: pa.Table, schema: pa.Schema):
        self.schema = schema
        self.batches = source.to_batches()  # zero-copy, columns sliced to common chunk boundaries
        lengths = np.fromiter((b.num_rows for b in self.batches), dtype=np.int64, count=len(self.batches))
        self.starts = np.concatenate([[0], np.cumsum(lengths)])[:-1] if len(lengths) else np.zeros(0, np.int64)

    def __call__(self, idx: np.ndarray) -> pa.RecordBatch:
        if len(self.batches) == 1:
            taken = self.batches[0].take(pa.array(idx, type=pa.int64()))
        else:
            which = np.searchsorted(self.starts, idx, side="right") - 1
            order = np.argsort(which, kind="stable")
            bounds = np.flatnonzero(np.diff(which[order])) + 1
            pieces = [
                self.batches[int(which[run[0]])].take(pa.array(idx[run] - self.starts[which[run[0]]], type=pa.int64()))
                for run in np.split(order, bounds)
            ]
            inverse = np.empty_like(order)
            inverse[order] = np.arange(len(order))
            joined = pa.concat_batches(pieces)
            del pieces  # at most two copies of the group at a time
            taken = joined.take(pa.array(inverse, type=pa.int64()))
        columns = list(taken.columns) + [pa.array(idx, type=pa.int64())]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def write_packed(
    directory: Path, source: pa.Table, parts: Sequence[np.ndarray], *, block_bytes: int = BLOCK_BYTES,
    file_bytes: int = FILE_BYTES, gather_bytes: int = GATHER_BYTES, progress: Callable[[int], None] | None = None,
) -> PackedIndex:
    """Write client ``c``'s rows ``source.take(parts[c])`` (plus ``row_id`` = ``parts[c]``) for every client,
    in order, into packed files under ``directory / DATA_DIR`` (which must exist and be empty); see the
    module docstring for the format. ``source``'s schema metadata is kept in every file. ``parts`` is a
    :class:`~fedray.data.client_index.ClientIndex` or a list of arrays; ``progress(rows)`` is called after
    each gathered group with the rows it wrote."""
    index = ClientIndex.from_parts(parts)
    n = len(index)
    starts = index.offsets
    schema = source.schema.append(pa.field("row_id", pa.int64())).with_metadata(source.schema.metadata)
    row_bytes = max(1.0, source.nbytes / max(1, source.num_rows)) + 8
    rows_per_block = int(block_bytes // row_bytes)
    if max(1, rows_per_block) >= 1 << 30:
        raise DataError(f"packed writer: block_bytes={block_bytes} makes batches too long for int32 row numbers")
    first_client, client_block, client_row = plan_blocks(None, rows_per_block, starts)
    block_start = starts[first_client]  # first row of every batch, in partition order
    block_end = np.append(block_start[1:], starts[n])
    group_of = block_start // max(1, int(gather_bytes // row_bytes))  # batches gathered together
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(group_of)) + 1, [len(first_client)]])
    sink = _PackSink(directory, schema, file_bytes)
    gather = _Gatherer(source, schema) if len(first_client) else None
    client_end = np.append(first_client[1:], n)
    try:
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if hi <= lo:
                continue
            c_lo, c_hi = int(first_client[lo]), int(client_end[hi - 1])
            assert gather is not None
            group = gather(index.rows_of(c_lo, c_hi))
            base = int(block_start[lo])
            for b in range(lo, hi):
                sink.add(group.slice(int(block_start[b]) - base, int(block_end[b] - block_start[b])))
            if progress is not None:
                progress(group.num_rows)
            del group
        files, blocks = sink.finish()
    except BaseException:
        sink.abort()
        raise
    # the global index of batch b: blocks are numbered file by file, each file adding its schema block
    # (and, before the next file, its end-of-stream block)
    rows = blocks.column("rows").to_numpy()
    batch_index = np.flatnonzero(rows > 0)
    if len(batch_index) != len(first_client):
        raise DataError(f"packed writer: {len(batch_index)} record batches written, {len(first_client)} planned")
    if len(batch_index) and int(batch_index[-1]) >= 1 << 31:
        raise DataError(f"packed writer: {len(rows)} blocks do not fit an int32 block number")
    for lo in range(0, n, 1 << 20):  # in place, a slice at a time: int32, -1 for an empty client
        part = client_block[lo:lo + (1 << 20)]
        placed = part >= 0
        part[placed] = batch_index[part[placed]]
    return PackedIndex(files=files, blocks=blocks, client_block=client_block, client_row=client_row)


# ----------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class BlockRef:
    """One block of a packed file: global ``index``, its file's ``path``, byte ``offset`` and ``nbytes``,
    ``rows`` and recorded ``crc32``."""

    index: int
    path: Path
    offset: int
    nbytes: int
    rows: int
    crc32: int


_RANDOM = getattr(mmap, "MADV_RANDOM", None)
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)


def _advise(mm: mmap.mmap, advice: int | None, *where: int) -> None:
    """``mm.madvise(advice, *where)`` where the platform has it: a hint, so a refusal changes nothing."""
    if advice is not None:
        try:
            mm.madvise(advice, *where)
        except (OSError, ValueError):
            pass


class _Mapped:
    """One packed file, memory-mapped read-only, with its (checked) schema."""

    __slots__ = ("mm", "buf", "schema")

    def __init__(self, mm: mmap.mmap, buf: pa.Buffer, schema: pa.Schema):
        self.mm, self.buf, self.schema = mm, buf, schema


class PackedFiles:
    """Read access to the packed files of a partition directory (see the module docstring)."""

    def __init__(self, root: Path, files: list[dict], blocks: pa.Table, check_reads: bool = True):
        self.root = root
        self.names = [str(f["name"]) for f in files]
        self.sizes = np.array([int(f["bytes"]) for f in files], dtype=np.int64)
        self.file = blocks.column("file").to_numpy().astype(np.int64)
        self.offset = blocks.column("offset").to_numpy().astype(np.int64)
        self.nbytes = blocks.column("nbytes").to_numpy().astype(np.int64)
        self.rows = blocks.column("rows").to_numpy().astype(np.int64)
        self.crc32 = blocks.column("crc32").to_numpy()
        self.check_reads = bool(check_reads)
        self._first = np.searchsorted(self.file, np.arange(len(self.names) + 1))  # first block of each file
        self._mapped: dict[int, _Mapped] = {}
        self._lock = threading.Lock()

    def check_index(self, where: str) -> None:
        """Raise :class:`DataError` (naming ``where``) unless the blocks tile every file in order."""
        nf, nb = len(self.names), len(self.file)
        if nf == 0 or (nb and (self.file.min() < 0 or self.file.max() >= nf)) or np.any(np.diff(self.file) < 0):
            raise DataError(f"{where}: block files are not 0..{nf - 1} in order")
        if np.any(self.nbytes <= 0) or np.any(self.rows < 0):
            raise DataError(f"{where}: a block with no bytes or negative rows")
        first, last = self._first[:-1], self._first[1:] - 1
        ends = self.offset + self.nbytes
        inner = np.ones(nb, dtype=bool)
        inner[first[first < nb]] = False
        if np.any(last < first) or np.any(self.offset[first] != 0) or np.any(ends[last] != self.sizes):
            raise DataError(f"{where}: blocks do not cover every file from byte 0 to its recorded size")
        if np.any(self.offset[inner] != ends[np.flatnonzero(inner) - 1]):
            raise DataError(f"{where}: blocks of a file are not contiguous")

    def path(self, f: int) -> Path:
        return self.root / self.names[f]

    def ref(self, b: int) -> BlockRef:
        return BlockRef(int(b), self.path(int(self.file[b])), int(self.offset[b]), int(self.nbytes[b]),
                        int(self.rows[b]), int(self.crc32[b]))

    def _map(self, f: int) -> _Mapped:
        """File ``f`` mapped and its schema block checked (once per process and file)."""
        hit = self._mapped.get(f)
        if hit is not None:
            return hit
        with self._lock:
            if (hit := self._mapped.get(f)) is not None:
                return hit
            path = self.path(f)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError as e:
                raise DataError(f"missing packed file {path}") from e
            except OSError as e:
                raise DataError(f"cannot open packed file {path}: {e}") from e
            try:
                size = os.fstat(fd).st_size
                if size != self.sizes[f] or size == 0:
                    raise DataError(f"corrupt or truncated packed file {path}: {size} bytes, the index records "
                                    f"{int(self.sizes[f])}")
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # keeps its own descriptor for size()
            finally:
                os.close(fd)
            _advise(mm, _RANDOM)  # a round's clients are scattered: no read-around (module docstring)
            buf = pa.py_buffer(mm)
            b = int(self._first[f])
            header = buf.slice(0, int(self.nbytes[b]))
            if buffer_crc32(header) != self.crc32[b]:
                raise DataError(f"corrupt schema block of packed file {path}: CRC-32 {buffer_crc32(header):08x}, "
                                f"the index records {int(self.crc32[b]):08x}")
            try:
                schema = pa.ipc.read_schema(pa.ipc.read_message(header))
            except (OSError, pa.ArrowException, ValueError) as e:
                raise DataError(f"corrupt schema block of packed file {path}: {e}") from e
            self._mapped[f] = hit = _Mapped(mm, buf, schema)
            return hit

    def schema(self) -> pa.Schema:
        """The rows' schema (that of file 0; every file has the same)."""
        return self._map(0).schema

    def _body(self, b: int, who: str, prefetch: bool = True) -> tuple[_Mapped, pa.Buffer]:
        """Block ``b``'s bytes in the mapping, after checking the file's size and (with ``check_reads``) the
        block's CRC-32. Errors name the file, the block and ``who`` (e.g. a client). ``prefetch``: ask for the
        block's pages first (``MADV_WILLNEED``); a check right after a read leaves it out."""
        f = int(self.file[b])
        m = self._map(f)
        size = m.mm.size()
        if size != self.sizes[f]:
            raise DataError(f"corrupt or truncated packed file {self.path(f)} ({who}): {size} bytes, the index "
                            f"records {int(self.sizes[f])}")
        offset, nbytes = int(self.offset[b]), int(self.nbytes[b])
        if prefetch:
            start = offset - offset % mmap.PAGESIZE
            _advise(m.mm, _WILLNEED, start, min(offset + nbytes, size) - start)  # the block's pages in one request
        body = m.buf.slice(offset, nbytes)
        if self.check_reads and (crc := buffer_crc32(body)) != self.crc32[b]:
            raise DataError(f"corrupt block {b} of {self.path(f)} ({who}): CRC-32 {crc:08x}, the index records "
                            f"{int(self.crc32[b]):08x} (content changed since it was written)")
        return m, body

    def check_block(self, b: int, who: str) -> None:
        """Check block ``b`` again (file size and, with ``check_reads``, CRC-32): a batch decoded from it is a
        view of the mapping, so rows that were in use while the file changed in place fail here."""
        self._body(b, who, prefetch=False)  # its pages were just read

    def batch(self, b: int, who: str) -> pa.RecordBatch:
        """Record batch ``b``, decoded zero-copy from the mapping after checking the file's size and (with
        ``check_reads``) the block's CRC-32. Errors name the file, the block and ``who`` (e.g. a client)."""
        m, body = self._body(b, who)
        f = int(self.file[b])
        try:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(body), m.schema)
        except (OSError, pa.ArrowException, ValueError) as e:
            raise DataError(f"corrupt block {b} of {self.path(f)} ({who}): {e}") from e
        if batch.num_rows != self.rows[b]:
            raise DataError(f"corrupt block {b} of {self.path(f)} ({who}): {batch.num_rows} rows, the index "
                            f"records {int(self.rows[b])}")
        return batch

    def verify(self, describe: Callable[[int], str], workers: int | None = None) -> None:
        """Check every file's size and every block's CRC-32 (streamed, :func:`check_file_blocks`). Raises
        :class:`DataError` naming the first damaged file and block (``describe(b)`` says what block ``b``
        holds) and how many are damaged."""

        def one(f: int) -> list[tuple[int, int, str]]:
            lo, hi = int(self._first[f]), int(self._first[f + 1])
            found = check_file_blocks(self.path(f), int(self.sizes[f]), self.nbytes[lo:hi], self.crc32[lo:hi])
            return [(f, -1 if k < 0 else lo + k, problem) for k, problem in found]

        if workers is None:
            cores = os.cpu_count() or 1
            workers = 1 if cores < 4 else min(4, cores // 2)
        files = range(len(self.names))
        if workers <= 1 or len(files) <= 1:
            bad = [x for f in files for x in one(f)]
        else:
            with ThreadPoolExecutor(max_workers=min(workers, len(files)), thread_name_prefix="fedray-verify") as pool:
                bad = [x for found in pool.map(one, files) for x in found]
        if not bad:
            return
        f, b, problem = bad[0]
        more = f" ({len(bad)} damaged blocks or files)" if len(bad) > 1 else ""
        if b < 0:
            raise DataError(f"damaged packed file {self.path(f)}: {problem}{more}")
        raise DataError(f"damaged block {b} of {self.path(f)} (bytes {int(self.offset[b])}.."
                        f"{int(self.offset[b] + self.nbytes[b])}, {describe(b)}): {problem}{more}")
