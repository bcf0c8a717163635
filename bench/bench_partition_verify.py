#!/usr/bin/env python
"""Benchmark: what checking a cached packed partition costs (size of every file + CRC-32 of every block).

Prints a table; makes no assertions on time. Usage::

    python bench/bench_partition_verify.py [--repeats 5] [--reads 500] [--synthetic-clients 10000]

Partitions: mnist5k (4,000 train rows, dirichlet alpha=0.3) with 100 and 1,000 clients, and the
``synthetic`` source with N generating clients partitioned ``natural`` into N clients. For each: packed
files, blocks and bytes; ``open`` (meta, manifest index and block index, no data); ``verify_blocks`` with 1,
2 and 4 threads (threads share the files; best of ``--repeats``, files in the page cache, as for a cache
reused by the next run; a cold cache adds the disk read of the bytes listed); the CRC-32 the writer adds
(one pass over the bytes, in memory); and the per-read cost of the CRC-32 check of the block a client's rows
lie in (mean over ``--reads`` reads of clients 0, 1, ..., without and with ``check_reads``), next to the
cost of one float32 pass over the same images, the least a training step does with them.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedray.data.checksum import buffer_crc32  # noqa: E402
from fedray.data.sources import load_source  # noqa: E402
from fedray.data.store import PartitionStore, build_partition  # noqa: E402


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _read_mean(st: PartitionStore, reads: int, to_float: bool = False) -> float:
    """Mean seconds of one ``client_arrays`` (clients 0, 1, ...), with ``to_float`` also the one pass
    over the images that every training step makes at least (uint8/float32 -> float32)."""
    cids = [i % st.num_clients for i in range(reads)]
    st.client_arrays(cids[0])
    times = []
    for cid in cids:
        t = time.perf_counter()
        images, _ = st.client_arrays(cid)
        if to_float:
            np.array(images, dtype=np.float32, copy=True)
        times.append(time.perf_counter() - t)
    return statistics.mean(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reads", type=int, default=500)
    ap.add_argument("--synthetic-clients", type=int, default=10_000)
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="fedray-bench-verify-"))
    mnist = load_source("mnist5k")
    k = args.synthetic_clients
    synthetic = load_source("synthetic", num_clients=k)
    cases = [
        ("mnist5k dirichlet", mnist, {"name": "dirichlet", "num_clients": 100, "seed": 0, "alpha": 0.3}),
        ("mnist5k dirichlet", mnist, {"name": "dirichlet", "num_clients": 1000, "seed": 0, "alpha": 0.3}),
        ("synthetic natural", synthetic, {"name": "natural", "num_clients": k, "seed": 0}),
    ]
    ms = lambda s: f"{s * 1e3:8.1f}"  # noqa: E731
    us = lambda s: f"{s * 1e6:8.1f}"  # noqa: E731
    print(f"{'partition':<18} {'clients':>7} {'files':>5} {'blocks':>6} {'MiB':>6} {'build ms':>8} {'open ms':>8} {'verify ms 1t':>12} "
          f"{'2t':>8} {'4t':>8} {'crc@write':>9} {'read us':>8} {'+crc us':>8} {'+f32 us':>8}")
    try:
        for label, bundle, spec in cases:
            t = time.perf_counter()
            st = build_partition(bundle, spec, root, overwrite=True)
            t_build = time.perf_counter() - t
            files = st.files
            nbytes = sum(p.stat().st_size for p in files)
            blocks = len(pq.read_table(st.path / "blocks.parquet"))
            t_open = _best(lambda: PartitionStore.open(st.path), args.repeats)
            t_verify = {w: _best(lambda: st.verify_blocks(workers=w), args.repeats) for w in (1, 2, 4)}
            blobs = [p.read_bytes() for p in files]
            t_crc = _best(lambda: [buffer_crc32(b) for b in blobs], args.repeats)
            blobs.clear()
            plain = PartitionStore.open(st.path, check_reads=False)
            t_read = _read_mean(plain, args.reads)
            t_read_crc = _read_mean(st, args.reads)
            t_read_f32 = _read_mean(plain, args.reads, to_float=True)
            print(f"{label:<18} {st.num_clients:>7,} {len(files):>5} {blocks:>6} {nbytes / 2**20:>6.1f} {ms(t_build)} {ms(t_open)} "
                  f"{ms(t_verify[1]):>12} {ms(t_verify[2])} {ms(t_verify[4])} {ms(t_crc):>9} "
                  f"{us(t_read)} {us(t_read_crc)} {us(t_read_f32)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
