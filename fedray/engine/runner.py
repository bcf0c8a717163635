"""The driver: prepares data and the run directory, starts the coordinator, runs the rounds, writes outputs.

``run_experiment(cfg)`` is what ``fedray run``, ``jobs.train``, sweeps, studies and the tests call. It is
four steps: :func:`setup_run` (checks, data, run directory), :class:`Engine` (the coordinator, as a Ray
actor or in-process), :class:`RoundLoop` (the rounds, with callbacks from :mod:`fedray.engine.callbacks`)
and :func:`finish_run` (final weights, summary, status). With ``engine.backend: ray`` it uses the Ray
instance already initialised in this process, the cluster named by ``engine.ray_address`` / ``fedray run
--address`` or ``RAY_ADDRESS`` (under ``ray job submit``), or starts a private, loopback-only local one with
token authentication (:mod:`fedray.core.ray_env`); with ``local`` nothing of Ray is imported.
"""

from __future__ import annotations

import contextlib
import io
import math
import platform
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedray.config import ConfigError, ExperimentConfig, config_hash, dump_config, load_config
from fedray.core.io import atomic_write_bytes, atomic_write_text
from fedray.data.sources import load_source
from fedray.data.store import build_partition
from fedray.engine.callbacks import Checkpointer, DriverFaults, OnRound, Progress, TensorBoard, Trackers
from fedray.engine.claim import check_run_dir, default_run_name
from fedray.engine.dispatch import RunAborted
from fedray.engine.faults import FaultInjector
from fedray.engine.launch import Actors, EarlyStart, coordinator_options, early_start, kill_actors, start_actors  # noqa: F401
from fedray.engine.outcomes import InStore
from fedray.engine.pool import default_num_workers
from fedray.engine.spec import worker_spec
from fedray.engine.state import ClientStateStore
from fedray.plugins import check_data_fit, check_driver, check_output_root, check_registries
from fedray.reporting.rundir import RunDir
from fedray.reporting.trackers import open_trackers

__all__ = ["Engine", "RoundLoop", "Run", "RunResult", "default_run_name", "finish_run", "prepare_data",
           "run_experiment", "setup_run"]


@dataclass
class RunResult:
    run_dir: Path
    rounds: list[dict] = field(default_factory=list)
    weights_hash: str = ""
    final: dict = field(default_factory=dict)
    startup_seconds: float = 0.0
    startup_phases: dict = field(default_factory=dict)  # seconds from the start: data ready, Ray up, actors ready
    rounds_seconds: float = 0.0
    interrupted: bool = False
    stopped_early: bool = False
    failed: str | None = None  # why the run stopped without a trustworthy result
    coordinator_restarts: int = 0  # coordinator actors that died and were replaced from the last checkpoint

    @property
    def accuracy(self) -> float:
        for r in reversed(self.rounds):
            if r.get("accuracy") is not None:
                return float(r["accuracy"])
        return math.nan


class _Interrupted(Exception):
    pass


def prepare_data(cfg: ExperimentConfig, log=None):
    """Load the source and build (or reuse, after checking every shard) the partition; returns (bundle,
    store). A damaged cached partition is rebuilt, with one line to ``log``."""
    bundle = load_source(cfg.data.source, cfg.data.root, **cfg.data.params)
    spec = {"name": cfg.data.partition.name, "num_clients": int(cfg.data.partition.num_clients),
            "seed": int(cfg.partition_seed), **cfg.data.partition.params}
    cache = Path(cfg.data.cache_dir or Path(cfg.output.root) / "_partitions")
    store = build_partition(bundle, spec, cache, log=log)
    nonempty = int((np.asarray(store.sizes) > 0).sum())
    if nonempty == 0:
        raise ConfigError("data.partition: every client is empty")
    return bundle, store


def _test_payload(bundle) -> dict:
    t = bundle.test
    out = {"images": np.ascontiguousarray(t.images()), "labels": np.ascontiguousarray(t.labels)}
    if t.domains is not None:
        out["domains"] = np.ascontiguousarray(t.domains)
    return out


# ------------------------------------------------------------------------------------------- set-up
@dataclass
class Run:
    """A prepared run: its config, data, run directory and whether it resumes."""

    cfg: ExperimentConfig
    rd: RunDir
    bundle: object
    store: object
    resume: bool
    t_start: float
    trackers: Trackers  # the MLflow / W&B runs it mirrors into (started), possibly none
    early: EarlyStart | None = None  # Ray and the actors, started while the data loaded (fedray.engine.launch)
    t_data: float = 0.0  # when the data was ready (time.perf_counter())

    @property
    def state_path(self) -> str:
        return str(self.rd.state_path)


