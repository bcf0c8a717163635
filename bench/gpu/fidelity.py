"""The fidelity sweeps (issue 31) on the GPU machine (issue 32, item 7): many paper-protocol runs at once on one GPU.

A sweep's points are ordinary fedray runs; on the GPU machine each runs in a process of its own with
``engine.backend: local`` (no Ray: the image has none, and the data and this tree fill the 64 MiB that may travel)
and ``engine.device: cuda``, several at once (the runs are small and launch-bound: one alone leaves the GPU mostly
idle). ``engine.device`` is part of a run's config hash, so a GPU run is named apart from the CPU run of the same
point (its bits differ: docs/gpu.md), and a table's seeds of one cell come from one kind of device.

    # here (where the data is): copy the files the sweep reads into bench/gpu/.data (ignored by git; checked < 60 MiB)
    python bench/gpu/fidelity.py prepare jobs/sweeps/scala_fmnist.yaml
    # on the GPU machine: carry ["bench/gpu/.data"]; the points not yet in docs/results/<sweep>/, seed 0 of every
    # cell first, 8 at a time, none started that the time left cannot hold, every run still going at --deadline
    # stopped and left out
    python3 bench/gpu/fidelity.py run jobs/sweeps/scala_fmnist.yaml --parallel 8 --deadline 520
    # here: the finished runs' small outputs into docs/results/<sweep>/ (an existing run directory is never replaced)
    python bench/gpu/fidelity.py unpack <files_at>

On a CPU machine that is stopped every few hours (a session), ``run --device cpu`` runs the same points under the
names ``fedray sweep`` gives them (the same configs, hashes and numbers; in-process, one thread each), starts none
that the time left cannot hold (``--expect``: a run's seconds, before one has finished), and leaves the archive
for ``unpack`` as on the GPU:

    python bench/gpu/fidelity.py run jobs/sweeps/scala_fmnist.yaml --device cpu --parallel 2 --deadline 9000 \
        --expect 1800 --out /tmp/fid
    python bench/gpu/fidelity.py unpack /tmp/fid

Runs of ``fedray sweep`` itself (on Ray, with checkpoints, on a machine that keeps its files) reach docs/results the
same way: ``python bench/gpu/fidelity.py harvest runs/sweeps/scala_fmnist``.

``$OUT`` gets three files: ``fidelity.json`` (every point: its values, status, seconds, accuracy), ``fidelity.log``
and ``fidelity-runs.tar.gz`` (config.yaml, metrics.jsonl, run.json and summary.json of every finished run).
``run --dry`` runs the same on the CPU with tiny sizes (a check of the script here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "gpu" / ".data"
SMALL = ("config.yaml", "metrics.jsonl", "run.json", "summary.json")  # what docs/results keeps of a run
MAX_CARRY = 60 << 20
# the CPU check here: two rounds of a small partition (the same steps, the device's figures meaningless)
DRY = ["train.rounds=2", "eval.every=1", "data.partition.num_clients=20", "train.clients_per_round=2"]


LOG: list[Path] = []  # run's $OUT/fidelity.log, once known


def log(msg: str) -> None:
    line = f"[fidelity {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    for p in LOG:
        with open(p, "a") as f:
            f.write(line + "\n")


def load_points(sweep: str, device: str, extra: list[str]):
    """The sweep's points as this script runs them: in-process, no checkpoints. ``cuda``: on the GPU, named apart
    from the CPU runs; ``cpu``: the sweep's own engine.device (``auto``, resolved to the CPU by :func:`run`), so
    every point keeps the name, and the numbers, of the same point of ``fedray sweep`` on a CPU machine (neither
    the backend nor the output fields are hashed)."""
    from fedray.apps.sweep_spec import load_sweep

    over = ["engine.backend=local", "output.checkpoint_every=0", "output.tensorboard=false",
            "output.progress=false", *extra]
    if device == "cuda":  # GPU bits that repeat (docs/gpu.md: the same weights with any worker count and a resume)
        over += ["engine.device=cuda", "engine.deterministic=true"]
    spec = load_sweep(sweep, overrides=over)
    if device == "cpu":
        for p in spec.points:
            if p.config.get("engine", {}).get("device", "auto") == "cuda":
                raise SystemExit(f"point {p.index} ({p.describe()}): engine.device is cuda; --device cpu runs "
                                 "the sweep's CPU points")
    return spec


def data_needs(spec) -> dict[tuple[str, str], None]:
    """(source, root) of every point's data, in order: the root a run reads (data.root, or fedray's default root
    for a fetchable source)."""
    from fedray.config import from_dict
    from fedray.data.fetch import data_root

    needs: dict[tuple[str, str], None] = {}
    for p in spec.points:
        d = from_dict(p.config).data
        root = data_root(d)
        if root is None:
            raise SystemExit(f"point {p.index} ({p.describe()}): data.source {d.source!r} reads no files "
                             "(an embedded source: nothing to carry)")
        needs[(d.source, root)] = None
    return needs


def prepare(args) -> int:
    from fedray.data.fetch import find_layout

    spec = load_points(args.sweep, "cpu", [])
    total = 0
    for source, root in data_needs(spec):
        found = find_layout(source, root)
        if found is None:
            raise SystemExit(f"{source}: no files under {root} (data.root); install or fetch them first "
                             f"(fedray data fetch {source})")
        dest = DATA / source
        dest.mkdir(parents=True, exist_ok=True)
        for f in sorted(found.iterdir()):
            if f.is_file() and ("idx" in f.name or f.suffix in (".gz", ".npz")):
                shutil.copy2(f, dest / f.name)
                total += f.stat().st_size
                log(f"{source}: {f} -> {dest / f.name} ({f.stat().st_size / 2**20:.1f} MiB)")
    if total > MAX_CARRY:
        raise SystemExit(f"{total / 2**20:.1f} MiB of data: over the {MAX_CARRY >> 20} MiB that may travel with the "
                         "tree; run the sweeps' data sets one at a time")
    log(f"{total / 2**20:.1f} MiB in {DATA}: carry [\"bench/gpu/.data\"]")
    return 0


def place_data(spec, carried: Path) -> None:
    """Put the carried files where every point reads them (the point's own data root, so its config and its name
    stay those of the sweep), or stop naming the root that cannot be made."""
    from fedray.data.fetch import find_layout

    for source, root in data_needs(spec):
        if find_layout(source, root) is not None:
            continue
        src = carried / source
        if not src.is_dir():
            raise SystemExit(f"{source}: not under {root} and not carried ({src}); run `fidelity.py prepare` here")
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                target = Path(root) / f.name
                if not target.exists():
                    target.symlink_to(f.resolve())
        except OSError as e:
            raise SystemExit(f"data.root {root}: cannot place the carried {source} files there ({e}); "
                             f"--set data.root={src} reads them where they are (the runs' names then change)") from e
        if find_layout(source, root) is None:
            raise SystemExit(f"{source}: the carried files in {src} are not the layout fedray reads")
        log(f"{source}: the carried files linked into {root}")


def finished_names(dirs: list[Path]) -> set[str]:
    out = set()
    for d in dirs:
        for rj in d.glob("*/run.json"):
            try:
                if json.loads(rj.read_text()).get("status") == "finished":
                    out.add(rj.parent.name)
            except (OSError, ValueError):
                continue
    return out


_RUNNER = """
import json, sys
from fedray.config import from_dict
from fedray.driver.runner import run_experiment
cfg = from_dict(json.load(open(sys.argv[1])))
r = run_experiment(cfg, progress=False, log=lambda *a: None)
print("FIDELITY_RESULT " + json.dumps({"run_dir": str(r.run_dir), "failed": r.failed, "final": r.final,
                                       "weights_hash": r.weights_hash}), flush=True)
