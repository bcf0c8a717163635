"""Benchmark FINCH (fedray.clustering.finch) on clustered 128-D data.

Prints, for 1k, 10k and 50k points: wall time, peak traced memory during the call (tracemalloc sees every
numpy buffer, including the matmul tiles, which torch writes into numpy-allocated arrays), the process's peak
RSS so far (includes the interpreter, torch and the input), the number of partitions and their cluster
counts.  No assertions.

    python bench/bench_finch.py [--sizes 1000 10000 50000] [--dim 128] [--distance cosine]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedray.clustering import finch  # noqa: E402


def clustered_data(n: int, dim: int, n_centers: int, seed: int = 0) -> np.ndarray:
    """``n`` points around ``n_centers`` random centres (unit-norm centres, noise std 0.05 per dimension)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_centers, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    assign = rng.integers(0, n_centers, size=n)
    return (centers[assign] + 0.05 * rng.standard_normal((n, dim))).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--distance", default="cosine", choices=["cosine", "euclidean"])
    args = parser.parse_args()

    finch(clustered_data(200, args.dim, 5), distance=args.distance)  # warm-up (imports, BLAS threads)
    print(f"FINCH benchmark: dim={args.dim}, distance={args.distance}")
    print(f"{'N':>7} {'centres':>7} {'time_s':>8} {'peak_traced_MB':>15} {'peak_rss_MB':>12} {'P':>3}  clusters")
    for n in args.sizes:
        n_centers = max(5, n // 500)
        X = clustered_data(n, args.dim, n_centers, seed=n)
        tracemalloc.start()
        t0 = time.perf_counter()
        result = finch(X, distance=args.distance)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n:>7} {n_centers:>7} {elapsed:>8.2f} {peak / 2**20:>15.1f} {rss_mb:>12.0f} "
            f"{len(result.partitions):>3}  {result.num_clusters}"
        )


if __name__ == "__main__":
    main()
