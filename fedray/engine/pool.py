"""Worker pools: the same interface over Ray actors and over in-process workers.

The round programs only talk to a pool: ``put`` an object once per round, ``submit(i, method, ...)``
a call of a :class:`~fedray.engine.worker.ClientWorker` method to worker ``i`` (one of ``slots``, the
live workers), ``wait`` for finished tasks, read a ``result`` (raising :class:`WorkerLost` when the worker
process died), ``replace`` a dead worker, ``cancel`` unfinished tasks, ``call_all`` a method on every
live worker.

**Shrink and grow (Ray).** ``replace(i)`` retires slot ``i`` for good and starts a replacement actor in a
new slot without waiting for it: the round goes on with the workers left (a lost node with no spare
capacity shrinks the pool). ``poll()`` adds replacements whose start-up call returned to ``slots`` (a
replacement that died before it was ready is started again when the scheduler allows it); ``wait`` also
wakes up when a replacement becomes ready. ``await_worker`` blocks only when no worker is left, until a
replacement is ready or none can come (no alive node can host one, or Ray could not place the one starting
by its start deadline).

**Start deadline** (``engine.start_timeout_s``). An actor answers nothing until its constructor returns (its
process imports torch), so a stopped or deadlocked start-up cannot be told from a slow one by a heartbeat: a
worker that has not answered this long after it was started is looked up in Ray's actor table
(:func:`start_silence`). One Ray started (it has a process) is handled like a hung worker: killed and replaced in
a new slot. One Ray could not place (no process: no node has its resources) fails the pool's start naming the
resources; a replacement Ray cannot place waits in the background for a node with room, as before, and fails the
run only when no worker is left.
The in-process pool replaces a worker in place (``replace`` returns True: the slot is usable again).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any

from fedray.config import EngineConfig
from fedray.core.errors import ConfigError
from fedray.engine.outcomes import WorkerLost
from fedray.engine.spec import WorkerSpec
from fedray.engine.worker import ClientWorker

__all__ = ["LocalPool", "PoolBase", "RayPool", "WorkerLost", "WorkerSetupFailed", "default_num_workers",
           "start_silence"]


class WorkerSetupFailed(RuntimeError):
    """A replacement worker's constructor raised an error of the run's data or configuration (its last line names
    it): every replacement would raise it again, so the run stops with it instead of restarting workers."""


#: errors a worker's set-up (``ClientWorker.__init__`` / ``setup``) raises the same way in every process: the
#: partition on disk damaged or changed (``DataError``) or the run's configuration (``ConfigError``)
_SETUP_ERRORS = ("DataError", "ConfigError")


def _setup_error(err: BaseException) -> str | None:
    """The ``Name: message`` line of the exception a worker's constructor raised, when Ray reports that the actor
    died in its creation task with one of :data:`_SETUP_ERRORS`; None for any other death (a crash, a kill)."""
    if not getattr(err, "actor_init_failed", False):
        return None
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    name = last.split(":", 1)[0].rsplit(".", 1)[-1]
    return last if name in _SETUP_ERRORS else None


def start_silence(ray, actor, timeout: float) -> tuple[bool, str]:
    """Why ``actor`` has not answered ``timeout`` s after it was started, from Ray's actor table (the GCS; no
    dashboard needed): (started, reason). ``started``: Ray placed it and its process runs (it has a pid), so it is
    stopped, deadlocked or slower than the deadline; else Ray has not placed it (no node has its resources free,
    or its process never registered), or the table could not be read."""
    head = f"did not answer within {timeout:g} s of its start (engine.start_timeout_s)"
    try:
        from ray._private import state

        info = state.actors(actor._actor_id.hex()) or {}
    except Exception as e:  # noqa: BLE001 - the lookup is for the message; not knowing is said
        return False, f"{head}; Ray's actor table could not be read ({type(e).__name__}: {e})"
    pid, node = int(info.get("Pid") or 0), (info.get("Address") or {}).get("NodeID") or ""
    if pid:
        return True, (f"{head}: Ray started it (pid {pid} on node {node[:12]}) but it did not answer: stopped, "
                      f"deadlocked or slower than the deadline")
    try:
        available = ray.available_resources()
    except Exception:  # noqa: BLE001
        available = "?"
    return False, (f"{head}: Ray has not placed it (actor state {info.get('State', '?')}, no process): no node has "
                   f"its resources free; available: {available}")


@dataclass(eq=False)
class _LocalHandle:
    widx: int
    value: object = None
    error: BaseException | None = None


class PoolBase:
    """What the scheduler needs of a pool beyond submit/wait/result, for a pool that replaces a lost worker
    in place (its slots are ``0 .. size-1`` for good): :class:`LocalPool`, the unit tests' fake pools."""

    size: int
    pipeline_depth = 1  # tasks a worker holds at once (in-process tasks run at submit time: nothing to queue)
    heartbeat_interval: float | None = None  # in-process workers cannot hang apart from the coordinator

    def check_heartbeats(self, busy) -> None:
        """Kill the workers of ``busy`` (slots holding tasks) found hung (none here)."""

    @property
    def slots(self) -> list[int]:
        return list(range(self.size))

    def name(self, widx: int) -> str:
        return f"w{widx}"

    def poll(self, respawn: bool = True) -> None:
        """Take in replacements that are ready (none here: replacement is in place)."""

    def await_worker(self, respawn: bool = True, timeout: float | None = None) -> bool:
        """No worker is live: wait for one; False when none can come."""
        return bool(self.slots)

    def lost_summary(self) -> str:
        return "no worker in the pool"