"""


def run(args) -> int:
    out = Path(args.out or os.environ.get("OUT") or ROOT / "bench" / "out" / "fidelity")
    out.mkdir(parents=True, exist_ok=True)
    LOG.append(out / "fidelity.log")
    work = Path(args.work or tempfile.mkdtemp(prefix="fedray-fidelity."))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + args.deadline
    os.environ.setdefault("FEDRAY_CACHE_DIR", str(work / "cache"))  # partitions and the default data root
    import torch

    device = "cpu" if args.dry else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: --device cpu runs the sweep on the CPU, --dry checks the script")
    spec = load_points(args.sweep, device, (DRY if args.dry else []) + list(args.set))
    place_data(spec, Path(args.data))
    done_dir = ROOT / "docs" / "results" / spec.name
    done = finished_names([done_dir])
    todo = [p for p in spec.points if p.run_dir.name not in done]
    record = {"sweep": spec.name, "device": device, "parallel": args.parallel, "deadline_s": args.deadline,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "points": len(spec.points), "already_in_docs": len(spec.points) - len(todo), "runs": []}
    if args.max_points:
        todo = todo[: args.max_points]
    log(f"{spec.name}: {len(spec.points)} points, {record['already_in_docs']} in {done_dir}, {len(todo)} to run, "
        f"{args.parallel} at a time, deadline {args.deadline} s, device {device}")
    runs_root = work / "runs"
    # on the CPU every run sees no GPU, so the sweep's engine.device auto is the CPU its name stands for
    child_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}" + os.environ.get("PYTHONPATH", "")}
    if device == "cpu":
        child_env["CUDA_VISIBLE_DEVICES"] = ""
    running: dict[int, tuple] = {}  # pid -> (point, Popen, start, stdout path)
    durations: list[float] = []

    def save() -> None:
        record["elapsed_s"] = round(time.monotonic() - t_start, 1)
        tmp = out / "fidelity.json.tmp"
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(out / "fidelity.json")

    def finish(pid: int, status: str) -> None:
        p, proc, t0, logf = running.pop(pid)
        secs = time.monotonic() - t0
        res = None
        for line in Path(logf).read_text(errors="replace").splitlines():
            if line.startswith("FIDELITY_RESULT "):
                res = json.loads(line[len("FIDELITY_RESULT "):])
        if status == "exited":
            status = "finished" if res and not res.get("failed") and proc.returncode == 0 else "failed"
        entry = {"index": p.index, "name": p.run_dir.name, "values": p.values, "status": status,
                 "seconds": round(secs, 1), "returncode": proc.returncode}
        if res:
            entry.update(final=res.get("final"), weights_hash=res.get("weights_hash"), run_dir=res.get("run_dir"),
                         failed=res.get("failed"))
        if status == "failed":
            entry["log_tail"] = Path(logf).read_text(errors="replace")[-1500:]
        if status == "finished":
            durations.append(secs)
        record["runs"].append(entry)
        acc = (res or {}).get("final", {}).get("accuracy") if res else None
        log(f"point {p.index} {p.run_dir.name}: {status} in {secs:.0f} s" + (f", accuracy {acc:.4f}" if acc else ""))
        save()

    queue = list(todo)
    while queue or running:
        now = time.monotonic()
        for pid, (p, proc, t0, logf) in list(running.items()):
            if proc.poll() is not None:
                finish(pid, "exited")
        if now >= deadline:
            for pid, (p, proc, t0, logf) in list(running.items()):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                finish(pid, "stopped at the deadline")
            break
        # a new run starts only where the time left holds the longest finished run (10 % over), or --expect
        expect = max(1.1 * max(durations) if durations else 0.0, args.expect)
        while queue and len(running) < args.parallel and (deadline - time.monotonic()) > expect:
            p = queue.pop(0)
            cfg = json.loads(json.dumps(p.config, default=str))
            cfg.setdefault("output", {})["root"] = str(runs_root)
            cfg.setdefault("data", {})["cache_dir"] = str(work / "partitions")
            cpath = work / f"point-{p.index}.json"
            cpath.write_text(json.dumps(cfg))
            logf = work / f"point-{p.index}.log"
            proc = subprocess.Popen([sys.executable, "-c", _RUNNER, str(cpath)], cwd=ROOT,
                                    stdout=open(logf, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                                    env=child_env)
            running[proc.pid] = (p, proc, time.monotonic(), logf)
            log(f"point {p.index} {p.run_dir.name} started ({p.describe()})")
        if not running and queue:
            log(f"{len(queue)} points left: the time left ({deadline - time.monotonic():.0f} s) holds none "
                f"(the longest run took {max(durations):.0f} s)")
            break
        time.sleep(0.5)
    record["not_started"] = [p.run_dir.name for p in queue]
    save()
    # the small outputs of every finished run, one archive (the device returns at most 8 files)
    finished = [Path(e["run_dir"]) for e in record["runs"] if e["status"] == "finished"]
    with tarfile.open(out / "fidelity-runs.tar.gz", "w:gz") as tar:
        for rd in finished:
            for f in SMALL:
                if (rd / f).exists():
                    tar.add(rd / f, arcname=f"{spec.name}/{rd.name}/{f}")
    log(f"done in {time.monotonic() - t_start:.0f} s: {len(finished)} finished, "
        f"{len(record['runs']) - len(finished)} not, {len(queue)} not started; "
        f"{len(finished)} runs in {out / 'fidelity-runs.tar.gz'}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(e["status"] != "failed" for e in record["runs"]) else 1


def _add_run(into: Path, rel: Path, files: dict[str, bytes], where: str) -> None:
    """One run's small outputs into ``into/rel`` (``<sweep>/<run name>``), whole or not at all (a temporary folder
    renamed); a run directory already there is never replaced."""
    if (into / rel).exists():
        log(f"{into / rel} exists: kept as it is, the copy in {where} left out")
        return
    tmp = into / rel.parent / f".{rel.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    tmp.replace(into / rel)
    log(f"{into / rel}")


def unpack(args) -> int:
    src = Path(args.files)
    tar_path = src / "fidelity-runs.tar.gz" if src.is_dir() else src
    into = Path(args.into)
    with tarfile.open(tar_path) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        for m in members:
            parts = Path(m.name).parts
            if len(parts) != 3 or parts[2] not in SMALL or ".." in parts:
                raise SystemExit(f"{tar_path}: unexpected member {m.name!r}")
        for r in sorted({Path(m.name).parent for m in members}):
            files = {}
            for m in members:
                if Path(m.name).parent == r:
                    f = tar.extractfile(m)
                    assert f is not None
                    files[Path(m.name).name] = f.read()
            _add_run(into, r, files, str(tar_path))
    return 0


def harvest(args) -> int:
    """The finished runs of a ``fedray sweep`` output directory (``runs/*``) into docs/results/<sweep>/, as
    ``unpack`` adds a device's: the small outputs only, a run directory there never replaced."""
    from fedray.core.owner import read_run_status

    sweep_dir = Path(args.sweep_dir)
    record = sweep_dir / "sweep.json"
    if not record.is_file():
        raise SystemExit(f"{sweep_dir}: not a fedray sweep output directory (no sweep.json)")
    name = json.loads(record.read_text())["name"]
    added = 0
    for rd in sorted((sweep_dir / "runs").glob("*/run.json")):
        run = rd.parent
        if read_run_status(run)[1] != "finished" or not all((run / f).is_file() for f in SMALL):
            continue
        rel = Path(name) / run.name
        if not (Path(args.into) / rel).exists():
            added += 1
        _add_run(Path(args.into), rel, {f: (run / f).read_bytes() for f in SMALL}, str(sweep_dir))
    log(f"{added} finished runs of {name} added to {Path(args.into) / name}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="copy the sweep's data files into bench/gpu/.data (to carry)")
    a.add_argument("sweep")
    a = sub.add_parser("run", help="run the sweep's points not yet in docs/results, several at once")
    a.add_argument("sweep")
    a.add_argument("--parallel", type=int, default=8)
    a.add_argument("--deadline", type=float, default=520, help="seconds: runs still going then are stopped")
    a.add_argument("--data", default=str(DATA), help="the carried data (prepare's folder)")
    a.add_argument("--max-points", type=int, default=None)
    a.add_argument("--out", default=None, help="default $OUT, else bench/out/fidelity")
    a.add_argument("--work", default=None, help="run directories (default: a temporary folder, removed)")
    a.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: the GPU runs (named apart); cpu: the sweep's own CPU points, under their names")
    a.add_argument("--expect", type=float, default=0.0,
                   help="seconds one run takes: none starts that the time left cannot hold (before one finished)")
    a.add_argument("--dry", action="store_true", help="CPU check: engine.device cpu, tiny sizes")
    a.add_argument("--set", action="append", default=[], metavar="A.B=C",
                   help="an override of every point (it changes the runs' names where it changes their numbers)")
    a = sub.add_parser("unpack", help="the finished runs' small outputs into docs/results/<sweep>/")
    a.add_argument("files", help="the folder the device returned (or the archive)")
    a.add_argument("--into", default=str(ROOT / "docs" / "results"))
    a = sub.add_parser("harvest", help="a fedray sweep directory's finished runs into docs/results/<sweep>/")
    a.add_argument("sweep_dir", help="the sweep's output directory (sweep.json, runs/)")
    a.add_argument("--into", default=str(ROOT / "docs" / "results"))
    args = ap.parse_args(argv)
    return {"prepare": prepare, "run": run, "unpack": unpack, "harvest": harvest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
