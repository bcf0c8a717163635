"""What a client worker and the coordinator are built from: small, picklable descriptions of the run (no torch
here, so the driver can start the actors without importing it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CoordinatorSpec", "WorkerSpec", "worker_spec"]


@dataclass
class WorkerSpec:
    """Everything a worker needs to build itself; small and picklable."""

    config: dict  # resolved ExperimentConfig as a dict
    partition_path: str
    state_path: str | None
    run_dir: str
    device: str = "cpu"
    gpu_fraction: float | None = None


def worker_spec(cfg_dict: dict, partition_path: str, state_path: str | None, run_dir: str,
                worker_gpus: float) -> WorkerSpec:
    """What every ClientWorker of a run is built from: a (fractional) GPU when the workers were given one
    and ``engine.device`` allows it, else the CPU."""
    requested = cfg_dict["engine"]["device"]
    device = ("cuda" if requested == "cuda" else "auto") if requested in ("auto", "cuda") and worker_gpus > 0 else "cpu"
    return WorkerSpec(config=cfg_dict, partition_path=partition_path, state_path=state_path, run_dir=run_dir,
                      device=device, gpu_fraction=worker_gpus or None)


@dataclass
class CoordinatorSpec:
    """Everything the coordinator needs to build itself (:class:`~fedray.engine.coordinator.Coordinator`): the
    run's config, partition and directory, the test split (on Ray a reference into the object store:
    :class:`~fedray.engine.outcomes.InStore`), its pool's size and per-worker resources, the client-state store
    and, on Ray, the client workers started for it (its pool owns them from then on)."""

    config: dict
    partition_path: str
    run_dir: str
    test: object
    num_workers: int
    worker_cpus: float
    worker_gpus: float
    state_path: str | None
    workers: list | None = None

    def worker_spec(self) -> WorkerSpec:
        return worker_spec(self.config, self.partition_path, self.state_path, self.run_dir, self.worker_gpus)
