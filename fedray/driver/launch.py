"""Starting a run's Ray side early, while the driver imports fedray and loads the data.

Most of a cold ``fedray run``'s start-up is processes starting: Ray's own (GCS, raylet, agents) and then
one Python process per actor (the coordinator and every client worker), each importing torch and fedray.
None of that needs the run's data. :class:`EarlyStart` therefore joins or starts Ray in a background
thread as soon as the config is known and starts the actors right away, without their arguments: a
:class:`~fedray.engine.worker.ClientWorker` with no spec and a :class:`~fedray.engine.host.CoordinatorHost`. Once the data and
the run directory are ready the driver hands them their arguments (``setup``), in the order every actor
receives calls from one caller, so nothing they compute changes.

The driver of a Ray run imports no torch (1.7 CPU-seconds on the same two cores the actors start on): the
actor classes' modules leave it to the actors' construction, and the checks that need the registries are the
coordinator host's first call (:meth:`EarlyStart.check`).
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any

from fedray.core.errors import ConfigError
from fedray.core.ray_env import current_node_id, ensure_ray
from fedray.core.signals import install_driver_handlers
from fedray.engine.host import ray_coordinator_class

__all__ = ["ActorSilent", "Actors", "EarlyStart", "await_call", "coordinator_options", "early_start", "kill_actors",
           "start_actors"]


def _no_sigterm_warning(record) -> bool:
    """Ray warns that it set no SIGTERM handler when started from a thread; :class:`EarlyStart` sets it."""
    return "SIGTERM handler is not set" not in record.getMessage()


def coordinator_options(cfg, ray) -> dict:
    """Ray options of the coordinator actor: its CPUs and, with ``engine.coordinator_placement: driver``, a
    hard affinity to the driver's node (a 0-CPU actor would otherwise land on any node, and its node's death
    ends the run)."""
    e = cfg.engine
    opts = {"num_cpus": e.coordinator_num_cpus, "max_restarts": 0, "max_concurrency": 1}
    if e.coordinator_placement == "driver":
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = current_node_id()
        cpus = next((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["NodeID"] == node), None)
        if cpus is not None and e.coordinator_num_cpus > cpus:
            raise ConfigError(f"engine.coordinator_placement: driver, but the driver's node has {cpus:g} CPUs for "
                              f"engine.coordinator_num_cpus={e.coordinator_num_cpus:g}; use coordinator_placement: any")
        assert node is not None  # this process joined Ray (start_actors runs after ensure_ray)
        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    return opts


@dataclass
class Actors:
    """A run's actors, started without their arguments."""

    workers: list
    coord: Any  # the CoordinatorHost actor's handle
    num_workers: int
    worker_cpus: float
    worker_gpus: float

    def kill(self, ray) -> None:
        kill_actors(ray, [self.coord, *self.workers])


