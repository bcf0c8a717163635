"""A full disk, or a signal, while a run writes its directory (issue 34): the run fails loudly (``run.json`` failed,
the reason naming the file, ``fedray run`` exit 1) or stops, the previous checkpoint stays intact, no torn or
temporary file is left, and ``--resume`` with space back reaches the fault-free run's bits with every round recorded
once.

The full disk is injected in the one write helper (``FEDRAY_FAULT_WRITE=GLOB@N=enospc``, :mod:`fedray.core.io`) at
a chosen write, and, where this machine lets the test mount one, made real: a small tmpfs filled up mid-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedray.core.errors import DiskFull
from fedray.core.io import FAULT_ENV, is_temp_name
from fedray.reporting.rundir import RunDir
from bench.chaos_faults import mount_tmpfs
from tests.helpers import ROOT, run_quiet, small_config, write_tiny_config


@pytest.fixture(scope="module")
def clean_hash(tmp_path_factory, partition_cache):
    """The fault-free run's weights hash."""
    return run_quiet(_cfg(tmp_path_factory.mktemp("clean"), partition_cache)).weights_hash


def _cfg(tmp_path, partition_cache, **over) -> dict:
    """The small config with an MLP (fast), 4 rounds."""
    return small_config(tmp_path, partition_cache, model__name="mlp", train__rounds=4, **over)


def _faulty(monkeypatch, spec: str) -> None:
    import fedray.core.io as io

    monkeypatch.setenv(FAULT_ENV, spec)
    monkeypatch.setattr(io, "_counts", {})  # counted from this run's start, as in a new process


def _assert_consistent(rd: RunDir, rounds: list[int]) -> None:
    """metrics.jsonl holds exactly ``rounds`` (whole lines), the ledger the same rounds, and no temporary file."""
    text = rd.metrics_path.read_text()
    assert text.endswith("\n") and [json.loads(line)["round"] for line in text.splitlines()] == rounds
    assert [RunDir.checkpoint_round(p) for p in sorted((rd.path / "ledger").iterdir())] == rounds
    assert not [p for p in rd.path.rglob("*") if is_temp_name(p.name)]


def _run_failing(cfg: dict):
    with pytest.raises(DiskFull) as err:
        run_quiet(cfg)
    rd = RunDir(next(Path(cfg["output"]["root"]).iterdir()))
    info = rd.read_json("run.json")
    assert info["status"] == "failed" and "no space left on device" in info["error"], info
    return rd, str(err.value), info["error"]


@pytest.mark.parametrize("target, spec, recorded, checkpoint", [
    # the row of round 2 (write 1 is the new run's empty metrics.jsonl): no torn line, round 1 kept
    ("metrics.jsonl", "metrics.jsonl@3=enospc", [1], 1),
    # round 4's row, with checkpoints every 2 rounds: the checkpoint written at the failure must not be the
    # coordinator's round-4 state under rows 1-3 (round 4 would never be recorded)
    ("metrics.jsonl", "metrics.jsonl@5=enospc", [1, 2, 3], 2),
    ("round-000003.parquet", "round-000003.parquet@1=enospc", [1, 2], 2),
    ("ckpt-000002.npz", "ckpt-*.npz@1=enospc", [1, 2], 2),
])
def test_a_full_disk_fails_the_run_loudly_and_resume_reaches_the_bits(tmp_path, partition_cache, monkeypatch,
                                                                     clean_hash, target, spec, recorded, checkpoint):
    every = 1 if target == "metrics.jsonl" and recorded == [1] else 2
    cfg = _cfg(tmp_path, partition_cache, output__checkpoint_every=every)
    _faulty(monkeypatch, spec)
    rd, message, reason = _run_failing(cfg)
    assert target in message and target in reason
    _assert_consistent(rd, recorded)
    st = rd.load_checkpoint()  # the last good checkpoint, readable, and the state of the last recorded round
    assert st is not None
    assert int(st["round"]) == checkpoint

    monkeypatch.delenv(FAULT_ENV)  # space is back
    from fedray.driver.runner import run_experiment

    res = run_experiment(resume=rd.path, progress=False, log=lambda *a: None)
    assert res.weights_hash == clean_hash
    _assert_consistent(rd, [1, 2, 3, 4])
    assert rd.read_json("run.json")["status"] == "finished"


