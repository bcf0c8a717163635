"""End to end through Ray Jobs: a real `ray start --head` on loopback, `ray job submit`, `ray job stop`.

The head gets its own --temp-dir and ports, and is torn down by terminating exactly the processes whose
command line names that temp dir (a plain `ray stop` would also kill the test session's own Ray).
The head runs with fedray's local settings (tests/helpers.ray_head_env: token authentication on with
fedray's token, every port on 127.0.0.1); `ray job submit` and the job's driver use the same token.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, ray_head_env, start_ray_head, terminate_matching

pytestmark = pytest.mark.jobs

VENV_BIN = Path(sys.executable).parent


def _env() -> dict:
    return ray_head_env(RAY_JOB_STOP_WAIT_TIME_S="30")


HEAD: dict = {}  # the module's head: its GCS address and temp dir, for the tests that join it directly


@pytest.fixture(scope="module")
def head():
    temp = tempfile.mkdtemp(prefix="frj-", dir="/tmp")
    # an agent that cannot bind leaves the job server without an agent (submissions then wait forever):
    # start_ray_head chooses every port
    head = start_ray_head(temp, _env(), "--num-cpus=2", "--include-dashboard=true")
    HEAD.update(head, temp=temp)
    address = head["dashboard"]
    deadline = time.time() + 60
    while time.time() < deadline:  # the job server answers a little after `ray start` returns
        r = subprocess.run([str(VENV_BIN / "ray"), "job", "list", "--address", address], env=_env(),
                           capture_output=True, text=True)
        if r.returncode == 0:
            break
        time.sleep(1)
    yield address
    terminate_matching(temp, head["gcs"])
    shutil.rmtree(temp, ignore_errors=True)


def _ray_job(address: str, *args, timeout=420) -> subprocess.CompletedProcess:
    cmd = [str(VENV_BIN / "ray"), "job", *args, "--address", address] if args[0] != "submit" else \
        [str(VENV_BIN / "ray"), "job", "submit", "--address", address, *args[1:]]
    deadline = time.time() + 300  # generous: the agent starts slowly on a loaded 2-core machine
    while True:
        r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        # right after `ray start` the job agent may not be registered yet: retry that case only
        if "No available agent" not in r.stdout + r.stderr or time.time() > deadline:
            return r
        time.sleep(2)


def _submit_args(out_dir: Path, *extra: str, submission_id: str, no_wait: bool = False) -> list[str]:
    args = ["submit", "--submission-id", submission_id, "--working-dir", ".", "--runtime-env",
            "cluster/runtime_env.yaml"]
    if no_wait:
        args.append("--no-wait")
    return [*args, "--", "python", "-m", "jobs.train", *extra, "--output-dir", str(out_dir)]


def _status(address: str, sid: str) -> str:
    from ray.job_submission import JobSubmissionClient

    token = Path(_env()["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    return str(JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"})
               .get_job_status(sid).value)


def test_submit_training_job(head, tmp_path):
    out = tmp_path / "out"
    r = _ray_job(head, *_submit_args(out, "--config", "jobs/configs/demo.yaml", "train.rounds=2",
                                     "train.clients_per_round=4", "output.tensorboard=false",
                                     submission_id="fedray-test-train"))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert _status(head, "fedray-test-train") == "SUCCEEDED"
    run_dirs = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert len(run_dirs) == 1
    rows = [json.loads(line) for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2]
    assert f"run directory: {run_dirs[0]}" in r.stdout  # the final log line says where the outputs are
    assert "[fedray] round" in r.stdout  # progress is visible in the job logs


def test_missing_config_fails_clearly(head, tmp_path):
    r = _ray_job(head, *_submit_args(tmp_path, "--config", "jobs/configs/no-such.yaml",
                                     submission_id="fedray-test-missing"))
    assert r.returncode != 0
    assert "jobs/configs/no-such.yaml" in r.stdout + r.stderr and "not found" in r.stdout + r.stderr


def test_missing_data_path_fails_clearly(head, tmp_path):
    """A data.root that does not exist on the cluster fails before any work, naming the field and the path."""
    r = _ray_job(head, *_submit_args(tmp_path, "--config", "jobs/configs/demo.yaml", "data.source=cifar10",
                                     "data.root=/mnt/no-such-share/cifar10", submission_id="fedray-test-missing-data"))
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "data.root" in out and "/mnt/no-such-share/cifar10" in out and "does not exist" in out


def test_stop_then_resume_job(head, tmp_path):
    from fedray.config import load_config
    from fedray.driver.runner import run_experiment

    out = tmp_path / "out"
    over = ["train.rounds=8", "train.clients_per_round=10", "output.checkpoint_every=1", "output.tensorboard=false"]
    r = _ray_job(head, *_submit_args(out, "--config", "jobs/configs/demo.yaml", *over,
                                     submission_id="fedray-test-stop", no_wait=True))
    assert r.returncode == 0, r.stderr[-3000:]
    deadline = time.time() + 300
    run_dir = None
    while time.time() < deadline:
        dirs = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith("_")] if out.exists() else []
        if dirs and (dirs[0] / "metrics.jsonl").exists() and len((dirs[0] / "metrics.jsonl").read_text().splitlines()) >= 2:
            run_dir = dirs[0]
            break
        time.sleep(0.5)
    assert run_dir is not None, _ray_job(head, "logs", "fedray-test-stop").stdout[-3000:]
    stop = _ray_job(head, "stop", "fedray-test-stop")
    assert stop.returncode == 0, stop.stderr[-2000:]
    deadline = time.time() + 120
    while _status(head, "fedray-test-stop") not in ("STOPPED", "FAILED", "SUCCEEDED") and time.time() < deadline:
        time.sleep(1)
    status = _status(head, "fedray-test-stop")
    done = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert status == "STOPPED" and done < 8, (status, done)
    assert sorted((run_dir / "checkpoints").glob("ckpt-*.npz")), "the stopped job left no checkpoint"
    r = _ray_job(head, "submit", "--submission-id", "fedray-test-resume", "--working-dir", ".", "--runtime-env",
                 "cluster/runtime_env.yaml", "--", "python", "-m", "jobs.train", "--resume", str(run_dir))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(1, 9))
    summary = json.loads((run_dir / "summary.json").read_text())
    # the stopped-and-resumed job ends with the weights of an uninterrupted run (in-process backend here)
    cfg = load_config(ROOT / "jobs" / "configs" / "demo.yaml", over + ["engine.backend=local",
                                                                      "engine.num_workers=1"])
    cfg.output.root = str(tmp_path / "ref")
    ref = run_experiment(cfg, progress=False, log=lambda *a: None)
    assert summary["weights_hash"] == ref.weights_hash


# ------------------------------------------------------------------ a user's project (examples/custom-method)
EXAMPLE = ROOT / "examples" / "custom-method"
SMALL = ["train.rounds=2", "data.partition.num_clients=8", "train.clients_per_round=4", "output.tensorboard=false"]


def _project(tmp_path) -> Path:
    dst = tmp_path / "myproject"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    return dst


def _reference_weights(project: Path, tmp_path) -> str:
    """The example's weights in-process (the plugin imported in this process, then forgotten)."""
    from fedray.config import load_config
    from fedray.core import plugin_loader
    from fedray.driver.runner import run_experiment

    cfg = load_config(project / "exp.yaml", [*SMALL, "engine.backend=local", f"output.root={tmp_path / 'ref'}"])
    try:
        return run_experiment(cfg, progress=False, log=lambda *a: None).weights_hash
    finally:
        plugin_loader._forget("mymethod")


