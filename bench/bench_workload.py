"""Benchmark: fedray vs the plain-PyTorch sequential floor on W1 / W2 of shared/bench/WORKLOAD.md.

Runs, in one invocation on the same machine: the floor with 1 and 2 torch threads, and fedray on a local
Ray with 2 client workers (1 CPU, 1 torch thread each). Each implementation runs as its own process under
``/usr/bin/time -v`` (whole-process wall and max RSS of the top process) while a sampler adds up the
PSS and RSS of the whole process tree every 0.25 s (Ray's workers included). Prints a table with the
ratios fedray / best floor. No assertions: figures only.

fedray runs cold (``fedray-ray-2w``: a private local Ray started by the run) and warm (``fedray-2w-warm``:
on the Ray of ``fedray up``, started once before the runs with a record of its own, so no other run of the
machine joins it, and stopped by ``fedray down`` after them; ``--no-warm`` skips it); nothing is timed
while that cluster starts its idle workers (after ``up`` and after each warm run, whose exit refills them).
The warm run's memory includes that cluster's processes, the idle workers refilled at its exit included.
fedray with ``engine.fold_group=5`` runs too, warm (cold with ``--no-warm``; ``--fold-group G`` picks G,
``--fold-group 0`` skips it);
``--baseline-tree DIR`` adds fedray run from another checkout (a change's before/after in one invocation).
Besides the floor ratios it prints the exit time after each script's last line and the whole process over
the 2-thread floor's.

``--multi-client M [M ...]`` adds fedray with ``engine.multi_client: M`` (docs/scaling.md). Flower's
simulation engine (bench/flower_app, 2 Ray actors of 1 CPU, 1 torch thread) runs on the same workload
whenever its own virtualenv ``bench/.flower-venv`` exists; ``--flower`` creates it first
(``pip install flwr[simulation]==1.41.0 torch==2.13.0 mlxtend scikit-learn``; Flower pins its own Ray) and
``--no-flower`` skips it. With Flower the script prints the Flower-vs-fedray ratios (end-to-end wall,
rounds, rounds 2..R). pfl-research's simulation (bench/workload_pfl.py: one process, 1 and 2 torch threads, as the
floor) runs likewise whenever ``bench/.pfl-venv`` exists; ``--pfl`` creates it first (``pip install torch==2.13.0``,
then ``pip install -c constraints.txt pfl[pytorch]==0.6.0 mlxtend scikit-learn numpy`` with torch held at 2.13.0,
the CPU wheel) and ``--no-pfl`` skips it; its ratios over fedray are printed as Flower's.
``--workloads pfl-shape`` is pfl-research's benchmark geometry (1,000 users x 50 samples, 50 a round, batch 10, 1
epoch; bench/workload_def.py): the bench writes its data once with fedray's synthetic source and hands the file to
the floor and the peers (``--data``), fedray generating the same numbers itself.
``fedray bench workload ARGS`` runs this script.

    .venv/bin/python bench/bench_workload.py                 # W1 and W2, 1 repetition, everything
    .venv/bin/python bench/bench_workload.py --workloads W1 --reps 3 --json bench/out/w1.json
    .venv/bin/python bench/bench_workload.py --multi-client 5 --flower --reps 2
    .venv/bin/python bench/bench_workload.py --workloads W1 --reps 1 --baseline-tree /tmp/base
    .venv/bin/python bench/bench_workload.py --workloads pfl-shape --flower --pfl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from workload_def import WORKLOADS, export_pfl_shape  # noqa: E402  (numpy only at import)

FLOWER_VENV = HERE / ".flower-venv"
FLOWER_REQUIREMENTS = ["flwr[simulation]==1.41.0", "torch==2.13.0", "mlxtend", "scikit-learn", "numpy"]


def flower_venv_ready() -> bool:
    """Whether ``bench/.flower-venv`` exists with :data:`FLOWER_REQUIREMENTS` installed."""
    return _venv_ready(FLOWER_VENV, FLOWER_REQUIREMENTS)


def ensure_flower_venv(base_python: str | None = None) -> Path:
    """The Python of ``bench/.flower-venv``, created with Flower's simulation extra on first use. Flower
    pins its own Ray, so it never shares fedray's environment."""
    py = FLOWER_VENV / "bin" / "python"
    marker = FLOWER_VENV / ".fedray-bench-ok"
    if flower_venv_ready():
        return py
    base = base_python or getattr(sys, "_base_executable", None) or sys.executable
    print(f"creating {FLOWER_VENV} with {' '.join(FLOWER_REQUIREMENTS)} (once)", file=sys.stderr)
    subprocess.run([base, "-m", "venv", str(FLOWER_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *FLOWER_REQUIREMENTS], check=True)
    marker.write_text(" ".join(FLOWER_REQUIREMENTS))
    return py


PFL_VENV = HERE / ".pfl-venv"
#: pfl-research's peer. torch is installed first and kept by a constraints file: ``torch==2.13.0`` resolves
#: to the CPU wheel here, and pip would otherwise pull PyPI's default (CUDA) build for ``pfl[pytorch]``.
PFL_TORCH = "torch==2.13.0"
PFL_REQUIREMENTS = ["pfl[pytorch]==0.6.0", "mlxtend", "scikit-learn", "numpy"]


def _venv_ready(venv: Path, requirements: list[str]) -> bool:
    marker = venv / ".fedray-bench-ok"
    return (venv / "bin" / "python").exists() and marker.exists() and \
        marker.read_text().strip() == " ".join(requirements)


def pfl_venv_ready() -> bool:
    """Whether ``bench/.pfl-venv`` exists with :data:`PFL_TORCH` and :data:`PFL_REQUIREMENTS` installed."""
    return _venv_ready(PFL_VENV, [PFL_TORCH, *PFL_REQUIREMENTS])


def pfl_install_commands(py: Path, constraints: Path) -> list[list[str]]:
    """The two pip commands that fill ``bench/.pfl-venv``: torch alone, then pfl with the rest under a
    constraints file that holds torch at :data:`PFL_TORCH` (so pip keeps the CPU wheel)."""
    return [[str(py), "-m", "pip", "install", "-q", PFL_TORCH],
            [str(py), "-m", "pip", "install", "-q", "-c", str(constraints), *PFL_REQUIREMENTS]]


def ensure_pfl_venv(base_python: str | None = None) -> Path:
    """The Python of ``bench/.pfl-venv``, created with pfl-research (PyPI ``pfl``) on first use."""
    py = PFL_VENV / "bin" / "python"
    reqs = [PFL_TORCH, *PFL_REQUIREMENTS]
    if pfl_venv_ready():
        return py
    base = base_python or getattr(sys, "_base_executable", None) or sys.executable
    print(f"creating {PFL_VENV} with {' '.join(reqs)} (once)", file=sys.stderr)
    subprocess.run([base, "-m", "venv", str(PFL_VENV)], check=True)
    constraints = PFL_VENV / "constraints.txt"
    constraints.write_text(PFL_TORCH + "\n")
    for cmd in pfl_install_commands(py, constraints):
        subprocess.run(cmd, check=True)
    torch_version = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"], check=True,
                                   capture_output=True, text=True).stdout.strip()
    if not torch_version.startswith(PFL_TORCH.split("==")[1]):
        raise RuntimeError(f"{PFL_VENV}: pip replaced {PFL_TORCH} by torch {torch_version}")
    (PFL_VENV / ".fedray-bench-ok").write_text(" ".join(reqs))
    return py


