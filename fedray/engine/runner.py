"""The driver: prepares data and the run directory, starts the coordinator, runs the rounds, writes outputs.

``run_experiment(cfg)`` is what ``fedray run``, ``jobs.train`` and the tests call. With
``engine.backend: ray`` it uses the Ray instance already initialised in this process, the one named by
``RAY_ADDRESS`` (under ``ray job submit``), or starts a local one; with ``local`` nothing of Ray is
imported.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedray.config import ConfigError, ExperimentConfig, config_hash, dump_config, from_dict, load_config
from fedray.core.ray_env import ensure_ray
from fedray.reporting.rundir import RunDir, TensorBoardLogger


@dataclass
class RunResult:
    run_dir: Path
    rounds: list[dict] = field(default_factory=list)
    weights_hash: str = ""
    final: dict = field(default_factory=dict)
    startup_seconds: float = 0.0
    rounds_seconds: float = 0.0
    interrupted: bool = False
    stopped_early: bool = False

    @property
    def accuracy(self) -> float:
        for r in reversed(self.rounds):
            if r.get("accuracy") is not None:
                return float(r["accuracy"])
        return math.nan


class _Interrupted(Exception):
    pass


def default_run_name(cfg: ExperimentConfig) -> str:
    return cfg.output.name or f"{cfg.algorithm.name}-{config_hash(cfg)}"


def prepare_data(cfg: ExperimentConfig):
    """Load the source and build (or reuse) the partition; returns (bundle, store)."""
    from fedray.data.sources import load_source
    from fedray.data.store import build_partition

    bundle = load_source(cfg.data.source, cfg.data.root, **cfg.data.params)
    spec = {"name": cfg.data.partition.name, "num_clients": int(cfg.data.partition.num_clients),
            "seed": int(cfg.partition_seed), **cfg.data.partition.params}
    cache = Path(cfg.data.cache_dir or Path(cfg.output.root) / "_partitions")
    store = build_partition(bundle, spec, cache)
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


def run_experiment(cfg: ExperimentConfig | None = None, *, resume: str | Path | None = None,
                   progress: bool | None = None, log=print, on_round=None) -> RunResult:
    """Run (or resume) one experiment to the end. Ctrl-C writes a checkpoint and returns early.

    ``on_round(report) -> bool | None`` is called after every round with that round's metrics row;
    returning ``True`` stops the run there (after a checkpoint), e.g. when an Optuna pruner says so.
    The result then has ``stopped_early = True``."""
    t_start = time.perf_counter()
    if resume is not None:
        rd = RunDir(resume)
        if not (rd.path / "config.yaml").is_file():
            raise ConfigError(f"--resume {str(resume)!r}: not a run directory (no config.yaml)")
        cfg = load_config(rd.path / "config.yaml")
    if cfg is None:
        raise ConfigError("run_experiment needs a config or a run directory to resume")
    from fedray.algorithms import build_algorithm, build_server_optimizer
    from fedray.data.sources import SOURCES
    from fedray.models import MODELS

    # registry checks before any work
    build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
    build_server_optimizer(cfg.server.name, cfg.server.lr, cfg.server.params)
    if cfg.model.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {cfg.model.name!r} (known: {', '.join(sorted(MODELS))})")
    if cfg.data.source not in SOURCES:
        raise ConfigError(f"data.source: unknown source {cfg.data.source!r} (known: {', '.join(sorted(SOURCES))})")

    bundle, store = prepare_data(cfg)
    if int(cfg.engine.multi_client) > 1:  # refuse unsupported algorithms / models before any engine work
        from fedray.engine.multiclient import check_multi_client

        check_multi_client(cfg, store.meta)
    if resume is None:
        rd = RunDir(Path(cfg.output.root) / default_run_name(cfg))
    rd.create()
    if resume is None:
        from fedray.core.io import atomic_write_text

        atomic_write_text(rd.path / "config.yaml", dump_config(cfg))
    rd.write_json("run.json", {
        "config_hash": config_hash(cfg), "partition_hash": store.hash, "source": cfg.data.source,
        "source_fingerprint": bundle.fingerprint, "algorithm": cfg.algorithm.name, "model": cfg.model.name,
        "python": platform.python_version(), "status": "running",
        "num_clients": int(store.num_clients), "partition_path": str(store.path),
    })
    if progress is None:
        progress = cfg.output.progress

    cfg_dict = cfg.to_dict()
    cfg_dict.pop("source_path", None)
    test = _test_payload(bundle)
    state_path = str(rd.state_path)
    k = int(cfg.train.clients_per_round)
    if cfg.engine.backend == "ray":
        import ray

        from fedray.engine.coordinator import Coordinator, worker_spec
        from fedray.engine.pool import RayPool, default_num_workers

        ensure_ray(cfg.engine.object_store_memory)
        n_workers, wcpu, wgpu = default_num_workers(cfg, k)
        # the client workers start (import torch, open the partition) while the coordinator actor does
        workers = RayPool.start(worker_spec(cfg_dict, str(store.path), state_path, str(rd.path), wgpu),
                                n_workers, wcpu, wgpu)
        coord_cls = ray.remote(Coordinator).options(num_cpus=cfg.engine.coordinator_num_cpus, max_restarts=0,
                                                     max_concurrency=1)
        coord = coord_cls.remote(cfg_dict, str(store.path), str(rd.path), ray.put(test), n_workers, wcpu, wgpu,
                                 state_path, workers)

        def call(method, *args):
            return ray.get(getattr(coord, method).remote(*args))
    else:
        from fedray.engine.coordinator import Coordinator
        from fedray.engine.pool import default_num_workers

        n_workers, wcpu, wgpu = default_num_workers(cfg, k)
        coord = Coordinator(cfg_dict, str(store.path), str(rd.path), test, n_workers, wcpu, wgpu, state_path)

        def call(method, *args):
            return getattr(coord, method)(*args)

    info = call("ready")
    start_round = 1
    if resume is not None:
        st = rd.load_checkpoint()
        if st is not None:
            call("load_state_dict", st)
            start_round = int(st["round"]) + 1
            from fedray.engine.state import ClientStateStore

            ClientStateStore(state_path).prune(keep_from_round=start_round, drop_after_round=int(st["round"]))
            rd.truncate_metrics(int(st["round"]))
        else:
            rd.truncate_metrics(0)
            from fedray.engine.state import ClientStateStore

            ClientStateStore(state_path).clear()
        log(f"[fedray] resuming {rd.path} at round {start_round}")
    else:
        rd.truncate_metrics(0)
    startup = time.perf_counter() - t_start
    log(f"[fedray] run {rd.path} | {cfg.algorithm.name} on {cfg.data.source} | {store.num_clients} clients, "
        f"{k}/round | {info['workers']} {cfg.engine.backend} workers | {info['num_params']:,} params | "
        f"start-up {startup:.1f} s")

    tb = None
    if cfg.output.tensorboard:
        try:
            tb = TensorBoardLogger(rd.path / "tb")
        except Exception as e:  # noqa: BLE001 - tensorboard missing: say so once, keep running
            log(f"[fedray] TensorBoard disabled: {e}")
    result = RunResult(run_dir=rd.path, rounds=rd.read_metrics(), startup_seconds=startup)
    faults = cfg.engine.fault_injection or {}
    bar = None
    if progress and sys.stderr.isatty() and not os.environ.get("TQDM_DISABLE"):
        from tqdm import tqdm

        bar = tqdm(total=int(cfg.train.rounds), initial=start_round - 1, unit="round", dynamic_ncols=True)
    last_ckpt_round = start_round - 1
    previous_handler = None
    interrupted = {"flag": False}

    def on_sigterm(signum, frame):  # `ray job stop` sends SIGTERM to the driver: stop after a checkpoint
        interrupted["flag"] = True
        raise _Interrupted()

    try:
        previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread
        previous_handler = None
    in_flight: dict = {}  # Ray: the round the coordinator actor is running (it goes on after a Ctrl-C)

    def run_round(rnd: int) -> dict:
        if cfg.engine.backend != "ray":
            return call("run_round", rnd)
        in_flight.update(round=rnd, ref=coord.run_round.remote(rnd), t0=time.perf_counter())
        report = ray.get(in_flight["ref"])
        in_flight.clear()
        return report

    def record_round(rnd: int, report: dict, t_round: float) -> None:
        ledger = report.pop("ledger")
        rd.write_ledger(rnd, ledger)
        report["failures"] = sum(1 for r in ledger if r["failure"])
        report["wall_seconds"] = time.perf_counter() - t_round  # driver view: round trip + ledger write
        rd.append_metrics(report)
        result.rounds.append(report)
        if tb is not None:
            tb.log(report)
        if bar is not None:
            post = {"acc": f"{report.get('accuracy', float('nan')):.3f}", "s": f"{report['seconds_total']:.2f}"}
            bar.set_postfix(post)
            bar.update(1)
        elif progress:
            acc = report.get("accuracy")
            log(f"[fedray] round {rnd:4d}/{cfg.train.rounds}  "
                f"acc {acc if acc is None else f'{acc:.4f}'}  loss {report['loss']:.4f}  "
                f"{report['seconds_total']:.2f} s")

    t_rounds = time.perf_counter()
    rnd = start_round - 1
    try:
        for rnd in range(start_round, int(cfg.train.rounds) + 1):
            if faults.get("kind") == "driver_exit" and int(faults.get("round", -1)) == rnd:
                marker = rd.path / "faults" / f"driver-r{rnd}"
                if not marker.exists():
                    marker.parent.mkdir(parents=True, exist_ok=True)
                    marker.write_text("1")
                    os._exit(17)  # testing aid: a hard crash of the driver before round `rnd`
            t_round = time.perf_counter()
            report = run_round(rnd)
            record_round(rnd, report, t_round)
            stop = bool(on_round(report)) if on_round is not None else False
            every = int(cfg.output.checkpoint_every)
            if every and (rnd % every == 0 or rnd == int(cfg.train.rounds) or stop):
                rd.save_checkpoint(call("state_dict"), keep=int(cfg.output.keep_checkpoints))
                last_ckpt_round = rnd
                from fedray.engine.state import ClientStateStore

                ClientStateStore(state_path).prune(keep_from_round=rnd + 1)
            if stop:
                result.stopped_early = True
                break
    except (KeyboardInterrupt, _Interrupted):
        result.interrupted = True
        if in_flight:  # the actor finishes that round anyway: record it, so the checkpoint and rows agree
            try:
                log(f"[fedray] interrupted: finishing round {in_flight['round']} on the coordinator first")
                record_round(in_flight["round"], ray.get(in_flight["ref"]), in_flight["t0"])
            except Exception as e:  # noqa: BLE001 - a second Ctrl-C or a failed round: checkpoint what we have
                log(f"[fedray] round {in_flight['round']} not recorded: {type(e).__name__}: {e}")
        done = result.rounds[-1]["round"] if result.rounds else 0
        if done > last_ckpt_round:
            try:
                rd.save_checkpoint(call("state_dict"), keep=int(cfg.output.keep_checkpoints))
            except Exception as e:  # noqa: BLE001
                log(f"[fedray] could not write the final checkpoint: {e}")
        log(f"[fedray] interrupted after round {done}; resume with: fedray run --resume {rd.path}")
    finally:
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)
        if bar is not None:
            bar.close()
        if tb is not None:
            tb.close()
    result.rounds_seconds = time.perf_counter() - t_rounds
    weights = call("get_weights")
    result.weights_hash = call("weights_hash")
    call("shutdown")
    if cfg.engine.backend == "ray":
        import ray

        ray.kill(coord)
    if not result.interrupted:
        from fedray.core.io import atomic_write_bytes
        import io

        buf = io.BytesIO()
        np.save(buf, weights)
        atomic_write_bytes(rd.path / "final_weights.npy", buf.getvalue())
        last = result.rounds[-1] if result.rounds else {}
        result.final = {
            "round": last.get("round"), "accuracy": result.accuracy, "ema_accuracy": last.get("ema_accuracy"),
            "domain_accuracy": last.get("domain_accuracy"), "weights_hash": result.weights_hash,
            "startup_seconds": startup, "rounds_seconds": result.rounds_seconds,
            "mean_round_seconds": float(np.mean([r["seconds_total"] for r in result.rounds])) if result.rounds else None,
            "total_seconds": time.perf_counter() - t_start,
        }
        rd.write_json("summary.json", result.final)
    run = rd.read_json("run.json")
    run["status"] = "interrupted" if result.interrupted else ("stopped" if result.stopped_early else "finished")
    rd.write_json("run.json", run)
    log(f"[fedray] {'stopped' if result.interrupted else 'finished'}: accuracy {result.accuracy:.4f} | "
        f"weights {result.weights_hash} | outputs in {rd.path}")
    return result


def run_from_dict(data: dict, **kwargs) -> RunResult:
    return run_experiment(from_dict(data), **kwargs)
