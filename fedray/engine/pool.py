"""Worker pools: the same interface over Ray actors and over in-process workers.

The round programs only talk to a pool: ``put`` an object once per round, ``submit(i, method, ...)``
a call of a :class:`~fedray.engine.worker.ClientWorker` method to worker ``i``, ``wait`` for finished
tasks, read a ``result`` (raising :class:`WorkerLost` when the worker process died), ``replace`` a dead
worker, ``cancel`` unfinished tasks, ``call_all`` a method on every worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fedray.core.errors import ConfigError
from fedray.engine.outcomes import WorkerLost
from fedray.engine.replica import WorkerSpec
from fedray.engine.worker import ClientWorker

__all__ = ["LocalPool", "RayPool", "WorkerLost", "default_num_workers"]


@dataclass(eq=False)
class _LocalHandle:
    widx: int
    value: object = None
    error: BaseException | None = None


class LocalPool:
    """In-process workers (no Ray): tasks run synchronously at submit time. For debugging and tests."""

    kind = "local"

    def __init__(self, spec: WorkerSpec, num_workers: int):
        self.spec = spec
        self.workers = [ClientWorker(spec, f"w{i}") for i in range(num_workers)]
        self.restarts = 0

    @property
    def size(self) -> int:
        return len(self.workers)

    def put(self, obj):
        return obj

    def submit(self, widx: int, method: str, *args) -> _LocalHandle:
        """Run ``ClientWorker.<method>(*args)`` on worker ``widx`` (now: in-process tasks are synchronous)."""
        h = _LocalHandle(widx)
        try:
            h.value = getattr(self.workers[widx], method)(*args)
        except Exception as e:  # noqa: BLE001
            h.error = e
        return h

    def wait(self, handles: list, timeout: float | None = None) -> list:
        return list(handles)

    def result(self, h: _LocalHandle):
        if h.error is not None:
            raise WorkerLost(f"in-process worker w{h.widx} failed: {h.error!r}") from h.error
        return h.value

    def replace(self, widx: int) -> None:
        self.workers[widx] = ClientWorker(self.spec, f"w{widx}.{self.restarts + 1}")
        self.restarts += 1

    def cancel(self, handles: list) -> None:
        return None

    def call_all(self, method: str, timeout: float | None = None) -> list:
        return [getattr(w, method)() for w in self.workers]

    def shutdown(self) -> None:
        self.workers = []


class RayPool:
    """A fixed pool of ``ClientWorker`` actors with fractional CPU/GPU resources."""

    kind = "ray"

    def __init__(self, spec: WorkerSpec, num_workers: int, num_cpus: float, num_gpus: float, actors: list | None = None):
        """``actors``: workers already started with :meth:`start` (the driver starts them while the
        coordinator actor starts, so the two start-ups overlap); the pool waits for them and owns them
        from here on (replacements are started by the pool)."""
        import ray

        self.ray = ray
        self.spec = spec
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.actor_cls = self._actor_cls(num_cpus, num_gpus)
        self.restarts = 0
        if actors is not None and len(actors) != num_workers:
            raise ValueError(f"RayPool: {len(actors)} pre-started workers given for num_workers={num_workers}")
        self.workers = list(actors) if actors is not None else self.start(spec, num_workers, num_cpus, num_gpus)
        self._ready(self.workers)

    @staticmethod
    def _actor_cls(num_cpus: float, num_gpus: float):
        import ray

        return ray.remote(ClientWorker).options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0,
                                                max_task_retries=0)

    @classmethod
    def start(cls, spec: WorkerSpec, num_workers: int, num_cpus: float, num_gpus: float) -> list:
        """Start ``num_workers`` ClientWorker actors without waiting for them (handles to pass as ``actors``)."""
        actor_cls = cls._actor_cls(num_cpus, num_gpus)
        return [actor_cls.remote(spec, f"w{i}") for i in range(num_workers)]

    def _ready(self, actors, timeout: float = 600.0):
        refs = [a.ping.remote() for a in actors]
        ready, pending = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            raise RuntimeError(
                f"{len(pending)} of {len(refs)} client workers did not start within {timeout:.0f} s: the cluster "
                f"may lack the requested resources (num_cpus={self.num_cpus}, num_gpus={self.num_gpus} per worker); "
                f"available: {self.ray.available_resources()}"
            )
        self.ray.get(ready)

    @property
    def size(self) -> int:
        return len(self.workers)

    def put(self, obj):
        return self.ray.put(obj)

    def submit(self, widx: int, method: str, *args):
        """Call ``ClientWorker.<method>(*args)`` on actor ``widx``; returns the result's object ref."""
        return getattr(self.workers[widx], method).remote(*args)

    def wait(self, handles: list, timeout: float | None = None) -> list:
        if not handles:
            return []
        ready, _ = self.ray.wait(handles, num_returns=1, timeout=timeout)
        if ready:
            more, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0)
            ready = more or ready
        return ready

    def result(self, ref):
        from ray import exceptions as rex

        try:
            return self.ray.get(ref)
        except (rex.RayActorError, rex.WorkerCrashedError, rex.OutOfMemoryError, rex.ObjectLostError) as e:
            raise WorkerLost(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
        except rex.RayTaskError as e:  # an exception escaped run_clients itself (not a client)
            raise WorkerLost(f"worker task failed: {str(e).splitlines()[0]}") from e

    def replace(self, widx: int) -> None:
        old = self.workers[widx]
        try:
            self.ray.kill(old, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
        self.restarts += 1
        new = self.actor_cls.remote(self.spec, f"w{widx}.{self.restarts}")
        self._ready([new])
        self.workers[widx] = new

    def cancel(self, handles: list) -> None:
        for h in handles:
            try:
                self.ray.cancel(h)
            except Exception:  # noqa: BLE001
                pass

    def call_all(self, method: str, timeout: float | None = None) -> list:
        """``ClientWorker.<method>()`` on every worker, in worker order."""
        return self.ray.get([getattr(a, method).remote() for a in self.workers], timeout=timeout)

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                self.ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        self.workers = []


def default_num_workers(cfg, clients_per_round: int) -> tuple[int, float, float]:
    """(workers, cpus per worker, gpus per worker) from the config and the cluster's resources."""
    e = cfg.engine
    gpus_total = 0.0
    cpus_total = 1.0
    if e.backend == "ray":
        import ray

        res = ray.cluster_resources()
        gpus_total = float(res.get("GPU", 0.0))
        cpus_total = float(res.get("CPU", 1.0))
    else:
        try:
            import torch

            gpus_total = float(torch.cuda.device_count()) if e.device != "cpu" else 0.0
        except Exception:  # noqa: BLE001
            gpus_total = 0.0
        cpus_total = float(len(os.sched_getaffinity(0)))
    if e.device == "cpu":
        gpus_total = 0.0
    if e.device == "cuda" and gpus_total <= 0:
        where = "the Ray cluster has" if e.backend == "ray" else "torch sees"
        raise ConfigError(f"engine.device: cuda, but {where} no GPU; use engine.device: auto (a GPU when there is "
                          f"one) or cpu")
    num_gpus = e.worker_num_gpus
    if num_gpus is None:
        num_gpus = (1.0 / e.workers_per_gpu) if gpus_total > 0 else 0.0
    if e.device == "cuda" and not num_gpus:
        raise ConfigError("engine.device: cuda, but engine.worker_num_gpus is 0: the workers would train on the CPU")
    num_cpus = float(e.worker_num_cpus)
    if e.num_workers is not None:
        n = int(e.num_workers)
    elif num_gpus > 0:
        n = int(gpus_total / num_gpus + 1e-9)
    else:
        n = int(cpus_total / max(num_cpus, 1e-9) + 1e-9) if num_cpus > 0 else int(cpus_total)
    n = max(1, min(n, clients_per_round))
    return n, num_cpus, float(num_gpus)