class LocalPool(PoolBase):
    """In-process workers (no Ray): tasks run synchronously at submit time. For debugging and tests."""

    kind = "local"

    def __init__(self, spec: WorkerSpec, num_workers: int):
        self.spec = spec
        self.workers = [self._worker(f"w{i}") for i in range(num_workers)]
        self.restarts = 0

    def _worker(self, name: str) -> ClientWorker:
        w = ClientWorker(self.spec, name)
        w.in_process = True
        return w

    @property
    def size(self) -> int:  # type: ignore[override]  # PoolBase's fakes set it; this pool counts its workers
        return len(self.workers)

    def name(self, widx: int) -> str:
        return self.workers[widx].name

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

    def replace(self, widx: int) -> bool:
        """A new in-process worker in slot ``widx``, at once: True (the slot is usable again)."""
        self.workers[widx] = self._worker(f"w{widx}.{self.restarts + 1}")
        self.restarts += 1
        return True

    def workers_info(self) -> list[dict]:
        return [{"name": w.name, "node": None, "state": "live"} for w in self.workers]

    def cancel(self, handles: list) -> None:
        return None

    def call_all(self, method: str, timeout: float | None = None, skip_lost: bool = False) -> list:
        return [getattr(w, method)() for w in self.workers]

    def shutdown(self) -> None:
        self.workers = []