def _claim_run_dir(rd: RunDir, cfg: ExperimentConfig, overwrite: bool) -> None:
    """A new run never lands on an earlier one's files: refuse (:func:`~fedray.engine.claim.check_run_dir`),
    unless ``overwrite`` asks to delete them."""
    check_run_dir(rd.path, cfg, overwrite=overwrite)
    if rd.holds_run():
        rd.clear()


def setup_run(cfg: ExperimentConfig | None, resume: str | Path | None = None, overwrite: bool = False,
              log=print, early: EarlyStart | None = None) -> Run:
    """Checks before any work, then the data and the run directory (``run.json`` status ``running``).

    With ``early`` (a Ray run's actors, starting), the checks that need the registries are made by the
    coordinator actor, after the data is ready (:meth:`EarlyStart.check`): this process never imports torch
    for them. Either way they come before the run directory is claimed."""
    t_start = time.perf_counter()
    if resume is not None:
        rd = RunDir(resume)
        if not (rd.path / "config.yaml").is_file():
            raise ConfigError(f"--resume {str(resume)!r}: not a run directory (no config.yaml)")
        cfg = load_config(rd.path / "config.yaml")
    if cfg is None:
        raise ConfigError("run_experiment needs a config or a run directory to resume")
    if early is None:
        check_registries(cfg)  # before the data: a misspelt name fails at once
    else:
        check_driver(cfg)  # the data source's name, the trackers' libraries (this process writes to them)
    check_output_root(cfg)
    bundle, store = prepare_data(cfg, log)
    t_data = time.perf_counter()
    if early is None:
        check_data_fit(cfg, store.meta)  # the model for the data's shape; groups of clients (engine.multi_client)
    else:
        early.check(cfg, store.meta)
    if resume is None:
        rd = RunDir(Path(cfg.output.root) / default_run_name(cfg))
        _claim_run_dir(rd, cfg, overwrite)
    rd.create()
    info = {"config_hash": config_hash(cfg), "partition_hash": store.hash, "source": cfg.data.source,
            "source_fingerprint": bundle.fingerprint, "algorithm": cfg.algorithm.name, "model": cfg.model.name,
            "python": platform.python_version(), "status": "running",
            "num_clients": int(store.num_clients), "partition_path": str(store.path)}
    if cfg.plugins:  # the user's code this run ran: digests (also in the config hash), origins, versions
        from fedray.core.plugin_loader import provenance

        info["plugins"] = provenance(cfg.plugin_code, cfg.plugin_roots)
    trackers = Trackers(rd, open_trackers(cfg, rd.path, rd.path.name), log)
    trackers.start(cfg, info)  # one that cannot start fails here, before run.json claims the directory
    if resume is None:
        atomic_write_text(rd.path / "config.yaml", dump_config(cfg))
    rd.write_json("run.json", info)
    return Run(cfg=cfg, rd=rd, bundle=bundle, store=store, resume=resume is not None, t_start=t_start,
               trackers=trackers, t_data=t_data)


class CoordinatorLost(RuntimeError):
    """The coordinator actor died (its process was killed or exited, or its node was lost)."""


