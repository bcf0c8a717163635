"""Chaos: random fault schedules over whole fedray runs, each checked against fedray's promise.

    python bench/chaos.py --schedules 40 --seed 0              # figures at the end, one line per schedule
    python bench/chaos.py --schedules 5 --kinds enospc,driver_sigkill --keep --workdir /tmp/chaos
    python bench/chaos.py --seed 0 --only 17                   # replay schedule 17 of seed 0 (same plan)
    fedray bench chaos --schedules 40                          # the same (bench/bench_chaos.py)
    python bench/chaos.py --seed 21 --first 40 --schedules 20 --results r.jsonl   # a shard: schedules 40..59
    python bench/chaos.py --report r.jsonl other.jsonl         # the figures of every record (docs/reliability.md)
    python bench/chaos.py --variants sweep,tune --schedules 4  # `fedray sweep` / `fedray tune` (bench/chaos_apps.py)
    python bench/chaos.py --cluster --schedules 10             # on a 3-node loopback cluster (bench/chaos_cluster.py)

The promise (docs/reliability.md): a run either ends with the bits of the fault-free run, or fails loudly (exit
non-zero; run.json ``failed`` with a reason, ``interrupted``, or ``killed`` when its driver was killed) and
``fedray run --resume`` reaches those bits; nothing written is lost or silently overwritten.

A schedule is one short ``fedray run`` (the FedAvg CNN on the embedded MNIST subset, 20 clients, 4 a round, 4 rounds
on a private local Ray with 2 workers; a program variant: plain, ``engine.fold_group``, ``engine.multi_client``, the
split program (SCALA), or an application over two such runs: ``fedray sweep``, ``fedray tune``) with ``--min-faults``
to ``--max-faults`` faults drawn from the seed (a fault whose driver ended before it struck moves on to the next
driver, at most ``--carry`` times) (bench/chaos_faults.py: the kinds, how each is planned and
injected). The harness runs the driver as a subprocess, injects the faults, and after every driver that exits
non-zero checks that the failure was loud and runs ``fedray run --resume`` (a fresh ``fedray run`` when no run.json
was written), until a driver exits 0 or a resume is refused. Then it checks the promise:

- the final weights hash equals the fault-free run's (computed once per variant, same command, no fault);
- ``metrics.jsonl`` holds every round once, in order, and the ledger one file per round holding that round;
- run.json says ``finished``; no temporary file of a write and no space reserve is left in the run directory;
- no process of the run (found by an environment tag every Ray process inherits) outlives it, and nothing is left
  in the run's own TMPDIR (Ray's session directories go to ``RAY_TMPDIR``: its logs, which Ray keeps by design).

Violations are counted and printed with the command that replays the schedule. Exit status 1 when any.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import chaos_apps  # noqa: E402
import chaos_records  # noqa: E402
from chaos_cluster import LoopbackCluster  # noqa: E402
from chaos_faults import COORDINATOR, KINDS, WORKER, Fault, Target, mount_tmpfs, unmount, write_spec  # noqa: E402

from fedray.core.io import FAULT_ENV, FAULT_LOG_ENV, is_temp_name  # noqa: E402
from fedray.core.owner import read_run_status  # noqa: E402
from fedray.core.ray_env import LOOPBACK_SWITCH  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TAG_ENV = "FEDRAY_CHAOS_TAG"
ROUNDS = 4
VARIANTS = {"federated": {}, "fold_group": {"engine": {"fold_group": 2}},
            "multi_client": {"engine": {"multi_client": 2}},
            # the split program: SCALA's server step every local iteration, on the CNN with split points
            "split": {"model": {"name": "cnn_taps"},
                      "algorithm": {"name": "scala", "params": {"local_iters": 2, "batch_size": 40}}},
            # applications (bench/chaos_apps.py): `fedray sweep` over 2 points, `fedray tune` over a 2-value grid
            "sweep": {}, "tune": {}}
#: the variants drawn unless --variants names others (those of the first figures in docs/reliability.md)
DEFAULT_VARIANTS = ["federated", "fold_group", "multi_client"]


def experiment(variant: str, root: Path, cache: Path, rounds: int = ROUNDS, checkpoint_every: int = 1) -> dict:
    cfg = {
        "seed": 0,
        "data": {"source": "mnist5k", "normalize": False, "cache_dir": str(cache),
                 "partition": {"name": "dirichlet", "num_clients": 20, "params": {"alpha": 0.5}}},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": rounds, "clients_per_round": 4, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 1},
        # a hung worker found in 5 s, one stopped while it starts in 60 s (within the harness's driver time limit);
        # neither is hashed: the bits do not depend on them
        "engine": {"backend": "ray", "num_workers": 2, "max_worker_restarts": 8, "max_coordinator_restarts": 4,
                   "heartbeat_s": 5.0, "start_timeout_s": 60.0},
        "output": {"root": str(root), "name": "run", "checkpoint_every": checkpoint_every, "tensorboard": False,
                   "progress": False},
    }
    for section, values in VARIANTS[variant].items():
        cfg[section].update(values)
    return cfg


@dataclass
class Attempt:
    number: int
    command: str  # run | resume
    rc: int | None = None
    status: str | None = None  # run.json's, a dead driver's "running" read as "killed"
    reason: str | None = None
    seconds: float = 0.0
    hung: bool = False
    tail: str = ""


@dataclass
class Outcome:
    index: int
    variant: str
    faults: list[Fault]
    attempts: list[Attempt] = field(default_factory=list)
    ending: str = "unfinished"  # identical | other bits | refused | unfinished
    problems: list[str] = field(default_factory=list)  # violations of the promise
    leaked: list[str] = field(default_factory=list)
    started_over: int = 0  # resumes refused for want of a checkpoint, then run again with --overwrite
    seconds: float = 0.0

    @property
    def loud_failures(self) -> int:
        return sum(1 for a in self.attempts if a.rc != 0)


# ------------------------------------------------------------------------------------------- processes
def driver_env(tag: str, scratch: Path, cluster: LoopbackCluster | None = None) -> dict:
    """A driver's environment: no fault, no outside Ray (or the loopback cluster's address and token), its own
    TMPDIR and RAY_TMPDIR, and the schedule's tag."""
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, FAULT_LOG_ENV, "RAY_ADDRESS")}
    if cluster is not None:
        env.update({k: v for k, v in cluster.env.items() if k.startswith("RAY_AUTH") or k == LOOPBACK_SWITCH},
                   RAY_ADDRESS=cluster.address)
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    env.update({"TQDM_DISABLE": "1", "FEDRAY_NO_WARM": "1", "RAY_USAGE_STATS_ENABLED": "0", TAG_ENV: tag,
                "RAY_TMPDIR": str(scratch / "ray"), "TMPDIR": str(scratch / "tmp"),
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    return env


def tagged(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``tag`` (a schedule's drivers and all their Ray processes)."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def reap(tag: str, wait_s: float = 30.0) -> list[str]:
    """Wait (bounded) for the schedule's processes to end; SIGKILL and name those still there."""
    deadline = time.monotonic() + wait_s
    left = tagged(tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = tagged(tag)
    names = []
    for p in left:
        try:
            names.append(f"pid {p.pid} {' '.join(p.cmdline())[:70]}")
            p.kill()
        except psutil.Error:
            continue
    return names


def rows(run_dir: Path) -> int:
    try:
        with open(run_dir / "metrics.jsonl", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


# ------------------------------------------------------------------------------------------- one driver
@dataclass
class Schedule:
    index: int
    variant: str
    faults: list[Fault]
    config: Path
    run_dir: Path
    scratch: Path
    tag: str
    disk: Path | None = None
    cluster: LoopbackCluster | None = None
    app: str | None = None  # sweep | tune: ``config`` is its file, ``run_dir`` its output directory

    def progress(self) -> int:
        """Rounds recorded so far (by all of an application's runs)."""
        if self.app is None:
            return rows(self.run_dir)
        return sum(rows(d) for d in chaos_apps.run_dirs(self.app, self.config))


def _watch(s: Schedule, proc: subprocess.Popen, attempt: int, timeout_s: float) -> bool:
    """Fire this driver's moment faults as they fall due; True when the driver outlived ``timeout_s`` (hung)."""
    t = Target(proc, s.run_dir, s.disk, cluster=s.cluster)
    start = s.progress()
    pending = [f for f in s.faults if f.attempt == attempt and KINDS[f.kind].fire is not None]
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        now = time.monotonic()
        done = s.progress() - start
        for f in pending:
            if f.fired:
                continue
            if f.due is None and done >= f.after_rows:
                f.due = now + f.delay_s
            if f.due is not None and now >= f.due:
                fire = KINDS[f.kind].fire
                f.fired = bool(fire and fire(f, t))  # nothing to act on yet (no worker started): the next poll
        if now > deadline:
            proc.kill()
            proc.wait()
            return True
        time.sleep(0.02)
    for pid in t.stopped:  # a hung worker of this driver: it goes with its Ray
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return False


def run_driver(s: Schedule, attempt: int, command: str, timeout_s: float) -> Attempt:
    """Driver process ``attempt``: ``fedray run CONFIG`` (``run``), ``fedray run --resume RUN_DIR`` (``resume``) or
    ``fedray run CONFIG --overwrite`` (``overwrite``), its moment faults fired as they fall due."""
    a = Attempt(attempt, command)
    cmd = [sys.executable, "-m", "fedray", "run", "--quiet"]
    cmd += ["--resume", str(s.run_dir)] if command == "resume" else [str(s.config)]
    cmd += ["--overwrite"] if command == "overwrite" else []
    if s.app is not None:
        cmd = chaos_apps.command(s.app, s.config, command == "resume")
    env = driver_env(s.tag, s.scratch, s.cluster)
    log = s.scratch / f"driver-{attempt}.log"
    spec = write_spec(s.faults, attempt)
    if spec:
        env[FAULT_ENV], env[FAULT_LOG_ENV] = spec, str(log.with_suffix(".faults"))
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            a.hung = _watch(s, proc, attempt, timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    a.rc, a.seconds = proc.returncode, time.monotonic() - t0
    a.tail = "\n".join(log.read_text(errors="replace").strip().splitlines()[-6:])
    faults_log = log.with_suffix(".faults")  # the write faults that struck, as fedray's write helper logged them
    struck = Counter(faults_log.read_text().split()) if faults_log.is_file() else Counter()
    for f in s.faults:
        if f.write and f.attempt == attempt and not f.fired and struck.get(f.write, 0) > 0:
            struck[f.write] -= 1
            f.fired = True
    if s.disk is not None:
        for p in s.disk.glob("filler*"):
            p.unlink()  # space is back for the resume
    if s.cluster is not None:
        s.cluster.heal()  # a worker node whose raylet was killed is started again before the resume
    if s.app is not None:
        a.status, a.reason = chaos_apps.session_status(s.app, s.config)
    elif (s.run_dir / "run.json").is_file():
        _, a.status, a.reason = read_run_status(s.run_dir)
    return a


# ------------------------------------------------------------------------------------------- the promise
def check_ending(run_dir: Path, rounds: int, want_hash: str) -> tuple[str, list[str]]:
    """(ending, problems) of a run whose last driver exited 0: ``identical`` or ``other bits``, and what breaks
    the promise (lost or repeated rounds in metrics.jsonl or the ledger, half-written files, a wrong status)."""
    problems: list[str] = []
    info, status, _ = read_run_status(run_dir)
    if status != "finished":
        problems.append(f"exit 0 but run.json says {status}")
    try:
        got = json.loads((run_dir / "summary.json").read_text()).get("weights_hash")
    except (OSError, ValueError):
        got = None
    ending = "identical" if got == want_hash else "other bits"
    if ending != "identical":
        problems.append(f"silent wrong result: weights {got}, the fault-free run's {want_hash}")
    text = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").is_file() else ""
    try:
        recorded = [int(json.loads(line)["round"]) for line in text.splitlines()]
    except (ValueError, KeyError):
        recorded = []
        problems.append("metrics.jsonl holds a line that is not a whole row")
    if recorded != list(range(1, rounds + 1)) or (text and not text.endswith("\n")):
        problems.append(f"metrics.jsonl rounds {recorded}, expected 1..{rounds} once each")
    problems += _ledger_problems(run_dir, rounds)
    left = [str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
            if p.is_file() and (is_temp_name(p.name) or p.name == ".space-reserve")]
    if left:
        problems.append(f"left in the run directory: {left}")
    return ending, problems


def _ledger_problems(run_dir: Path, rounds: int) -> list[str]:
    import pyarrow.parquet as pq

    files = sorted((run_dir / "ledger").glob("round-*.parquet"))
    names = [f.name for f in files]
    want = [f"round-{r:06d}.parquet" for r in range(1, rounds + 1)]
    if names != want:
        return [f"ledger files {names}, expected {want}"]
    for r, f in enumerate(files, start=1):
        try:
            held = set(pq.read_table(f, columns=["round"]).column("round").to_pylist())
        except Exception as e:  # noqa: BLE001 - a damaged file is what this looks for
            return [f"ledger {f.name} unreadable: {type(e).__name__}: {e}"]
        if held != {r}:
            return [f"ledger {f.name} holds rounds {sorted(held)}"]
    return []


def _loud(a: Attempt) -> str | None:
    """What is wrong with a driver that exited non-zero, if anything: its failure must be on record."""
    if a.status is None or a.status in ("interrupted", "killed", "finished", "crashed", "aborted"):
        # no run.json yet (died in set-up), stopped with a checkpoint, or killed: the record says so; an application's
        # session ends crashed / aborted (its traceback in its log), finished when a run failed (that run's record)
        return None
    if a.status == "failed":
        return None if a.reason else "run.json says failed without a reason"
    return f"driver {a.number} exited {a.rc} but run.json says {a.status}"


# ------------------------------------------------------------------------------------------- one schedule
def plan(seed: int, index: int, variants: list[str], kinds: list[str], max_faults: int,
         min_faults: int = 1) -> tuple[str, list[Fault], int]:
    """Schedule ``index`` of ``seed``: (program variant, faults, output.checkpoint_every): ``min_faults`` to
    ``max_faults`` faults (with ``min_faults=1`` the draws of the first harness, so its schedules replay)."""
    rng = random.Random(f"chaos:{seed}:{index}")
    variant = rng.choice(variants)
    every = rng.choice([1, 1, 2])
    checkpoints = len({min(r, ROUNDS) for r in range(every, ROUNDS + every, every)})
    n = rng.randint(min_faults, max_faults)
    if variant in chaos_apps.APPS:  # no tmpfs of its own, no single partition to damage
        kinds = [k for k in kinds if not KINDS[k].disk and k != "shard_corrupt"]
    faults = [KINDS[rng.choice(kinds)].plan(rng, ROUNDS, checkpoints) for _ in range(n)]
    return variant, faults, every


def run_schedule(ctx: Context, index: int) -> Outcome:
    variant, faults, every = plan(ctx.seed, index, ctx.variants, ctx.kinds, ctx.max_faults, ctx.min_faults)
    out = Outcome(index, variant, faults)
    tag = uuid.uuid4().hex[:10]
    scratch = Path(tempfile.mkdtemp(prefix=f"fc-{tag[:6]}-", dir="/tmp"))  # short: Ray's socket paths
    disk = None
    root = ctx.workdir / f"s{index:04d}"
    if any(KINDS[f.kind].disk for f in faults):
        disk = scratch / "disk"
        if not mount_tmpfs(disk, "96m"):
            raise RuntimeError("disk_full needs a tmpfs of its own (mount -t tmpfs): run as root, or leave it out")
        root = disk
    cfg_path = scratch / "config.yaml"
    cfg = experiment(variant if variant not in chaos_apps.APPS else "federated", root / "runs", ctx.cache,
                     checkpoint_every=every)
    cfg_path.write_text(yaml.safe_dump(cfg))
    s = Schedule(index, variant, faults, cfg_path, root / "runs" / "run", scratch, tag, disk, ctx.cluster)
    if variant in chaos_apps.APPS:
        s.app, s.config = variant, chaos_apps.write_files(variant, cfg, root / "app")
        s.run_dir = chaos_apps.out_dir(variant, s.config)
    t0 = time.monotonic()
    try:
        _drive(ctx, s, out)
    finally:
        out.leaked = reap(tag) + (actors_left(ctx.cluster) if ctx.cluster is not None else [])
        if out.leaked:
            out.problems.append(f"processes left after the run: {out.leaked}")
        stray = [p.name for p in (scratch / "tmp").iterdir()] if (scratch / "tmp").is_dir() else []
        if stray:
            out.problems.append(f"left in the run's TMPDIR: {stray}")
        building = [p.name for p in ctx.cache.glob(".tmp-*")] if ctx.cache.is_dir() else []
        if building:  # a partition build a killed driver left half-done (never used: an install is a rename)
            out.problems.append(f"left in the partition cache: {building}")
            for p in ctx.cache.glob(".tmp-*"):
                shutil.rmtree(p, ignore_errors=True)
        if ctx.keep:
            shutil.copytree(scratch, root / "scratch", dirs_exist_ok=True, ignore=shutil.ignore_patterns("sockets"))
        if disk is not None:
            unmount(disk)
        shutil.rmtree(scratch, ignore_errors=True)
        if not ctx.keep:
            shutil.rmtree(ctx.workdir / f"s{index:04d}", ignore_errors=True)
    out.seconds = time.monotonic() - t0
    return out


def _drive(ctx: Context, s: Schedule, out: Outcome) -> None:
    """Drivers until one exits 0 (then the promise is checked), a resume is refused for another reason than a
    missing checkpoint, or the attempts run out. A resume refused for want of a checkpoint (killed before the first
    one) is followed by what its message says: ``--overwrite``, which must reach the same bits."""
    limit = 2 + len(s.faults) * (1 + ctx.carry) + sum(1 for f in s.faults if f.attempt > 0)
    command = "run"
    for attempt in range(limit):
        a = run_driver(s, attempt, command, ctx.timeout_s * (2 if s.app else 1))
        out.attempts.append(a)
        if a.rc != 0:
            carry_over(s.faults, attempt, ctx.carry)
        if a.hung:
            out.problems.append(f"driver {attempt} still ran after {ctx.timeout_s:.0f} s (hung); killed")
        if a.rc == 0:
            if s.app is not None:
                out.ending, problems = chaos_apps.check(s.app, s.config, ctx.references[s.variant], check_ending)
            else:
                out.ending, problems = check_ending(s.run_dir, ROUNDS, ctx.references[s.variant])
            out.problems += problems
            return
        if a.rc == 2 and "start over with --overwrite" in a.tail and command == "resume":
            out.started_over += 1
            command = "overwrite"
            continue
        if a.rc == 2 and a.status != "failed":  # refused before it claimed the run (a failed one is resumed)
            out.ending = "refused"
            out.problems.append(f"driver {attempt} ({a.command}) refused, exit 2: {a.tail.splitlines()[-1:]}")
            return
        wrong = _loud(a)
        if wrong:
            out.problems.append(wrong)
        command = "resume" if (s.run_dir / ("run.json" if s.app is None else "")).exists() else "run"
    out.problems.append(f"no driver finished the run in {limit} tries")


def carry_over(faults: list[Fault], attempt: int, times: int) -> None:
    """Driver ``attempt`` ended non-zero (another follows): its faults that did not strike (it ended before their
    moment or write came) move to the next driver, each at most ``times`` times in all."""
    for f in faults:
        if f.attempt == attempt and not f.fired and f.carried < times:
            f.attempt, f.carried, f.due = attempt + 1, f.carried + 1, None


# ------------------------------------------------------------------------------------------- the harness
@dataclass
class Context:
    seed: int
    workdir: Path
    cache: Path
    variants: list[str]
    kinds: list[str]
    max_faults: int = 3
    timeout_s: float = 300.0
    keep: bool = False
    references: dict = field(default_factory=dict)  # variant -> weights hash (an application's: lr -> results)
    min_faults: int = 1
    carry: int = 0  # times a fault that did not strike moves on to the next driver (0: the first harness's rule)
    mode: str = "one-node"  # one-node: a private local Ray per driver; cluster: every driver joins ``cluster``
    cluster: LoopbackCluster | None = None


def reference(ctx: Context, variant: str):
    """The fault-free run's weights hash: the same command, no fault (an application's: its results by lr)."""
    root = ctx.workdir / f"ref-{variant}"
    shutil.rmtree(root, ignore_errors=True)
    cfg = root / "config.yaml"
    root.mkdir(parents=True)
    app = variant if variant in chaos_apps.APPS else None
    base = experiment("federated" if app else variant, root / "runs", ctx.cache)
    cfg.write_text(yaml.safe_dump(base))
    cmd = [sys.executable, "-m", "fedray", "run", "--quiet", str(cfg)]
    if app:
        cfg = chaos_apps.write_files(app, base, root / "app")
        cmd = chaos_apps.command(app, cfg, False)
    tag = uuid.uuid4().hex[:10]
    scratch = Path(tempfile.mkdtemp(prefix=f"fc-{tag[:6]}-", dir="/tmp"))
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=driver_env(tag, scratch, ctx.cluster), capture_output=True, text=True,
                           timeout=ctx.timeout_s * (3 if app else 1))
        reap(tag)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if r.returncode != 0:
        raise RuntimeError(f"the fault-free {variant} run failed (exit {r.returncode}): {r.stderr[-2000:]}")
    if app:
        return chaos_apps.results(app, cfg)
    return json.loads((root / "runs" / "run" / "summary.json").read_text())["weights_hash"]


def actors_left(cluster: LoopbackCluster, wait_s: float = 30.0) -> list[str]:
    """The run's actor processes still alive on the cluster ``wait_s`` after its last driver ended (Ray ends a job's
    actors with its driver); SIGKILLed and named."""
    deadline = time.monotonic() + wait_s
    while cluster.actors([WORKER, COORDINATOR]) and time.monotonic() < deadline:
        time.sleep(0.5)
    names = []
    for p in cluster.actors([WORKER, COORDINATOR]):
        try:
            names.append(f"pid {p.pid} {' '.join(p.cmdline())[:70]} (cluster actor)")
            p.kill()
        except psutil.Error:
            continue
    return names


def available_kinds(names: list[str] | None, cluster: bool = False) -> list[str]:
    """The kinds drawn: ``names`` (checked), else every default kind this machine can inject."""
    if names:
        unknown = [n for n in names if n not in KINDS]
        if unknown:
            raise SystemExit(f"chaos: unknown fault kind(s) {unknown}; known: {', '.join(KINDS)}")
        return names
    can_mount = os.geteuid() == 0 and shutil.which("mount") is not None
    return [k.name for k in KINDS.values() if (k.default or (cluster and k.cluster)) and (can_mount or not k.disk)]


def summarize(outcomes: list[Outcome]) -> dict:
    """The figures of ``outcomes`` (as their records would give them: bench/chaos_records.py)."""
    return chaos_records.summarize([chaos_records.make_record(o, mode="one-node", seed=0, settings={}, commit="")
                                    for o in outcomes])


def describe(o: Outcome) -> str:
    faults = ", ".join(f.describe() + ("" if f.fired else " [not injected]") for f in o.faults)
    drivers = " -> ".join(f"{a.command} exit {a.rc}" + (f" ({a.status}: {(a.reason or '')[:80]})"
                                                         if a.rc else "") for a in o.attempts)
    return f"{o.variant}: {faults} | {drivers} | {o.ending}, {o.seconds:.0f} s"


def settings(ctx: Context) -> dict:
    """What a schedule's plan and run depend on besides its seed and index (part of its key in a results file)."""
    return {"variants": ctx.variants, "kinds": ctx.kinds, "min_faults": ctx.min_faults,
            "max_faults": ctx.max_faults, "carry": ctx.carry, "rounds": ROUNDS}


def run(ctx: Context, indices: list[int], log=print, results: Path | None = None) -> list[Outcome]:
    """Run schedules ``indices`` of the seed; with ``results``, append each one's record as it finishes."""
    for v in sorted({plan(ctx.seed, i, ctx.variants, ctx.kinds, ctx.max_faults, ctx.min_faults)[0]
                     for i in indices}):
        if v not in ctx.references:
            ctx.references[v] = reference(ctx, v)
            log(f"[chaos] fault-free {v} run: weights {ctx.references[v]}")
    commit = chaos_records.git_commit()
    outcomes = []
    for n, i in enumerate(indices, start=1):
        o = run_schedule(ctx, i)
        outcomes.append(o)
        log(f"[chaos] {n}/{len(indices)} schedule {i} {describe(o)}")
        for p in o.problems:
            log(f"[chaos]   VIOLATION: {p}\n[chaos]   replay: python bench/chaos.py {replay_args(ctx)} --only {i}")
        if results is not None:
            chaos_records.append(results, chaos_records.make_record(o, mode=ctx.mode, seed=ctx.seed,
                                                                   settings=settings(ctx), commit=commit))
    return outcomes


def replay_args(ctx: Context) -> str:
    kinds = "" if ctx.kinds == available_kinds(None, ctx.cluster is not None) else f" --kinds {','.join(ctx.kinds)}"
    return (f"{'--cluster ' if ctx.cluster is not None else ''}--seed {ctx.seed} --variants {','.join(ctx.variants)} --min-faults {ctx.min_faults} "
            f"--max-faults {ctx.max_faults} --carry {ctx.carry}{kinds}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=20)
    ap.add_argument("--first", type=int, default=0, help="the first schedule index (a shard: FIRST..FIRST+N-1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", type=int, nargs="+", help="run these schedule numbers of the seed (a replay)")
    ap.add_argument("--kinds", help=f"comma-separated fault kinds to draw from (default: {', '.join(available_kinds(None))})")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"program variants to draw from (known: {', '.join(VARIANTS)})")
    ap.add_argument("--min-faults", type=int, default=2)
    ap.add_argument("--max-faults", type=int, default=6)
    ap.add_argument("--carry", type=int, default=2, help="times a fault whose driver ended before it struck moves "
                                                         "on to the next driver (0: never)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a driver may run before it counts as hung")
    ap.add_argument("--workdir", help="where the runs go (default: a temporary directory, removed)")
    ap.add_argument("--keep", action="store_true", help="keep every schedule's run directory and driver logs")
    ap.add_argument("--json", help="write the figures and every schedule's outcome to this file")
    ap.add_argument("--results", help="append one JSON line per finished schedule to this file (shards accumulate; "
                                      "a schedule already in it is refused)")
    ap.add_argument("--cluster", action="store_true", help="run every schedule against a head and 2 worker nodes "
                                                            "started with `ray start` on 127.0.0.1 (adds the fault "
                                                            "raylet_sigkill)")
    ap.add_argument("--report", nargs="+", metavar="FILE", help="print the figures of these results files; run nothing")
    args = ap.parse_args(argv)
    if args.report:
        return chaos_records.report([Path(p) for p in args.report])
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"chaos: unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fedray-chaos-"))
    ctx = Context(args.seed, workdir, workdir / "partitions", args.variants.split(","),
                  available_kinds(args.kinds.split(",") if args.kinds else None, args.cluster), args.max_faults,
                  args.timeout, args.keep, min_faults=args.min_faults, carry=args.carry,
                  mode="cluster" if args.cluster else "one-node")
    indices = args.only or list(range(args.first, args.first + args.schedules))
    results = Path(args.results) if args.results else None
    if results is not None:
        held = {chaos_records.key(r) for r in chaos_records.read([results])}
        again = [i for i in indices if (ctx.mode, ctx.seed, i, chaos_records.plan_digest(settings(ctx))) in held]
        if again:
            raise SystemExit(f"chaos: {results} already holds schedule(s) {again} of seed {ctx.seed} with these "
                             f"settings; run other indices (--first) or another seed")
    print(f"[chaos] seed {args.seed}: kinds {', '.join(ctx.kinds)}; variants {', '.join(ctx.variants)}; "
          f"schedules {indices[0]}..{indices[-1]}; in {workdir}")
    try:
        if args.cluster:
            ctx.cluster = LoopbackCluster().start()
            print(f"[chaos] a head and 2 worker nodes on 127.0.0.1 (token auth): {ctx.cluster.address}")
        outcomes = run(ctx, indices, results=results)
    finally:
        if ctx.cluster is not None:
            ctx.cluster.stop()
    fig = summarize(outcomes)
    print(f"\nchaos figures (seed {args.seed}, schedules {indices[0]}..{indices[-1]})\n{chaos_records.table(fig)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": fig, "outcomes": [asdict(o) for o in outcomes]}, indent=1,
                                              default=str) + "\n")
    if not args.workdir and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if fig["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