def test_a_full_disk_at_the_latest_pointer_keeps_the_previous_checkpoint(tmp_path, partition_cache, monkeypatch,
                                                                       clean_hash):
    cfg = _cfg(tmp_path, partition_cache, output__checkpoint_every=1)
    _faulty(monkeypatch, "latest@2=enospc,ckpt-*.npz@3=enospc")  # round 2's pointer, then its retry at the end
    rd, _, reason = _run_failing(cfg)
    assert "latest" in reason
    assert RunDir.checkpoint_round(rd.latest_checkpoint()) == 1 and rd.load_checkpoint()["round"] == 1
    monkeypatch.delenv(FAULT_ENV)
    from fedray.driver.runner import run_experiment

    assert run_experiment(resume=rd.path, progress=False, log=lambda *a: None).weights_hash == clean_hash
    _assert_consistent(rd, [1, 2, 3, 4])


def test_fedray_run_exits_1_naming_the_file_and_resumes(tmp_path):
    cfg = write_tiny_config(tmp_path, rounds=3)
    env = {**os.environ, "TQDM_DISABLE": "1", FAULT_ENV: "metrics.jsonl@3=enospc"}
    cmd = [sys.executable, "-m", "fedray", "run", str(cfg), "--quiet", "output.checkpoint_every=1"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    run_dir = tmp_path / "runs" / "tiny"
    assert "fedray run: run failed: no space left on device writing" in r.stderr and "metrics.jsonl" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    show = subprocess.run([sys.executable, "-m", "fedray", "show", str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "status:          failed" in show.stdout and "no space left on device" in show.stdout, show.stdout
    env.pop(FAULT_ENV)
    r = subprocess.run([sys.executable, "-m", "fedray", "run", "--resume", str(run_dir), "--quiet"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert [row["round"] for row in RunDir(run_dir).read_metrics()] == [1, 2, 3]


@pytest.mark.parametrize("action, code", [("sigkill", -9), ("sigterm", 130)])
def test_a_driver_signalled_in_the_middle_of_a_checkpoint_write_resumes_to_the_bits(tmp_path, action, code):
    """SIGKILL in the middle of writing round 2's checkpoint leaves its temporary file, which --resume removes (no
    half-written file stays); SIGTERM there stops the run (exit 130) with a whole checkpoint. Both resume to the
    bits of the undisturbed run."""
    env = {**os.environ, "TQDM_DISABLE": "1"}

    def fedray(*args: str, **extra) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fedray", *args, "--quiet"], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=300)

    (tmp_path / "clean").mkdir()
    clean = fedray("run", str(write_tiny_config(tmp_path / "clean", rounds=3)), "output.checkpoint_every=1")
    assert clean.returncode == 0, clean.stderr[-2000:]
    r = fedray("run", str(write_tiny_config(tmp_path, rounds=3)), "output.checkpoint_every=1",
               **{FAULT_ENV: f"ckpt-*.npz@2={action}"})
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-2000:]
    rd = RunDir(tmp_path / "runs" / "tiny")
    temps = [p.name for p in (rd.path / "checkpoints").iterdir() if is_temp_name(p.name)]
    assert bool(temps) == (action == "sigkill"), temps
    r = fedray("run", "--resume", str(rd.path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not [p for p in rd.path.rglob("*") if is_temp_name(p.name)]
    want = RunDir(tmp_path / "clean" / "runs" / "tiny").read_json("summary.json")["weights_hash"]
    assert rd.read_json("summary.json")["weights_hash"] == want
    _assert_consistent(rd, [1, 2, 3])


def test_a_second_sigterm_during_the_interruption_s_checkpoint_waits_for_it(tmp_path):
    """SIGTERM in round 1's checkpoint write stops the run; a second one while the interruption's checkpoint is
    written (its ``latest`` pointer) used to kill the driver there: no checkpoint, and --resume refused. It now waits
    for that checkpoint, then ends the driver (the in-process engine keeps SIGTERM's default action)."""
    env = {**os.environ, "TQDM_DISABLE": "1", FAULT_ENV: "ckpt-*.npz@1=sigterm,latest@1=sigterm"}
    cfg = write_tiny_config(tmp_path, rounds=3)
    r = subprocess.run([sys.executable, "-m", "fedray", "run", str(cfg), "--quiet", "output.checkpoint_every=1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -15, r.stdout[-2000:] + r.stderr[-2000:]
    rd = RunDir(tmp_path / "runs" / "tiny")
    assert rd.load_checkpoint()["round"] == 1 and [row["round"] for row in rd.read_metrics()] == [1]
    env.pop(FAULT_ENV)
    r = subprocess.run([sys.executable, "-m", "fedray", "run", "--resume", str(rd.path), "--quiet"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _assert_consistent(rd, [1, 2, 3])


def test_a_second_signal_that_exits_the_driver_still_records_the_interruption(tmp_path, partition_cache,
                                                                            monkeypatch, clean_hash):
    """With a handler that exits on SIGTERM (what a Ray run's early start installs: ``sys.exit(15)``), the second
    SIGTERM ends run_experiment with SystemExit after the interruption's checkpoint: run.json says interrupted (it
    said running, read as killed, though the driver was alive to write it)."""
    import signal

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
    try:
        _faulty(monkeypatch, "ckpt-*.npz@1=sigterm,latest@1=sigterm")
        cfg = _cfg(tmp_path, partition_cache, output__checkpoint_every=1)
        with pytest.raises(SystemExit):
            run_quiet(cfg)
    finally:
        signal.signal(signal.SIGTERM, previous)
    rd = RunDir(next((tmp_path / "runs").iterdir()))
    info = rd.read_json("run.json")
    assert info["status"] == "interrupted" and "second" in info["error"], info
    assert rd.load_checkpoint()["round"] == 1 and not (rd.path / ".space-reserve").exists()
    monkeypatch.delenv(FAULT_ENV)
    from fedray.driver.runner import run_experiment

    assert run_experiment(resume=rd.path, progress=False, log=lambda *a: None).weights_hash == clean_hash
    _assert_consistent(rd, [1, 2, 3, 4])


# ------------------------------------------------------------------------------------------ a real full disk
def _fill(path: Path) -> None:
    """Write zeros into ``path`` until the file system is full."""
    with open(path, "wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError as e:
            assert e.errno == 28, e


def test_a_disk_that_fills_up_mid_run_fails_it_loudly_and_resume_reaches_the_bits(tmp_path, partition_cache,
                                                                                   clean_hash, monkeypatch):
    """A 16 MiB tmpfs for the run directory, filled up when round 2 is recorded (before its checkpoint), and kept
    full (another writer takes whatever the failed writes free): the checkpoint and its retry at the end fail;
    run.json still says failed, in the room of the reserve the run directory keeps for that; round 1's checkpoint
    stays the one resumed from."""
    disk = tmp_path / "disk"
    if not mount_tmpfs(disk, "16m"):
        pytest.skip("cannot mount a tmpfs here (not root); the injected ENOSPC tests above cover the writes")
    try:
        cfg = _cfg(disk, partition_cache, output__checkpoint_every=1)
        filler = disk / "filler"
        import fedray.driver.runner as runner

        real_fail = runner.fail_run

        def fail_when_full(*args, **kw) -> None:
            _fill(disk / "filler-2")  # what the failed checkpoint writes freed is taken again
            real_fail(*args, **kw)

        monkeypatch.setattr(runner, "fail_run", fail_when_full)

        def on_round(report: dict) -> None:
            if report["round"] == 2:
                _fill(filler)

        with pytest.raises(DiskFull):
            run_quiet(cfg, on_round=on_round)
        rd = RunDir(next((disk / "runs").iterdir()))
        info = rd.read_json("run.json")
        assert info["status"] == "failed" and "ckpt-000002.npz" in info["error"], info
        assert rd.load_checkpoint()["round"] == 1
        _assert_consistent(rd, [1, 2])
        filler.unlink()
        (disk / "filler-2").unlink()
        monkeypatch.setattr(runner, "fail_run", real_fail)
        from fedray.driver.runner import run_experiment

        assert run_experiment(resume=rd.path, progress=False, log=lambda *a: None).weights_hash == clean_hash
        _assert_consistent(rd, [1, 2, 3, 4])
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=30)