class Engine:
    """The coordinator of a run, as a Ray actor (``engine.backend: ray``) or in this process. A coordinator
    actor that died is replaced by :meth:`restart` (the loop then loads the last checkpoint into it). With
    ``run.early``, the actors it starts are the ones started while the driver loaded the data."""

    def __init__(self, run: Run):
        cfg, early = run.cfg, run.early
        self.run = run
        self.cfg_dict = cfg.to_dict()
        self.cfg_dict.pop("source_path", None)
        self.test = _test_payload(run.bundle)
        self.ray = None
        self.in_flight: dict = {}  # Ray: the round the coordinator actor is running (it goes on after a Ctrl-C)
        self.restarts = 0  # coordinator actors replaced
        self.workers: list = []  # the client workers this driver started for the current coordinator
        self._setups: list = []  # the workers' setup calls, awaited by ready()
        if cfg.engine.backend == "ray":
            import ray

            self.ray = ray
            self._start(early.result())
        else:
            from fedray.engine.coordinator import Coordinator

            n, wcpu, wgpu = default_num_workers(cfg, int(cfg.train.clients_per_round))
            self.coord = Coordinator(self.cfg_dict, str(run.store.path), str(run.rd.path), self.test, n, wcpu, wgpu,
                                     run.state_path)

    def _start(self, actors: Actors | None = None) -> None:
        """Give the client workers and a coordinator actor (in the initial state) that owns them their
        arguments, starting them first unless ``actors`` were started early."""
        run, ray = self.run, self.ray
        actors = actors or start_actors(run.cfg)
        self.workers, self.coord = actors.workers, actors.coord
        spec = worker_spec(self.cfg_dict, str(run.store.path), run.state_path, str(run.rd.path), actors.worker_gpus)
        self._setups = [self.coord.setup.remote(self.cfg_dict, str(run.store.path), str(run.rd.path),
                                                InStore(ray.put(self.test)), actors.num_workers, actors.worker_cpus,
                                                actors.worker_gpus, run.state_path, self.workers),
                        *[w.setup.remote(spec) for w in self.workers]]

    def ready(self) -> dict:
        """The coordinator's ``ready`` (workers, parameters) once it and every client worker are set up. An actor
        that dies while they start (its node was lost, or is being lost while Ray still places actors on it)
        raises :class:`CoordinatorLost`: a restart starts them again, within ``engine.max_coordinator_restarts``."""
        if self._setups:
            from ray import exceptions as rex

            try:
                self._get(self._setups[0])  # the coordinator's own errors first (it also waits for its workers)
                self.ray.get(self._setups[1:])
            except rex.RayTaskError as e:  # the coordinator's setup found one of its new workers dead
                if not isinstance(getattr(e, "cause", None), rex.RayActorError):
                    raise
                raise CoordinatorLost(f"a client worker died while the coordinator started: {_reason(e)}") from e
            except rex.RayActorError as e:
                raise CoordinatorLost(f"an actor died while starting: {_reason(e)}") from e
            self._setups = []
        return self.call("ready")

    def restart(self) -> dict:
        """Replace a dead coordinator actor: kill what is left of it and of its workers (replacement workers
        died with it), start new ones in the initial state; what ``ready`` says."""
        self._kill()
        self.in_flight.clear()
        self.restarts += 1
        self._start()
        return self.ready()

    def _get(self, ref):
        """``ray.get`` of a coordinator call; the actor's death raises :class:`CoordinatorLost`."""
        from ray import exceptions as rex

        try:
            return self.ray.get(ref)
        except rex.RayTaskError:  # an error raised inside the coordinator (it is alive): not a lost coordinator
            raise
        except rex.RayActorError as e:  # ActorDiedError, ActorUnavailableError
            raise CoordinatorLost(_reason(e)) from e

    def call(self, method: str, *args):
        if self.ray is None:
            return getattr(self.coord, method)(*args)
        return self._get(self.coord.call.remote(method, *args))

    def run_round(self, rnd: int) -> dict:
        if self.ray is None:
            return self.coord.run_round(rnd)
        self.in_flight.update(round=rnd, ref=self.coord.call.remote("run_round", rnd), t0=time.perf_counter())
        report = self._get(self.in_flight["ref"])
        self.in_flight.clear()
        return report

    def finish_in_flight(self) -> tuple[int, dict, float] | None:
        """After an interruption: the round the actor was running, finished (it goes on anyway)."""
        if not self.in_flight:
            return None
        f = dict(self.in_flight)
        self.in_flight.clear()
        return f["round"], self._get(f["ref"]), f["t0"]

    def _kill(self) -> None:
        kill_actors(self.ray, [self.coord, *self.workers])

    def close(self) -> None:
        if self.ray is None:
            self.coord.shutdown()
            return
        try:
            self.call("shutdown")
        finally:  # also when the coordinator is the thing that died: its workers would hold their CPUs
            self._kill()


def _restore(run: Run, engine: Engine, st: dict | None) -> int:
    """Put the coordinator at checkpoint ``st`` (None: the initial state, which a new coordinator has) and
    drop what was recorded after it: metrics rows, ledger files, client-state versions. The first round to run."""
    last = 0 if st is None else int(st["round"])
    if st is None:
        ClientStateStore(run.state_path).clear()
    else:
        engine.call("load_state_dict", st)
        ClientStateStore(run.state_path).prune(keep_from_round=last + 1, drop_after_round=last)
    run.rd.truncate_metrics(last)
    return last + 1


