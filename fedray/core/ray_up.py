"""``fedray up`` / ``fedray down``: a local Ray that stays up between runs, so ``fedray run`` skips Ray's
start (GCS, raylet and agents: 2.5-10 s on 2 cores).

``up`` runs ``ray start --head`` with the rules of :mod:`fedray.core.ray_env` for a local Ray: every process
on 127.0.0.1 only, token authentication on (fedray's token file unless ``RAY_AUTH_TOKEN`` /
``RAY_AUTH_TOKEN_PATH`` name another), every port chosen free here (another Ray on the machine keeps its
defaults), its own temp dir (``/tmp/fedray-up-*``), no dashboard. It then records the cluster in
``warm_record_path()``; ``fedray run`` joins only that recorded cluster (``ensure_ray(warm=True)``). Worker
processes import ``torch`` and fedray's client worker and coordinator before they take work (Ray's
``preload_python_modules``), as a run's actors would anyway, and ``--idle-workers`` of them (default: the
node's CPUs + 1) are kept started and idle, refilled as each warm run exits, so that the next run's actors
find their processes ready (:mod:`fedray.core.warm_workers`).

``down`` stops exactly the processes of that cluster (those whose command line holds its temp dir: a
plain ``ray stop`` would stop every Ray of the machine, other users' included), then removes the record
and the temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from fedray.core.io import atomic_write_text
from fedray.core.ray_env import FEDRAY_DIR, local_ray_env, read_warm_record, warm_record_path
from fedray.core.warm_workers import head_process, spawn_refill

__all__ = ["PRELOAD_MODULES", "cluster_pids", "down", "up"]

#: What every worker process of the `fedray up` cluster imports before it takes work. Not torch._dynamo
#: (1.3 CPU-s, +70 MB): fedray's optimizers no longer import it (fedray.algorithms.base.make_torch_optimizer).
PRELOAD_MODULES = ("torch", "fedray.engine.worker", "fedray.engine.coordinator")
STOP_TIMEOUT_S = 15.0
TEMP_PREFIX = "/tmp/fedray-up-"  # short: Ray's unix socket paths (at most 107 bytes) live under it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_pids(temp_dir: str, address: str | None = None) -> list[int]:
    """The processes of the head started with ``temp_dir``: those whose command line contains it (GCS,
    raylet, agents) and their descendants (Ray's workers, whose titles Ray rewrites to ``ray::...``). With
    the head's GCS ``address`` also the processes given ``--address=<address>``: the Ray Client server that
    ``ray start --head`` leaves behind (its parent, the ``ray start`` command, has exited, and its command
    line does not name the temp dir); ``fedray down`` once left it running for about a minute on port
    10001."""
    me, marked = os.getpid(), []
    children: dict[int, list[int]] = {}
    flag = f"--address={address}".encode() if address else None
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmdline = f.read()
                if temp_dir.encode() in cmdline or (flag is not None and flag in cmdline.split(b"\0")):
                    marked.append(int(d))
            with open(f"/proc/{d}/stat") as f:
                children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    out, stack = set(), list(marked)
    while stack:
        pid = stack.pop()
        if pid not in out and pid != me:
            out.add(pid)
            stack.extend(children.get(pid, []))
    return sorted(out)


def _stop(temp_dir: str, address: str | None, timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM the cluster's processes (:func:`cluster_pids`), SIGKILL what is left after ``timeout``; how many
    there were."""
    pids = cluster_pids(temp_dir, address)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in cluster_pids(temp_dir, address):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + (timeout if sig == signal.SIGTERM else 5.0)
        while cluster_pids(temp_dir, address) and time.time() < deadline:
            time.sleep(0.2)
        if not cluster_pids(temp_dir, address):
            break
    return len(pids)


def up(num_cpus: int | None = None, num_gpus: int | None = None, object_store_memory: int | None = None,
       idle_workers: int | None = None, log=print) -> dict:
    """Start the warm local Ray (or report the one already recorded and running); returns its record.
    ``idle_workers`` (default: the node's CPUs + 1, a default run's client workers and coordinator; 0: none)
    worker processes are kept idle with torch and fedray imported, for the next run's actors
    (:mod:`fedray.core.warm_workers`)."""
    rec = read_warm_record(log)
    if rec is not None:
        log(f"[fedray] a `fedray up` Ray already runs at {rec['address']} (record {warm_record_path()}); "
            f"`fedray down` stops it")
        return rec
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # RAY_prestart_worker_first_driver=0: the raylet would start one worker per CPU for every driver that joins,
    # without the driver's runtime env (so never used by a run's actors), importing torch beside its start-up
    env.update(local_ray_env(), RAY_USAGE_STATS_ENABLED="0", RAY_preload_python_modules=",".join(PRELOAD_MODULES),
               RAY_prestart_worker_first_driver="0")
    temp = tempfile.mkdtemp(prefix=Path(TEMP_PREFIX).name, dir=Path(TEMP_PREFIX).parent)
    gcs, node_manager = _free_port(), _free_port()
    ray_bin = Path(sys.executable).parent / "ray"
    cmd = [str(ray_bin) if ray_bin.exists() else sys.executable, *([] if ray_bin.exists() else ["-m", "ray.scripts.scripts"]),
           "start", "--head", f"--port={gcs}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
           f"--node-manager-port={node_manager}",
           f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
           f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
           f"--temp-dir={temp}", "--disable-usage-stats"]
    cmd += [f"--num-cpus={int(num_cpus)}"] if num_cpus is not None else []
    cmd += [f"--num-gpus={int(num_gpus)}"] if num_gpus is not None else []
    cmd += [f"--object-store-memory={int(object_store_memory)}"] if object_store_memory else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    pid = head_process(temp, "gcs_server")
    if out.returncode != 0 or pid is None:
        _stop(temp, f"127.0.0.1:{gcs}")
        shutil.rmtree(temp, ignore_errors=True)
        raise RuntimeError(f"fedray up: `ray start --head` failed (exit {out.returncode}):\n"
                           f"{(out.stdout + out.stderr)[-3000:]}")
    rec = {"address": f"127.0.0.1:{gcs}", "temp_dir": temp, "gcs_pid": pid,
           "token_path": env.get("RAY_AUTH_TOKEN_PATH"), "python": sys.executable, "fedray": str(FEDRAY_DIR),
           "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "preload": list(PRELOAD_MODULES), "node_manager_port": node_manager,
           "idle_workers": int((num_cpus or os.cpu_count() or 1) + 1 if idle_workers is None else idle_workers)}
    path = warm_record_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_text(path, json.dumps(rec, indent=1) + "\n")
    log(f"[fedray] Ray is up at {rec['address']} (127.0.0.1 only, token auth on; temp dir {temp}); "
        f"`fedray run` uses it until `fedray down` (record {path})")
    if spawn_refill(rec, env.get("RAY_AUTH_TOKEN_PATH")) is not None:
        log(f"[fedray] starting {rec['idle_workers']} idle workers with torch and fedray imported for the next "
            f"run's actors (about 250 MB each; `fedray up --idle-workers 0` keeps none)")
    return rec


def down(log=print) -> bool:
    """Stop the recorded `fedray up` Ray, remove its record and temp dir; False when none was recorded."""
    path = warm_record_path()
    try:
        rec = json.loads(path.read_text())
        temp = str(rec["temp_dir"])
    except FileNotFoundError:
        log(f"[fedray] no `fedray up` Ray recorded ({path}): nothing to stop")
        return False
    except (OSError, ValueError, KeyError, TypeError) as e:
        path.unlink(missing_ok=True)
        log(f"[fedray] removed an unreadable `fedray up` record {path} ({type(e).__name__}: {e})")
        return False
    if not temp.startswith(TEMP_PREFIX):  # never stop by a foreign marker
        raise RuntimeError(f"fedray down: the record {path} names temp dir {temp!r}, not one fedray up made; "
                           f"remove the record by hand")
    n = _stop(temp, rec.get("address"))
    path.unlink(missing_ok=True)
    shutil.rmtree(temp, ignore_errors=True)
    log(f"[fedray] stopped the `fedray up` Ray at {rec.get('address', '?')} ({n} processes)")
    return True