class RayPool:
    """A pool of ``ClientWorker`` actors with fractional CPU/GPU resources that shrinks when workers are lost
    and grows back as their replacements start (module docstring). Slots are never reused: a retired slot
    stays retired, a replacement gets a new slot."""

    kind = "ray"
    #: tasks the scheduler keeps queued on one actor: the next starts as the last ends, not after its result's
    #: round trip through the coordinator (fedray.engine.dispatch, "Pipelining")
    pipeline_depth = 2

    def __init__(self, spec: WorkerSpec, num_workers: int, num_cpus: float, num_gpus: float, actors: list | None = None,
                 heartbeat_s: float | None = None, start_timeout_s: float = EngineConfig.start_timeout_s):
        """``actors``: workers already started with :meth:`start` (the driver starts them while the
        coordinator actor starts, so the two start-ups overlap); the pool waits for them and owns them
        from here on (replacements are started by the pool). ``heartbeat_s``: see :meth:`check_heartbeats`;
        ``start_timeout_s``: the start deadline (module docstring)."""
        import ray

        self.ray = ray
        self.heartbeat_s = heartbeat_s
        self.start_timeout_s = float(start_timeout_s)
        self.heartbeat_interval = None if heartbeat_s is None else max(0.05, min(1.0, heartbeat_s / 4))
        self._pings: dict[int, tuple[Any, float]] = {}  # slot -> (its unanswered heartbeat, when it was sent)
        self._answered: dict[int, float] = {}  # slot -> when its last heartbeat was answered
        self.hung: dict[int, str] = {}  # slot -> why it was killed as hung
        self._slot_of: dict = {}  # task ref -> slot (a killed hung worker's tasks fail naming why)
        self.spec = spec
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.actor_cls = self._actor_cls(num_cpus, num_gpus)
        self.restarts = 0
        if actors is not None and len(actors) != num_workers:
            raise ValueError(f"RayPool: {len(actors)} pre-started workers given for num_workers={num_workers}")
        self.workers = list(actors) if actors is not None else self.start(spec, num_workers, num_cpus, num_gpus)
        self.names = [f"w{i}" for i in range(num_workers)]
        self.nodes: list[str | None] = [None] * num_workers  # the Ray node of each slot
        self.live = [False] * num_workers  # False: retired, or a worker still starting
        self.lost: list[str] = []  # "<name> (node <id>)" of every worker lost, for error messages
        self._pending: dict = {}  # node_id() ref of a starting replacement -> its slot
        self._due: dict[int, float] = {}  # slot of a starting replacement -> when its start deadline passes
        self._respawn: list[int] = []  # slots whose replacement died before it was ready
        self.unplaced: str | None = None  # a replacement Ray could not place by its start deadline, and why
        self._ready(self.workers)

    @staticmethod
    def _actor_cls(num_cpus: float, num_gpus: float):
        return _ray_worker_class().options(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)

    @classmethod
    def start(cls, spec: WorkerSpec | None, num_workers: int, num_cpus: float, num_gpus: float) -> list:
        """Start ``num_workers`` ClientWorker actors without waiting for them (handles to pass as ``actors``)."""
        actor_cls = cls._actor_cls(num_cpus, num_gpus)
        return [actor_cls.remote(spec, f"w{i}") for i in range(num_workers)]

    def _ready(self, actors) -> None:
        """Wait for the pool's first workers, at most ``start_timeout_s``: the ones that answered are live; one Ray
        started that did not answer is handled like a hung worker (killed, replaced in a new slot: the pool starts
        smaller and grows back); one Ray could not place fails the start. A worker that died starting raises Ray's
        error, which the driver takes for a coordinator lost while starting."""
        refs = [a.node_id.remote() for a in actors]
        self.ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        done = set(self.ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        silent: list[tuple[int, str]] = []
        unplaced: list[str] = []
        for slot, ref in enumerate(refs):
            if ref not in done:
                started, why = start_silence(self.ray, actors[slot], self.start_timeout_s)
                if started:
                    silent.append((slot, why))
                else:
                    unplaced.append(f"{self.names[slot]} {why}")
        if unplaced:
            raise RuntimeError(f"{len(unplaced)} of {len(refs)} client workers did not start (num_cpus="
                               f"{self.num_cpus:g}, num_gpus={self.num_gpus:g} per worker): {'; '.join(unplaced)}")
        for slot, ref in enumerate(refs):
            if ref in done:
                self.nodes[slot], self.live[slot] = self.ray.get(ref), True
        for slot, why in silent:  # as a hung worker: killed, replaced in a new slot
            self.hung[slot] = f"worker hung while starting: {self.names[slot]} {why}; killed"
            self.replace(slot)

    @property
    def slots(self) -> list[int]:
        """The live workers' slots (the scheduler submits to these only)."""
        return [i for i, ok in enumerate(self.live) if ok]

    @property
    def size(self) -> int:
        return len(self.slots)

    def name(self, widx: int) -> str:
        return self.names[widx]

    def put(self, obj):
        return self.ray.put(obj)

    def submit(self, widx: int, method: str, *args):
        """Call ``ClientWorker.<method>(*args)`` on actor ``widx``; returns the result's object ref."""
        if not self.live[widx]:
            raise RuntimeError(f"RayPool: slot {widx} ({self.names[widx]}) is not a live worker")
        ref = getattr(self.workers[widx], method).remote(*args)
        self._slot_of[ref] = widx
        return ref

    def wait(self, handles: list, timeout: float | None = None) -> list:
        """The finished ones of ``handles`` (blocks until one is, or a replacement becomes ready: then [])."""
        if not handles:
            return []
        ready, _ = self.ray.wait(handles + list(self._pending), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(handles, num_returns=len(handles), timeout=0)
        return ready

    def result(self, ref):
        from ray import exceptions as rex

        slot = self._slot_of.pop(ref, None)
        try:
            return self.ray.get(ref)
        except (rex.RayActorError, rex.WorkerCrashedError, rex.OutOfMemoryError, rex.ObjectLostError) as e:
            if slot in self.hung:
                raise WorkerLost(self.hung[slot]) from e
            raise WorkerLost(str(e).splitlines()[0] if str(e) else type(e).__name__) from e
        except rex.RayTaskError as e:  # an exception escaped run_clients itself (not a client)
            raise WorkerLost(f"worker task failed: {str(e).splitlines()[0]}") from e

    def check_heartbeats(self, busy) -> None:
        """Heartbeats of the workers holding tasks (``busy`` slots): each gets a ``ping`` (served on its own
        thread, so a worker deep in a client's training answers within milliseconds) every
        :attr:`heartbeat_interval`; one left unanswered for ``heartbeat_s`` marks its worker hung (stopped,
        deadlocked, swapped out, its node unreachable): the actor is killed, so its tasks fail as a lost
        worker's and the scheduler replaces it and re-runs its clients with the same seeds."""
        timeout, interval = self.heartbeat_s, self.heartbeat_interval
        if timeout is None or interval is None:
            return
        now = time.monotonic()
        if self._pings:
            done, _ = self.ray.wait([ref for ref, _ in self._pings.values()], num_returns=len(self._pings), timeout=0)
            done_set = set(done)
            for slot, (ref, _) in list(self._pings.items()):
                if ref in done_set:
                    del self._pings[slot]
                    self._answered[slot] = now
        for slot in busy:
            if not self.live[slot] or slot in self.hung:
                continue
            if slot in self._pings:
                if now - self._pings[slot][1] >= timeout:
                    self._hang(slot)
            elif now - self._answered.get(slot, 0.0) >= interval:
                self._pings[slot] = (self.workers[slot].ping.remote(), now)

    def _hang(self, slot: int) -> None:
        node = self.nodes[slot]
        self.hung[slot] = (f"worker hung: {self.names[slot]} (node {node[:12] if node else '?'}) left a heartbeat "
                           f"unanswered for {self.heartbeat_s:g} s (engine.heartbeat_s); killed")
        self._pings.pop(slot, None)
        self._kill(self.workers[slot])

    # ------------------------------------------------------------------------------ shrink and grow
    def replace(self, widx: int) -> bool:
        """Worker ``widx`` died: retire its slot, start a replacement in a new slot (not waited for). False:
        the slot is not usable again."""
        self._kill(self.workers[widx])
        self.live[widx] = False
        self._pings.pop(widx, None)
        node = self.nodes[widx]
        self.lost.append(f"{self.names[widx]} (node {node[:12] if node else '?'}{', hung' if widx in self.hung else ''})")
        self._spawn(widx)
        return False

    def _spawn(self, widx: int) -> None:
        """Start a replacement for slot ``widx``'s worker in a new slot, named after its lineage (w0.1, w0.3)."""
        self.restarts += 1
        name = f"{self.names[widx].split('.')[0]}.{self.restarts}"
        actor = self.actor_cls.remote(self.spec, name)
        self.workers.append(actor)
        self.names.append(name)
        self.nodes.append(None)
        self.live.append(False)
        self._pending[actor.node_id.remote()] = len(self.workers) - 1
        self._due[len(self.workers) - 1] = time.monotonic() + self.start_timeout_s

    def poll(self, respawn: bool = True) -> None:
        """Take in the replacements that are ready now; one that died before it was ready is started again
        when ``respawn`` (the scheduler's restart budget allows), else later."""
        from ray import exceptions as rex

        if self._pending:
            done, _ = self.ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
            for ref in done:
                slot = self._pending.pop(ref)
                self._due.pop(slot, None)
                try:
                    self.nodes[slot] = self.ray.get(ref)
                    self.live[slot] = True
                except (rex.RayActorError, rex.RayTaskError, rex.WorkerCrashedError) as e:
                    raised = _setup_error(e)
                    if raised is not None:  # the same spec raises the same in every replacement: stop here
                        raise WorkerSetupFailed(f"a replacement client worker ({self.names[slot]}) could not set up the "
                                                f"run, and none could: {raised}")
                    self.lost.append(f"{self.names[slot]} (died starting: {str(e).splitlines()[0][:120]})")
                    self._respawn.append(slot)
        self._check_starts()
        while respawn and self._respawn:
            self._spawn(self._respawn.pop(0))

    def _check_starts(self) -> None:
        """Replacements past their start deadline (``start_timeout_s``): one Ray started but that did not answer
        is killed and started again as one that died starting (when the scheduler's restart budget allows); one
        Ray could not place keeps waiting for a node with room, looked up again a deadline later."""
        now = time.monotonic()
        for ref, slot in list(self._pending.items()):
            if now < self._due.get(slot, now + 1.0):
                continue
            started, why = start_silence(self.ray, self.workers[slot], self.start_timeout_s)
            if not started:
                self._due[slot] = now + self.start_timeout_s
                self.unplaced = f"{self.names[slot]} {why}"
                continue
            del self._pending[ref]
            self._due.pop(slot, None)
            self._kill(self.workers[slot])
            self.lost.append(f"{self.names[slot]} (hung while starting: {why}; killed)")
            self._respawn.append(slot)

    def await_worker(self, respawn: bool = True, timeout: float | None = None) -> bool:
        """No worker is left: block until a replacement is ready (True), or none can come (False): nothing is
        starting, no alive node has the resources of a worker, Ray could not place the one starting by its start
        deadline, or ``timeout`` passed. A replacement Ray started that does not answer by its deadline is started
        again (:meth:`poll`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.unplaced = None
        while True:
            self.poll(respawn)
            if self.slots:
                return True
            if not self._pending or not self._capacity() or self.unplaced is not None or \
                    (deadline is not None and time.monotonic() >= deadline):
                return False
            left = 1.0 if deadline is None else deadline - time.monotonic()
            self.ray.wait(list(self._pending), num_returns=1, timeout=max(0.0, min(1.0, left)))

    def _capacity(self) -> bool:
        """Whether an alive node has the CPUs and GPUs of one worker (in total, free or not)."""
        for n in self.ray.nodes():
            res = n.get("Resources", {})
            if n.get("Alive") and res.get("CPU", 0.0) >= self.num_cpus and res.get("GPU", 0.0) >= self.num_gpus:
                return True
        return False

    def lost_summary(self) -> str:
        """Why no worker is left, for the run's error."""
        lost = ", ".join(self.lost) or "none"
        res = f"num_cpus={self.num_cpus:g}, num_gpus={self.num_gpus:g} per worker"
        if self.unplaced is not None:
            return f"workers lost: {lost}; the replacement {self.unplaced} ({res})"
        if self._pending and self._capacity():
            return f"workers lost: {lost}; no replacement was ready in time ({res})"
        return f"workers lost: {lost}; no alive Ray node can host a replacement ({res})"

    def workers_info(self) -> list[dict]:
        """Every slot's worker: name, node, and state (live, starting or retired)."""
        starting = set(self._pending.values())
        return [{"name": self.names[i], "node": self.nodes[i],
                 "state": "live" if self.live[i] else ("starting" if i in starting else "retired")}
                for i in range(len(self.workers))]

    # ------------------------------------------------------------------------------
    def cancel(self, handles: list) -> None:
        for h in handles:
            try:
                self.ray.cancel(h)
            except Exception:  # noqa: BLE001
                pass

    def call_all(self, method: str, timeout: float | None = None, skip_lost: bool = False) -> list:
        """``ClientWorker.<method>()`` on every live worker, in slot order. ``skip_lost``: the answers of the
        workers that gave one within ``timeout``, a worker that died or did not answer left out (the rounds find
        and replace it) instead of raising."""
        refs = [getattr(self.workers[i], method).remote() for i in self.slots]
        if not skip_lost:
            return self.ray.get(refs, timeout=timeout)
        done = set(self.ray.wait(refs, num_returns=len(refs), timeout=timeout)[0])
        out = []
        for ref in refs:
            try:
                if ref in done:
                    out.append(self.ray.get(ref))
            except Exception:  # noqa: BLE001 - a worker lost here is the rounds' to replace
                continue
        return out

    def _kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass

    def shutdown(self) -> None:
        for w in self.workers:  # retired ones too: a kill of a dead actor is a no-op
            self._kill(w)
        self.workers, self.live, self._pending, self._respawn = [], [], {}, []


@functools.lru_cache(maxsize=None)
def _ray_worker_class():
    """``ClientWorker`` as a Ray actor class, with ``ping`` in a concurrency group of its own (one thread): the
    heartbeat of :meth:`RayPool.check_heartbeats`; the work stays on the default group's single thread, one task
    at a time (not always in submission order: see docs/engine.md, "A worker hangs")."""
    import ray

    class RayClientWorker(ClientWorker):
        @ray.method(concurrency_group="heartbeat")
        def ping(self) -> bool:
            return True

    return ray.remote(concurrency_groups={"heartbeat": 1})(RayClientWorker)


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

