"""A partition's client index as two flat arrays: every client's train rows, client 0's first, and offsets.

A partitioner's result used to be a list of N index arrays. At ten million clients that list is ten million
Python objects (about 1 GB before any row) and every pass over it (sizes, the partition hash, label counts,
the packed writer) a Python loop of ten million steps. :class:`ClientIndex` keeps the same content as two
arrays: ``rows`` (client 0's rows, then client 1's, ... each client's in its partitioner's order) and
``offsets`` (int64, N + 1 entries, client ``c``'s rows are ``rows[offsets[c]:offsets[c + 1]]``).

``rows`` is int32 when a partitioner builds it so (row numbers below 2^31, :func:`row_dtype`: 4 bytes a row less
at ten million clients, 114 MiB of a writer's peak at 30 million rows), else int64; what the index hands out is
int64 either way. It is a ``Sequence`` of N int64 arrays (``index[c]``: a view of ``rows`` when they are int64, a
copy of the client's rows when int32; ``len``, iteration), so code
written for a list of arrays reads it unchanged; code that is linear in the clients uses :attr:`sizes`,
:meth:`rows_of`, :meth:`chunks` and :meth:`owners` instead. :meth:`from_owner` builds one from a per-row owner
array exactly as the partitioners' ``np.split`` of a stable sort did, with one sort and no per-client object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from .table import DataError

__all__ = ["CHUNK_ROWS", "PASS_ROWS", "ClientIndex", "class_count_chunks", "counts_of", "group_stable", "label_stats",
           "row_dtype", "rows_by_class"]

CHUNK_ROWS = 1 << 22  # rows per pass of the chunked helpers (sizes, counts, hashing): about 32 MB of int64
PASS_ROWS = 1 << 18  # items per pass of the counting sort's placement (group_stable): its arrays, about 12 MB


def row_dtype(n: int) -> np.dtype:
    """int32 when the numbers ``0 .. n - 1`` (row numbers, client ids) fit it, else int64: half the bytes of
    the temporaries of the partitioners at ten million clients; results stay int64."""
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)


def group_stable(keys: np.ndarray, num_keys: int, *, at: np.ndarray | None = None, dtype=None,
                 what: str = "group_stable: keys", pass_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A stable counting sort by key, in linear memory: ``(grouped, offsets)`` (``offsets``: int64, ``num_keys + 1``
    entries) with ``grouped[offsets[k]:offsets[k + 1]]`` the items whose key is ``k``, in ascending item order.

    Items are ``i = 0 .. len(keys) - 1`` with key ``keys[i]`` and value ``i``, or, with ``at``, ``i = 0 ..
    len(at) - 1`` with key ``keys[at[i]]`` and value ``at[i]``; items with key -1 are left out. So ``grouped`` is
    ``np.argsort(keys, kind="stable")`` without the -1 items (``at[np.argsort(keys[at], kind="stable")]`` with
    ``at``): the same array, whatever the algorithm, since a stable order is unique. ``dtype``: of ``grouped``
    (default: ``at``'s, else :func:`row_dtype`). Two passes of ``pass_rows`` items (:data:`PASS_ROWS`): one counts the keys, one
    sorts each pass's items stably by key and puts them after the items of the same key of the passes before
    (each key's cursor is its entry of ``offsets``, which ends as its end). Memory besides ``grouped`` and
    ``offsets``: a pass's arrays and, while counting, one ``num_keys``-long count."""
    keys = np.asarray(keys)
    n_items = len(at) if at is not None else len(keys)
    out_dtype = np.dtype(dtype) if dtype is not None else (at.dtype if at is not None else row_dtype(n_items))
    step = max(1, int(PASS_ROWS if pass_rows is None else pass_rows))

    def key_pass(lo: int, hi: int) -> np.ndarray:
        return keys[lo:hi] if at is None else keys[at[lo:hi]]

    counts = np.zeros(num_keys + 1, dtype=np.int64)  # counts[0]: the items with key -1
    count_step = max(step, CHUNK_ROWS)
    for lo in range(0, n_items, count_step):
        part = key_pass(lo, lo + count_step)
        if part.size and (int(part.min()) < -1 or int(part.max()) >= num_keys):
            raise DataError(f"{what} must lie in [-1, {num_keys}), found [{int(part.min())}, {int(part.max())}]")
        counts += np.bincount(part.astype(np.int64) + 1, minlength=num_keys + 1)
        del part
    dropped = int(counts[0])
    offsets = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(counts[1:], out=offsets[1:])
    offsets[1:] -= counts[1:]  # offsets[k + 1]: key k's first place; it advances to key k's end
    del counts
    grouped = np.empty(n_items - dropped, dtype=out_dtype)
    cursor = offsets[1:]
    for lo in range(0, n_items, step):
        k = key_pass(lo, lo + step)
        sel = np.flatnonzero(k >= 0) if dropped else None
        if sel is not None:
            k = k[sel]
        if not k.size:
            continue
        shift = max(1, (k.size - 1).bit_length())
        if num_keys <= 1 << 16:  # numpy sorts 8- and 16-bit keys stably by radix, in linear time
            order = np.argsort(k.astype(np.uint8 if num_keys <= 1 << 8 else np.uint16), kind="stable")
            ks = k[order]
        else:  # (key, place in the pass) is unique: its sort is the stable order
            if (num_keys - 1).bit_length() + shift > 62:
                raise DataError(f"group_stable: {num_keys} keys and passes of {k.size} items do not fit 63 bits")
            comp = k.astype(np.int64) << shift
            comp |= np.arange(k.size)
            comp.sort()
            order, ks = comp & ((1 << shift) - 1), comp >> shift
            del comp
        del k
        if sel is not None:
            order = sel[order]
        order += lo  # the items, in key order (stable)
        starts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        starts = np.concatenate([np.zeros(1, dtype=starts.dtype), starts])
        lens = np.diff(np.append(starts, ks.size))
        first = ks[starts]
        del ks
        dest = np.repeat(cursor[first] - starts, lens)
        dest += np.arange(dest.size)
        grouped[dest] = order if at is None else at[order]
        cursor[first] += lens
    return grouped, offsets


