"""Slices of a cluster for several whole runs at once (``fedray tune`` trials, ``fedray sweep`` points).

Every run of a batch gets its own ``Coordinator`` actor and ``workers`` client-worker actors of
``cpus_per_worker`` / ``gpus_per_worker`` each, so a run is a slice of the cluster and the heavy work happens
in the actors, not in the driver threads that call ``run_experiment``. How many runs go at once is the
asked concurrency capped so that the slices always fit the cluster together::

    cpus per run = workers * cpus_per_worker + engine.coordinator_num_cpus
    gpus per run = workers * gpus_per_worker
    C = min(concurrency, floor(cluster CPUs / cpus per run), floor(cluster GPUs / gpus per run))

With ``engine.backend: local`` runs go one at a time (``C = 1``, whatever was asked): in-process runs in
threads of one process share torch's global RNG (model initialisation, dropout masks) and thread settings,
so their numbers would depend on how the threads interleave. Ray's scheduler enforces every actor's
resources; the cap only makes sure that the ``C`` slices never wait for each other.
"""

from __future__ import annotations

import os

from fedray.config import ConfigError, ExperimentConfig
from fedray.core.ray_env import ensure_ray


def cluster_totals(cfg: ExperimentConfig) -> tuple[float, float]:
    """(CPUs, GPUs) the runs of ``cfg``'s backend can use: the Ray cluster's (joined or started here, as
    ``engine.ray_address`` / ``RAY_ADDRESS`` say), or this machine's for the local backend."""
    e = cfg.engine
    if e.backend == "ray":
        import ray

        from fedray.plugins import plugin_py_modules

        ensure_ray(e.object_store_memory, address=e.ray_address, py_modules=plugin_py_modules(cfg))
        cr = ray.cluster_resources()
        cpus, gpus = float(cr.get("CPU", 0.0)), float(cr.get("GPU", 0.0))
    else:
        cpus, gpus = float(len(os.sched_getaffinity(0))), 0.0
        if e.device != "cpu":
            try:
                import torch

                gpus = float(torch.cuda.device_count())
            except Exception:  # noqa: BLE001 - no usable torch CUDA: no GPU
                gpus = 0.0
    return cpus, (0.0 if e.device == "cpu" else gpus)


def plan_slices(cfg: ExperimentConfig, concurrency: int, *, workers: int | None = None,
                cpus_per_worker: float | None = None, gpus_per_worker: float | None = None,
                field: str = "trial_resources", totals: tuple[float, float] | None = None) -> tuple[int, dict]:
    """(runs at once, resource description) for runs of ``cfg`` (the base config) with the given slice; an
    unset part of the slice comes from ``cfg.engine``. ``field`` names the slice in error messages;
    ``totals`` (CPUs, GPUs) skips asking the cluster."""
    e = cfg.engine
    cpus, gpus = totals if totals is not None else cluster_totals(cfg)
    workers = workers if workers is not None else int(e.num_workers or 1)
    cpw = cpus_per_worker if cpus_per_worker is not None else float(e.worker_num_cpus)
    gpw = gpus_per_worker
    if gpw is None:
        gpw = e.worker_num_gpus if e.worker_num_gpus is not None else (1.0 / e.workers_per_gpu if gpus > 0 else 0.0)
    t_cpu = workers * cpw + float(e.coordinator_num_cpus) if e.backend == "ray" else float(e.torch_threads)
    t_gpu = workers * float(gpw)
    where = "cluster" if e.backend == "ray" else "machine"
    if t_gpu > 0 and gpus <= 0:
        raise ConfigError(f"{field}.gpus_per_worker: {gpw} GPUs per worker requested but the {where} has no GPU")
    cap = int(concurrency)
    if t_cpu > 0:
        cap = min(cap, int(cpus / t_cpu + 1e-9))
    if t_gpu > 0:
        cap = min(cap, int(gpus / t_gpu + 1e-9))
    if cap < 1:
        what = field.split("_")[0]
        raise ConfigError(f"{field}: one {what} needs {t_cpu:g} CPUs and {t_gpu:g} GPUs but the {where} has "
                          f"{cpus:g} CPUs and {gpus:g} GPUs")
    note = None
    if e.backend == "local" and cap > 1:
        note = (f"engine.backend local: one run at a time (asked {int(concurrency)}; in-process runs in threads of "
                f"one process share torch's global RNG, so their numbers would depend on the interleaving); "
                f"engine.backend ray runs {cap} at once")
        cap = 1
    desc = {"backend": e.backend, "workers": workers, "cpus_per_worker": cpw, "gpus_per_worker": float(gpw),
            "cpus_per_trial": t_cpu, "gpus_per_trial": t_gpu, "cluster_cpus": cpus, "cluster_gpus": gpus,
            "concurrency_requested": int(concurrency), "concurrency": cap, "note": note}
    return cap, desc


def apply_slice(data: dict, desc: dict) -> dict:
    """Set one run's engine section (a config dict, changed in place and returned) to the slice ``desc``.
    None of these fields is hashed: the run's numbers and its run directory name do not change."""
    eng = data.setdefault("engine", {})
    eng["num_workers"] = int(desc["workers"])
    eng["worker_num_cpus"] = float(desc["cpus_per_worker"])
    eng["worker_num_gpus"] = float(desc["gpus_per_worker"])
    return data
