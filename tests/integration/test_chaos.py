"""The chaos harness (bench/chaos.py, issue 34): its promise checker catches what it is there to catch, its plans
are reproducible from the seed, and a small seeded subset of its schedules keeps fedray's promise: two runs on a
private Ray, one with a worker stopped (hung, found by its heartbeat) and then a full disk at a checkpoint write (a
loud failure, then --resume), one with the coordinator SIGKILLed while the run starts; each ends with the fault-free
run's bits, every round recorded once, no half-written file, no process left."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.chaos import KINDS, Context, check_ending, plan, run, summarize
from fedray.reporting.rundir import RunDir


def _finished_run(path: Path, rounds: int = 3) -> Path:
    """A run directory as a finished run leaves it (rows, ledger files, summary), without training."""
    rd = RunDir(path).create()
    for r in range(1, rounds + 1):
        rd.append_metrics({"round": r, "loss": 1.0 / r})
        rd.write_ledger(r, [{"client": 0, "round": r, "samples": 1, "loss": 0.5, "seconds": 0.1, "worker": "w0",
                             "failure": None, "attempt": 1}])
    rd.save_checkpoint({"round": rounds, "weights": np.zeros(2, dtype=np.float32)})
    rd.write_json("run.json", {"status": "finished"})
    rd.write_json("summary.json", {"weights_hash": "abc"})
    return path


def test_the_promise_checker_catches_each_breach(tmp_path):
    ok = _finished_run(tmp_path / "ok")
    assert check_ending(ok, 3, "abc") == ("identical", [])
    assert check_ending(ok, 3, "def")[0] == "other bits"
    assert any("silent wrong result" in p for p in check_ending(ok, 3, "def")[1])

    dup = _finished_run(tmp_path / "dup")
    RunDir(dup).append_metrics({"round": 3})
    assert any("metrics.jsonl rounds [1, 2, 3, 3]" in p for p in check_ending(dup, 3, "abc")[1])
    torn = _finished_run(tmp_path / "torn")
    with open(torn / "metrics.jsonl", "a") as f:
        f.write('{"round": 4')
    assert check_ending(torn, 3, "abc")[1]

    lost = _finished_run(tmp_path / "lost")
    (lost / "ledger" / "round-000002.parquet").unlink()
    assert any(p.startswith("ledger files") for p in check_ending(lost, 3, "abc")[1])
    moved = _finished_run(tmp_path / "moved")
    shutil.copy(moved / "ledger" / "round-000001.parquet", moved / "ledger" / "round-000002.parquet")
    assert any("holds rounds [1]" in p for p in check_ending(moved, 3, "abc")[1])

    temp = _finished_run(tmp_path / "temp")
    (temp / "checkpoints" / ".ckpt-000003.npz.x1y2z3.tmp.npz").write_bytes(b"half")
    (temp / ".space-reserve").write_bytes(b"")
    problems = check_ending(temp, 3, "abc")[1]
    assert any(".ckpt-000003.npz.x1y2z3.tmp.npz" in p and ".space-reserve" in p for p in problems), problems

    running = _finished_run(tmp_path / "running")
    RunDir(running).write_json("run.json", {"status": "failed", "error": "x"})
    assert any("run.json says failed" in p for p in check_ending(running, 3, "abc")[1])


#: the kinds the seeded subset below draws from (fixed: a kind added to the table must not change its plans)
SUBSET_KINDS = ["worker_sigkill", "coordinator_sigkill", "driver_sigkill", "driver_sigterm", "checkpoint_sigterm",
                "checkpoint_sigkill", "write_sigkill", "enospc", "shard_corrupt", "worker_sigstop"]


def test_plans_come_from_the_seed_and_every_kind_is_in_the_table():
    kinds = [k for k, v in KINDS.items() if v.default and not v.disk]
    a = plan(3, 7, ["federated", "fold_group"], kinds, 3)
    assert a == plan(3, 7, ["federated", "fold_group"], kinds, 3)
    assert a != plan(4, 7, ["federated", "fold_group"], kinds, 3)
    assert set(SUBSET_KINDS) <= set(kinds) and {"worker_sigstop", "coordinator_sigstop"} <= set(kinds)
    assert all(KINDS[f.kind] for f in a[1])


@pytest.mark.parametrize("title, worker, coordinator", [
    ("ray::ClientWorker.run_clients", True, False), ("ray::RayClientWorker.__init__", True, False),
    ("ray::CoordinatorHost.run_round", False, True), ("ray::RayCoordinatorHost.ping", False, True),
    ("ray::IDLE", False, False), ("python -m fedray run x.yaml", False, False)])
def test_the_ray_processes_of_a_run_are_told_apart_by_their_titles(title, worker, coordinator):
    from bench.chaos_faults import COORDINATOR, WORKER

    assert bool(WORKER.match(title)) == worker and bool(COORDINATOR.match(title)) == coordinator


#: (seed, schedule): a worker stopped (hung) in round 2, found by its heartbeat, then a full disk at round 3's
#: checkpoint (a loud failure, then --resume); the coordinator SIGKILLed while the run starts
SUBSET = [(6, 0), (7, 1)]


@pytest.mark.slow
def test_a_seeded_subset_of_chaos_schedules_keeps_the_promise(tmp_path, partition_cache):
    ctx = Context(seed=0, workdir=tmp_path / "chaos", cache=partition_cache, variants=["federated"], kinds=SUBSET_KINDS,
                  max_faults=3, timeout_s=240.0)
    lines: list[str] = []
    outcomes = []
    for seed, index in SUBSET:
        ctx = dataclasses.replace(ctx, seed=seed)
        outcomes += run(ctx, [index], log=lines.append)
    fig = summarize(outcomes)
    report = json.dumps(fig, indent=1) + "\n" + "\n".join(lines)
    assert fig["violations"] == 0 and fig["identical"] == len(SUBSET), report
    assert fig["faults_injected"] >= 2 and fig["loud_failures_resumed"] >= 1, report
    assert fig["leaked_processes"] == 0, report
    fired = {f.kind for o in outcomes for f in o.faults if f.fired}
    assert {"enospc", "worker_sigstop", "coordinator_sigkill"} <= fired, report


def test_results_accumulate_once_per_schedule_and_report_the_figures(tmp_path, capsys):
    """Shards append one whole record per schedule; a schedule already recorded is refused (before a shard starts
    and under the lock); --report counts every file's records and refuses a torn line or a schedule twice."""
    from bench import chaos_records as cr
    from bench.chaos import Attempt, Outcome, main
    from bench.chaos_faults import Fault

    def outcome(i: int, fired: bool, ending: str = "identical") -> Outcome:
        o = Outcome(i, "federated", [Fault("driver_sigkill", fired=fired), Fault("enospc", write="latest@1=enospc")])
        o.attempts = [Attempt(0, "run", rc=-9, status="killed"), Attempt(1, "resume", rc=0, status="finished")]
        o.ending = ending
        return o

    settings = {"variants": ["federated"], "max_faults": 6}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    cr.append(a, cr.make_record(outcome(0, True), mode="one-node", seed=3, settings=settings, commit="x"))
    cr.append(a, cr.make_record(outcome(1, False), mode="one-node", seed=3, settings=settings, commit="x"))
    cr.append(b, cr.make_record(outcome(2, True, "other bits"), mode="one-node", seed=3, settings=settings,
                                commit="x"))
    with pytest.raises(cr.DuplicateSchedule):
        cr.append(a, cr.make_record(outcome(1, True), mode="one-node", seed=3, settings=settings, commit="x"))
    # the same index under other settings is another schedule
    cr.append(a, cr.make_record(outcome(1, True), mode="one-node", seed=3, settings={}, commit="x"))
    assert len(a.read_text().splitlines()) == 3

    fig = cr.summarize(cr.read([a, b]))
    assert (fig["schedules"], fig["faults_planned"], fig["faults_injected"]) == (4, 8, 3)
    assert fig["identical"] == 3 and fig["other_bits"] == 1 and fig["loud_failures_resumed"] == 3
    assert main(["--report", str(a), str(b)]) == 0
    assert "| schedules | 4 (plain 4) |" in capsys.readouterr().out

    shutil.copy(a, tmp_path / "again.jsonl")
    with pytest.raises(SystemExit, match="twice"):
        main(["--report", str(a), str(tmp_path / "again.jsonl")])
    with open(b, "a") as f:
        f.write('{"v": 1, "mode": "one-n')
    with pytest.raises(SystemExit, match="not a whole chaos record"):
        main(["--report", str(b)])
    # a shard asking for a schedule already recorded with its settings is refused before it runs anything
    from bench.chaos import settings as settings_of

    ctx = Context(seed=3, workdir=tmp_path / "w", cache=tmp_path / "c", variants=["federated"],
                  kinds=["driver_sigkill"], max_faults=6, min_faults=2, carry=2)
    cr.append(b.with_name("c.jsonl"), cr.make_record(outcome(1, True), mode="one-node", seed=3,
                                                     settings=settings_of(ctx), commit="x"))
    with pytest.raises(SystemExit, match=r"already holds schedule\(s\) \[1\]"):
        main(["--seed", "3", "--first", "0", "--schedules", "2", "--results", str(b.with_name("c.jsonl")),
              "--variants", "federated", "--kinds", "driver_sigkill", "--workdir", str(tmp_path / "w")])


def test_a_fault_its_driver_outlived_moves_on_at_most_carry_times_and_plans_keep_their_counts():
    from bench.chaos import carry_over
    from bench.chaos_faults import Fault

    faults = [Fault("driver_sigkill", attempt=0, fired=True), Fault("worker_sigkill", attempt=0),
              Fault("enospc", attempt=1, write="latest@1=enospc")]
    for attempt in range(4):
        carry_over(faults, attempt, 2)
    assert [(f.attempt, f.carried) for f in faults] == [(0, 0), (2, 2), (3, 2)]
    kinds = [k for k, v in KINDS.items() if v.default and not v.disk]
    for i in range(20):
        assert 2 <= len(plan(9, i, ["federated"], kinds, 6, min_faults=2)[1]) <= 6
    # apps draw no fault that needs a run directory of their own (a tmpfs, the partition of one run)
    assert not {f.kind for i in range(30) for f in plan(9, i, ["sweep", "tune"], list(KINDS), 6, 2)[1]} \
        & {"disk_full", "shard_corrupt"}