def rows_by_class(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, rows, offsets)``: the classes present in ``labels`` (non-negative integers) in ascending order,
    and the rows of the ``i``-th of them, ``rows[offsets[i]:offsets[i + 1]]``, ascending: ``np.flatnonzero(labels
    == classes[i])`` for every class in one counting sort (:func:`group_stable`; ``rows`` int32 below 2^31 rows)."""
    labels = np.asarray(labels)
    top = int(labels.max()) if labels.size else -1
    if top < max(1 << 20, labels.size):  # the labels index a count of their own
        rows, offsets = group_stable(labels, top + 1, what="rows_by_class: labels")
        present = np.flatnonzero(offsets[1:] > offsets[:-1])
        return present, rows, np.append(offsets[present], offsets[-1])
    classes, inverse = np.unique(labels, return_inverse=True)
    rows, offsets = group_stable(inverse.reshape(-1), classes.size, what="rows_by_class: labels")
    return classes, rows, offsets


class ClientIndex(Sequence):
    """Client ``c``'s rows are ``rows[offsets[c]:offsets[c + 1]]`` (module docstring)."""

    __slots__ = ("rows", "offsets")

    def __init__(self, rows: np.ndarray, offsets: np.ndarray):
        rows = np.asarray(rows)
        rows = np.ascontiguousarray(rows, dtype=np.int32 if rows.dtype == np.int32 else np.int64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if rows.ndim != 1 or offsets.ndim != 1 or offsets.size < 1:
            raise DataError(f"ClientIndex: rows and offsets must be 1-D with offsets non-empty, got shapes "
                            f"{rows.shape} and {offsets.shape}")
        if offsets[0] != 0 or offsets[-1] != rows.size:
            raise DataError(f"ClientIndex: offsets must run from 0 to len(rows)={rows.size}, got "
                            f"{int(offsets[0])}..{int(offsets[-1])}")
        if offsets.size > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
            raise DataError("ClientIndex: offsets must be non-decreasing (a client cannot have a negative size)")
        self.rows = rows
        self.offsets = offsets

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_parts(cls, parts: Sequence[np.ndarray]) -> "ClientIndex":
        """The index of a list of per-client arrays (or the index itself, as it is)."""
        if isinstance(parts, ClientIndex):
            return parts
        n = len(parts)
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        rows = np.empty(int(offsets[-1]), dtype=np.int64)
        for c, p in enumerate(parts):
            rows[offsets[c]:offsets[c + 1]] = np.asarray(p).reshape(-1)
        return cls(rows, offsets)

    @classmethod
    def from_sizes(cls, rows: np.ndarray, sizes: np.ndarray) -> "ClientIndex":
        """Consecutive runs of ``rows``, ``sizes[c]`` of them for client ``c``."""
        sizes = np.asarray(sizes, dtype=np.int64)
        offsets = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(rows, offsets)

    @classmethod
    def from_owner(cls, owner: np.ndarray, num_clients: int) -> "ClientIndex":
        """Client ``k`` gets the rows ``r`` with ``owner[r] == k`` in ascending order; rows with owner -1 are
        left out: the same arrays as splitting the ascending assigned rows by a stable sort of their owners. A
        counting sort (:func:`group_stable`): besides the result (4 bytes a row below 2^31 rows, and 8 a client), a
        pass's arrays, never a sort of every row at once; ``owner`` may be any integer dtype (int32 at ten million
        clients)."""
        owner = np.asarray(owner)
        if owner.ndim != 1:
            raise DataError(f"ClientIndex.from_owner: owner must be 1-D, got shape {owner.shape}")
        if not np.issubdtype(owner.dtype, np.integer):
            owner = owner.astype(np.int64)
        rows, offsets = group_stable(owner, num_clients, dtype=row_dtype(owner.size),
                                     what="ClientIndex.from_owner: owners")
        return cls(rows, offsets)

    # -- the Sequence of arrays ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self.offsets.size - 1

    @overload
    def __getitem__(self, c: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, c: slice) -> "ClientIndex": ...

    def __getitem__(self, c):
        n = len(self)
        if isinstance(c, slice):
            lo, hi, step = c.indices(n)
            if step != 1:
                raise DataError("ClientIndex: slices must have step 1")
            hi = max(lo, hi)
            return ClientIndex(self.rows[self.offsets[lo]:self.offsets[hi]], self.offsets[lo:hi + 1] - self.offsets[lo])
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"ClientIndex indices must be integers or slices, not {type(c).__name__}")
        c = int(c)
        if c < 0:
            c += n
        if not 0 <= c < n:
            raise IndexError(f"client {c} out of range [0, {n})")
        return self.rows[self.offsets[c]:self.offsets[c + 1]].astype(np.int64, copy=False)

    def __iter__(self) -> Iterator[np.ndarray]:
        rows, off = self.rows, self.offsets.tolist()
        for c in range(len(off) - 1):
            yield rows[off[c]:off[c + 1]].astype(np.int64, copy=False)

    def __repr__(self) -> str:
        return f"ClientIndex({len(self)} clients, {self.rows.size} rows)"

    # -- flat access ---------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.rows.size)

    @property
    def sizes(self) -> np.ndarray:
        """Rows per client (int64, a new array)."""
        return np.diff(self.offsets)

    def rows_of(self, lo: int, hi: int) -> np.ndarray:
        """The rows of clients ``lo .. hi - 1``, one after the other (int64: a view of int64 ``rows``, a copy of
        int32 ones)."""
        return self.rows[self.offsets[lo]:self.offsets[hi]].astype(np.int64, copy=False)

    def owners(self, lo: int, hi: int) -> np.ndarray:
        """The client of each row of :meth:`rows_of` ``(lo, hi)`` (int64)."""
        return np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(self.offsets[lo:hi + 1]))

    def chunks(self, rows_per_chunk: int = CHUNK_ROWS, max_clients: int | None = None) -> Iterator[tuple[int, int]]:
        """Consecutive client ranges ``(lo, hi)`` covering every client, each of about ``rows_per_chunk`` rows
        (a larger client is a range of its own) and at most ``max_clients`` clients."""
        n = len(self)
        step = max(1, int(max_clients or n or 1))
        lo = 0
        while lo < n:
            hi = int(np.searchsorted(self.offsets, self.offsets[lo] + max(1, int(rows_per_chunk)), side="right")) - 1
            hi = min(n, max(hi, lo + 1), lo + step)
            yield lo, hi
            lo = hi


