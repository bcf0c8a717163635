"""Cost of fedray's aggregation choice: an ordered float32 fold vs the order-independent alternatives.

    .venv/bin/python bench/bench_aggregate.py                   # FedAvg CNN size (1,663,370 params)
    .venv/bin/python bench/bench_aggregate.py --params 11000000 --clients 10 100

The coordinator folds client updates in *sampled order* (``acc = a_1 w_1``, then ``acc += a_k w_k``,
float32), holding early arrivals in a bounded reorder buffer (fedray/engine/coordinator.py). This
prints, per client update, what that fold costs next to:

- ``arrival``: the same float32 fold in arrival order (what most platforms do; not reproducible: float
  addition is not associative, so the result depends on which client finished first);
- ``float64``: accumulating in float64 and rounding once (still order-dependent in its last bits, only
  less often);
- ``fixed-point``: exact int64 accumulation of ``round(a_k w_k * 2**s)`` (order-independent, so no
  reorder buffer is needed, but the result differs from plain FedAvg arithmetic and overflows for large
  scales or many clients).

It also checks which of them give bit-identical results for two arrival orders, and the memory each
needs (held updates). No assertions: figures only. Single thread, as the coordinator runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def _h(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:12]


def fold_f32(updates, coeffs, order):
    acc = None
    for i in order:
        if acc is None:
            acc = updates[i] * np.float32(coeffs[i])
        else:
            acc += updates[i] * np.float32(coeffs[i])
    return acc


def fold_f64(updates, coeffs, order):
    acc = np.zeros(updates[0].shape, np.float64)
    for i in order:
        acc += updates[i].astype(np.float64) * coeffs[i]
    return acc.astype(np.float32)


def fold_fixed(updates, coeffs, order, shift=24):
    acc = np.zeros(updates[0].shape, np.int64)
    scale = float(1 << shift)
    for i in order:
        acc += np.rint(updates[i].astype(np.float64) * (coeffs[i] * scale)).astype(np.int64)
    return (acc / scale).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=int, default=1_663_370, help="model size (default: FedAvg CNN)")
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50], help="updates per round")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    mb = args.params * 4 / 2**20
    print(f"model: {args.params:,} float32 params ({mb:.1f} MB per update), 1 thread")
    print("| updates | method | ms per update | identical for two arrival orders | updates held |")
    print("|---|---|---|---|---|")
    for k in args.clients:
        base = rng.standard_normal(args.params).astype(np.float32) * 0.05
        updates = [base + rng.standard_normal(args.params).astype(np.float32) * 1e-3 for _ in range(k)]
        sizes = rng.integers(20, 200, size=k)
        coeffs = sizes / sizes.sum()
        order_a = list(range(k))
        order_b = list(rng.permutation(k))
        rows = {
            "ordered fold (fedray)": (lambda o: fold_f32(updates, coeffs, order_a), "yes, by construction",
                                      "reorder window (2 x workers x task size)"),
            "arrival-order float32": (lambda o: fold_f32(updates, coeffs, o), None, "1"),
            "float64 accumulate": (lambda o: fold_f64(updates, coeffs, o), None, "1"),
            "fixed-point int64 (2^24)": (lambda o: fold_fixed(updates, coeffs, o), None, "1"),
        }
        for name, (fn, same, held) in rows.items():
            best = float("inf")
            for _ in range(args.reps):
                t = time.perf_counter()
                ra = fn(order_a)
                best = min(best, time.perf_counter() - t)
            if same is None:
                same = "yes" if _h(ra) == _h(fn(order_b)) else "no"
            print(f"| {k} | {name} | {best / k * 1e3:.2f} | {same} | {held} |")
        ref = fold_f64(updates, coeffs, order_a)
        err = float(np.abs(fold_f32(updates, coeffs, order_a) - ref).max())
        print(f"| {k} | (max abs difference, ordered float32 vs float64) | {err:.2e} | | |")


if __name__ == "__main__":
    main()
