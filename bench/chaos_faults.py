"""The faults of the chaos harness (bench/chaos.py): one table, :data:`KINDS`, with how each kind is planned from a
schedule's random generator and how it is injected.

Two ways in. *At a moment*: the harness watches the run directory (rows of ``metrics.jsonl``) and, once the planned
number of rounds of this driver process is recorded plus a random delay, acts from outside on the processes it
finds with psutil among the driver's descendants (``ray::...ClientWorker``, ``ray::CoordinatorHost``) or on disk.
*In a write*: ``FEDRAY_FAULT_WRITE`` (:mod:`fedray.core.io`) in the driver's environment makes the N-th write of
a file fail with ENOSPC or the driver signal itself in the middle of it (during a checkpoint write, a metrics
append, ...).

Adding a kind is adding a row to :data:`KINDS`; ``default=False`` keeps a kind out of the draw unless ``--kinds``
names it. ``worker_sigstop`` and ``coordinator_sigstop`` (a hung process: alive, silent) are found by the heartbeats
of ``engine.heartbeat_s`` (the harness's runs set 5 s), or while they start by ``engine.start_timeout_s`` (60 s); a run
that outlives the driver's time limit counts as hung.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

WORKER = re.compile(r"^ray::\w*ClientWorker\b")
COORDINATOR = re.compile(r"^ray::\w*CoordinatorHost\b")

#: the writes a full disk or a signal may strike (``FEDRAY_FAULT_WRITE`` globs), with how many of each a driver
#: process makes at most in a run (``R``: one a round; ``C``: one a checkpoint; numbers: that many)
WRITES = {"metrics.jsonl": "R", "round-*.parquet": "R", "ckpt-*.npz": "C", "latest": "C", "run.json": 2,
          "config.yaml": 1, "summary.json": 1, "final_weights.npy": 1}


@dataclass
class Fault:
    """One planned fault: of ``kind``, in driver process ``attempt`` (0: the first run, 1: its first resume, ...),
    once that process has recorded ``after_rows`` rounds and ``delay_s`` more seconds passed (moment kinds), or at
    the write ``write`` (``GLOB@N=ACTION``: write kinds)."""

    kind: str
    attempt: int = 0
    after_rows: int = 0
    delay_s: float = 0.0
    write: str = ""
    pick: int = 0  # seeds the choice of the process or file acted on
    fired: bool = False
    note: str = ""  # what was done (the process, the file)
    carried: int = 0  # times it moved on to the next driver, its own having ended before it struck
    due: float | None = field(default=None, repr=False)  # monotonic time it fires at, once its rows are in

    def describe(self) -> str:
        where = self.write or f"after {self.after_rows} round(s) + {self.delay_s:.2f} s"
        return f"{self.kind} (driver {self.attempt}, {where})"


@dataclass
class Target:
    """What a moment fault acts on: the driver process, its run directory, the run's tmpfs (disk_full)."""

    driver: subprocess.Popen
    run_dir: Path
    disk: Path | None = None
    stopped: list[int] = field(default_factory=list)  # pids SIGSTOPped, resumed at the end
    cluster: Any = None  # the loopback cluster the driver joined (bench/chaos_cluster.py), if any


@dataclass(frozen=True)
class Kind:
    name: str
    plan: Callable[[random.Random, int, int], Fault]  # (rng, rounds, checkpoints) -> a fault
    fire: Callable[[Fault, Target], bool] | None  # moment kinds: inject now; False when there is nothing to act on
    ray: bool = False  # needs Ray processes (engine.backend ray)
    disk: bool = False  # needs the run directory on a tmpfs of the harness's own
    cluster: bool = False  # needs the loopback cluster (--cluster)
    default: bool = True  # drawn unless --kinds names the kinds
    note: str = ""


