"""What a client worker is built from: a small, picklable description of the run (no torch here, so the
driver can start workers without importing it)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerSpec", "worker_spec"]


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
