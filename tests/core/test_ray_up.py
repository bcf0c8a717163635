"""fedray/core/ray_up.py: `fedray up` keeps a loopback Ray running, `fedray run` joins that recorded cluster
(and says so) with the same bits as a cold run, `fedray down` stops exactly it; a stale record is dropped.

The cluster of this module runs with its own XDG_CACHE_HOME (record and token), its own temp dir and ports:
no other test, and no other user of the machine, can find or join it; FEDRAY_NO_WARM=1 (tests/conftest.py)
keeps every other test's `fedray run` off any `fedray up` cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import shutil

import pytest
import yaml

from fedray.config import load_config
from fedray.core import plugin_loader, ray_env, ray_up, warm_workers
from tests.helpers import ROOT, run_quiet, small_config, terminate_matching

#: a string this test process's own command line holds, as a live head's holds its temp dir (argv[0] may be a
#: relative path such as `.venv/bin/python`, so sys.executable, always absolute, may not be in it)
with open("/proc/self/cmdline", "rb") as _f:
    OWN_CMDLINE = _f.read().split(b"\0")[0].decode()


def _env(cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "FEDRAY_NO_WARM")}
    env.update(XDG_CACHE_HOME=str(cache), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", TQDM_DISABLE="1")
    return env


def _fedray(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "fedray", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _until(what, timeout: float = 180.0):
    """Poll ``what()`` until it returns something true (returned) or ``timeout`` seconds pass (AssertionError)."""
    deadline = time.monotonic() + timeout
    while not (got := what()):
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what.__doc__}"
        time.sleep(0.2)
    return got


def run_quiet_cfg(cfg) -> str:
    """The weights hash of an in-process run of an ExperimentConfig."""
    from fedray.driver.runner import run_experiment

    return run_experiment(cfg, progress=False, log=lambda *a: None).weights_hash


def _idle(rec: dict) -> dict[int, str | None]:
    """pid -> warm code of the ready idle workers of the `fedray up` head of ``rec``."""
    raylet = warm_workers._raylet_pid(rec["temp_dir"])
    return warm_workers.idle_workers(raylet)[0] if raylet else {}


#: a driver that joins the warm cluster as code of another fingerprint would, and reports its actor's process
OTHER_CODE_DRIVER = """
import os, ray
from fedray.core import ray_env, warm_workers
warm_workers.code_fingerprint = lambda *a: "0000other0000000"
ray_env.ensure_ray(warm=True, log=lambda *a: None, log_to_driver=False)
print("HELD", warm_workers.runs_active(ray_env.read_warm_record()["temp_dir"]))  # a run holds the cluster
a = ray.remote(num_cpus=0)(type("Probe", (), {"pid": lambda self: (os.getpid(), os.environ.get("FEDRAY_WARM_CODE"))})).remote()
print("PROBE", *ray.get(a.pid.remote()))
"""


#: a refill of the cluster (temp dir, raylet port) as it runs after the code on disk has changed
REFILL_AS_OTHER_CODE = """
import sys
from fedray.core import warm_workers
warm_workers.code_fingerprint = lambda *a: "0000other0000000"
sys.exit(warm_workers.main(["--temp-dir", sys.argv[1], "--port", sys.argv[2], "--count", "3"]))
"""


@pytest.mark.ray
def test_up_run_down(tmp_path, partition_cache, ray_session):
    """`fedray up` -> `fedray run` uses it (one line says so) and gives the cold run's weights -> `fedray down`
    stops every process of it and removes the record. The cluster keeps CPUs + 1 idle workers of this code:
    the run's actors start in them, a driver of other code never does, the run refills them as it exits, and a
    refill after the code changed replaces them."""
    cache = tmp_path / "cache"
    env = _env(cache)
    cfg = small_config(tmp_path / "cold", partition_cache, train__rounds=2, train__clients_per_round=4,
                       model={"name": "mlp", "params": {"hidden": [16]}},
                       engine={"backend": "ray", "num_workers": 2, "worker_num_cpus": 0.5})
    cold = run_quiet(cfg)  # the session's Ray: a cold start of the same run
    cfg["output"]["root"] = str(tmp_path / "warm")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    _fedray(env, "up", "--num-cpus", "2")
    rec = json.loads((cache / "fedray" / "ray" / "up.json").read_text())
    try:
        assert rec["address"].startswith("127.0.0.1:") and rec["temp_dir"].startswith(ray_up.TEMP_PREFIX)
        assert ray_up.cluster_pids(rec["temp_dir"])
        again = _fedray(env, "up")  # already up: reported, not started twice
        assert "already runs at " + rec["address"] in again.stdout
        code = warm_workers.code_fingerprint()
        assert rec["idle_workers"] == 3

        def three_idle():
            """three idle workers of this code"""
            idle = _idle(rec)
            return idle if sorted(idle.values()) == [code] * 3 else None

        first = _until(three_idle)
        probe = subprocess.run([sys.executable, "-c", OTHER_CODE_DRIVER], env={**env, "PYTHONPATH": str(ROOT)},
                               capture_output=True, text=True, timeout=240, cwd=ROOT)
        assert probe.returncode == 0, probe.stderr[-3000:]
        pid, probe_code = probe.stdout.split("PROBE")[-1].split()
        assert int(pid) not in first and probe_code == "0000other0000000"  # other code: a process of its own
        assert "HELD True" in probe.stdout and not warm_workers.runs_active(rec["temp_dir"])  # held while it ran
        run = _fedray(env, "run", str(tmp_path / "run.yaml"), "-q")
        assert f"using the warm Ray of `fedray up` at {rec['address']}" in run.stdout
        run_dir = Path(run.stdout.strip().splitlines()[-1].removeprefix("run directory: "))
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["weights_hash"] == cold.weights_hash
        # a user's method (a plugin outside the repository) on the warm cluster: the in-process weights
        project = tmp_path / "myproject"
        shutil.copytree(ROOT / "examples" / "custom-method", project, ignore=shutil.ignore_patterns("__pycache__"))
        small = ["train.rounds=2", "data.partition.num_clients=8", "train.clients_per_round=4",
                 f"data.cache_dir={partition_cache}", "output.tensorboard=false"]
        plugin_run = _fedray(env, "run", str(project / "exp.yaml"), *small, f"output.root={tmp_path / 'pw'}", "-q")
        assert f"using the warm Ray of `fedray up` at {rec['address']}" in plugin_run.stdout
        plugin_dir = Path(plugin_run.stdout.strip().splitlines()[-1].removeprefix("run directory: "))
        local = load_config(project / "exp.yaml", [*small, "engine.backend=local", f"output.root={tmp_path / 'pl'}"])
        try:
            assert json.loads((plugin_dir / "summary.json").read_text())["weights_hash"] == run_quiet_cfg(local)
        finally:
            plugin_loader._forget("mymethod")
        # the run's 3 actors took the 3 idle workers (they end with the run), and its exit refilled them
        refilled = _until(lambda: (idle := three_idle()) and not set(idle) & set(first) and idle)
        assert all(os.path.exists(f"/proc/{p}") for p in refilled)
        # the code changes: the next refill stops the idle workers of the old code and starts ones of the new
        other = subprocess.run([sys.executable, "-c", REFILL_AS_OTHER_CODE, rec["temp_dir"],
                                str(rec["node_manager_port"])], capture_output=True, text=True, timeout=240, cwd=ROOT,
                               env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": rec["token_path"]})
        assert other.returncode == 0 and "stopped idle worker" in other.stdout, other.stdout + other.stderr[-3000:]

        def replaced():
            """three idle workers of the other code, none of the old"""
            idle = _idle(rec)
            return sorted(idle.values()) == ["0000other0000000"] * 3 and not set(idle) & set(refilled)

        _until(replaced)
        assert not any(os.path.exists(f"/proc/{p}") for p in refilled)
        refilled = list(_idle(rec))
        # the Ray Client server `ray start --head` leaves behind: its command line names the GCS, not the temp dir
        client = [p for p in ray_up.cluster_pids(rec["temp_dir"], rec["address"])
                  if p not in ray_up.cluster_pids(rec["temp_dir"])]
        down = _fedray(env, "down")
        assert "stopped the `fedray up` Ray at " + rec["address"] in down.stdout
        assert not ray_up.cluster_pids(rec["temp_dir"], rec["address"])
        assert not any(os.path.exists(f"/proc/{p}") for p in client)
        assert not any(os.path.exists(f"/proc/{p}") for p in refilled)  # idle workers stop with the cluster
        assert not (cache / "fedray" / "ray" / "up.json").exists() and not Path(rec["temp_dir"]).exists()
        assert "nothing to stop" in _fedray(env, "down").stdout
    finally:
        terminate_matching(rec["temp_dir"], rec["address"])


def _record(monkeypatch, tmp_path, rec: dict | str) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = ray_env.warm_record_path()
    path.parent.mkdir(parents=True)
    path.write_text(rec if isinstance(rec, str) else json.dumps(rec))
    return path


def test_stale_record_is_dropped_with_a_notice(monkeypatch, tmp_path):
    """A record whose GCS process is gone, or whose port no longer answers, is removed and ignored (a cold
    start follows); so is an unreadable one."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lines = []
    path = _record(monkeypatch, tmp_path, {"address": f"127.0.0.1:{port}", "temp_dir": "/tmp/fedray-up-gone",
                                           "gcs_pid": os.getpid(), "token_path": None})
    assert ray_env.read_warm_record(lines.append) is None  # this process does not run under that temp dir
    assert not path.exists() and "is gone; starting a local Ray instead" in lines[-1]
    # alive process with the marker in its command line, but nothing answers at the port
    path.write_text(json.dumps({"address": f"127.0.0.1:{port}", "temp_dir": OWN_CMDLINE, "gcs_pid": os.getpid()}))
    assert ray_env.read_warm_record(lines.append) is None and not path.exists()
    path.write_text("{not json")
    assert ray_env.read_warm_record(lines.append) is None and "unreadable" in lines[-1] and not path.exists()
    assert ray_env.read_warm_record(lines.append) is None and len(lines) == 3  # no record: silent


