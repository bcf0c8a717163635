"""Client workers: one model replica each, many virtual clients in turn.

``ClientWorker`` is a plain class. The Ray backend wraps it as an actor with fractional CPU/GPU
resources; the in-process backend calls it directly. A worker holds one :class:`Replica` and routes each
task to a client runtime chosen for it: :class:`SequentialRuntime` (one client after another),
:class:`GroupedRuntime` (``engine.multi_client > 1``: groups of clients at once) or
:class:`SplitRuntime` (the split program's per-iteration tasks). Failures inside one client are reported
per client; a crash of the whole process is handled by the coordinator's scheduler.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from fedray.core.procinfo import proc_memory_mb
from fedray.core.ray_env import current_node_id
from fedray.engine.faults import FaultInjector
from fedray.engine.outcomes import ClientOutcome, EvalOutcome, GroupOutcome, SplitOutcome
from fedray.engine.spec import WorkerSpec
from fedray.engine.state import ClientStateStore

if TYPE_CHECKING:  # the torch side: imported by the worker when it is constructed (RUNTIME_MODULES), not here
    from fedray.algorithms.context import ClientHints

__all__ = ["ClientOutcome", "ClientWorker", "RUNTIME_MODULES", "WorkerSpec"]

#: The worker's torch side. This module imports none of it, so that a driver can start ``ClientWorker`` actors
#: without importing torch (``fedray run``: tests/test_cli_imports.py); a worker imports it when it is
#: constructed, before its ``setup``. (``fedray up``'s idle workers preload torch and the coordinator, which
#: leaves 20 ms of these to the construction: :data:`fedray.core.ray_up.PRELOAD_MODULES`.)
RUNTIME_MODULES = ("fedray.engine.replica", "fedray.engine.client.sequential", "fedray.engine.client.grouped",
                   "fedray.engine.client.split", "fedray.engine.client.partial", "fedray.engine.evaluation")


class ClientWorker:
    def __init__(self, spec: WorkerSpec | None, name: str = "w0"):
        """``spec=None``: an actor started before the run's data is ready (its process imports torch and
        fedray meanwhile); :meth:`setup` gives it the spec, before any task."""
        for module in RUNTIME_MODULES:  # torch and the runtimes now, while the driver still loads the data
            importlib.import_module(module)
        self.name = name
        self.spec: WorkerSpec | None = None
        # set by LocalPool: this worker lives in the coordinator's process, so a split task hands its activations
        # over as tensors where they are (on a GPU: no copy through host memory) instead of numpy arrays
        self.in_process = False
        self._federated: Any = None  # the client runtimes (torch-side), built at their first task
        self._split: Any = None
        if spec is not None:
            self.setup(spec)

    def setup(self, spec: WorkerSpec) -> str:
        """Build this worker's replica of the run (the model, the partition store, the client state)."""
        from fedray.engine.replica import Replica

        self.spec = spec
        self.replica = Replica.for_worker(spec)
        self.states = ClientStateStore(spec.state_path) if spec.state_path else None
        self.faults = FaultInjector(self.replica.cfg.engine.fault_injection, spec.run_dir)
        return self.name

    def pid(self) -> int:
        return os.getpid()

    def device(self) -> str:
        """What this worker trains on (:func:`~fedray.engine.replica.device_name`)."""
        from fedray.engine.replica import device_name

        return device_name(self.replica.device)

    def node_id(self) -> str | None:
        """The Ray node this worker runs on (None in-process, without Ray); the pool's start-up call."""
        return current_node_id()

    def memory(self) -> dict:
        """This process's resident memory now and at peak (VmHWM), in MB (NaN where /proc is missing)."""
        rss, peak = proc_memory_mb(os.getpid())
        return {"rss_mb": rss, "peak_mb": peak}

    def run_clients(self, rnd: int, weights, payload: dict, chunk: list[tuple[int, int]],
                    hints: ClientHints | None = None) -> list[ClientOutcome]:
        """Train each (position, client id) of ``chunk`` from ``weights``; one outcome per client."""
        from fedray.algorithms.base import ClientHints

        return self._runtime().run(rnd, weights, payload, chunk, hints or ClientHints())

    def run_group(self, rnd: int, weights, payload: dict, items: list[tuple[int, int, float]],
                  hints: ClientHints | None = None) -> GroupOutcome:
        """``engine.fold_group``: train ``items = [(position, client id, a_k)]`` and return their partial sum
        (:mod:`fedray.engine.client.partial`)."""
        from fedray.algorithms.base import ClientHints
        from fedray.engine.client.partial import run_partial_sum

        step = max(1, int(self.replica.cfg.engine.multi_client))
        return run_partial_sum(self._runtime(), rnd, weights, payload, items, hints or ClientHints(), step)

    def _runtime(self):
        if self._federated is None:
            from fedray.engine.client.grouped import GroupedRuntime
            from fedray.engine.client.sequential import SequentialRuntime

            multi = int(self.replica.cfg.engine.multi_client) > 1
            runtime = GroupedRuntime if multi else SequentialRuntime
            self._federated = runtime(self.replica, self.states, self.faults, self.name)
        return self._federated

    def evaluate_shards(self, weights, test: dict, shards: list, analysis: bool = False) -> list[EvalOutcome]:
        """Evaluate ``weights`` on the test shards ``[(shard, start, stop)]`` (:mod:`fedray.engine.evaluation`)."""
        from fedray.engine.evaluation import evaluate_shards

        return evaluate_shards(self.replica, weights, test, shards, analysis, self.name)

    def split_step(self, rnd: int, it: int, init, payload: dict, items: list, grads: dict | None = None,
                   replay: list | None = None) -> list[SplitOutcome]:
        """Task ``it`` of a split round (:meth:`SplitRuntime.step`)."""
        if self._split is None:
            from fedray.engine.client.split import SplitRuntime

            self._split = SplitRuntime(self.replica, self.states, self.faults, self.name, tensors=self.in_process)
        return self._split.step(rnd, it, init, payload, items, grads, replay)