def _export_data(workload: str, folder: str) -> str:
    """pfl-shape: its arrays, made once by fedray's synthetic source, as an .npz for the floor and the peers
    (fedray generates them itself, so every implementation trains on the same numbers); "" for W1 / W2."""
    if WORKLOADS[workload].data != "synthetic":
        return ""
    path = str(Path(folder) / f"{workload}.npz")
    shapes = export_pfl_shape(path)
    print(f"  ({workload}: data {shapes} in {path})", file=sys.stderr)
    return path


def _tree(pid: int) -> list[int]:
    out, stack = [], [pid]
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def _mem(pid: int) -> tuple[int, int]:
    pss = rss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return pss, rss


class TreeSampler(threading.Thread):
    """Peak summed PSS/RSS of a process tree, sampled every ``period`` seconds. Ray's raylet, GCS and
    worker processes are started as children of the driver, so they are counted."""

    def __init__(self, pid: int, warm_temp: str | None = None, period: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.warm_temp, self.period = pid, warm_temp, period
        self.peak_pss = self.peak_rss = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            pss = rss = 0
            pids = set(_tree(self.pid))
            if self.warm_temp:  # a warm run's actors are children of the `fedray up` raylet, not of the driver
                from fedray.core.ray_up import cluster_pids

                pids |= set(cluster_pids(self.warm_temp))  # the cluster's processes and their descendants
            for p in pids:
                a, b = _mem(p)
                pss += a
                rss += b
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_rss = max(self.peak_rss, rss)
            self.stop.wait(self.period)


def run_one(cmd: list[str], root: Path = ROOT, warm_temp: str | None = None, timeout: float | None = None) -> dict:
    """One implementation's process under ``time -v``; ``root``: the checkout it runs from; ``warm_temp``:
    the temp dir of the `fedray up` cluster it joins (whose processes the memory sampler adds), else a cold
    run that must not join it (FEDRAY_NO_WARM=1). The process runs in a session of its own: past ``timeout``
    seconds (or on Ctrl-C) its whole process group is killed and RuntimeError raised."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
               TQDM_DISABLE="1", PYTHONPATH=str(root))
    if warm_temp is None:
        env["FEDRAY_NO_WARM"] = "1"
    else:
        env.update(_warm_env(), PYTHONPATH=str(root))
        env.pop("FEDRAY_NO_WARM", None)
    full = ["/usr/bin/time", "-v", *cmd]
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root,
                            start_new_session=True)
    sampler = TreeSampler(proc.pid, warm_temp)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:  # a timeout or Ctrl-C: the run's processes (Ray's included) go with it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise RuntimeError(f"{' '.join(cmd)} timed out after {timeout:g} s (killed)") from None
        raise
    finally:
        sampler.stop.set()
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", err)
    if m:
        h, mi, s = m.groups()
        res["wall_s"] = int(h or 0) * 3600 + int(mi) * 60 + float(s)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    if m:
        res["driver_max_rss_gb"] = int(m.group(1)) / 2**20
    res["tree_peak_pss_gb"] = sampler.peak_pss / 2**30
    res["tree_peak_rss_gb"] = sampler.peak_rss / 2**30
    return res


#: The benchmark's `fedray up` keeps its record (and token) in a cache of its own (made by _warm_up), so no
#: other `fedray run` of the machine joins it; the decoded datasets stay in the usual cache.
WARM_CACHE: str | None = None


def _warm_env() -> dict:
    from fedray.data.formats import cache_dir

    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT), XDG_CACHE_HOME=WARM_CACHE,
                FEDRAY_CACHE_DIR=str(cache_dir()))


def _warm_up() -> dict:
    """`fedray up` (2 logical CPUs, the workers' and coordinator's), the record of the cluster it started."""
    global WARM_CACHE
    WARM_CACHE = tempfile.mkdtemp(prefix="fedray-bench-up-")
    subprocess.run([sys.executable, "-m", "fedray", "up", "--num-cpus", "2"], env=_warm_env(), cwd=ROOT, check=True)
    rec = json.loads((Path(WARM_CACHE) / "fedray" / "ray" / "up.json").read_text())
    _warm_settle(rec)
    return rec


def _warm_settle(rec: dict) -> None:
    """Nothing is timed while the `fedray up` cluster starts its idle workers (after `up`, and after each warm
    run: its exit refills them); a warm run finds them ready, as between a user's runs."""
    from fedray.core.warm_workers import wait_ready

    t = time.perf_counter()
    ready = wait_ready(rec["temp_dir"], int(rec.get("idle_workers") or 0))
    time.sleep(0.5)  # the refill process exits (wait_ready has waited for the workers' preload to end)
    print(f"  (warm cluster: {ready} idle workers ready after {time.perf_counter() - t:.1f} s)", file=sys.stderr)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["W1", "W2"], choices=sorted(WORKLOADS),
                    help="W1, W2 (shared/bench/WORKLOAD.md) and pfl-shape (bench/workload_def.py); default W1 W2")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", help="also write all raw figures here")
    ap.add_argument("--skip-floor2", action="store_true", help="skip the 2-thread floor")
    ap.add_argument("--multi-client", type=int, nargs="*", default=[], metavar="M",
                    help="also run fedray with engine.multi_client=M (one implementation per M)")
    ap.add_argument("--flower", action="store_true",
                    help="run Flower's simulation engine, creating its virtualenv bench/.flower-venv first if needed "
                         "(without this flag Flower runs when that virtualenv exists)")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower even when its virtualenv exists")
    ap.add_argument("--pfl", action="store_true",
                    help="run pfl-research's simulation (bench/workload_pfl.py), creating its virtualenv bench/.pfl-venv "
                         "first if needed (without this flag pfl runs when that virtualenv exists)")
    ap.add_argument("--no-pfl", action="store_true", help="skip pfl-research even when its virtualenv exists")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip fedray on the warm Ray of `fedray up` (started before the runs, stopped after); "
                         "fold_group then runs cold")
    ap.add_argument("--fold-group", type=int, metavar="G", default=5,
                    help="also run fedray with engine.fold_group=G, warm (cold with --no-warm) (default 5; "
                         "0 or 1: skip)")
    ap.add_argument("--baseline-tree", type=Path, metavar="DIR",
                    help="also run fedray (cold) from another checkout, e.g. `git worktree add /tmp/base main`, "
                         "to measure a change in the same invocation")
    ap.add_argument("--run-timeout", type=float, metavar="S", default=900.0,
                    help="kill one implementation's run after S seconds (default 900); a failed or killed run is "
                         "reported and left out of the table, the others go on")
    args = ap.parse_args(argv)
    py = sys.executable
    fedray = [py, str(HERE / "workload_fedray.py"), "--backend", "ray", "--workers", "2"]
    impls = {
        "floor-1t": lambda w: [py, str(HERE / "workload_floor.py"), "--workload", w, "--threads", "1"],
        "floor-2t": lambda w: [py, str(HERE / "workload_floor.py"), "--workload", w, "--threads", "2"],
        "fedray-ray-2w": lambda w: [*fedray, "--workload", w],
    }
    roots = {}
    if not args.no_warm:
        impls["fedray-2w-warm"] = lambda w: [*fedray, "--workload", w, "--warm"]
    if args.fold_group is not None and args.fold_group > 1:  # warm beside the warm run, else cold
        fg = [*fedray, "--fold-group", str(args.fold_group), *([] if args.no_warm else ["--warm"])]
        impls[f"fedray-2w-fg{args.fold_group}" + ("" if args.no_warm else "-warm")] = lambda w: [*fg, "--workload", w]
    if args.baseline_tree:
        base = args.baseline_tree.resolve()
        impls["fedray-baseline"] = lambda w: [py, str(base / "bench" / "workload_fedray.py"), "--workload", w,
                                              "--backend", "ray", "--workers", "2"]
        roots["fedray-baseline"] = base
    if args.skip_floor2:
        impls.pop("floor-2t")
    for m in args.multi_client:
        impls[f"fedray-2w-m{m}"] = (lambda m: lambda w: [py, str(HERE / "workload_fedray.py"), "--workload", w,
                                                         "--backend", "ray", "--workers", "2",
                                                         "--multi-client", str(m)])(m)
    if args.flower or (not args.no_flower and flower_venv_ready()):
        fpy = str(ensure_flower_venv())
        impls["flower-2a"] = lambda w: [fpy, str(HERE / "workload_flower.py"), "--workload", w, "--actors", "2"]
    if args.pfl or (not args.no_pfl and pfl_venv_ready()):
        ppy = str(ensure_pfl_venv())
        for t in ([1] if args.skip_floor2 else [1, 2]):  # one process, as the floor: 1 and 2 torch threads
            impls[f"pfl-{t}t"] = (lambda t: lambda w: [ppy, str(HERE / "workload_pfl.py"), "--workload", w,
                                                       "--threads", str(t)])(t)
    raw, failed = [], []
    data_dir = tempfile.mkdtemp(prefix="fedray-bench-data-")
    try:
        data = {w: _export_data(w, data_dir) for w in args.workloads}
        warm = _warm_up() if "fedray-2w-warm" in impls else None
        for w in args.workloads:
            for rep in range(args.reps):
                for name, cmd in impls.items():  # interleaved, so drift hits every implementation alike
                    c = cmd(w) + (["--data", data[w]] if data[w] and not name.startswith("fedray") else [])
                    try:
                        r = run_one(c, roots.get(name, ROOT), warm["temp_dir"] if name.endswith("-warm") else None,
                                    args.run_timeout)
                    except RuntimeError as exc:
                        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                        failed.append(f"{w} rep {rep} {name}: {lines[0]}" + (f" ... {lines[-1]}" if len(lines) > 1 else ""))
                        print(f"  {failed[-1]}", file=sys.stderr)
                        continue
                    finally:
                        if name.endswith("-warm"):
                            _warm_settle(warm)
                    r.update(impl=name, workload=w, rep=rep)
                    raw.append(r)
                    print(f"  {w} rep {rep} {name:18s} start {r['startup_s']:.2f} s  rounds {r['rounds_s']:.2f} s  "
                          f"wall {r.get('wall_s', 0):.1f} s  acc {r['accuracy']:.3f}  hash {r['weights_hash']}",
                          file=sys.stderr)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        if WARM_CACHE is not None:
            subprocess.run([py, "-m", "fedray", "down"], env=_warm_env(), cwd=ROOT, check=False)
            shutil.rmtree(WARM_CACHE, ignore_errors=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(raw, indent=1))
    print()
    hdr = (f"{'workload':8s} {'impl':18s} {'wall s':>7s} {'start s':>7s} {'rounds s':>8s} {'r1 s':>6s} "
           f"{'r2..R s':>7s} {'exit s':>6s} {'PSS GB':>6s} {'acc':>6s} {'hash':>16s} {'rounds/best floor':>17s} "
           f"{'start/floor-1t':>14s} {'wall/floor-2t':>13s}")
    print(hdr)
    print("-" * len(hdr))
    for w in args.workloads:
        rows = {n: rs for n in impls if (rs := [r for r in raw if r["workload"] == w and r["impl"] == n])}
        if "floor-1t" not in rows:
            print(f"{w}: no floor-1t run, no table")
            continue
        med = {n: statistics.median(r["rounds_s"] for r in rs) for n, rs in rows.items()}
        best_floor = min(v for n, v in med.items() if n.startswith("floor"))
        floor_start = statistics.median(r["startup_s"] for r in rows["floor-1t"])
        floor2_wall = statistics.median(r.get("wall_s", float("nan")) for r in rows.get("floor-2t", rows["floor-1t"]))
        for n, rs in rows.items():
            r0 = rs[0]
            wall = statistics.median(r.get("wall_s", float("nan")) for r in rs)
            start = statistics.median(r["startup_s"] for r in rs)
            r1 = statistics.median(r["round_s"][0] for r in rs)
            steady = statistics.median(statistics.mean(r["round_s"][1:]) for r in rs)
            # after the script's own last line: interpreter exit (a local Ray's shutdown included)
            exit_s = statistics.median(r.get("wall_s", float("nan")) - r["total_s"] for r in rs)
            pss = max(r["tree_peak_pss_gb"] for r in rs)
            print(f"{w:8s} {n:18s} {wall:7.1f} {start:7.2f} {med[n]:8.2f} {r1:6.2f} {steady:7.3f} {exit_s:6.2f} "
                  f"{pss:6.2f} {r0['accuracy']:6.3f} {r0['weights_hash']:>16s} {med[n] / best_floor:17.2f} "
                  f"{start / floor_start:14.2f} {wall / floor2_wall:13.2f}")
        hashes = {n: {r["weights_hash"] for r in rs} for n, rs in rows.items()}
        same = len({h for hs in hashes.values() for h in hs}) == 1
        print(f"{w}: final weights identical across implementations (1-thread floor vs fedray): "
              f"{hashes.get('floor-1t') == hashes.get('fedray-ray-2w')}; all: {same}")
        for peer in [n for n in rows if n.startswith(("flower", "pfl"))]:
            print_peer_ratios(w, peer, rows, med)
    for f in failed:
        print(f"FAILED (left out of the table): {f}")


def print_peer_ratios(w: str, peer: str, rows: dict, med: dict) -> None:
    """A peer platform's figures over each fedray implementation's: end-to-end wall, rounds, rounds 2..R."""
    pr = rows[peer]
    for n in [n for n in rows if n.startswith("fedray")]:
        fr = rows[n]
        wall = statistics.median(r.get("wall_s", float("nan")) for r in pr) / statistics.median(
            r.get("wall_s", float("nan")) for r in fr)
        steady = statistics.median(statistics.mean(r["round_s"][1:]) for r in pr) / statistics.median(
            statistics.mean(r["round_s"][1:]) for r in fr)
        print(f"{w}: {peer} / {n}: end-to-end wall {wall:.2f}x, rounds {med[peer] / med[n]:.2f}x, "
              f"rounds 2..R {steady:.2f}x (higher = fedray faster)")

if __name__ == "__main__":
    main()
