"""The driver's set-up and finish of a run: checks before any work, the data and the run directory
(:func:`setup_run`), and the final weights, summary and status (:func:`finish_run`, :func:`fail_run`)."""

from __future__ import annotations

import io
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedray.config import ConfigError, ExperimentConfig, config_hash, dump_config, load_config
from fedray.core.io import atomic_write_bytes, atomic_write_text
from fedray.core.owner import describe_device, describe_owner, device_kinds, owner_record, read_run_status
from fedray.data.fetch import data_root, ensure_data
from fedray.data.sources import load_source
from fedray.data.store import PartitionStore, build_partition
from fedray.data.table import DataBundle
from fedray.driver.launch import EarlyStart
from fedray.plugins import check_data_fit, check_driver, check_output_root, check_registries
from fedray.reporting.callbacks import Trackers
from fedray.reporting.claim import check_run_dir, default_run_name, refuse_live_owner
from fedray.reporting.rundir import RunDir, last_accuracy
from fedray.reporting.trackers import open_trackers

__all__ = ["Run", "RunResult", "fail_run", "finish_run", "prepare_data", "run_status", "setup_run", "stop_run"]


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
        return last_accuracy(self.rounds)


def prepare_data(cfg: ExperimentConfig, log=None):
    """Load the source and build (or reuse, after checking every shard) the partition; returns (bundle,
    store). A damaged cached partition is rebuilt, with one line to ``log``. With ``data.download``, a missing
    layout is fetched first (:func:`fedray.data.fetch.ensure_data`; on Ray, :func:`~fedray.driver.launch.early_start`
    did it before Ray started)."""
    ensure_data(cfg, log or print)
    bundle = load_source(cfg.data.source, data_root(cfg.data), **cfg.data.params)
    spec = {"name": cfg.data.partition.name, "num_clients": int(cfg.data.partition.num_clients),
            "seed": int(cfg.partition_seed), **cfg.data.partition.params}
    cache = Path(cfg.data.cache_dir or Path(cfg.output.root) / "_partitions")
    store = build_partition(bundle, spec, cache, log=log)
    nonempty = int((np.asarray(store.sizes) > 0).sum())
    if nonempty == 0:
        raise ConfigError("data.partition: every client is empty")
    return bundle, store


@dataclass
class Run:
    """A prepared run: its config, data, run directory and whether it resumes."""

    cfg: ExperimentConfig
    rd: RunDir
    bundle: DataBundle
    store: PartitionStore
    resume: bool
    t_start: float
    trackers: Trackers  # the MLflow / W&B runs it mirrors into (started), possibly none
    early: EarlyStart | None = None  # Ray and the actors, started while the data loaded (fedray.driver.launch)
    t_data: float = 0.0  # when the data was ready (time.perf_counter())
    found: str = ""  # a resume: the status run.json said (killed, interrupted, ...; fedray.driver.rounds.resume_state)
    device_before: dict | None = None  # a resume: what its rounds so far trained on (run.json's device)

    @property
    def state_path(self) -> str:
        return str(self.rd.state_path)