def _resume_state(run: Run, engine: Engine, log) -> int:
    """Load the newest checkpoint into the coordinator; the first round to run."""
    rd = run.rd
    if not run.resume:
        rd.truncate_metrics(0)
        return 1
    st = rd.load_checkpoint()  # what checkpoints/latest names; a damaged one raises
    recorded = rd.read_metrics()
    if st is None and recorded:  # never start over silently: the recorded rounds would be lost
        raise ConfigError(f"--resume {rd.path}: no checkpoint (checkpoints/latest) to continue the "
                          f"{len(recorded)} recorded rounds from (output.checkpoint_every="
                          f"{run.cfg.output.checkpoint_every}); start over with --overwrite")
    start_round = _restore(run, engine, st)
    log(f"[fedray] resuming {rd.path} at round {start_round}")
    return start_round


# ------------------------------------------------------------------------------------------- rounds
@contextlib.contextmanager
def _signals_deferred():
    """SIGINT and SIGTERM wait until the block has run (in the main thread; elsewhere Python delivers no
    signal anyway). Without it a Ctrl-C right after a round's metrics row was written, before the loop knew
    the round was recorded, left the interruption's checkpoint unwritten (seen in CI)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a signal that came meanwhile is delivered now


class RoundLoop:
    """Runs rounds ``start_round .. train.rounds`` on ``engine``, records each (ledger, metrics.jsonl),
    calls the callbacks; Ctrl-C or SIGTERM (``ray job stop``) ends it after recording the round in flight."""

    def __init__(self, run: Run, engine: Engine, callbacks: list, result: RunResult, log=print):
        self.run, self.engine, self.callbacks, self.result, self.log = run, engine, callbacks, result, log
        self.stopping = False

    def record(self, rnd: int, report: dict, t_round: float) -> None:
        ledger = report.pop("ledger")
        with _signals_deferred():  # ledger, metrics row and result agree even when Ctrl-C comes now
            self.run.rd.write_ledger(rnd, ledger)
            report["failures"] = sum(1 for r in ledger if r["failure"])
            report["wall_seconds"] = time.perf_counter() - t_round  # driver view: round trip + ledger write
            self.run.rd.append_metrics(report)
            self.result.rounds.append(report)
        for cb in self.callbacks:
            if cb.on_round_end(self, report):
                self.stopping = True

    def run_rounds(self, start_round: int) -> None:
        def on_sigterm(signum, frame):  # `ray job stop` sends SIGTERM to the driver: stop after a checkpoint
            raise _Interrupted()

        try:
            previous = signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread
            previous = None
        for cb in self.callbacks:
            cb.on_run_start(self, start_round)
        try:
            rnd = start_round
            while rnd <= int(self.run.cfg.train.rounds):
                for cb in self.callbacks:
                    cb.on_round_start(self, rnd)
                t_round = time.perf_counter()
                try:
                    self.record(rnd, self.engine.run_round(rnd), t_round)
                except CoordinatorLost as e:  # in the round or in a callback's call: back to the last checkpoint
                    rnd = self._restart(rnd, e)
                    continue
                if self.stopping:
                    self.result.stopped_early = True
                    break
                rnd += 1
        except (KeyboardInterrupt, _Interrupted):
            self.result.interrupted = True
            self._finish_in_flight()
            done = self.result.rounds[-1]["round"] if self.result.rounds else 0
            self.log(f"[fedray] interrupted after round {done}; resume with: fedray run --resume {self.run.rd.path}")
        except Exception as e:
            self.result.failed = _reason(e)
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            for cb in self.callbacks:
                cb.on_run_end(self, self.result.interrupted)

    def _restart(self, rnd: int, err: CoordinatorLost) -> int:
        """The coordinator died during round ``rnd``: a new one, at the last checkpoint (the rows, ledger files
        and client state recorded after it are dropped); the round to go on from. Past
        ``engine.max_coordinator_restarts`` restarts the run fails."""
        limit = int(self.run.cfg.engine.max_coordinator_restarts)
        while True:
            if self.engine.restarts >= limit:
                raise RunAborted(f"round {rnd}: the coordinator died after {self.engine.restarts} restart(s) "
                                 f"(engine.max_coordinator_restarts={limit}): {err}") from err
            self.log(f"[fedray] coordinator lost in round {rnd} ({err}); restarting it from the last checkpoint "
                     f"({self.engine.restarts + 1}/{limit})")
            try:
                self.engine.restart()
                start = _restore(self.run, self.engine, self.run.rd.load_checkpoint())
                break
            except CoordinatorLost as again:
                err = again
        self.result.coordinator_restarts = self.engine.restarts
        self.result.rounds = self.run.rd.read_metrics()
        self.stopping = False  # a stop asked for in a dropped round is asked again when that round is re-run
        for cb in self.callbacks:
            cb.on_restart(self, start)
        self.log(f"[fedray] coordinator restarted; continuing at round {start}")
        return start

    def _finish_in_flight(self) -> None:
        """The actor finishes the round it was running anyway: record it, so checkpoint and rows agree."""
        try:
            flight = self.engine.in_flight.get("round")
            if flight is not None:
                self.log(f"[fedray] interrupted: finishing round {flight} on the coordinator first")
            done = self.engine.finish_in_flight()
            if done is not None:
                self.record(*done)
        except Exception as e:  # noqa: BLE001 - a second Ctrl-C or a failed round: checkpoint what we have
            self.log(f"[fedray] round {self.engine.in_flight.get('round', '?')} not recorded: {type(e).__name__}: {e}")


# ------------------------------------------------------------------------------------------- finish
def _reason(err: BaseException) -> str:
    """The first line of an error, without Ray's wrapping (``RayTaskError(X)`` keeps the cause)."""
    cause = getattr(err, "cause", None) or err
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"


