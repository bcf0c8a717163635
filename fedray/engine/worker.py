"""Client workers: one model replica each, many virtual clients in turn.

``ClientWorker`` is a plain class. The Ray backend wraps it as an actor with fractional CPU/GPU
resources; the in-process backend calls it directly. A worker receives the round's broadcast weights
(a flat float32 vector, zero-copy from the object store), then trains a chunk of clients one after the
other, each starting from those weights, and returns one :class:`ClientOutcome` per client.
Failures inside one client are caught and reported per client, so one bad client does not take the
others of its chunk down; a crash of the whole process is handled by the coordinator.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedray.engine.split import SplitClientMixin


@dataclass
class WorkerSpec:
    """Everything a worker needs to build itself; small and picklable."""

    config: dict  # resolved ExperimentConfig as a dict
    partition_path: str
    state_path: str | None
    run_dir: str
    device: str = "cpu"
    gpu_fraction: float | None = None


@dataclass
class ClientOutcome:
    cid: int
    pos: int  # position in the round's sampled order
    weights: np.ndarray | None
    num_samples: int
    loss: float
    seconds: float
    worker: str
    extras: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    error: str | None = None


class ClientWorker(SplitClientMixin):  # split-program methods: fedray.engine.split
    def __init__(self, spec: WorkerSpec, name: str = "w0"):
        from fedray.algorithms import build_algorithm
        from fedray.config import from_dict
        from fedray.data.loader import Augment
        from fedray.data.store import PartitionStore
        from fedray.engine.state import ClientStateStore
        from fedray.core.weights import FlatParams
        from fedray.models import model_for_meta

        self.name = name
        self.spec = spec
        cfg = from_dict(spec.config, validate=False)
        self.cfg = cfg
        torch.set_num_threads(int(cfg.engine.torch_threads))
        dev = spec.device
        if dev == "auto":  # a (fractional) GPU was requested: use it when torch sees one, else the CPU
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(dev)
        if self.device.type == "cuda" and spec.gpu_fraction:
            torch.cuda.set_per_process_memory_fraction(min(1.0, float(spec.gpu_fraction)), self.device)
        self.store = PartitionStore.open(spec.partition_path)
        self.meta = self.store.meta
        self.algorithm = build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
        self._model_factory = lambda: model_for_meta(cfg.model.name, self.meta, **cfg.model.params)
        self.model = self._model_factory()
        self.flat = FlatParams(self.model, self.device)
        self.augment = Augment.from_spec(cfg.train.augment) if cfg.train.augment else None
        self.states = ClientStateStore(spec.state_path) if spec.state_path else None
        self.faults = dict(cfg.engine.fault_injection or {})
        self.run_dir = Path(spec.run_dir)

    def ping(self) -> str:
        return self.name

    def pid(self) -> int:
        return os.getpid()

    def memory(self) -> dict:
        """This process's resident memory now and at peak (VmHWM), in MB (NaN where /proc is missing)."""
        from fedray.core.procinfo import proc_memory_mb

        rss, peak = proc_memory_mb(os.getpid())
        return {"rss_mb": rss, "peak_mb": peak}

    # ---------------------------------------------------------------------------------------
    def run_clients(self, rnd: int, weights, payload: dict, chunk: list[tuple[int, int]]) -> list[ClientOutcome]:
        """Train each (position, client id) of ``chunk`` from ``weights``; one outcome per client."""
        from fedray.algorithms.base import ClientContext

        if int(getattr(self.cfg.engine, "multi_client", 1)) > 1:  # groups of clients at once
            from fedray.engine.multiclient import run_clients_grouped

            return run_clients_grouped(self, rnd, weights, payload, chunk)
        weights = np.asarray(weights)
        out = []
        for pos, cid in chunk:
            t0 = time.perf_counter()
            try:
                self._maybe_fault(rnd, cid)
                images, labels = self.store.client_arrays(cid)
                self.flat.load(weights)
                state = self.states.load(cid, rnd) if (self.states is not None and self.algorithm.stateful_clients) else None
                ctx = ClientContext(
                    cid=cid,
                    rnd=rnd,
                    seed=int(self.cfg.seed),
                    model=self.model,
                    flat=self.flat,
                    global_weights=weights,
                    images=images,
                    labels=labels,
                    meta=self.meta,
                    train=self.cfg.train,
                    device=self.device,
                    normalize=bool(self.cfg.data.normalize),
                    augment=self.augment,
                    state=state,
                    num_classes=self.meta.num_classes,
                    model_factory=self._model_factory,
                    prox_mu=float(payload.get("prox_mu") or 0.0),  # FedACG's client proximal term, any algorithm
                )
                upd = self.algorithm.local_update(ctx, payload)
                if upd.state is not None and self.states is not None:
                    self.states.save(cid, rnd, upd.state)
                out.append(
                    ClientOutcome(
                        cid=cid,
                        pos=pos,
                        weights=upd.weights,
                        num_samples=int(upd.num_samples),
                        loss=float(upd.loss),
                        seconds=time.perf_counter() - t0,
                        worker=self.name,
                        extras=upd.extras,
                        metrics=upd.metrics,
                    )
                )
            except Exception as e:  # noqa: BLE001 - reported per client, the coordinator decides
                out.append(
                    ClientOutcome(
                        cid=cid,
                        pos=pos,
                        weights=None,
                        num_samples=0,
                        loss=float("nan"),
                        seconds=time.perf_counter() - t0,
                        worker=self.name,
                        error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}",
                    )
                )
        return out

    # ---------------------------------------------------------------------------------------
    def _maybe_fault(self, rnd: int, cid: int) -> None:
        """Testing aid (``engine.fault_injection``): fail deterministically at (round, client).

        ``{kind: exit|raise, round: R, client: C, times: T}``: the first T times client C of round R
        is started anywhere, the worker process exits (``exit``, like a crash or an OOM kill) or the
        client raises (``raise``). A counter file in the run directory makes it exactly T times
        across worker replacements and retries."""
        f = self.faults
        if not f or int(f.get("round", -1)) != rnd or int(f.get("client", -1)) != cid:
            return
        times = int(f.get("times", 1))
        marker = self.run_dir / "faults" / f"r{rnd}-c{cid}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL files make the count exact under concurrency
        for i in range(times):
            try:
                fd = os.open(f"{marker}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            if f.get("kind", "exit") == "exit":
                os._exit(17)
            raise RuntimeError(f"injected fault in round {rnd}, client {cid}")
