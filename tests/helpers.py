"""Helpers imported by test files in several directories (fixtures are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root


def small_config(tmp_path, partition_cache, **over) -> dict:
    """A small, fast FedAvg experiment on the embedded MNIST subset (as a config dict)."""
    cfg = {
        "seed": 0,
        "data": {"source": "mnist5k", "normalize": False, "cache_dir": str(partition_cache),
                 "partition": {"name": "dirichlet", "num_clients": 100, "params": {"alpha": 0.3}}},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 3, "clients_per_round": 6, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 1},
        "engine": {"backend": "local", "num_workers": 1},
        "output": {"root": str(tmp_path / "runs"), "checkpoint_every": 1, "tensorboard": False, "progress": False},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


# ------------------------------------------------------------------ a `ray start --head` of a test module's own
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_head_env(**extra) -> dict:
    """Environment for a test's `ray start --head` and its clients: fedray's local settings (token auth on,
    fedray's token, nodes on 127.0.0.1), no RAY_ADDRESS, the venv's `ray` on PATH."""
    import os
    import sys

    from fedray.core.ray_env import local_ray_env

    env = dict(os.environ)
    env.update(local_ray_env(), RAY_USAGE_STATS_ENABLED="0", TQDM_DISABLE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra)
    env.pop("RAY_ADDRESS", None)
    return env


def start_ray_head(temp: str, env: dict, *extra: str) -> dict:
    """`ray start --head` on loopback with its own --temp-dir and every port chosen here (the test session's
    own Ray already holds the defaults, e.g. the dashboard agent's 52365). Returns the GCS and dashboard
    addresses; stop it with ``terminate_matching(temp)``."""
    import subprocess
    import sys

    gcs, dash = free_port(), free_port()
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={gcs}",
           "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
           "--num-gpus=0", f"--dashboard-agent-listen-port={free_port()}",
           f"--dashboard-agent-grpc-port={free_port()}", f"--metrics-export-port={free_port()}",
           f"--runtime-env-agent-port={free_port()}", f"--temp-dir={temp}", "--disable-usage-stats", *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {"gcs": f"127.0.0.1:{gcs}", "dashboard": f"http://127.0.0.1:{dash}"}


def pids_matching(text: str) -> list[int]:
    import os

    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        pids.append(int(d))
            except OSError:
                continue
    return pids


def terminate_matching(text: str) -> None:
    """SIGTERM, then SIGKILL after 15 s, every process whose command line contains ``text`` (a head's own
    temp dir: a plain `ray stop` would also stop other people's Ray)."""
    import os
    import signal
    import time

    for pid in pids_matching(text):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 15
    while pids_matching(text) and time.time() < deadline:
        time.sleep(0.2)
    for pid in pids_matching(text):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