def fail_run(run: Run, engine: Engine | None, result: RunResult, log=print) -> None:
    """A run that cannot produce a trustworthy result: ``run.json`` says ``failed`` with the reason; the
    checkpoint of the last good round stays (the Checkpointer wrote it); no final weights or summary."""
    if engine is not None:
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - the coordinator may be the thing that died
            pass
    info = run.rd.read_json("run.json")
    info.update(status="failed", error=result.failed)
    run.rd.write_json("run.json", info)
    log(f"[fedray] failed: {result.failed} | outputs in {run.rd.path}")


def finish_run(run: Run, engine: Engine, result: RunResult, log=print) -> RunResult:
    """Final weights and summary (not after an interruption), the status in ``run.json``."""
    rd = run.rd
    weights = engine.call("get_weights")
    result.weights_hash = engine.call("weights_hash")
    engine.close()
    if not result.interrupted:
        buf = io.BytesIO()
        np.save(buf, weights)
        atomic_write_bytes(rd.path / "final_weights.npy", buf.getvalue())
        last = result.rounds[-1] if result.rounds else {}
        result.final = {
            "round": last.get("round"), "accuracy": result.accuracy, "ema_accuracy": last.get("ema_accuracy"),
            "domain_accuracy": last.get("domain_accuracy"), "weights_hash": result.weights_hash,
            "startup_seconds": result.startup_seconds, "rounds_seconds": result.rounds_seconds,
            "mean_round_seconds": float(np.mean([r["seconds_total"] for r in result.rounds])) if result.rounds else None,
            "total_seconds": time.perf_counter() - run.t_start,
            "coordinator_restarts": result.coordinator_restarts,
            # the last evaluation's values of eval.metrics (only when it names some: summary.json as before otherwise)
            **{name: last[name] for name in run.cfg.eval.metrics if name in last},
        }
        rd.write_json("summary.json", result.final)
    info = rd.read_json("run.json")
    info["status"] = _status(result)
    rd.write_json("run.json", info)
    restarts = f" | coordinator restarts {result.coordinator_restarts}" if result.coordinator_restarts else ""
    log(f"[fedray] {'stopped' if result.interrupted else 'finished'}: accuracy {result.accuracy:.4f} | "
        f"weights {result.weights_hash}{restarts} | outputs in {rd.path}")
    return result


def _callbacks(run: Run, progress: bool, on_round, trackers: Trackers, log) -> list:
    cfg = run.cfg
    cbs = [DriverFaults(FaultInjector(cfg.engine.fault_injection, run.rd.path)),
           Progress(progress, cfg.train.rounds, log)]
    if cfg.output.tensorboard:
        cbs.append(TensorBoard(run.rd.path / "tb", log))
    if trackers.trackers:
        cbs.append(trackers)
    if on_round is not None:
        cbs.append(OnRound(on_round))
    cbs.append(Checkpointer(run.rd, cfg.output.checkpoint_every, cfg.output.keep_checkpoints, cfg.train.rounds,
                            run.state_path, log))  # last: it sees whether a callback above asked to stop
    return cbs


