#!/usr/bin/env python
"""Benchmark: fedray, pfl-research and Flower on the scale curves' points, side by side in one invocation (issue 30
item 5).

Prints figures; makes no assertions. For each ``P:K`` point, in turn (so drift in others' load hits every platform
of a point alike):

- **fedray**: ``fedray scale`` of ``jobs/configs/scale_curves.yaml`` restricted to that one point (the sweep file
  of ``bench_scale_rounds.py --points``, run by its ``run_sweep``): the synthetic clients (4 rows of 8 features, 3
  of them train), ``mlp`` with ``hidden: [64]``, 2 workers, batch 10, lr 0.05, 1 local epoch, 3 rounds; its
  ``client_updates_per_s`` (rounds 2..R, evaluation seconds left out).
- **pfl-research** (``bench/workload_pfl.py --workload scale-P-K-R`` in ``bench/.pfl-venv``, made as
  ``bench_workload.py --pfl`` makes it; one process, 1 torch thread) and **Flower** (``bench/workload_flower.py``
  in ``bench/.flower-venv``: P SuperNodes, 2 Ray actors of 1 CPU; only points with P <= ``--flower-max-population``,
  default 100,000: each SuperNode costs Flower about 10.7 us CPU and 1.58 KiB before round 1, docs/scaling.md)
  read the same arrays: fedray's ``synthetic`` source with the scale file's ``data.params`` at ``num_clients: P``
  (the arrays the point's fedray run trains on, read from fedray's cache, ``FEDRAY_CACHE_DIR``), written once per
  point as an ``.npz``. Same model, initial weights from ``torch.manual_seed(0)``, batch 10, lr 0.05, 1 epoch,
  the same rounds; updates/s over rounds 2..R (``sum K / sum of their seconds``; neither peer evaluates inside a
  round). Every client holds exactly 3 training rows, so an update is the same work on every platform; the
  sampled clients are the peers' own draw (``default_rng([0, round])``), not fedray's.

Each peer run is a subprocess under ``bench_workload.run_one`` with ``--run-timeout`` seconds: a failure or a
timeout is reported and left out of the table, the other runs go on. The load average is printed at the start
and the end (the machine these figures come from is shared). Outputs (the sweep directories, the ``.npz`` files,
``peers.json``) go under ``--output-dir``; keep it outside the repository.

    FEDRAY_CACHE_DIR=/work/scale/cache nice -n 5 .venv/bin/python bench/bench_scale_peers.py --output-dir /work/peers/run1
    .venv/bin/python bench/bench_scale_peers.py --output-dir /work/peers/big --points 1000:100 --with-1m --with-10m \\
        --flower-max-population 1000000 --run-timeout 1800
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import workload_def as wd  # noqa: E402  (numpy only at import)

CONFIG = "jobs/configs/scale_curves.yaml"
DEFAULT_POINTS = "1000:100,10000:100,100000:100"
POINT_1M = (1_000_000, 100)
POINT_10M = (10_000_000, 100)


def parse_points(text: str, with_1m: bool = False, with_10m: bool = False) -> list[tuple[int, int]]:
    """``"P:K,P:K"`` (``1_000_000`` style underscores allowed) as ``[(P, K), ...]`` in order, duplicates dropped,
    plus (1,000,000, 100) and (10,000,000, 100) when asked for. ValueError for a malformed point or K > P."""
    out: list[tuple[int, int]] = []
    for s in (s.strip() for s in text.split(",")):
        if not s:
            continue
        parts = [x.strip().replace("_", "") for x in s.split(":")]
        if len(parts) != 2 or not all(x.isdigit() for x in parts):
            raise ValueError(f"point {s!r}: expected P:K (two positive integers)")
        p, k = (int(x) for x in parts)
        if p < 1 or k < 1 or k > p:
            raise ValueError(f"point {s!r}: needs 1 <= K <= P")
        if (p, k) not in out:
            out.append((p, k))
    for flag, pt in ((with_1m, POINT_1M), (with_10m, POINT_10M)):
        if flag and pt not in out:
            out.append(pt)
    if not out:
        raise ValueError("no points")
    return out


def scale_setup(config: str = CONFIG) -> dict:
    """What the peers need from the scale file, checked against what they implement: the synthetic source's
    ``data.params`` (without ``num_clients``, which is P), the rounds, and the training geometry. ValueError when
    the scale file asks for something the peers do not do (another source, model, partition or optimiser)."""
    import yaml

    spec = yaml.safe_load((ROOT / config).read_text())
    exp = spec.get("experiment") or {}
    if "base" in spec or spec.get("overrides"):
        raise ValueError(f"{config}: the peers read an inline `experiment:` only (no base / overrides)")
    data, model, train = exp.get("data") or {}, exp.get("model") or {}, exp.get("train") or {}
    algo = (exp.get("algorithm") or {}).get("name", "fedavg")
    checks = {
        "data.source": (data.get("source"), "synthetic"),
        "data.normalize": (bool(data.get("normalize", True)), False),
        "data.partition.name": ((data.get("partition") or {}).get("name"), "natural"),
        "model.name": (model.get("name"), "mlp"),
        "model.params.hidden": ((model.get("params") or {}).get("hidden"), [wd.SCALE_HIDDEN]),
        "algorithm.name": (algo, "fedavg"),
        "train.batch_size": (train.get("batch_size"), wd.BATCH_SIZE),
        "train.lr": (train.get("lr"), wd.LR),
        "train.local_epochs": (train.get("local_epochs", 1), wd.LOCAL_EPOCHS),
        "data.params.dimension": ((data.get("params") or {}).get("dimension"), wd.SCALE_DIMENSION),
    }
    bad = [f"{k} is {v!r}, the peers do {want!r}" for k, (v, want) in checks.items() if v != want]
    if bad:
        raise ValueError(f"{config}: " + "; ".join(bad))
    params = {k: v for k, v in (data.get("params") or {}).items() if k != "num_clients"}
    rounds = int(spec.get("rounds", 1))
    if rounds < 2:
        raise ValueError(f"{config}: rounds {rounds}; rounds 2..R are measured, so R >= 2")
    return {"params": params, "rounds": rounds}


def export_point(params: dict, population: int, path: Path) -> dict:
    """The point's arrays, made by fedray's ``synthetic`` source with the scale file's ``params`` at P clients
    (read from fedray's cache when the sweep wrote it), as an ``.npz`` for the peers; returns their shapes."""
    from fedray.data.sources import load_source

    b = load_source("synthetic", None, **{**params, "num_clients": int(population)})
    arrays = {"x_tr": b.train.images(), "y_tr": b.train.labels, "x_te": b.test.images(), "y_te": b.test.labels,
              "c_tr": b.train.table.column("client").to_numpy().astype(np.int64)}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return {k: tuple(v.shape) for k, v in arrays.items()}


def peer_commands(point: tuple[int, int], rounds: int, data: str, pfl_py: str | None, flower_py: str | None,
                  flower_max: int, pfl_threads: int = 1, actors: int = 2) -> dict[str, list[str]]:
    """The peer runs of one point: ``{name: argv}``; Flower only up to ``flower_max`` clients."""
    name = wd.scale_name(point[0], point[1], rounds)
    cmds = {}
    if pfl_py:
        cmds[f"pfl-{pfl_threads}t"] = [pfl_py, str(HERE / "workload_pfl.py"), "--workload", name, "--threads",
                                      str(pfl_threads), "--data", data]
    if flower_py and point[0] <= flower_max:
        cmds[f"flower-{actors}a"] = [flower_py, str(HERE / "workload_flower.py"), "--workload", name, "--actors",
                                     str(actors), "--data", data]
    return cmds


def peer_updates_per_s(res: dict, per_round: int, key: str = "round_s") -> float:
    """Updates/s of a peer's JSON line over rounds 2..R (every sampled client of this data is non-empty); with
    ``key="round_cpu_s"``, updates per CPU-second of its process (pfl-research reports them; NaN without)."""
    measured = res.get(key, [])[1:]
    secs = float(sum(measured))
    return per_round * len(measured) / secs if secs > 0 else math.nan


def run_fedray(point: tuple[int, int], out: Path) -> dict:
    """``fedray scale`` of the scale file at this one point (bench_scale_rounds' sweep restriction and runner)."""
    import pandas as pd

    import bench_scale_rounds as bsr

    p, k = point
    config = bsr.restrict(CONFIG, f"{p}:{k}", out, None)
    t = time.perf_counter()
    _, _, cpu = bsr.run_sweep(config, out, [])
    wall = time.perf_counter() - t
    d = pd.read_parquet(out / "scaling.parquet")
    row = d.iloc[-1]
    if row.status != "ok":
        raise RuntimeError(f"fedray P={p} K={k}: {row.status}")
    workers, n, tree = cpu.get(0, (math.nan, 0, math.nan))  # rounds 2 .. R-1: the workers, every process of the run

    def per(cpu_s: float) -> float:
        return k * n / cpu_s if n > 0 and cpu_s > 0 else math.nan

    return {"updates_per_s": float(row.client_updates_per_s), "round_s": float(row.round_s), "wall_s": wall,
            "updates_per_cpu_s": per(tree), "updates_per_worker_cpu_s": per(workers)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output-dir", required=True, type=Path, help="sweep directories, .npz files, peers.json")
    ap.add_argument("--points", default=DEFAULT_POINTS, help=f"P:K points, comma-separated (default {DEFAULT_POINTS})")
    ap.add_argument("--with-1m", action="store_true", help="add P = 1,000,000, K = 100")
    ap.add_argument("--with-10m", action="store_true", help="add P = 10,000,000, K = 100")
    ap.add_argument("--flower-max-population", type=int, default=100_000,
                    help="run Flower only on points with P <= this (default 100,000)")
    ap.add_argument("--run-timeout", type=float, default=900.0, metavar="S",
                    help="kill one peer run after S seconds (reported, left out of the table; default 900)")
    ap.add_argument("--no-pfl", action="store_true")
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--no-fedray", action="store_true", help="peers only (no ratios)")
    ap.add_argument("--create-venvs", action="store_true",
                    help="create bench/.pfl-venv and bench/.flower-venv when missing (bench_workload.py's functions)")
    args = ap.parse_args(argv)
    points = parse_points(args.points, args.with_1m, args.with_10m)
    setup = scale_setup()
    import bench_workload as bw

    pfl_py = flower_py = None
    if not args.no_pfl and (args.create_venvs or bw.pfl_venv_ready()):
        pfl_py = str(bw.ensure_pfl_venv())
    if not args.no_flower and (args.create_venvs or bw.flower_venv_ready()):
        flower_py = str(bw.ensure_flower_venv())
    for name, py, flag in (("pfl-research", pfl_py, args.no_pfl), ("Flower", flower_py, args.no_flower)):
        if py is None and not flag:
            print(f"({name}: no virtualenv; --create-venvs makes it)", file=sys.stderr)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out = args.output_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    load0, t0 = os.getloadavg(), time.strftime("%H:%M:%S", time.gmtime())
    print(f"start {t0} UTC, load average {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}; points "
          + ", ".join(f"{p:,}:{k:,}" for p, k in points), flush=True)
    results: dict = {}
    failed: list[str] = []
    for p, k in points:
        res = results.setdefault(f"{p}:{k}", {})
        if not args.no_fedray:
            try:
                res["fedray-2w"] = run_fedray((p, k), out / f"fedray-P{p}-K{k}")
                print(f"  P={p:,} K={k:,} fedray-2w: {res['fedray-2w']['updates_per_s']:.1f} upd/s", flush=True)
            except (RuntimeError, SystemExit, OSError) as exc:
                failed.append(f"P={p:,} K={k:,} fedray-2w: {exc}")
                print(f"  {failed[-1]}", flush=True)
        npz = out / f"data-P{p}.npz"
        cmds = peer_commands((p, k), setup["rounds"], str(npz), pfl_py, flower_py, args.flower_max_population)
        if cmds and not npz.exists():
            t = time.perf_counter()
            shapes = export_point(setup["params"], p, npz)
            print(f"  (P={p:,}: data {shapes} in {npz}, {time.perf_counter() - t:.1f} s)", flush=True)
        for name, cmd in cmds.items():
            try:
                r = bw.run_one(cmd, timeout=args.run_timeout)
            except RuntimeError as exc:
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                failed.append(f"P={p:,} K={k:,} {name}: {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else ""))
                print(f"  {failed[-1]}", flush=True)
                continue
            r["updates_per_s"] = peer_updates_per_s(r, k)
            r["updates_per_cpu_s"] = peer_updates_per_s(r, k, "round_cpu_s")
            res[name] = r
            print(f"  P={p:,} K={k:,} {name}: {r['updates_per_s']:.1f} upd/s (start {r['startup_s']:.1f} s, "
                  f"wall {r.get('wall_s', math.nan):.1f} s, peak PSS {r['tree_peak_pss_gb']:.2f} GB)", flush=True)
        if npz.exists() and p >= 1_000_000:
            npz.unlink()  # the large arrays stay in fedray's cache only
    load1, t1 = os.getloadavg(), time.strftime("%H:%M:%S", time.gmtime())
    (out / "peers.json").write_text(json.dumps({"points": results, "failed": failed, "load_start": load0,
                                                "load_end": load1, "start_utc": t0, "end_utc": t1}, indent=1))
    print(table(points, results))
    print(f"load average at start ({t0} UTC): {load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f}; "
          f"at end ({t1} UTC): {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f}")
    for f in failed:
        print(f"FAILED (left out of the table): {f}")
    return 0


def table(points: list[tuple[int, int]], results: dict) -> str:
    """Markdown: updates/s of each platform per point and the peers' over fedray's (below 1: fedray faster); where
    CPU was measured, also updates per CPU-second of all of a platform's processes in the measured rounds and that
    ratio (below 1: fedray does more per CPU-second), which others' load on a shared machine does not skew."""
    names = sorted({n for r in results.values() for n in r if n != "fedray-2w"})
    with_cpu = [n for n in names if any(math.isfinite(r.get(n, {}).get("updates_per_cpu_s", math.nan))
                                        for r in results.values())]
    head = ["P", "K", "fedray upd/s", *[f"{n} upd/s" for n in names], *[f"{n} / fedray" for n in names]]
    if with_cpu:
        head += ["fedray upd/CPU-s", *[f"{n} upd/CPU-s" for n in with_cpu], *[f"{n} / fedray (CPU)" for n in with_cpu]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for p, k in points:
        r = results.get(f"{p}:{k}", {})
        f = r.get("fedray-2w", {}).get("updates_per_s", math.nan)
        ups = [r.get(n, {}).get("updates_per_s", math.nan) for n in names]
        cells = [f"{p:,}", f"{k:,}", _fmt(f, 1), *[_fmt(u, 1) for u in ups], *[_fmt(u / f, 2) for u in ups]]
        if with_cpu:
            fc = r.get("fedray-2w", {}).get("updates_per_cpu_s", math.nan)
            cs = [r.get(n, {}).get("updates_per_cpu_s", math.nan) for n in with_cpu]
            cells += [_fmt(fc, 1), *[_fmt(c, 1) for c in cs], *[_fmt(c / fc, 2) for c in cs]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(x: float, nd: int) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.{nd}f}"


if __name__ == "__main__":
    sys.exit(main())
