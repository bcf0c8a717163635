"""What the chaos harness (bench/chaos.py, issue 34) found around the coordinator of a Ray run. A coordinator (or a
client worker) that dies while the run starts: before the fix the run stopped with Ray's ActorDiedError traceback
(exit 1); now it is started again, within ``engine.max_coordinator_restarts``, as one that dies in a round, and the
run ends with the undisturbed bits. A SIGTERM that lands while the driver waits in Ray's compiled code: before the
fix a SystemError failed the run; now it stops as interrupted, the round in flight recorded and checkpointed."""

from __future__ import annotations

import pytest

from fedray.config import from_dict
from fedray.driver import launch, runner
from fedray.engine.dispatch import RunAborted
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config

pytestmark = pytest.mark.ray

BASE = dict(train__rounds=2, engine__backend="ray", engine__num_workers=1, model__name="mlp")


@pytest.fixture(scope="module")
def clean_hash(tmp_path_factory, partition_cache):
    cfg = small_config(tmp_path_factory.mktemp("clean"), partition_cache, **{**BASE, "engine__backend": "local"})
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None).weights_hash


def _kill(ray, actor) -> None:
    ray.kill(actor, no_restart=True)


def test_a_coordinator_dead_before_its_first_call_is_started_again(tmp_path, partition_cache, ray_session,
                                                                   clean_hash, monkeypatch):
    real = launch.EarlyStart.check
    killed = []

    def kill_first(self, cfg, meta):
        if not killed:
            killed.append(self.result().coord)
            _kill(ray_session, killed[0])
        return real(self, cfg, meta)

    monkeypatch.setattr(launch.EarlyStart, "check", kill_first)
    logs: list[str] = []
    res = run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE)), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash and killed
    assert any("coordinator lost while starting" in line and "(1/" in line for line in logs), logs
    assert [r["round"] for r in RunDir(res.run_dir).read_metrics()] == [1, 2]


@pytest.mark.parametrize("which", ["coordinator", "worker"])
def test_an_actor_dead_while_the_coordinator_sets_up_is_started_again(tmp_path, partition_cache, ray_session,
                                                                      clean_hash, monkeypatch, which):
    real = runner.open_coordinator

    def open_then_kill(run):
        engine = real(run)
        _kill(ray_session, engine.coord if which == "coordinator" else engine.worker_actors[0])
        return engine

    monkeypatch.setattr(runner, "open_coordinator", open_then_kill)
    logs: list[str] = []
    res = run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE)), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash
    assert any("coordinator lost while starting" in line for line in logs), logs
    assert RunDir(res.run_dir).read_json("run.json")["status"] == "finished"


def test_a_coordinator_that_keeps_dying_in_start_up_stops_the_run_clearly(tmp_path, partition_cache, ray_session,
                                                                         monkeypatch):
    real = launch.EarlyStart.check

    def always_kill(self, cfg, meta):
        original = launch.start_actors

        def start_and_kill(c):
            actors = original(c)
            _kill(ray_session, actors.coord)
            return actors

        monkeypatch.setattr(launch, "start_actors", start_and_kill)
        _kill(ray_session, self.result().coord)
        return real(self, cfg, meta)

    monkeypatch.setattr(launch.EarlyStart, "check", always_kill)
    cfg = small_config(tmp_path, partition_cache, **BASE, engine__max_coordinator_restarts=1)
    with pytest.raises(RunAborted, match=r"the coordinator died while starting, 2 time\(s\) \(engine\."
                                         r"max_coordinator_restarts=1\)"):
        run_experiment(from_dict(cfg), progress=False, log=lambda *a: None)


class _InterruptedInRay:
    """``ray`` as the coordinator handle uses it, except that the wait for round 2 ends as a signal's exception does
    inside Ray's compiled code: a SystemError ("returned a result with an exception set") caused by what the
    SIGTERM handler raised (seen by bench/chaos.py with a real SIGTERM in ``ray.get``)."""

    def __init__(self, ray, engine):
        self._ray, self._engine, self.fired = ray, engine, False

    def __getattr__(self, name):
        return getattr(self._ray, name)

    def get(self, ref, *args, **kw):
        if not self.fired and self._engine.in_flight.get("round") == 2 and ref is self._engine.in_flight.get("ref"):
            self.fired = True
            from fedray.driver.rounds import _Interrupted

            try:
                raise _Interrupted()
            except _Interrupted as cause:
                raise SystemError("<built-in method __new__ of type object> returned a result with an exception "
                                  "set") from cause
        return self._ray.get(ref, *args, **kw)