def run_experiment(cfg: ExperimentConfig | None = None, *, resume: str | Path | None = None,
                   progress: bool | None = None, log=print, on_round=None, overwrite: bool = False,
                   ray_address: str | None = None, warm: bool = False, early: EarlyStart | None = None,
                   t0: float | None = None) -> RunResult:
    """Run (or resume) one experiment to the end. Ctrl-C writes a checkpoint and returns early.

    A run directory that already holds a run is refused (``ConfigError``) unless ``overwrite`` deletes
    its results first; a run that cannot produce a trustworthy result raises, with ``run.json`` status
    ``failed`` and the reason.

    ``on_round(report) -> bool | None`` is called after every round with that round's metrics row;
    returning ``True`` stops the run there (after a checkpoint), e.g. when an Optuna pruner says so.
    The result then has ``stopped_early = True``.

    ``ray_address`` (``fedray run --address``) names the Ray cluster to join, over ``engine.ray_address``,
    also when resuming. ``warm`` (``fedray run`` without ``--no-warm``): with no address, join the Ray of
    ``fedray up`` when one is recorded and running (:func:`fedray.core.ray_env.ensure_ray`).

    With ``engine.backend: ray``, Ray and the run's actors start in the background while the data loads
    (:mod:`fedray.engine.launch`); ``early``: that start, begun by the caller for these same arguments
    (``fedray run`` begins it before it imports the runner).

    ``t0``: where the reported start-up (``RunResult.startup_seconds``) counts from, a ``time.perf_counter()``
    value; ``fedray run`` passes its process's start. Default: when ``early`` began, else now."""
    t0 = t0 if t0 is not None else getattr(early, "t0", None) or time.perf_counter()
    early = early or early_start(cfg, resume, ray_address, warm, log, t0=t0)
    try:
        run = setup_run(cfg, resume, overwrite, log, early)
    except BaseException:
        if early is not None:
            early.abort()
        raise
    run.t_start, run.early = t0, early
    data_s = run.t_data - t0
    cfg = run.cfg
    if ray_address:
        cfg.engine.ray_address = ray_address  # not hashed: the same run on another cluster
    result = RunResult(run_dir=run.rd.path)
    engine, trackers = None, run.trackers
    try:
        engine = Engine(run)
        info = engine.ready()
        start_round = _resume_state(run, engine, log)
        result.startup_seconds = startup = time.perf_counter() - run.t_start
        result.startup_phases = {"data": data_s, "ray": getattr(early, "ray_seconds", None), "ready": startup}
        ray_s = f", Ray up at {early.ray_seconds:.1f} s" if getattr(early, "ray_seconds", None) is not None else ""
        log(f"[fedray] run {run.rd.path} | {cfg.algorithm.name} on {cfg.data.source} | {run.store.num_clients} "
            f"clients, {cfg.train.clients_per_round}/round | {info['workers']} {cfg.engine.backend} workers | "
            f"{info['num_params']:,} params | start-up {startup:.1f} s (data ready at {data_s:.1f} s{ray_s})")
        result.rounds = run.rd.read_metrics()
        loop = RoundLoop(run, engine, _callbacks(run, cfg.output.progress if progress is None else progress, on_round,
                                                 trackers, log), result, log)
        t_rounds = time.perf_counter()
        loop.run_rounds(start_round)
        result.rounds_seconds = time.perf_counter() - t_rounds
        finish_run(run, engine, result, log)
    except BaseException as e:
        if engine is None and early is not None:
            early.abort()
        if not result.failed and not isinstance(e, Exception):  # a second Ctrl-C during the finish
            result.interrupted = True
        else:
            result.failed = result.failed or _reason(e)
            fail_run(run, engine, result, log)
        trackers.finish("failed" if result.failed else "interrupted", result.final)
        raise
    trackers.finish(_status(result), result.final)
    return result


def _status(result: RunResult) -> str:
    return ("failed" if result.failed else "interrupted" if result.interrupted else
            "stopped" if result.stopped_early else "finished")