def _claim_run_dir(rd: RunDir, cfg: ExperimentConfig, overwrite: bool) -> None:
    """A new run never lands on an earlier one's files: refuse (:func:`~fedray.reporting.claim.check_run_dir`),
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
    resumes: list[dict] = []
    device_before = None
    if resume is not None:
        rd = RunDir(resume)
        if not (rd.path / "config.yaml").is_file():
            raise ConfigError(f"--resume {str(resume)!r}: not a run directory (no config.yaml)")
        cfg = load_config(rd.path / "config.yaml")
        resumes = _resume_history(rd, log)  # refuses a run whose driver still lives
        device_before = rd.read_json("run.json").get("device")
        check_resumable(rd, cfg, resumes[-1]["status"])
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
    for stale in rd.remove_temp_files():  # of writes a killed driver left half-done; never read
        log(f"[fedray] removed {stale.relative_to(rd.path)}, the temporary file of an interrupted write")
    rd.reserve_space()
    info = {"config_hash": config_hash(cfg), "partition_hash": store.hash, "source": cfg.data.source,
            "source_fingerprint": bundle.fingerprint, "algorithm": cfg.algorithm.name, "model": cfg.model.name,
            "python": platform.python_version(), "status": "running", "owner": owner_record(),
            "num_clients": int(store.num_clients), "partition_path": str(store.path)}
    if resume is not None:
        info["resumes"] = resumes
        if device_before is not None:  # kept until this session's is known and checked (record_device)
            info["device"] = device_before
    if cfg.plugins:  # the user's code this run ran: digests (also in the config hash), origins, versions
        from fedray.core.plugin_loader import provenance

        info["plugins"] = provenance(cfg.plugin_code, cfg.plugin_roots)
    trackers = Trackers(rd, open_trackers(cfg, rd.path, rd.path.name), log)
    trackers.start(cfg, info)  # one that cannot start fails here, before run.json claims the directory
    if resume is None:
        atomic_write_text(rd.path / "config.yaml", dump_config(cfg))
    rd.write_json("run.json", info)
    return Run(cfg=cfg, rd=rd, bundle=bundle, store=store, resume=resume is not None, t_start=t_start,
               trackers=trackers, t_data=t_data, found=resumes[-1]["status"] if resumes else "",
               device_before=device_before)


def record_device(run: Run, device: dict) -> None:
    """``run.json``'s ``device``: what the run trains on (the coordinator's ``ready``), once its workers are up.

    ``engine.device: auto`` is not part of a run's name, yet a run on the CPU and the same run on a GPU give
    different numbers (docs/gpu.md): a resume whose rounds so far ran on another kind of device (cpu against cuda)
    would be bit for bit neither run, so it is refused here, before any round, naming both. The record keeps the
    earlier device until this check passes, so a refused attempt leaves it as it was. A session none of whose
    workers answered the question (all lost while starting: the rounds replace them) records none to compare."""
    before = run.device_before
    # a session in which no worker answered has nothing to compare
    if before is not None and before["workers"] and device["workers"] and device_kinds(before) != device_kinds(device):
        raise ConfigError(
            f"--resume {run.rd.path}: its rounds so far trained on {describe_device(before)}, this session would "
            f"train on {describe_device(device)} (engine.device: {run.cfg.engine.device}); CPU and GPU runs of "
            "one config give different numbers, so the resumed run would be bit for bit neither. Resume it where "
            "it ran (with engine.backend local, CUDA_VISIBLE_DEVICES= hides a GPU), or start it over with "
            "engine.device set to cpu or cuda (a run of its own name)")
    info = run.rd.read_json("run.json")
    info["device"] = device
    run.rd.write_json("run.json", info)


def _resume_history(rd: RunDir, log) -> list[dict]:
    """run.json's earlier resumes and this one: the status it found (a dead driver's ``running`` is ``killed``,
    :func:`~fedray.core.owner.read_run_status`), why, and the driver that wrote it. A ConfigError when that driver
    still runs."""
    info, status, reason = read_run_status(rd.path)
    refuse_live_owner(rd.path, info)
    owner = info.get("owner")
    if status == "running" and owner:  # another host's driver (or no /proc): nothing here can tell
        log(f"[fedray] {rd.path}: run.json says its driver ({describe_owner(owner)}) is running it, which cannot be "
            f"checked from here; resuming (if it still runs, stop it: two drivers would write the same files)")
    elif status == "killed":
        log(f"[fedray] {rd.path}: {reason}; resuming it")
    return [*info.get("resumes", []), {"at": time.time(), "status": status, "reason": reason, "owner": owner}]


def check_resumable(rd: RunDir, cfg: ExperimentConfig, found: str) -> int:
    """Whether a resume of ``rd`` (whose run.json said ``found``) has a state to go on from; the recorded rounds it
    runs again from the initial state (0 when there is a checkpoint or nothing is recorded). Called before run.json
    is touched (so that a refused run keeps saying how it ended) and by :func:`fedray.driver.rounds.resume_state`
    after the start.

    Rounds recorded after the newest checkpoint are run again (a round's checkpoint is written after its row).
    Before the first checkpoint the initial state is that checkpoint: a driver killed after recording a round and
    before checkpointing it, at the first round a checkpoint is due (``output.checkpoint_every``, or the last round
    if sooner), leaves at most that many rounds and no checkpoint; they are run again. Anything else with recorded
    rounds and no checkpoint (``output.checkpoint_every: 0``, checkpoints removed, a run that ended otherwise) is
    refused rather than silently started over."""
    recorded = len(rd.read_metrics())
    if not recorded or (rd.path / "checkpoints" / "latest").is_file():
        return 0
    every = int(cfg.output.checkpoint_every)
    first_due = min(every, int(cfg.train.rounds)) if every else 0
    if found in ("killed", "running") and recorded <= first_due:  # "running": another host's driver, unchecked
        return recorded
    raise ConfigError(f"--resume {rd.path}: no checkpoint (checkpoints/latest) to continue the {recorded} recorded "
                      f"rounds from (output.checkpoint_every={every}); start over with --overwrite")


def fail_run(run: Run, engine, result: RunResult, log=print) -> None:
    """A run that cannot produce a trustworthy result: ``run.json`` says ``failed`` with the reason (on a full disk
    too: the run directory's reserve is freed first); the checkpoint of the last good round stays (the
    Checkpointer wrote it); no final weights or summary."""
    if engine is not None:
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - the coordinator may be the thing that died
            pass
    rd = run.rd
    rd.release_space()  # on a full disk, the room to say so
    rd.drop_unrecorded()  # a round whose metrics row could not be written is not recorded
    info = rd.read_json("run.json")
    info.update(status="failed", error=result.failed)
    rd.write_json("run.json", info)
    log(f"[fedray] failed: {result.failed} | outputs in {rd.path}")


def stop_run(run: Run, log=print, why: str = "stopped by a second Ctrl-C / SIGTERM") -> None:
    """A Ctrl-C or SIGTERM ended the run outside the round loop's handling (a second one while the run stopped or
    finished, or one while it started): ``run.json`` says ``interrupted`` with ``why`` (the checkpoint ``latest``
    names is where ``--resume`` goes on), unless it already says how the run ended. Without it the record kept
    saying ``running`` (read as ``killed``), though this driver was alive to write it."""
    try:
        info = run.rd.read_json("run.json")
        if info.get("status") == "running":
            info.update(status="interrupted", error=why)
            run.rd.write_json("run.json", info)
            run.rd.release_space()
    except Exception as e:  # noqa: BLE001 - a third signal, a full disk: the record reads killed then
        log(f"[fedray] could not record the interruption in run.json: {type(e).__name__}: {e}")


def finish_run(run: Run, engine, result: RunResult, log=print) -> RunResult:
    """Final weights and summary (not after an interruption), the status in ``run.json``."""
    rd = run.rd
    weights = engine.weights()
    result.weights_hash = engine.weights_hash()
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
    info["status"] = run_status(result)
    rd.write_json("run.json", info)
    rd.release_space()
    restarts = f" | coordinator restarts {result.coordinator_restarts}" if result.coordinator_restarts else ""
    log(f"[fedray] {'stopped' if result.interrupted else 'finished'}: accuracy {result.accuracy:.4f} | "
        f"weights {result.weights_hash}{restarts} | outputs in {rd.path}")
    return result


def run_status(result: RunResult) -> str:
    return ("failed" if result.failed else "interrupted" if result.interrupted else
            "stopped" if result.stopped_early else "finished")