def counts_of(values: np.ndarray, index: ClientIndex, lo: int, hi: int, k: int) -> np.ndarray:
    """``(hi - lo, k)`` int64: how often each value in ``[0, k)`` occurs among the rows of clients ``lo .. hi - 1``
    (``values``: one per train row)."""
    lab = values[index.rows_of(lo, hi)].astype(np.int64, copy=False)
    if lab.size and (lab.min() < 0 or lab.max() >= k):
        raise DataError(f"label_stats: labels must lie in [0, {k}), found [{lab.min()}, {lab.max()}]")
    own = index.owners(lo, hi) - lo
    return np.bincount(own * k + lab, minlength=(hi - lo) * k).reshape(hi - lo, k).astype(np.int64, copy=False)


def class_count_chunks(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int,
                       rows_per_chunk: int = CHUNK_ROWS, max_clients: int = 1 << 20) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(lo, hi, counts)`` for consecutive client ranges: ``counts`` the ``(hi - lo, num_classes)`` int64 class
    counts of clients ``lo .. hi - 1`` (memory: a chunk's rows and counts, never all clients' at once)."""
    index = ClientIndex.from_parts(parts)
    labels = np.asarray(labels)
    for lo, hi in index.chunks(rows_per_chunk, max_clients):
        yield lo, hi, counts_of(labels, index, lo, hi, num_classes)


def label_stats(labels: np.ndarray, parts: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Class counts per client: an ``(N, num_classes)`` int64 array, row k = bincount of client k's labels."""
    index = ClientIndex.from_parts(parts)
    out = np.zeros((len(index), num_classes), dtype=np.int64)
    for lo, hi, counts in class_count_chunks(labels, index, num_classes):
        out[lo:hi] = counts
    return out
