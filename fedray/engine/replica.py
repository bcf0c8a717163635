"""What the coordinator and every client worker build from the same description of a run.

A :class:`Replica` is the config, the partition store, the algorithm, one model with its flat weight
view, the augmentation and the device, built once per process from a :class:`WorkerSpec`.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from fedray.algorithms import algorithm_of
from fedray.config import from_dict
from fedray.core.weights import FlatParams
from fedray.data.loader import Augment
from fedray.data.store import PartitionStore
from fedray.engine.spec import WorkerSpec
from fedray.models import model_for_meta
from fedray.plugins import load_plugins

__all__ = ["CUBLAS_WORKSPACE", "Replica", "coordinator_device", "device_name", "use_deterministic_torch"]

#: cuBLAS's fixed workspace that deterministic cuBLAS needs (CUDA >= 10.2), unless the environment sets one
CUBLAS_WORKSPACE = ":4096:8"


def coordinator_device(engine_device: str) -> torch.device:
    return torch.device("cuda" if engine_device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")


def device_name(device: torch.device) -> str:
    """What a process trains on, as ``run.json``'s ``device`` records it: ``cpu``, or ``cuda (GPU model)``."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda ({torch.cuda.get_device_name(index)})"


def use_deterministic_torch() -> None:
    """``engine.deterministic: true`` in this process: torch's deterministic algorithms (an op without one raises,
    naming itself), cuDNN's deterministic kernels without autotuning, and cuBLAS's fixed workspace. The variable is
    read when cuBLAS makes its first handle, so this runs before any CUDA work of the process (a Replica is
    built first thing in a worker and in the coordinator). Process-wide and never undone: with
    ``engine.backend: local`` the calling process keeps the setting."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def limit_gpu_memory(device: torch.device, fraction: float) -> None:
    """Let this process's PyTorch allocator use at most ``fraction`` (the worker's ``engine.worker_num_gpus``) of
    ``device``'s memory, so that a worker past its share raises CUDA's out-of-memory error (which names
    ``engine.worker_num_gpus``: fedray/engine/outcomes.py) instead of starving the GPU's other workers. torch wants
    the device's index: a plain ``cuda`` (no index, the usual ``engine.device``) is the current device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(min(1.0, float(fraction)), index)


class Replica:
    """One process's copy of the experiment (see the module docstring).

    ``device``: ``"auto"`` (a GPU when torch sees one), ``"cpu"``/``"cuda"`` or a torch.device.
    ``seed_model``: seed torch with ``seed`` right before building the model (the initial global model)."""

    def __init__(self, cfg_dict: dict, partition_path: str, device, *, gpu_fraction: float | None = None,
                 seed_model: bool = False):
        cfg = from_dict(cfg_dict, validate=False)
        load_plugins(cfg)  # the user's modules, before anything is built from the registries
        self.cfg = cfg
        torch.set_num_threads(max(1, int(cfg.engine.torch_threads)))
        if cfg.engine.deterministic:
            use_deterministic_torch()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError("engine.device: cuda, but torch sees no GPU in this process (a CPU-only torch build, "
                               "or CUDA_VISIBLE_DEVICES hides it)")
        self.device = torch.device(device)
        if self.device.type == "cuda" and gpu_fraction:
            limit_gpu_memory(self.device, gpu_fraction)
        self.store = PartitionStore.open(partition_path)
        self.meta = self.store.meta
        self.sizes = np.asarray(self.store.sizes, dtype=np.int64)
        self.algorithm = algorithm_of(cfg)
        if seed_model:  # the initial global model: torch.manual_seed(seed) immediately followed by construction
            torch.manual_seed(int(cfg.seed))
        self.model = self.model_factory()
        self.flat = FlatParams(self.model, self.device)
        self.augment = Augment.from_spec(cfg.train.augment) if cfg.train.augment else None

    def model_factory(self) -> torch.nn.Module:
        """Another model of the run's architecture (e.g. MOON's copy of the global model): the configured model
        as the algorithm adapts it (:meth:`~fedray.algorithms.base.Algorithm.adapt_model`)."""
        cfg = self.cfg
        return self.algorithm.adapt_model(model_for_meta(cfg.model.name, self.meta, **cfg.model.params))

    @classmethod
    def for_worker(cls, spec: WorkerSpec) -> Replica:
        return cls(spec.config, spec.partition_path, spec.device, gpu_fraction=spec.gpu_fraction)