def test_sigterm_in_ray_s_compiled_code_stops_the_run_as_interrupted(tmp_path, partition_cache, ray_session,
                                                                      clean_hash, engines):
    """Before the fix the SystemError failed the run (run.json failed, exit 1) and, with checkpoints every 2 rounds,
    round 2 had no checkpoint: --resume refused. Now the round in flight is finished, recorded and checkpointed."""
    proxies = []

    def on_round(report):
        if report["round"] == 1:
            engine = engines[-1]
            proxies.append(_InterruptedInRay(engine.ray, engine))
            engine.ray = proxies[-1]

    cfg = small_config(tmp_path, partition_cache, **{**BASE, "train__rounds": 3}, output__checkpoint_every=2)
    res = run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, on_round=on_round)
    assert proxies and proxies[0].fired and res.interrupted
    rd = RunDir(res.run_dir)
    assert rd.read_json("run.json")["status"] == "interrupted"
    assert [r["round"] for r in rd.read_metrics()] == [1, 2] and rd.load_checkpoint()["round"] == 2
    clean = run_experiment(from_dict(small_config(tmp_path / "clean", partition_cache,
                                                  **{**BASE, "engine__backend": "local", "train__rounds": 3})),
                           progress=False, log=lambda *a: None)
    resumed = run_experiment(resume=rd.path, progress=False, log=lambda *a: None)
    assert resumed.weights_hash == clean.weights_hash and [r["round"] for r in rd.read_metrics()] == [1, 2, 3]


def test_a_coordinator_whose_calls_were_all_short_is_still_found_hung_within_the_heartbeat(
        tmp_path, partition_cache, ray_session, clean_hash, monkeypatch):
    """Rounds shorter than the heartbeat's ping interval (1 s) never left a ping answered while a call was pending,
    so the driver kept treating the coordinator as starting: one stopped in round 2 was given the start-up's
    allowance (engine.start_timeout_s, 600 s; 60 s here) instead of engine.heartbeat_s."""
    logs: list[str] = []
    cfg = small_config(tmp_path, partition_cache, **BASE, engine__heartbeat_s=4.0, engine__start_timeout_s=60.0,
                       engine__fault_injection={"kind": "coordinator_stop", "round": 2})
    res = run_experiment(from_dict(cfg), progress=False, log=logs.append)
    assert res.weights_hash == clean_hash
    assert any("coordinator hung" in line for line in logs), logs
    assert res.rounds_seconds < 45, res.rounds_seconds  # 4 s of silence and a restart, not the 60 s allowance


def test_a_coordinator_stopped_before_its_first_call_is_replaced_after_the_start_allowance(
        tmp_path, partition_cache, ray_session, clean_hash, monkeypatch):
    """Found by bench/chaos.py (the coordinator SIGSTOPped in start-up): the early start's check waited on it with no
    limit. It now waits as long as a start may take (engine.start_timeout_s; 40 s here), then replaces the actors."""
    import os
    import signal

    real = launch.EarlyStart.check
    stopped = []

    def stop_first(self, cfg, meta):
        if not stopped:
            coord = self.result().coord
            stopped.append(ray_session.get(coord.__ray_call__.remote(lambda actor: os.getpid())))
            os.kill(stopped[0], signal.SIGSTOP)
        return real(self, cfg, meta)

    monkeypatch.setattr(launch.EarlyStart, "check", stop_first)
    # without the fix the check waits for ever: after 240 s the stopped process is killed, which ends that wait
    # (and fails the test: the check never says it gave up)
    import threading

    watchdog = threading.Timer(240.0, lambda: stopped and os.kill(stopped[0], signal.SIGKILL))
    watchdog.start()
    logs: list[str] = []
    try:
        res = run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE, engine__start_timeout_s=40.0)),
                             progress=False, log=logs.append)
    finally:
        watchdog.cancel()
    assert res.weights_hash == clean_hash and stopped
    assert any("did not answer within 40 s of its start (engine.start_timeout_s): Ray started it" in line
               for line in logs), logs