def _summary(out: Path) -> dict:
    [run_dir] = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert run_dir.name.startswith("fedavg_logitl2-")
    return json.loads((run_dir / "summary.json").read_text())


def test_a_user_project_as_the_working_dir(head, tmp_path):
    """`ray job submit --working-dir <the user's project>`: the job's driver finds the plugin next to its config in
    the unpacked copy, every worker imports it there, and the run has the in-process weights."""
    project, out = _project(tmp_path), tmp_path / "out"
    r = _ray_job(head, "submit", "--submission-id", "fedray-test-plugin", "--working-dir", str(project),
                 "--runtime-env", str(ROOT / "cluster" / "runtime_env.yaml"), "--", "python", "-m", "jobs.train",
                 "--config", "exp.yaml", *SMALL, "--output-dir", str(out))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert _summary(out)["weights_hash"] == _reference_weights(project, tmp_path)


def test_fedray_run_joining_a_cluster_ships_the_plugin(head, tmp_path):
    """`fedray run --address` from a directory outside the project: the plugin goes to the nodes with the job's
    runtime env (py_modules), and the run has the in-process weights."""
    project, out = _project(tmp_path), tmp_path / "out"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([str(VENV_BIN / "fedray"), "run", str(project / "exp.yaml"), *SMALL, f"output.root={out}",
                        "--address", HEAD["gcs"], "--quiet"], env=_env(), capture_output=True, text=True,
                       timeout=420, cwd=elsewhere)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert _summary(out)["weights_hash"] == _reference_weights(project, tmp_path)
    shipped = list(Path(HEAD["temp"]).glob("session_*/runtime_resources/py_modules_files/*/mymethod/__init__.py"))
    assert shipped, sorted(str(p) for p in Path(HEAD["temp"]).glob("session_*/runtime_resources/*/*"))
