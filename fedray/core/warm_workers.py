"""Idle worker processes of the `fedray up` Ray, started before a run with torch and fedray imported.

Ray gives every job (every driver process) worker processes of its own, so on a warm cluster most of a
run's start-up is its actors' processes starting: the coordinator and each client worker import torch
and fedray (1.5-2.5 s apiece on 2 cores, all at once). The raylet can also start *idle* workers that no
job owns yet (its ``PrestartWorkers`` call); the next job's actors are placed in them when their runtime
environments match. fedray uses that, and makes the match mean "same code":

- every job that joins the `fedray up` cluster carries one environment variable, ``FEDRAY_WARM_CODE``: the
  :func:`code_fingerprint` of what a worker process would import now (fedray's source files by path, size
  and mtime, the interpreter, the site-packages directories, whose mtime changes when a package is
  installed or removed);
- :func:`refill` asks the raylet for idle workers with that variable until ``count`` of them are idle. It
  runs as a small detached process, started by `fedray up` and by every warm run as it exits, so the
  workers import torch between runs, not during one;
- a run whose code differs (a source file edited, a package installed) has another fingerprint: Ray never
  places its actors in those idle workers, and the next refill stops them;
- every process that joins the cluster as a warm job holds a shared lock on ``<temp dir>/fedray-runs.lock``
  until it exits (:func:`hold_run_lock`; it lets go as it asks for its refill, :func:`refill_at_exit`), and a
  refill asks for workers only while no process holds it (:func:`runs_active`): a run started right after
  another takes the workers already starting, and no more are started beside its own start-up and rounds
  (they were: a run started at once after the previous one's exit took 5.8-6.3 s to start on 2 cores
  instead of 1.6-2 s, with five processes importing torch at once).

A warm run's results are the same bits either way: an idle worker is a fresh process that has run nothing.
Each idle worker holds about 250 MB (torch imported) until a run takes it or `fedray down`.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

from fedray.core.procinfo import proc_cpu_seconds

__all__ = ["KEEP_ALIVE_S", "RUNS_LOCK", "WARM_CODE_ENV", "code_fingerprint", "head_process", "hold_run_lock",
           "idle_workers", "main", "refill", "refill_at_exit", "release_run_lock", "runs_active", "runtime_env",
           "spawn_refill", "wait_ready"]

#: The environment variable of a warm job and of the idle workers started for it.
WARM_CODE_ENV = "FEDRAY_WARM_CODE"
#: How long the raylet keeps an idle worker it was asked for (it may stop idle workers sooner otherwise).
KEEP_ALIVE_S = 30 * 24 * 3600
#: How long a refill waits for the workers it asked for to show up before it asks again.
PRESTART_GRACE_S = 3.0
#: A refill gives up after this long (a busy node whose CPUs never free up).
REFILL_DEADLINE_S = 300.0
#: How often a refill looks again whether the cluster's runs have all ended.
RUNS_POLL_S = 0.25
#: The file in the cluster's temp dir whose shared lock each warm job holds while it lives.
RUNS_LOCK = "fedray-runs.lock"
_PACKAGE = Path(__file__).resolve().parents[1]  # fedray/
_run_lock = None  # this process's shared lock on the runs lock of the cluster it joined, held until it exits
_NO_JOB = b"RAY_JOB_ID=ffffffff"  # what the raylet gives a worker it starts for no job


def code_fingerprint(package: Path = _PACKAGE) -> str:
    """16 hex digits that change whenever what a new worker process imports may have changed: every ``.py``
    file under ``package`` (relative path, size, mtime), the interpreter and its version, and the mtime of
    each site-packages directory."""
    h = hashlib.sha256(f"{sys.executable}\0{sys.version}\0".encode())
    for d in sorted({*site.getsitepackages(), site.getusersitepackages()}):
        try:
            h.update(f"{d}\0{os.stat(d).st_mtime_ns}\0".encode())
        except OSError:
            continue
    for p in sorted(package.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def runtime_env(fingerprint: str, base: dict | None = None) -> dict:
    """``base`` (a job's runtime_env, or none) with the warm-code variable added, and without eager install: a
    job whose runtime env installs eagerly has the raylet start one worker per CPU for it as it connects,
    which import torch beside the run's own start-up and are never used."""
    env = dict(base or {})
    env["env_vars"] = {**(env.get("env_vars") or {}), WARM_CODE_ENV: fingerprint}
    env["config"] = {**(env.get("config") or {}), "eager_install": False}
    return env


def hold_run_lock(temp_dir: str) -> bool:
    """Count this process as a run on the `fedray up` head of ``temp_dir`` until it exits: a shared ``flock`` on
    :data:`RUNS_LOCK`, which the kernel releases however the process ends (SIGKILL included). False when the
    lock file cannot be opened (the run goes on; refills then do not wait for it)."""
    global _run_lock
    if _run_lock is not None:
        return True
    try:
        f = open(Path(temp_dir) / RUNS_LOCK, "a")  # noqa: SIM115 - held open until the process exits
    except OSError:
        return False
    try:
        fcntl.flock(f, fcntl.LOCK_SH)  # waits only while a refill is testing the lock (microseconds)
    except OSError:
        f.close()
        return False
    _run_lock = f
    return True


def release_run_lock() -> None:
    """This process no longer counts as a run on its cluster (closing the file releases the lock)."""
    global _run_lock
    f, _run_lock = _run_lock, None
    if f is not None:
        try:
            f.close()
        except OSError:
            pass


def refill_at_exit(rec: dict) -> subprocess.Popen | None:
    """A warm job's exit (``atexit``; its actors are done): stop counting as a run, then :func:`spawn_refill`,
    so that the refill asks for workers at once, before a run started right after this one holds the lock
    (its actors then take the workers already starting)."""
    release_run_lock()
    return spawn_refill(rec)


def runs_active(temp_dir: str) -> bool:
    """Whether any process holds :func:`hold_run_lock` on the head of ``temp_dir`` now (this one included)."""
    try:
        f = open(Path(temp_dir) / RUNS_LOCK, "a")  # noqa: SIM115 - closed below
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def head_process(temp_dir: str, name: str) -> int | None:
    """The process named ``name`` (its ``comm``, e.g. ``raylet`` or ``gcs_server``) of the head started with
    ``temp_dir`` (its command line holds the temp dir)."""
    for d in os.listdir("/proc"):
        if d.isdigit() and _read(f"/proc/{d}/comm").strip() == name.encode() and \
                temp_dir.encode() in _read(f"/proc/{d}/cmdline"):
            return int(d)
    return None


def _raylet_pid(temp_dir: str) -> int | None:
    return head_process(temp_dir, "raylet")


def idle_workers(raylet_pid: int) -> tuple[dict[int, str | None], dict[int, str | None]]:
    """The raylet's worker processes started for no job (``RAY_JOB_ID`` nil) and not yet taken by one, as two
    maps pid -> their ``FEDRAY_WARM_CODE`` (None without one): those ready (titled ``ray::IDLE``) and those
    still starting (``default_worker.py``)."""
    ready: dict[int, str | None] = {}
    starting: dict[int, str | None] = {}
    key = WARM_CODE_ENV.encode() + b"="
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        stat = _read(f"/proc/{d}/stat")
        try:
            if int(stat.rsplit(b")", 1)[1].split()[1]) != raylet_pid:
                continue
        except (IndexError, ValueError):
            continue
        cmd = _read(f"/proc/{d}/cmdline")
        into = ready if cmd.startswith(b"ray::IDLE") else starting if b"default_worker.py" in cmd else None
        if into is None:
            continue
        env = _read(f"/proc/{d}/environ").split(b"\0")
        if _NO_JOB not in env:  # a job's own worker, between two of its tasks
            continue
        into[int(d)] = next((v[len(key):].decode() for v in env if v.startswith(key)), None)
    return ready, starting


def wait_ready(temp_dir: str, count: int, timeout: float = 120.0, quiet_s: float = 0.6) -> int:
    """Wait until ``count`` idle workers of this code are ready on the head of ``temp_dir`` and done with their
    preload (a benchmark starts its clock only then), or ``timeout`` passes; how many are ready. The raylet
    titles a worker ``ray::IDLE`` before its preload (torch, fedray) has finished, so "done" is read off
    its CPU time: grown by at most 50 ms over ``quiet_s``."""
    fingerprint, stop_at = code_fingerprint(), time.monotonic() + timeout
    seen: dict[int, tuple[float | None, float]] = {}  # pid -> (CPU seconds, since when)
    while True:
        raylet = _raylet_pid(temp_dir)
        pids = [pid for pid, code in idle_workers(raylet)[0].items() if code == fingerprint] if raylet else []
        now, busy = time.monotonic(), 0
        for pid in pids:
            cpu = proc_cpu_seconds(pid)
            last = seen.get(pid)
            if last is None or cpu is None or last[0] is None or cpu - last[0] > 0.05:
                seen[pid] = (cpu, now)
                busy += 1
            elif now - last[1] < quiet_s:
                busy += 1
        if (len(pids) >= count and not busy) or raylet is None or now > stop_at:
            return len(pids)
        time.sleep(0.2)


def _prestart(port: int, n: int, fingerprint: str) -> None:
    """Ask the raylet at 127.0.0.1:``port`` for ``n`` idle Python workers of the warm runtime env (it starts at
    most as many as its start-up concurrency allows; the rest are asked for again)."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray._private.utils import get_runtime_env_info
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    from ray.runtime_env import RuntimeEnv

    channel = init_grpc_channel(f"127.0.0.1:{port}")
    try:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
            node_manager_pb2.PrestartWorkersRequest(  # type: ignore[attr-defined]  # generated protobuf module
                language=common_pb2.Language.PYTHON,  # type: ignore[attr-defined]
                num_workers=n, keep_alive_duration_secs=KEEP_ALIVE_S,
                runtime_env_info=get_runtime_env_info(RuntimeEnv(**runtime_env(fingerprint)))), timeout=30)
    finally:
        channel.close()


def refill(temp_dir: str, port: int, count: int, *, deadline_s: float = REFILL_DEADLINE_S, log=print) -> int:
    """Until ``count`` idle workers with this code's fingerprint are ready on the head of ``temp_dir``: stop
    idle workers of other code, ask the raylet for the missing ones, but only while no run holds the
    cluster (:func:`runs_active`; the time spent waiting for runs to end does not count against
    ``deadline_s``). Returns how many are ready."""
    fingerprint = code_fingerprint()
    raylet = _raylet_pid(temp_dir)
    if raylet is None:
        log(f"[fedray] refill: no raylet runs under {temp_dir}")
        return 0
    stop_at = time.monotonic() + deadline_s
    stopped = set()
    waiting = False
    while True:
        ready, starting = idle_workers(raylet)
        for pid, code in ready.items():
            if code is not None and code != fingerprint and pid not in stopped:  # imported code changed since
                stopped.add(pid)
                try:
                    os.kill(pid, signal.SIGTERM)
                    log(f"[fedray] refill: stopped idle worker {pid} (code {code}, now {fingerprint})")
                except ProcessLookupError:
                    pass
        mine = sum(code == fingerprint for code in ready.values())
        if mine >= count or time.monotonic() > stop_at or not os.path.exists(f"/proc/{raylet}"):
            log(f"[fedray] refill: {mine} idle workers of code {fingerprint} ready (asked for {count})")
            return mine
        if runs_active(temp_dir):  # a run starts or trains: it takes the workers already starting, no more now
            if not waiting:
                log("[fedray] refill: waiting for the cluster's runs to end")
            waiting = True
            time.sleep(RUNS_POLL_S)
            stop_at += RUNS_POLL_S
            continue
        waiting = False
        # a worker the raylet has just forked shows no FEDRAY_WARM_CODE for a moment: starting ones count as this
        # code's unless they show another (asking for them again started one worker too many)
        missing = count - mine - sum(code in (None, fingerprint) for code in starting.values())
        if missing > 0:
            _prestart(port, missing, fingerprint)
            _await_new(raylet, set(ready) | set(starting), missing, PRESTART_GRACE_S)
        else:
            time.sleep(0.5)


def _await_new(raylet: int, known: set[int], n: int, timeout: float) -> None:
    """After asking the raylet for ``n`` workers: wait until ``n`` new worker processes show up, or ``timeout``
    (it forks them when it gets to it, and drops what exceeds its start-up concurrency). Asking again before
    they show up would start more than asked for."""
    stop_at = time.monotonic() + timeout
    while time.monotonic() < stop_at:
        time.sleep(0.2)
        ready, starting = idle_workers(raylet)
        if len((set(ready) | set(starting)) - known) >= n:
            return


def spawn_refill(rec: dict, token_path: str | None = None) -> subprocess.Popen | None:
    """Start :func:`refill` for the `fedray up` cluster of record ``rec`` as a detached process (its command
    line holds the cluster's temp dir, so `fedray down` stops it too); its lines go to
    ``<temp dir>/fedray-refill.log``. None when the record asks for no idle workers."""
    count, port, temp = int(rec.get("idle_workers") or 0), rec.get("node_manager_port"), rec.get("temp_dir")
    if count <= 0 or not port or not temp or not Path(temp).is_dir():
        return None
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0")
    if token_path or rec.get("token_path"):  # the cluster's token file (else RAY_AUTH_TOKEN, as `up` had it)
        env.pop("RAY_AUTH_TOKEN", None)
        env["RAY_AUTH_TOKEN_PATH"] = str(token_path or rec["token_path"])
    with open(Path(temp) / "fedray-refill.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "fedray.core.warm_workers", "--temp-dir", temp,
                                 "--port", str(port), "--count", str(count)],
                                cwd=str(_PACKAGE.parent), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedray.core.warm_workers",
                                 description="Keep COUNT idle workers of this code on the `fedray up` head.")
    ap.add_argument("--temp-dir", required=True)
    ap.add_argument("--port", type=int, required=True, help="the raylet's node manager port")
    ap.add_argument("--count", type=int, required=True)
    args = ap.parse_args(argv)
    # one refill at a time per cluster (runs that exit together would each ask for the missing workers);
    # a refill waiting here counts again once the one before it has finished
    with open(Path(args.temp_dir) / "fedray-refill.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        refill(args.temp_dir, args.port, args.count, log=lambda m: print(time.strftime("%H:%M:%S"), m, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