def test_record_of_another_checkout_is_not_joined(monkeypatch, tmp_path):
    """A running `fedray up` cluster whose workers import another checkout's fedray is not joined (the workers
    would run other code than the driver); its record stays for the checkout that made it."""
    with socket.socket() as s:  # a live "GCS": this process (its command line holds OWN_CMDLINE), a port
        s.bind(("127.0.0.1", 0))
        s.listen()
        lines = []
        path = _record(monkeypatch, tmp_path, {"address": f"127.0.0.1:{s.getsockname()[1]}",
                                               "temp_dir": OWN_CMDLINE, "gcs_pid": os.getpid(),
                                               "fedray": "/elsewhere/fedray"})
        assert ray_env.read_warm_record(lines.append) is None
        assert "its workers run fedray from /elsewhere/fedray" in lines[-1] and path.exists()
        path.write_text(json.dumps({**json.loads(path.read_text()), "fedray": str(ray_env.FEDRAY_DIR)}))
        assert ray_env.read_warm_record(lines.append)["gcs_pid"] == os.getpid() and len(lines) == 1


def test_down_refuses_a_foreign_temp_dir(monkeypatch, tmp_path):
    """`fedray down` stops processes by the recorded temp dir only when it is one `fedray up` made."""
    _record(monkeypatch, tmp_path, {"address": "127.0.0.1:1", "temp_dir": "/tmp/ray", "gcs_pid": 1})
    with pytest.raises(RuntimeError, match="not one fedray up made"):
        ray_up.down(log=lambda *a: None)
