"""Records tell the truth after a crash (issue 34): a driver SIGKILLed mid-run cannot write how it ended, so its
records name it (``owner``: pid, host, process start); every reader (``fedray show``, ``fedray report``, ``fedray
run``, ``--resume``, ``fedray sweep --resume``) then says ``killed`` with the reason instead of ``running``
forever, and a driver that is still alive is never written over. Real subprocesses, real SIGKILL and SIGSTOP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


from fedray.core.io import FAULT_ENV
from fedray.reporting.rundir import RunDir
from tests.helpers import ROOT, write_tiny_config

ENV = {**os.environ, "TQDM_DISABLE": "1"}


def _fedray(*args: str, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedray", *args], cwd=ROOT, env={**ENV, **extra},
                          capture_output=True, text=True, timeout=300)


def _wait_for(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_sigkilled_run_reads_killed_everywhere_and_resumes(tmp_path):
    cfg = write_tiny_config(tmp_path, rounds=3)
    # SIGKILL in the middle of appending round 2's metrics row: nothing of the driver's can run after it
    r = _fedray("run", str(cfg), "--quiet", "output.checkpoint_every=1", **{FAULT_ENV: "metrics.jsonl@3=sigkill"})
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "runs" / "tiny"
    raw = json.loads((run_dir / "run.json").read_text())
    assert raw["status"] == "running" and raw["owner"]["pid"] > 0  # as the killed driver left it

    show = _fedray("show", str(run_dir))
    assert show.returncode == 0, show.stderr
    assert "status:          killed\n" in show.stdout, show.stdout
    assert f"reason:          its driver (pid {raw['owner']['pid']} on " in show.stdout
    assert "ended without recording how" in show.stdout and "resume:          fedray run --resume" in show.stdout

    rep = _fedray("report", str(run_dir), "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr
    assert f"note: tiny is killed after round 1 (its driver (pid {raw['owner']['pid']}" in rep.stdout, rep.stdout

    again = _fedray("run", str(cfg), "--quiet", "output.checkpoint_every=1")
    assert again.returncode == 2 and "already holds a run (status killed)" in again.stderr, again.stderr

    res = _fedray("run", "--resume", str(run_dir))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "ended without recording how" in res.stdout and "resuming it" in res.stdout
    info = RunDir(run_dir).read_json("run.json")
    assert info["status"] == "finished" and info["owner"]["pid"] != raw["owner"]["pid"]
    assert [(h["status"], h["owner"]["pid"]) for h in info["resumes"]] == [("killed", raw["owner"]["pid"])]
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2, 3]
    assert "status:          finished" in _fedray("show", str(run_dir)).stdout


def test_a_run_whose_driver_lives_is_never_resumed_or_overwritten_by_another(tmp_path):
    cfg = write_tiny_config(tmp_path, rounds=3)
    run_dir = tmp_path / "runs" / "tiny"
    proc = subprocess.Popen([sys.executable, "-m", "fedray", "run", str(cfg), "--quiet", "output.checkpoint_every=1"],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: (run_dir / "run.json").is_file(), "the driver's run.json")
        proc.send_signal(signal.SIGSTOP)  # alive, and writing nothing while the others try
        show = _fedray("show", str(run_dir))
        assert f"status:          running (its driver: pid {proc.pid} on " in show.stdout, show.stdout
        for args in (("run", "--resume", str(run_dir)), ("run", str(cfg), "--overwrite")):
            r = _fedray(*args)
            assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
            assert f"is being run by a live driver (pid {proc.pid} on " in r.stderr, r.stderr
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    res = _fedray("run", "--resume", str(run_dir))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2, 3]


def test_a_sigkilled_sweep_records_its_session_killed_and_its_point_s_run_as_resumed(tmp_path, partition_cache):
    """``fedray sweep`` on the in-process engine, SIGKILLed when point 1 records round 2 (FEDRAY_SWEEP_KILL_AT), then
    ``--resume``: sweep.json's first session reads killed (with why), the second finished; point 1's run.json
    records that it resumed a killed run."""
    from tests.apps.sweeps import write_sweep

    path = write_sweep(tmp_path, partition_cache, axes={"seed": [0, 1]}, parallel=1, table=None)
    out = tmp_path / "out"
    sweep = [sys.executable, "-m", "fedray", "sweep", str(path), "--output-dir", str(out), "engine.backend=local"]
    r = subprocess.run(sweep, cwd=ROOT, env={**ENV, "FEDRAY_SWEEP_KILL_AT": "1:2"}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    first = json.loads((out / "sweep.json").read_text())["sessions"]
    assert [s["status"] for s in first] == ["running"] and first[0]["pid"] > 0
    dry = subprocess.run(sweep + ["--dry-run"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and dry.stdout.count("[killed]") == 1 and "[finished]" in dry.stdout, dry.stdout

    r = subprocess.run(sweep + ["--resume"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    sessions = json.loads((out / "sweep.json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"], sessions
    assert f"its driver (pid {first[0]['pid']} on " in sessions[0]["reason"]
    killed = [p for p in (out / "runs").iterdir() if RunDir(p).read_json("run.json").get("resumes")]
    assert len(killed) == 1 and RunDir(killed[0]).read_json("run.json")["resumes"][0]["status"] == "killed"
    assert all(RunDir(p).read_json("run.json")["status"] == "finished" for p in (out / "runs").iterdir())


def test_a_killed_run_without_a_checkpoint_is_refused_and_its_record_kept(tmp_path):
    """SIGKILLed after round 1's row, before any checkpoint (output.checkpoint_every=0): --resume has nothing to go
    on from and says so (exit 2, naming --overwrite) before it writes anything: run.json keeps reading killed, not
    the refusal; --overwrite then runs it again from round 1."""
    cfg = write_tiny_config(tmp_path, rounds=3)
    r = _fedray("run", str(cfg), "--quiet", **{FAULT_ENV: "metrics.jsonl@3=sigkill"})
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "runs" / "tiny"
    before = (run_dir / "run.json").read_text()
    res = _fedray("run", "--resume", str(run_dir))
    assert res.returncode == 2 and "no checkpoint (checkpoints/latest) to continue the 1 recorded rounds" in res.stderr
    assert "start over with --overwrite" in res.stderr
    assert (run_dir / "run.json").read_text() == before  # still the killed driver's record
    assert "status:          killed" in _fedray("show", str(run_dir)).stdout
    again = _fedray("run", str(cfg), "--quiet", "--overwrite")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2, 3]


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path):
    """SIGKILLed while writing its first checkpoint (output.checkpoint_every=2: after round 2's row): the initial state
    is the only one to go on from, and the 2 recorded rounds are at most one checkpoint interval, so --resume runs
    them again from the start (saying so) and ends with the weights of an uninterrupted run. The same kill with
    a checkpoint every round (round 1's row, then its checkpoint) was refused before, and a test that SIGSTOPs a
    driver at a random point hit it."""
    cfg = write_tiny_config(tmp_path, rounds=3)
    r = _fedray("run", str(cfg), "--quiet", "output.checkpoint_every=2", **{FAULT_ENV: "ckpt-*.npz@1=sigkill"})
    assert r.returncode == -signal.SIGKILL, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "runs" / "tiny"
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2]
    assert not (run_dir / "checkpoints" / "latest").is_file()
    res = _fedray("run", "--resume", str(run_dir))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "no checkpoint yet (output.checkpoint_every=2): its 2 recorded round(s) run again" in res.stdout
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2, 3]
    resumed = RunDir(run_dir).read_json("summary.json")
    plain = _fedray("run", str(cfg), "--quiet", "output.checkpoint_every=2", "output.root=" + str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert resumed["weights_hash"] == RunDir(tmp_path / "plain" / "tiny").read_json("summary.json")["weights_hash"]
