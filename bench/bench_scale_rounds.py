#!/usr/bin/env python
"""Benchmark: rounds of 10,000 clients from a 10,000,000-client population (issue 30, item 4).

Prints figures; makes no assertions. Runs one ``fedray scale`` sweep (default ``jobs/configs/scale_10k.yaml``:
the synthetic clients of 4 rows of 8 features, mlp, 2 workers, K = 100 / 1,000 / 10,000 clients per round from
P = 100,000 and from P = 10,000,000) in a child process, so that every ratio below comes from one invocation
on one machine state, and while it runs samples every 0.5 s the private (RssAnon) and file-backed (RssFile)
memory of the Ray client workers it started (descendants of the child; other users' Ray processes are not
counted). Then prints, from ``scaling.parquet``:

- per point: client updates/s, seconds per client update, the round's split (train / aggregate / eval /
  driver overhead), the coordinator's private memory (largest RssAnon at a round end), the workers' largest
  private and file-backed resident memory;
- the targets: seconds per update at K = 10,000 / P = 10,000,000 over K = 1,000 / P = 100,000 (target at most
  1.2), and the coordinator's private memory from K = 100 to K = 10,000 and from P = 100,000 to 10,000,000 at
  the same K (target at most +10 %).

The machine these figures come from is shared (other users' jobs move the load average between 2 and 30 within
minutes), so ``--repeat N`` runs the sweep N times in turn (output directories ``r1`` .. ``rN``) and the seconds per
update are also given as the best (smallest) of the N, per point: the figure least disturbed by others' load.
``--points P:K,P:K`` restricts the sweep to those points (e.g. the two of the 1.2x target).

Usage (the 10-million point keeps its generated arrays in the user cache and its 1.5 GiB partition under the
output directory: keep both outside the repository)::

    FEDRAY_CACHE_DIR=/work/scale/cache nice -n 5 python bench/bench_scale_rounds.py --output-dir /work/scale/scale_10k
    python bench/bench_scale_rounds.py --output-dir /work/scale/scale_10k --table-only   # print a finished sweep
    python bench/bench_scale_rounds.py --output-dir /work/scale/s10k --repeat 3 --points 100000:1000,10000000:10000
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _kib(text: str, key: str) -> float:
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


class WorkerSampler:
    """Largest RssAnon / RssFile (MiB) of any ``RayClientWorker`` process under ``pid``, per sweep point."""

    def __init__(self, pid: int):
        import psutil

        self.root = psutil.Process(pid)
        self.point = -1
        self.anon: dict[int, float] = defaultdict(float)
        self.file: dict[int, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            try:
                procs = self.root.children(recursive=True)
            except psutil.Error:
                return
            for p in procs:
                try:
                    if "RayClientWorker" not in " ".join(p.cmdline()):
                        continue
                    text = Path(f"/proc/{p.pid}/status").read_text()
                except (psutil.Error, OSError):
                    continue
                pt = self.point
                self.anon[pt] = max(self.anon[pt], _kib(text, "RssAnon"))
                self.file[pt] = max(self.file[pt], _kib(text, "RssFile"))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_sweep(config: str, out: Path, extra: list[str]) -> tuple[dict, dict]:
    cmd = [sys.executable, "-m", "fedray.cli", "scale", config, "--output-dir", str(out), *extra]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    sampler = WorkerSampler(proc.pid)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"\[scale\] point (\d+)/\d+", line)
        if m:
            sampler.point = int(m.group(1)) - 1
        if line.startswith("[scale]"):
            print(line.rstrip(), flush=True)
    rc = proc.wait()
    sampler.stop()
    if rc not in (0, 1):
        raise SystemExit(f"fedray scale exited {rc}")
    return dict(sampler.anon), dict(sampler.file)


def restrict(config: str, points: str, out: Path) -> str:
    """A copy of the scale file ``config`` (under ``out``) whose sweep is the ``P:K`` pairs of ``points``."""
    spec = re.sub(r"^sweeps?:.*\Z", "", (ROOT / config).read_text(), flags=re.M | re.S)
    for pk in points.split(","):
        p, k = (int(x) for x in pk.split(":"))
        spec += ("sweeps:\n" if "sweeps:" not in spec else "") + f"  - {{population: [{p}], clients_per_round: [{k}]}}\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "points.yaml"
    path.write_text(spec)
    return str(path)


def report(out: Path, anon: dict, file: dict):
    import pandas as pd

    d = pd.read_parquet(out / "scaling.parquet")
    ok = d[d.status == "ok"]
    print(f"\n{out}:")
    print(f"\n{'P':>10} {'K':>6} {'upd/s':>8} {'ms/upd':>7} {'round s':>8} {'train':>7} {'aggr':>6} {'eval':>6} "
          f"{'overhd':>6} {'coord priv MiB':>14} {'worker priv MiB':>15} {'worker file MiB':>15}")
    for _, r in ok.iterrows():
        pt = int(r.point)
        print(f"{int(r.population):>10,} {int(r.clients_per_round):>6,} {r.client_updates_per_s:8.1f} "
              f"{1e3 / r.client_updates_per_s:7.3f} {r.round_s:8.3f} {r.train_s:7.3f} {r.aggregate_s:6.3f} "
              f"{r.eval_s:6.3f} {r.overhead_s:6.3f} {r.coordinator_anon_mb:14.1f} "
              f"{anon.get(pt, np.nan):15.1f} {file.get(pt, np.nan):15.1f}")

    def at(p: int, k: int, col: str) -> float:
        row = ok[(ok.population == p) & (ok.clients_per_round == k)]
        return float(row[col].iloc[0]) if len(row) else float("nan")

    big, small = 10_000_000, 100_000
    spu = (1 / at(big, 10_000, "client_updates_per_s")) / (1 / at(small, 1_000, "client_updates_per_s"))
    print(f"seconds per client update, K=10,000/P=10M over K=1,000/P=100,000: {spu:.3f}x (target <= 1.2x)")
    for p in (small, big):
        lo, hi = at(p, 100, "coordinator_anon_mb"), at(p, 10_000, "coordinator_anon_mb")
        print(f"coordinator private memory at P={p:,}, K=100 -> K=10,000: {lo:.1f} -> {hi:.1f} MiB "
              f"({100 * (hi / lo - 1):+.1f} %, target <= +10 %)")
    for k in (100, 1_000, 10_000):
        lo, hi = at(small, k, "coordinator_anon_mb"), at(big, k, "coordinator_anon_mb")
        print(f"coordinator private memory at K={k:,}, P=100,000 -> 10,000,000: {lo:.1f} -> {hi:.1f} MiB "
              f"({100 * (hi / lo - 1):+.1f} %, target <= +10 %)")
    failed = d[d.status != "ok"]
    for _, r in failed.iterrows():
        print(f"point {int(r.point)} (P={int(r.population):,}, K={int(r.clients_per_round):,}): {r.status}")
    return {(int(r.population), int(r.clients_per_round)): 1 / r.client_updates_per_s for _, r in ok.iterrows()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="jobs/configs/scale_10k.yaml")
    ap.add_argument("--output-dir", required=True, type=Path)
    ap.add_argument("--table-only", action="store_true", help="print the figures of a finished sweep")
    ap.add_argument("--repeat", type=int, default=1, help="run the sweep this many times in turn")
    ap.add_argument("--points", default="", help="only these P:K points, comma-separated")
    ap.add_argument("overrides", nargs="*", help="a.b=c overrides passed to fedray scale")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    config = restrict(args.config, args.points, args.output_dir) if args.points else args.config
    outs = [args.output_dir] if args.repeat <= 1 else [args.output_dir / f"r{i + 1}" for i in range(args.repeat)]
    best: dict = {}
    for out in outs:
        anon: dict = {}
        file: dict = {}
        if not args.table_only:
            if out != args.output_dir:  # the repeats share the first one's partitions (the same data, hashed)
                shared = args.output_dir / "runs" / "_partitions"
                (out / "runs").mkdir(parents=True, exist_ok=True)
                if shared.is_dir() and not (out / "runs" / "_partitions").exists():
                    (out / "runs" / "_partitions").symlink_to(shared.resolve())
            anon, file = run_sweep(config, out, list(args.overrides))
        for key, spu in report(out, anon, file).items():
            best[key] = min(best.get(key, spu), spu)
    if len(outs) > 1:
        print(f"\nbest of {len(outs)} runs, ms per client update: "
              + ", ".join(f"P={p:,} K={k:,}: {1e3 * v:.3f}" for (p, k), v in sorted(best.items())))
        if (10_000_000, 10_000) in best and (100_000, 1_000) in best:
            print(f"seconds per client update, K=10,000/P=10M over K=1,000/P=100,000, best of {len(outs)}: "
                  f"{best[(10_000_000, 10_000)] / best[(100_000, 1_000)]:.3f}x (target <= 1.2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
