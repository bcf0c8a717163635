"""Shard checksums of the partition store: CRC-32 of a shard file's bytes.

Why CRC-32 (``zlib.crc32``): the checksum guards cached shards against accidental damage (a truncated
copy, a bad disk block, bytes overwritten by another program), not against an adversary, so a keyed
or cryptographic hash buys nothing. CRC-32 detects every burst error of up to 32 bits and any other
change with probability 1 - 2^-32, is in the standard library, and runs at about 2.9 GB/s on one core
here against 0.46 GB/s for ``hashlib.blake2b(digest_size=8)`` (64 MiB buffer, ``zlib`` 1.2.13). It
releases the GIL on large buffers, so with 4+ cores files are checked by a few threads in parallel
(on 2 cores, 2 threads measured slower than 1: see ``bench/bench_partition_verify.py``).

A shard's checksum is computed from the in-memory buffer that is written, so writing costs one extra
pass over bytes already in cache; checking a file streams it in 1 MiB reads (no whole-file copy).
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from .table import DataError

__all__ = ["CHECKSUM_NAME", "buffer_crc32", "check_shards", "file_crc32"]

CHECKSUM_NAME = "crc32"
_CHUNK = 1 << 20
_BATCH = 256  # files per thread task: amortises the task overhead over many small shards


def buffer_crc32(buf) -> int:
    """CRC-32 of a bytes-like object (``bytes``, ``memoryview``, ``pyarrow.Buffer``), as an unsigned int."""
    return zlib.crc32(buf) & 0xFFFFFFFF


def file_crc32(path: str | os.PathLike, expected_size: int | None = None) -> tuple[int, int | None]:
    """``(size, crc)`` of the file at ``path``, streamed in 1 MiB reads. When ``expected_size`` is
    given and the file's size differs, the file is not read and ``crc`` is ``None``.
    Raises ``OSError`` (e.g. ``FileNotFoundError``) as ``os.open`` does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if expected_size is not None and size != expected_size:
            return size, None
        crc, read = 0, 0
        while chunk := os.read(fd, _CHUNK):
            crc = zlib.crc32(chunk, crc)
            read += len(chunk)
        return read, crc & 0xFFFFFFFF
    finally:
        os.close(fd)


def check_shards(
    paths: Callable[[int], str], sizes: Sequence[int], crcs: Sequence[int], workers: int | None = None
) -> None:
    """Check the shards of clients ``0..len(sizes)-1`` (``paths(i)`` names client ``i``'s file) against
    their recorded sizes and CRC-32s. Raises :class:`DataError` naming the first client whose shard is
    missing, unreadable, of the wrong size or with the wrong checksum, its file, and how many shards
    are damaged. ``workers`` threads (default: 1 below 4 cores, else up to 4) share the files in
    batches; every file is checked, so the count is complete."""
    n = len(sizes)

    def batch(lo: int) -> list[tuple[int, str]]:
        bad = []
        for i in range(lo, min(n, lo + _BATCH)):
            want_size, want_crc = int(sizes[i]), int(crcs[i])
            try:
                size, crc = file_crc32(paths(i), want_size)
            except FileNotFoundError:
                bad.append((i, "missing"))
                continue
            except OSError as e:
                bad.append((i, f"unreadable ({e})"))
                continue
            if crc is None or size != want_size:
                bad.append((i, f"{size} bytes, the manifest records {want_size} (truncated or overwritten)"))
            elif crc != want_crc:
                bad.append((i, f"CRC-32 {crc:08x}, the manifest records {want_crc:08x} (same size, content changed)"))
        return bad

    starts = range(0, n, _BATCH)
    if workers is None:
        cores = os.cpu_count() or 1
        workers = 1 if cores < 4 else min(4, cores // 2)
    if workers <= 1 or len(starts) <= 1:
        bad = [b for lo in starts for b in batch(lo)]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(starts)), thread_name_prefix="fedray-verify") as pool:
            bad = [b for found in pool.map(batch, starts) for b in found]
    if bad:
        cid, problem = bad[0]
        more = ""
        if len(bad) > 1:
            listed = ", ".join(str(c) for c, _ in bad[:10]) + (", ..." if len(bad) > 10 else "")
            more = f" ({len(bad)} damaged shards: clients {listed})"
        raise DataError(f"damaged shard of client {cid}: {paths(cid)}: {problem}{more}")