def kill_actors(ray, actors: list) -> None:
    """``ray.kill`` each actor for good; one already dead is skipped."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass


class ActorSilent(RuntimeError):
    """An actor left a call and its heartbeat unanswered (:func:`await_call`): hung after it first answered
    (``starting`` False), or not up by its start deadline (``starting`` True). The message says why."""

    def __init__(self, message: str, starting: bool):
        super().__init__(message)
        self.starting = starting


def await_call(ray, actor, ref, *, heartbeat_s: float | None, start_timeout_s: float, answered: bool = False) -> bool:
    """Wait for ``ref``, a call of ``actor``, while the actor answers its heartbeat (``ping``, on a thread of its
    own); whether the actor has answered (a ping now, or an earlier call: ``answered``). Until it first answers, it
    is starting (its process, torch's import, its constructor: it can answer nothing before the constructor
    returns), for at most ``engine.start_timeout_s``; then the reason says whether Ray started it or could not
    place it (:func:`fedray.engine.pool.start_silence`). Once it answered, a ping left unanswered for
    ``engine.heartbeat_s`` is a hang (None: not watched). Either raises :class:`ActorSilent`; the caller kills the
    actor."""
    if heartbeat_s is None and answered:
        return True
    interval = max(0.05, min(1.0, min(heartbeat_s or start_timeout_s, start_timeout_s) / 4))
    ping, sent = None, 0.0
    while not ray.wait([ref], timeout=interval)[0]:
        now = time.monotonic()
        if ping is not None and ray.wait([ping], timeout=0)[0]:
            ping, answered = None, True
            if heartbeat_s is None:
                return True
        if ping is None:
            ping, sent = actor.ping.remote(), now
        elif answered and heartbeat_s is not None and now - sent >= heartbeat_s:
            raise ActorSilent(f"its heartbeat went unanswered for {heartbeat_s:g} s (engine.heartbeat_s)", False)
        elif not answered and now - sent >= start_timeout_s:
            from fedray.engine.pool import start_silence

            raise ActorSilent(start_silence(ray, actor, start_timeout_s)[1], True)
    return answered


def start_actors(cfg) -> Actors:
    """Start the client workers and the coordinator host of ``cfg`` on the Ray this process joined, without
    waiting for them."""
    import ray

    from fedray.engine.pool import RayPool, default_num_workers

    n, wcpu, wgpu = default_num_workers(cfg, int(cfg.train.clients_per_round))
    workers = RayPool.start(None, n, wcpu, wgpu)  # the client workers start while the coordinator host does
    coord = ray_coordinator_class(ray).options(**coordinator_options(cfg, ray)).remote()
    return Actors(workers, coord, n, wcpu, wgpu)


class EarlyStart:
    """Join or start Ray and start the run's actors in a background thread (``engine.backend: ray``);
    :meth:`result` waits for it and raises what it raised. ``address`` / ``warm``: which cluster, as
    :func:`~fedray.core.ray_env.ensure_ray` decides."""

    def __init__(self, cfg, *, address: str | None = None, warm: bool = False, log=print, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0  # the run's start-up counts from here
        self.cfg, self.address, self.warm, self.log = cfg, address, warm, log
        self.actors: Actors | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.ray_seconds: float | None = None  # when Ray was up (joined or started), from t0
        self._exit = threading.Event()  # the process exits: shut down the Ray this thread started
        self._ray_down = threading.Event()
        install_driver_handlers()  # what ray.init does from the main thread only, and never mid-import
        self.thread = threading.Thread(target=self._run, name="fedray-early-start", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import logging

        logging.getLogger("ray._private.worker").addFilter(_no_sigterm_warning)  # once: the same filter object
        try:
            from fedray.plugins import plugin_py_modules

            e = self.cfg.engine
            started = ensure_ray(e.object_store_memory, address=self.address, warm=self.warm, log=self.log,
                                 py_modules=plugin_py_modules(self.cfg))
            self.ray_seconds = time.perf_counter() - self.t0
            self.actors = start_actors(self.cfg)
        except BaseException as err:  # noqa: BLE001 - re-raised by result() in the main thread
            self.error = err
            return
        finally:
            self.done.set()
        if started:
            self._hold_ray()
        else:
            _leave_at_exit()

    def _hold_ray(self) -> None:
        """Keep this thread alive as long as the local Ray it started (its processes die with the thread that
        started them: PR_SET_PDEATHSIG), and shut that Ray down from here when the process exits: from any
        other thread ``ray.shutdown`` waits about 10 s for the raylet (measured with Ray 2.60; 1.4 s from
        this one), which every cold run paid after its results were written."""
        import atexit

        import ray

        atexit.register(self._shutdown_ray)  # runs before Ray's own atexit shutdown (registered at import)
        while ray.is_initialized() and not self._exit.wait(0.5):
            pass
        try:
            if self._exit.is_set() and ray.is_initialized():
                ray.shutdown()
        finally:
            self._ray_down.set()

    def _shutdown_ray(self) -> None:
        self._exit.set()
        self._ray_down.wait(timeout=60)

    def result(self) -> Actors:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.actors is not None  # the thread set them, or an error
        return self.actors

    def check(self, cfg, meta) -> None:
        """The config's checks that need the registries (:func:`fedray.plugins.check_run`), made by the
        coordinator actor as its first call, so that the driver does not import torch for them. Its
        ConfigError is raised here as one. A coordinator actor that dies first (killed, OOM), or does not answer
        by its start deadline (``engine.start_timeout_s``: stopped, deadlocked, or Ray could not place it), or hangs
        after it answered (``engine.heartbeat_s``), is started again with new workers, within
        ``engine.max_coordinator_restarts``, as one that dies in a round; past that the run stops
        (:class:`~fedray.engine.dispatch.RunAborted`)."""
        actors = self.result()
        import ray
        from ray import exceptions as rex

        eng = cfg.engine
        limit = int(eng.max_coordinator_restarts)
        for attempt in range(limit + 1):
            try:  # the first call of a new actor: as long as its start may take (torch's import), not for ever
                ref = actors.coord.check.remote(cfg, meta)
                await_call(ray, actors.coord, ref, heartbeat_s=eng.heartbeat_s,
                           start_timeout_s=eng.start_timeout_s)
                ray.get(ref)
                return
            except ActorSilent as silent:  # stopped, deadlocked or never placed while it started: as if it died
                reason = f"it {silent}; killed" if silent.starting else f"it hung: {silent}; killed"
                err: Exception = silent
            except rex.RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, ConfigError):
                    from fedray.plugins import driver_only_hint

                    raise ConfigError(f"{cause}{driver_only_hint(cfg)}") from None
                raise
            except rex.RayActorError as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                err = e
            if attempt == limit:
                from fedray.engine.dispatch import RunAborted

                raise RunAborted(f"the coordinator died while starting, {attempt + 1} time(s) (engine."
                                 f"max_coordinator_restarts={limit}): {reason}") from err
            self.log(f"[fedray] coordinator lost while starting ({reason}); starting the run's actors again "
                     f"({attempt + 1}/{limit})")
            actors.kill(ray)
            self.actors = actors = start_actors(self.cfg)

    def abort(self) -> None:
        """The run stopped before it used the actors: kill them (they hold CPUs on a shared cluster). A start still
        under way after ``engine.start_timeout_s`` is left to end with the process (its thread is a daemon)."""
        if not self.done.wait(timeout=float(self.cfg.engine.start_timeout_s)):
            self.log(f"[fedray] Ray's start did not end within engine.start_timeout_s="
                     f"{self.cfg.engine.start_timeout_s:g} s; leaving it")
            return
        if self.actors is not None:
            import ray

            self.actors.kill(ray)
            self.actors = None


@functools.cache
def _leave_at_exit() -> None:
    """Once per process: at exit, leave the Ray cluster this process joined with ``ray.shutdown()`` before Ray's
    own atexit call does, which first sleeps 0.5 s for late log lines (a warm run waited for it)."""
    import atexit

    import ray

    atexit.register(lambda: ray.shutdown() if ray.is_initialized() else None)


def early_start(cfg, resume=None, address: str | None = None, warm: bool = False, log=print,
                t0: float | None = None) -> EarlyStart | None:
    """:class:`EarlyStart` for a ``ray``-backend run of ``cfg`` (or of the run directory ``resume``); None for
    the in-process backend, or when the config cannot be read (``setup_run`` then says why). ``t0``: where the
    run's start-up counts from (a ``time.perf_counter()`` value; default now)."""
    if resume is not None:
        from pathlib import Path

        from fedray.config import load_config

        try:
            cfg = load_config(Path(resume) / "config.yaml")
        except Exception:  # noqa: BLE001 - setup_run reports it
            return None
    if cfg is None or cfg.engine.backend != "ray":
        return None
    if cfg.data.download:  # a missing dataset is fetched before Ray starts: a failed download wastes no Ray start
        from fedray.data.fetch import ensure_data

        ensure_data(cfg, log)
    return EarlyStart(cfg, address=address or cfg.engine.ray_address, warm=warm, log=log, t0=t0)
