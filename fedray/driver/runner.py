"""The driver: prepares data and the run directory, starts the coordinator, runs the rounds, writes outputs.

``run_experiment(cfg)`` is what ``fedray run``, ``jobs.train``, sweeps, studies and the tests call. It is
four steps, each a module of its own: :func:`~fedray.driver.setup.setup_run` (checks, data, run directory),
:func:`~fedray.driver.handle.open_coordinator` (the coordinator handle: a Ray actor or in-process),
:class:`~fedray.driver.rounds.RoundLoop` (the rounds, with callbacks from :mod:`fedray.reporting.callbacks` and :mod:`fedray.driver.callbacks`) and
:func:`~fedray.driver.setup.finish_run` (final weights, summary, status). With ``engine.backend: ray`` it uses the Ray
instance already initialised in this process, the cluster named by ``engine.ray_address`` / ``fedray run
--address`` or ``RAY_ADDRESS`` (under ``ray job submit``), or starts a private, loopback-only local one with
token authentication (:mod:`fedray.core.ray_env`); with ``local`` nothing of Ray is imported.
"""

from __future__ import annotations

import time
from pathlib import Path

from fedray.config import ExperimentConfig
from fedray.driver.callbacks import Checkpointer, DriverFaults
from fedray.reporting.callbacks import OnRound, Progress, TensorBoard, Trackers
from fedray.engine.faults import FaultInjector
from fedray.engine.dispatch import RunAborted
from fedray.driver.handle import CoordinatorLost, _reason, open_coordinator
from fedray.driver.launch import EarlyStart, early_start
from fedray.driver.rounds import RoundLoop, resume_state
from fedray.driver.setup import (Run, RunResult, fail_run, finish_run, record_device, run_status, setup_run,
                                 stop_run)

__all__ = ["run_experiment"]


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


def _ready(engine, cfg: ExperimentConfig, log) -> dict:
    """The coordinator's ``ready``; a coordinator (or one of its client workers) that dies while they start is
    started again, within ``engine.max_coordinator_restarts``, as one that dies in a round (the run directory holds
    nothing of it yet); past that the run stops (:class:`~fedray.engine.dispatch.RunAborted`)."""
    limit = int(cfg.engine.max_coordinator_restarts)
    try:
        return engine.ready()
    except CoordinatorLost as first:
        err = first
    while engine.restarts < limit:
        log(f"[fedray] coordinator lost while starting ({err}); starting it again ({engine.restarts + 1}/{limit})")
        try:
            return engine.restart()
        except CoordinatorLost as again:
            err = again
    raise RunAborted(f"the coordinator died while starting, after {engine.restarts} restart(s) "
                     f"(engine.max_coordinator_restarts={limit}): {err}") from err


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
    (:mod:`fedray.driver.launch`); ``early``: that start, begun by the caller for these same arguments
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
    looping = False  # the round loop runs: it handles a first Ctrl-C / SIGTERM itself
    try:
        engine = open_coordinator(run)
        info = _ready(engine, cfg, log)
        record_device(run, info["device"])  # a resume on another kind of device is refused, before any round
        start_round = resume_state(run, engine, log)
        result.startup_seconds = startup = time.perf_counter() - run.t_start
        result.startup_phases = {"data": data_s, "ray": getattr(early, "ray_seconds", None), "ready": startup}
        ray_up = getattr(early, "ray_seconds", None)
        ray_s = f", Ray up at {ray_up:.1f} s" if ray_up is not None else ""
        log(f"[fedray] run {run.rd.path} | {cfg.algorithm.name} on {cfg.data.source} | {run.store.num_clients} "
            f"clients, {cfg.train.clients_per_round}/round | {info['workers']} {cfg.engine.backend} workers | "
            f"{info['num_params']:,} params | start-up {startup:.1f} s (data ready at {data_s:.1f} s{ray_s})")
        result.rounds = run.rd.read_metrics()
        loop = RoundLoop(run, engine, _callbacks(run, cfg.output.progress if progress is None else progress, on_round,
                                                 trackers, log), result, log)
        t_rounds = time.perf_counter()
        looping = True
        loop.run_rounds(start_round)
        result.rounds_seconds = time.perf_counter() - t_rounds
        finish_run(run, engine, result, log)
    except BaseException as e:
        if engine is None and early is not None:
            early.abort()
        if not result.failed and not isinstance(e, Exception):  # a second Ctrl-C / SIGTERM during the finish
            result.interrupted = True
            stop_run(run, log, "stopped by a second Ctrl-C / SIGTERM" if looping else
                     "stopped by Ctrl-C / SIGTERM while the run started, before its rounds")
        else:
            result.failed = result.failed or _reason(e)
            fail_run(run, engine, result, log)
        trackers.finish("failed" if result.failed else "interrupted", result.final)
        raise
    trackers.finish(run_status(result), result.final)
    return result
