#!/usr/bin/env python
"""Benchmark: a synthetic population of millions of clients, generated, partitioned, written, reused and read.

Prints figures; makes no assertions. The source is ``synthetic`` with every client holding exactly ``--samples``
rows (``min_samples = max_samples_per_client = samples``) of ``--dimension`` features, ``--train-fraction`` of
them train and the first ``--max-test`` test rows kept; the partition is ``natural`` (one fedray client per
generating client). Stages, each timed, with the process's peak resident memory (VmHWM) after it:

1. generate the data set (``load_source``);
2. partition + hash alone (``partition_indices``, ``partition_hash``);
3. build the partition from scratch (partition, hash, packed files, manifest, client index);
4. reuse it (partition, hash, every block's and the manifest's CRC-32, open);
5. the statistics ``fedray partition`` prints and writes (summary, clients.csv, the two plots);
6. open it in a fresh process (what the coordinator and every worker do) and read clients there: seconds,
   private memory (RssAnon) before and after, read latency;
7. with ``--partitioners``: each other partitioner on the same labels, in a process of its own (seconds, peak).

``--driver-peak iid,dirichlet,...`` instead measures what a run's driver does with each partitioner at this size,
each in a process of its own: generate the data set, then build the partition from scratch (partitioner, hash,
packed files, manifest, client index) with the data set held beside it; prints seconds and the peak RSS (VmHWM)
after each stage (issue 30's target: a driver peak of at most 2 GB). ``--cache`` reads the data set from the user
cache instead of generating it in each child (minutes saved a partitioner at ten million clients).

Usage (outputs outside the repository; 10 million clients take about 25 minutes on 2 busy cores)::

    nice -n 10 python bench/bench_scale_partition.py --clients 10000000 --root /work/scale/p10m \\
        --partitioners iid,dirichlet,shards,classes_per_client
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedray.data.partition import partition_indices  # noqa: E402
from fedray.data.spec_hash import partition_hash, resolve_spec  # noqa: E402


def _status(key: str) -> float:
    """``key`` of /proc/self/status in MiB."""
    m = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def _line(stage: str, seconds: float, extra: str = "") -> None:
    print(f"{stage:<34} {seconds:9.1f} s   peak RSS {_status('VmHWM'):8.0f} MiB   private now {_status('RssAnon'):7.0f} MiB"
          + (f"   {extra}" if extra else ""), flush=True)


def _one_partitioner(args) -> int:
    """Child mode: one partitioner on the saved labels; prints a JSON line."""
    labels = np.load(args.labels)
    base = _status("VmHWM")
    params = json.loads(args.params)
    t = time.perf_counter()
    ix = partition_indices(args.one, labels, num_clients=args.clients, seed=0, **params)
    secs = time.perf_counter() - t
    print(json.dumps({"seconds": secs, "peak_mb": _status("VmHWM"), "labels_mb": labels.nbytes / 2**20,
                      "before_mb": base, "rows": ix.num_rows, "empty": int((ix.sizes == 0).sum())}))
    return 0


def _open_child(args) -> int:
    """Child mode: open the partition as a coordinator or worker does and read clients; prints a JSON line."""
    from fedray.data.store import PartitionStore

    before = _status("RssAnon")
    t = time.perf_counter()
    st = PartitionStore.open(args.open)
    t_open = time.perf_counter() - t
    rng = np.random.default_rng(0)
    cids = rng.integers(0, st.num_clients, 2000)
    st.client_arrays(int(cids[0]))
    times = []
    for c in cids.tolist():
        t = time.perf_counter()
        st.client_arrays(c)
        times.append(time.perf_counter() - t)
    from fedray.engine.sampling import sample_clients

    t = time.perf_counter()
    for r in range(20):
        sample_clients(st.sizes, 10_000, 0, r + 1)
    t_sample = (time.perf_counter() - t) / 20
    print(json.dumps({"open_s": t_open, "anon_before_mb": before, "anon_after_mb": _status("RssAnon"),
                      "rss_mb": _status("VmRSS"), "read_median_ms": 1e3 * float(np.median(times)),
                      "read_mean_ms": 1e3 * float(np.mean(times)), "sample_10k_ms": 1e3 * t_sample}))
    return 0


_PARAMS = {"dirichlet": {"alpha": 0.3}, "shards": {"shards_per_client": 2}, "classes_per_client": {"classes": 2}}


def _driver_child(args) -> int:
    """Child mode: data set, then the partition ``args.build`` built beside it; prints a JSON line."""
    import tempfile

    from fedray.data.sources import load_source
    from fedray.data.store import build_partition

    n, s = args.clients, args.samples
    t = time.perf_counter()
    bundle = load_source("synthetic", num_clients=n, min_samples=s, max_samples_per_client=s, dimension=args.dimension,
                         train_fraction=args.train_fraction, max_test_samples=args.max_test, max_total_samples=n * s,
                         cache=args.cache)
    gen_s, gen_peak, gen_private = time.perf_counter() - t, _status("VmHWM"), _status("RssAnon")
    spec = {"name": args.build, "num_clients": n, "seed": 0, **_PARAMS.get(args.build, {})}
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        t = time.perf_counter()
        build_partition(bundle, spec, Path(tmp), overwrite=True)
        build_s = time.perf_counter() - t
    print(json.dumps({"generate_s": gen_s, "generate_peak_mb": gen_peak, "generate_private_mb": gen_private,
                      "build_s": build_s, "peak_mb": _status("VmHWM")}))
    return 0


def _driver_peaks(args) -> int:
    for name in [x for x in args.driver_peak.split(",") if x]:
        argv = ["--build", name, "--clients", str(args.clients), "--samples", str(args.samples),
                "--dimension", str(args.dimension), "--train-fraction", str(args.train_fraction),
                "--max-test", str(args.max_test)] + (["--root", str(args.root)] if args.root else []) \
            + (["--cache"] if args.cache else [])
        got = _child(argv)
        print(f"driver with {name:<20} {'load' if args.cache else 'generate'} {got['generate_s']:6.1f} s (peak "
              f"{got['generate_peak_mb']:6.0f} MiB, private after {got['generate_private_mb']:6.0f} MiB), build "
              f"{got['build_s']:6.1f} s, peak RSS {got['peak_mb']:6.0f} MiB = {got['peak_mb'] * 2**20 / 1e9:.3f} GB", flush=True)
    return 0


def _child(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _disk(path: Path) -> dict[str, int]:
    files = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    return {"data": sum(v for k, v in files.items() if k.startswith("data/")),
            "clients.arrow": files.get("clients.arrow", 0), "manifest.parquet": files.get("manifest.parquet", 0),
            "blocks.parquet": files.get("blocks.parquet", 0), "all": sum(files.values())}


def _stats(st, root: Path) -> None:
    from fedray.data.stats import (format_summary, partition_summary, plot_client_summary, plot_label_distribution,
                                   write_client_table)

    t = time.perf_counter()
    summary = partition_summary(st)
    _line("5a. summary", time.perf_counter() - t)
    t = time.perf_counter()
    csv = write_client_table(st, root / "clients.csv")
    _line("5b. clients.csv", time.perf_counter() - t, f"{csv.stat().st_size / 2**20:.0f} MiB")
    t = time.perf_counter()
    plot_client_summary(st, root / "client_summary.png")
    plot_label_distribution(st, root / "label_distribution.png")
    _line("5c. plots", time.perf_counter() - t)
    print(format_summary(summary))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--samples", type=int, default=4, help="rows per generating client (train + test)")
    ap.add_argument("--train-fraction", type=float, default=0.75)
    ap.add_argument("--dimension", type=int, default=8)
    ap.add_argument("--max-test", type=int, default=100_000)
    ap.add_argument("--root", type=Path, required=False, help="partition cache (kept); default: a temporary folder")
    ap.add_argument("--partitioners", default="", help="comma-separated partitioners timed on the same labels")
    ap.add_argument("--skip-stats", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--labels", help=argparse.SUPPRESS)
    ap.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--open", help=argparse.SUPPRESS)
    ap.add_argument("--build", help=argparse.SUPPRESS)
    ap.add_argument("--driver-peak", default="", help="comma-separated partitioners: a driver's peak with each (above)")
    ap.add_argument("--cache", action="store_true", help="--driver-peak: read the data set from the user cache "
                    "($FEDRAY_CACHE_DIR; written by the first such run), as data.params.cache: true does, instead of "
                    "generating it in every child")
    args = ap.parse_args(argv)
    if args.build:
        return _driver_child(args)
    if args.driver_peak:
        return _driver_peaks(args)
    if args.one:
        return _one_partitioner(args)
    if args.open:
        return _open_child(args)
    return _run(args)


def _run(args) -> int:
    from fedray.data.sources import load_source
    from fedray.data.store import build_partition

    root = args.root or Path(f"/tmp/fedray-scale-{args.clients}")
    root.mkdir(parents=True, exist_ok=True)
    n, s = args.clients, args.samples
    print(f"synthetic: {n:,} clients x {s} rows of {args.dimension} float32 features, train_fraction "
          f"{args.train_fraction}, first {args.max_test:,} test rows kept; natural partition; cache {root}", flush=True)
    t = time.perf_counter()
    bundle = load_source("synthetic", num_clients=n, min_samples=s, max_samples_per_client=s, dimension=args.dimension,
                         train_fraction=args.train_fraction, max_test_samples=args.max_test, max_total_samples=n * s)
    labels = bundle.train.labels
    raw = bundle.train.images().nbytes + labels.nbytes
    _line("1. generate", time.perf_counter() - t, f"{labels.size:,} train rows, raw x + y {raw / 2**20:,.0f} MiB")
    spec = {"name": "natural", "num_clients": n, "seed": 0}
    t = time.perf_counter()
    ix = partition_indices("natural", labels, num_clients=n, seed=0,
                           natural=bundle.train.table.column("client").to_numpy())
    t_part = time.perf_counter() - t
    h = partition_hash(bundle.fingerprint, resolve_spec(spec), ix)
    _line("2. natural partition + hash", time.perf_counter() - t, f"partition {t_part:.1f} s, hash {h}")
    del ix
    t = time.perf_counter()
    st = build_partition(bundle, spec, root, overwrite=True)
    _line("3. build (from scratch)", time.perf_counter() - t)
    t = time.perf_counter()
    st = build_partition(bundle, spec, root)
    _line("4. reuse (CRC-32 of every block)", time.perf_counter() - t)
    disk = _disk(st.path)
    print(f"on disk: {disk['all'] / 2**20:,.0f} MiB = {disk['all'] / raw:.2f} x the raw train arrays "
          f"({', '.join(f'{k} {v / 2**20:,.0f} MiB' for k, v in disk.items() if k != 'all')})", flush=True)
    if not args.skip_stats:
        _stats(st, root)
    got = _child(["--open", str(st.path)])
    print(f"6. open in a fresh process: {got['open_s']:.2f} s, private memory {got['anon_before_mb']:.0f} -> "
          f"{got['anon_after_mb']:.0f} MiB (RSS {got['rss_mb']:.0f} MiB, mostly mapped pages); a client's rows: median "
          f"{got['read_median_ms']:.3f} ms, mean {got['read_mean_ms']:.3f} ms; sampling 10,000 clients "
          f"{got['sample_10k_ms']:.2f} ms", flush=True)
    _partitioners(args, labels, root)
    return 0


def _partitioners(args, labels: np.ndarray, root: Path) -> None:
    names = [x for x in args.partitioners.split(",") if x]
    if not names:
        return
    path = root.parent / f"{root.name}-labels.npy"
    np.save(path, labels)
    params = _PARAMS
    try:
        for name in names:
            got = _child(["--one", name, "--labels", str(path), "--clients", str(args.clients),
                          "--params", json.dumps(params.get(name, {}))])
            print(f"7. {name:<20} {got['seconds']:8.1f} s   peak RSS {got['peak_mb']:7.0f} MiB (labels alone "
                  f"{got['labels_mb']:.0f} MiB)   {got['rows']:,} rows, {got['empty']:,} empty clients", flush=True)
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
