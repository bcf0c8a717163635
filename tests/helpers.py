"""Helpers imported by test files in several directories (fixtures are in tests/conftest.py; helpers of one
directory in a module there, e.g. tests/tuning/studies.py)."""

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
    return set_nested(cfg, over)


def set_nested(cfg: dict, over: dict) -> dict:
    """Set ``over``'s values in ``cfg`` in place, a key ``a__b__c`` naming ``cfg["a"]["b"]["c"]``; returns ``cfg``."""
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


def synthetic_experiment(tmp_path, partition_cache, **over) -> dict:
    """``small_config`` on the synthetic natural-partition source (60 clients, an MLP), then ``over``."""
    cfg = small_config(tmp_path, partition_cache,
                       data__source="synthetic", data__normalize=False,
                       data__params={"num_clients": 60, "samples_per_client_mean": 12, "min_samples": 3,
                                     "size_sigma": 0.5},
                       data__partition={"name": "natural", "num_clients": 60, "params": {}},
                       model__name="mlp", model__params={"hidden": [16]}, train__clients_per_round=5)
    return set_nested(cfg, over)


def run_quiet(cfg: dict, **kw):
    """``run_experiment`` of a config dict, with no progress bar and no log lines."""
    from fedray.config import from_dict
    from fedray.driver.runner import run_experiment

    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


# ------------------------------------------------------------------ the FedCCL family and robustness runs
TINY_CNN4 = {"name": "cnn4", "params": {"channels": [4, 8], "embed_dim": 16}}


def cnn4_config(tmp_path, partition_cache, alg, params=None, **over):
    """A tiny ``cnn4`` run of ``alg``: 10 clients with a skewed Dirichlet partition, 2 rounds of 3."""
    base = dict(
        data__normalize=True,
        data__partition={"name": "dirichlet", "num_clients": 10, "params": {"alpha": 0.05}},
        model=TINY_CNN4,
        algorithm={"name": alg, "params": params or {}},
        train={"rounds": 2, "clients_per_round": 3, "batch_size": 64, "lr": 0.05},
    )
    base.update(over)
    return small_config(tmp_path, partition_cache, **base)


# ------------------------------------------------------------------ split learning runs
SPLIT_METHODS = ["scala", "splitfed_v1", "splitfed_v2", "splitfed_v3", "sfl_local_loss"]
TINY_ALEXNET = {"channels": [4, 8, 8, 8, 8], "fc": [16, 16]}
CPC = {"name": "classes_per_client", "num_clients": 100, "params": {"classes": 2}}


def split_config(tmp_path, partition_cache, name, params=None, model_params=None, **over):
    """A tiny ``alexnet_split`` run of ``name`` (a split method or an FL baseline), 2 classes per client."""
    algo_params = {"batch_size": 40, "local_iters": 2} if name in SPLIT_METHODS else {}
    algo_params.update(params or {})
    over = {"data__partition": CPC, "train__rounds": 2, "train__clients_per_round": 4, **over}
    return small_config(tmp_path, partition_cache, model={"name": "alexnet_split",
                                                          "params": {**TINY_ALEXNET, **(model_params or {})}},
                        algorithm={"name": name, "params": algo_params}, **over)


# ------------------------------------------------------------------ Ray instances of the tests
def start_test_ray() -> None:
    """The test session's local Ray (the ``ray_session`` fixture; a module that needed another cluster in this
    process starts it again): 4 logical CPUs, 1 fake GPU, started by fedray's ``ensure_ray``."""
    from fedray.core.ray_env import ensure_ray

    # "local": the tests' own instance, even when the shell has RAY_ADDRESS set
    ensure_ray(1 << 30, address="local", num_cpus=4, num_gpus=1, log_to_driver=False, configure_logging=False)


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


def write_tiny_config(tmp_path, backend: str = "local", rounds: int = 2) -> Path:
    """A YAML config of a run of seconds (digits, 4 clients, an MLP) for the ``fedray`` command in a
    subprocess; its run directory is ``tmp_path/runs/tiny``."""
    import textwrap

    cfg = Path(tmp_path) / "tiny.yaml"
    cfg.write_text(textwrap.dedent(f"""
        seed: 0
        data: {{source: digits, partition: {{name: iid, num_clients: 4}}}}
        model: {{name: mlp}}
        algorithm: {{name: fedavg}}
        train: {{rounds: {rounds}, clients_per_round: 2, local_epochs: 1, batch_size: 32, lr: 0.05}}
        engine: {{backend: {backend}, num_workers: 1}}
        output: {{root: {Path(tmp_path) / 'runs'}, name: tiny, checkpoint_every: 0, tensorboard: false}}
    """))
    return cfg


def start_ray_head(temp: str, env: dict, *extra: str) -> dict:
    """`ray start --head` on loopback with its own --temp-dir and every port chosen here (the test session's
    own Ray already holds the defaults, e.g. the dashboard agent's 52365). Returns the GCS and dashboard
    addresses; stop it with ``terminate_matching(temp, gcs_address)``."""
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


def terminate_matching(text: str, address: str | None = None) -> None:
    """SIGTERM, then SIGKILL after 15 s, every process whose command line contains ``text`` (a head's own
    temp dir: a plain `ray stop` would also stop other people's Ray) and their descendants, found before any
    is signalled (Ray retitles its agents and workers, and they outlive a killed raylet); with the head's GCS
    ``address``, also its Ray Client server (:func:`fedray.core.ray_up.cluster_pids`)."""
    import os
    import signal
    import time

    from fedray.core.procinfo import proc_runs, proc_start_ticks
    from fedray.core.ray_up import cluster_pids

    marks = {pid: proc_start_ticks(pid) for pid in cluster_pids(text, address)}

    def running() -> list[int]:
        return [pid for pid, start in marks.items() if proc_runs(pid, start)]

    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 0.0)):
        for pid in running():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait
        while running() and time.time() < deadline:
            time.sleep(0.2)


# ------------------------------------------------------------------ experiment trackers
def wandb_records(run_folder) -> list:
    """The records (``wandb_internal_pb2.Record``) of a W&B run folder's ``run-<id>.wandb`` transaction log,
    read the way W&B writes it: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of chunks,
    each with a 7-byte header (CRC-32, length, type: 1 full, 2 first, 3 middle, 4 last) that never
    straddles a block (a block's last < 7 bytes are padding)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_folder).glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    block, pos, buf, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def wandb_run(run_folder) -> dict:
    """What a W&B offline run folder holds: ``history`` {step: {key: value}}, ``config``, ``summary`` (last
    value of each key) and ``exit_code`` (None when the run was not finished), from :func:`wandb_records`."""
    import json

    out = {"history": {}, "config": {}, "summary": {}, "exit_code": None, "id": None, "preempting": False}
    for rec in wandb_records(run_folder):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["id"] = rec.run.run_id
            out["config"].update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            out["history"][int(row["_step"])] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            out["summary"].update({(u.key or "/".join(u.nested_key)): json.loads(u.value_json)
                                   for u in rec.summary.update})
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
        elif kind == "preempting":
            out["preempting"] = True
    return out