# ------------------------------------------------------------------ an actor stopped inside its constructor (issue 34)
def _stop_once(token) -> None:
    """SIGSTOP this process, the first time any process calls it with ``token`` (a file created exclusively: one
    stop across the run's actors); the file holds the stopped pid."""
    import os
    import signal

    try:
        fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    os.kill(os.getpid(), signal.SIGSTOP)


def _end_stopped(token) -> None:
    """SIGKILL the process ``token`` names if it is still there (before the fix nothing ever ends it)."""
    import os
    import signal

    if token.exists():
        try:
            os.kill(int(token.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def test_a_worker_stopped_in_its_constructor_is_replaced_at_the_start_deadline(
        tmp_path, partition_cache, ray_session, clean_hash, monkeypatch, engines):
    """Found by bench/chaos.py (seed 21 schedule 7: a ray::RayClientWorker.__init__ SIGSTOPped): the pool waited for
    it as long as a start may take (600 s), then said the cluster "may lack the requested resources". Now a worker
    that Ray started but that has not answered by engine.start_timeout_s is killed and replaced like a hung one: no
    coordinator restart, the run's bits unchanged. Before the fix the watchdog's SIGKILL (90 s) ended the wait and
    the coordinator's start was lost and restarted instead."""
    import threading

    import ray

    from fedray.engine import pool
    from fedray.engine.worker import ClientWorker

    token = tmp_path / "stopped.pid"

    class StopsInInit(ClientWorker):
        def __init__(self, *args):
            _stop_once(str(token))
            super().__init__(*args)

        @ray.method(concurrency_group="heartbeat")
        def ping(self) -> bool:
            return True

    stopping = ray.remote(concurrency_groups={"heartbeat": 1})(StopsInInit)
    monkeypatch.setattr(pool, "_ray_worker_class", lambda: stopping)  # the early start's workers (driver side)
    watchdog = threading.Timer(90.0, _end_stopped, (token,))
    watchdog.start()
    seen: dict = {}
    logs: list[str] = []
    try:
        cfg = small_config(tmp_path, partition_cache, **{**BASE, "engine__num_workers": 2},
                           engine__start_timeout_s=20.0)
        res = run_experiment(from_dict(cfg), progress=False, log=logs.append,
                             on_round=lambda report: seen.update(workers=engines[-1].workers()))
    finally:
        watchdog.cancel()
        _end_stopped(token)
    assert res.weights_hash == clean_hash and token.exists()
    assert not any("coordinator lost" in line for line in logs), logs
    assert len(engines) == 1 and engines[0].restarts == 0
    states = {w["name"]: w["state"] for w in seen["workers"]}
    retired = [n for n, s in states.items() if s == "retired"]
    assert len(retired) == 1 and retired[0] in ("w0", "w1"), states  # the stopped one, replaced in a new slot
    assert any(n.startswith(f"{retired[0]}.") for n in states), states
    assert [r["round"] for r in RunDir(res.run_dir).read_metrics()] == [1, 2]


def test_a_coordinator_stopped_in_its_constructor_fails_the_run_naming_the_start_deadline(
        tmp_path, partition_cache, ray_session, monkeypatch):
    """Found by bench/chaos.py (seed 22 schedule 4, cluster schedules 8 and 12: a CoordinatorHost.__init__
    SIGSTOPped): the driver's check waited on it for 600 s. Now it is given engine.start_timeout_s, then handled as
    a coordinator lost while starting; with no restart left the run stops saying which deadline passed and that Ray
    had started the process (not a lack of resources). Before the fix the check waited 600 s (the watchdog's SIGKILL
    at 90 s ended it as a death, without the deadline's name)."""
    import threading

    import ray

    from fedray.engine.host import CoordinatorHost

    token = tmp_path / "stopped.pid"

    class StopsInInit(CoordinatorHost):
        def __init__(self):
            _stop_once(str(token))
            super().__init__()

        @ray.method(concurrency_group="heartbeat")
        def ping(self) -> bool:
            return True

    stopping = ray.remote(concurrency_groups={"heartbeat": 1})(StopsInInit)
    monkeypatch.setattr(launch, "ray_coordinator_class", lambda ray_: stopping)
    watchdog = threading.Timer(90.0, _end_stopped, (token,))
    watchdog.start()
    cfg = small_config(tmp_path, partition_cache, **BASE, engine__start_timeout_s=8.0,
                       engine__max_coordinator_restarts=0)
    try:
        with pytest.raises(RunAborted, match=r"the coordinator died while starting, 1 time\(s\) \(engine\.max_"
                                             r"coordinator_restarts=0\): it did not answer within 8 s of its start "
                                             r"\(engine\.start_timeout_s\): Ray started it \(pid \d+ on node"):
            run_experiment(from_dict(cfg), progress=False, log=lambda *a: None)
    finally:
        watchdog.cancel()
        _end_stopped(token)
    assert token.exists()


# ------------------------------------------------------------------ SIGTERM between ray.init and the first round
def test_a_sigterm_after_ray_init_ends_the_driver_through_fedray_s_handler(tmp_path):
    """Found by bench/chaos.py: Ray's core worker installed abseil's failure-signal handler in the driver when it
    joined Ray, and it took SIGTERM too (``*** SIGTERM received``, then the signal raised again: exit 134 or 1, no
    record), until the round loop set its own handler. The driver signals itself in the middle of its first write of
    run.json, which comes after the coordinator's check, so after ray.init: now fedray's handler ends it (exit 15,
    as before Ray is up), the interrupted write leaves no file behind."""
    import os
    import subprocess
    import sys

    from fedray.core.io import FAULT_ENV
    from tests.helpers import ROOT, write_tiny_config

    cfg = write_tiny_config(tmp_path, backend="ray")
    r = subprocess.run([sys.executable, "-m", "fedray", "run", str(cfg), "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TQDM_DISABLE": "1", FAULT_ENV: "run.json@1=sigterm",
                                                    "FEDRAY_NO_WARM": "1"})
    assert r.returncode == 15, r.stdout[-2000:] + r.stderr[-3000:]
    assert "SIGTERM received" not in r.stderr, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "tiny"
    assert not (run_dir / "run.json").exists() and not [p for p in run_dir.iterdir() if ".tmp" in p.name]


def test_a_sigterm_while_the_run_starts_records_it_interrupted(tmp_path, partition_cache, ray_session, monkeypatch):
    """A SIGTERM after run.json claimed the directory and before the round loop (the coordinator's start): run.json
    says interrupted, naming the start; before, it said "stopped by a second Ctrl-C / SIGTERM" of a first one."""
    import os
    import signal
    import sys

    real = runner.open_coordinator

    def open_then_sigterm(run):
        engine = real(run)
        os.kill(os.getpid(), signal.SIGTERM)
        return engine

    monkeypatch.setattr(runner, "open_coordinator", open_then_sigterm)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # the early start's handler
    try:
        with pytest.raises(SystemExit):
            run_experiment(from_dict(small_config(tmp_path, partition_cache, **BASE)), progress=False,
                           log=lambda *a: None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    info = RunDir(next((tmp_path / "runs").iterdir())).read_json("run.json")
    assert info["status"] == "interrupted" and "while the run started" in info["error"], info


def test_a_pool_whose_worker_ray_cannot_place_says_so_at_the_start_deadline(ray_session):
    """The other half of the start deadline's message: a worker no node has the resources of (no process) is named
    as not placed, with the cluster's available resources, not as hung."""
    from fedray.engine.pool import RayPool

    actors = RayPool.start(None, 1, 1000.0, 0.0)  # more CPUs than the test session's Ray has
    try:
        with pytest.raises(RuntimeError, match=r"1 of 1 client workers did not start \(num_cpus=1000, num_gpus=0 per "
                                               r"worker\): w0 did not answer within 1 s of its start \(engine\.start_"
                                               r"timeout_s\): Ray has not placed it \(actor state PENDING_CREATION, "
                                               r"no process\)"):
            RayPool(None, 1, 1000.0, 0.0, actors=actors, start_timeout_s=1.0)
    finally:
        launch.kill_actors(ray_session, actors)