# ------------------------------------------------------------------------------------------- planning
def _moment(kind: str) -> Callable[[random.Random, int, int], Fault]:
    def plan(rng: random.Random, rounds: int, checkpoints: int) -> Fault:
        return Fault(kind, attempt=0 if rng.random() < 0.8 else 1, after_rows=rng.randrange(rounds),
                     delay_s=round(rng.uniform(0.0, 1.5), 3), pick=rng.randrange(1 << 30))
    return plan


def _write(kind: str, globs: list[str], action: str) -> Callable[[random.Random, int, int], Fault]:
    def plan(rng: random.Random, rounds: int, checkpoints: int) -> Fault:
        glob = rng.choice(globs)
        most = {"R": rounds, "C": checkpoints}.get(str(WRITES[glob])) or int(WRITES[glob])
        return Fault(kind, attempt=0 if rng.random() < 0.8 else 1,
                     write=f"{glob}@{rng.randint(1, max(1, most))}={action}")
    return plan


# ------------------------------------------------------------------------------------------- processes
def descendants(driver: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(driver.pid).children(recursive=True)
    except psutil.Error:
        return []


def ray_processes(driver: subprocess.Popen, pattern: re.Pattern) -> list[psutil.Process]:
    """The driver's descendants whose title (Ray sets the command line to ``ray::Class.method``) matches."""
    out = []
    for p in descendants(driver):
        try:
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if pattern.match(title) and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def _signal_one(procs: list[psutil.Process], sig: int, fault: Fault) -> int | None:
    """Send ``sig`` to one of ``procs`` (chosen by the fault's ``pick``); its pid, None when there was none."""
    if not procs:
        return None
    p = procs[fault.pick % len(procs)]
    try:
        title = " ".join(p.cmdline())
        p.send_signal(sig)
    except psutil.Error:
        return None
    fault.note = f"{signal.Signals(sig).name} pid {p.pid} ({title[:60]})"
    return p.pid


def _actors(t: Target, pattern: re.Pattern) -> list[psutil.Process]:
    """The run's actor processes of that title: the driver's descendants (its private Ray), or the cluster's."""
    return ray_processes(t.driver, pattern) + (t.cluster.actors([pattern]) if t.cluster is not None else [])


def _kill(pattern: re.Pattern, sig: int = signal.SIGKILL) -> Callable[[Fault, Target], bool]:
    def fire(fault: Fault, t: Target) -> bool:
        return _signal_one(_actors(t, pattern), sig, fault) is not None
    return fire


def _stop(pattern: re.Pattern) -> Callable[[Fault, Target], bool]:
    """SIGSTOP one of the processes: hung, not dead (SIGKILLed when its driver ends, if nothing did before)."""
    def fire(fault: Fault, t: Target) -> bool:
        pid = _signal_one(_actors(t, pattern), signal.SIGSTOP, fault)
        if pid is not None:
            t.stopped.append(pid)
        return pid is not None
    return fire


def _signal_driver(sig: int) -> Callable[[Fault, Target], bool]:
    def fire(fault: Fault, t: Target) -> bool:
        if t.driver.poll() is not None:
            return False
        t.driver.send_signal(sig)
        fault.note = f"{signal.Signals(sig).name} the driver (pid {t.driver.pid})"
        return True
    return fire


# ------------------------------------------------------------------------------------------- disk
def fill(path: Path) -> int:
    """Write zeros into ``path`` until its file system is full; the bytes written."""
    n = 0
    with open(path, "ab", buffering=0) as f:
        block = b"\0" * 65536
        while True:
            try:
                n += f.write(block) or 0
            except OSError:
                break
        small = b"\0" * 512
        while True:
            try:
                n += f.write(small) or 0
            except OSError:
                return n


def _kill_raylet(fault: Fault, t: Target) -> bool:
    if t.cluster is None or t.driver.poll() is not None:
        return False
    fault.note = t.cluster.kill_raylet(fault.pick) or ""
    return bool(fault.note)


def _fill_disk(fault: Fault, t: Target) -> bool:
    if t.disk is None:
        return False
    n = fill(t.disk / "filler")
    fault.note = f"filled the run's tmpfs ({n / 2**20:.1f} MiB)"
    return True


def _partition_files(run_dir: Path) -> list[Path]:
    import json

    try:
        part = Path(json.loads((run_dir / "run.json").read_text())["partition_path"])
    except (OSError, ValueError, KeyError):
        return []
    return sorted(p for p in part.rglob("*") if p.is_file() and p.stat().st_size > 0)


def _corrupt_shard(fault: Fault, t: Target) -> bool:
    """Damage a file of the run's partition in place (same inode, as a bad disk or a stray writer would): 64 random
    bytes at a random offset, or the file cut to half its size."""
    files = _partition_files(t.run_dir)
    if not files:
        return False
    rng = random.Random(fault.pick)
    data = [p for p in files if "data" in p.parts or p.suffix in (".arrow", ".arrows")] or files
    path = rng.choice(data)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if rng.random() < 0.5 and size > 64:
            at = rng.randrange(size - 64)
            f.seek(at)
            f.write(os.urandom(64))
            fault.note = f"overwrote 64 bytes at {at} of {path.name} ({size} bytes)"
        else:
            f.truncate(size // 2)
            fault.note = f"cut {path.name} from {size} to {size // 2} bytes"
    return True


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


# ------------------------------------------------------------------------------------------- the table
KINDS: dict[str, Kind] = {k.name: k for k in [
    Kind("worker_sigkill", _moment("worker_sigkill"), _kill(WORKER), ray=True),
    Kind("coordinator_sigkill", _moment("coordinator_sigkill"), _kill(COORDINATOR), ray=True),
    Kind("driver_sigkill", _moment("driver_sigkill"), _signal_driver(signal.SIGKILL)),
    Kind("driver_sigterm", _moment("driver_sigterm"), _signal_driver(signal.SIGTERM)),
    Kind("checkpoint_sigterm", _write("checkpoint_sigterm", ["ckpt-*.npz", "latest"], "sigterm"), None,
         note="SIGTERM in the middle of a checkpoint write"),
    Kind("checkpoint_sigkill", _write("checkpoint_sigkill", ["ckpt-*.npz", "latest"], "sigkill"), None,
         note="SIGKILL in the middle of a checkpoint write"),
    Kind("write_sigkill", _write("write_sigkill", ["metrics.jsonl", "round-*.parquet", "run.json"], "sigkill"), None,
         note="SIGKILL in the middle of a metrics append, a ledger or run.json write"),
    Kind("enospc", _write("enospc", list(WRITES), "enospc"), None, note="ENOSPC injected in the write helper"),
    Kind("disk_full", _moment("disk_full"), _fill_disk, disk=True, note="the run's own tmpfs filled up"),
    Kind("shard_corrupt", _moment("shard_corrupt"), _corrupt_shard, note="a partition file damaged in place"),
    Kind("worker_sigstop", _moment("worker_sigstop"), _stop(WORKER), ray=True,
         note="a hung worker (alive, silent): found by engine.heartbeat_s (engine.start_timeout_s while it starts), "
              "replaced, its clients re-run"),
    Kind("coordinator_sigstop", _moment("coordinator_sigstop"), _stop(COORDINATOR), ray=True,
         note="a hung coordinator: found by the driver's heartbeat (engine.heartbeat_s), restarted from the last "
              "checkpoint"),
    Kind("raylet_sigkill", _moment("raylet_sigkill"), _kill_raylet, ray=True, cluster=True, default=False,
         note="a worker node's raylet SIGKILLed (its workers die with it); the node is started again before the "
              "next driver"),
]}


def write_spec(faults: list[Fault], attempt: int) -> str:
    """``FEDRAY_FAULT_WRITE`` for driver process ``attempt``: its write faults."""
    return ",".join(f.write for f in faults if f.write and f.attempt == attempt)
