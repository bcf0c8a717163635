"""One coordinator handle per backend: what the driver calls the coordinator through.

:func:`open_coordinator` gives a :class:`LocalCoordinator` (``engine.backend: local``: the
:class:`~fedray.engine.coordinator.Coordinator` in this process, over in-process workers) or a
:class:`RayCoordinator` (the coordinator in an actor, :class:`~fedray.engine.host.CoordinatorHost`, over
``ClientWorker`` actors). Both have the same methods: ``ready``, ``run_round``, ``finish_in_flight``,
``state_dict``, ``load_state_dict``, ``weights``, ``weights_hash``, ``workers``, ``node_id``, ``pid``,
``restart`` and ``close``; each is built from a :class:`~fedray.engine.spec.CoordinatorSpec`, as a worker is
from a :class:`~fedray.engine.spec.WorkerSpec`. A Ray coordinator that dies raises :class:`CoordinatorLost`;
the round loop then calls ``restart`` and loads the last checkpoint into the new one. This module imports no
torch: the in-process coordinator's module is imported when a local run opens it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from fedray.config import EngineConfig
from fedray.driver.launch import Actors, ActorSilent, await_call, kill_actors, start_actors
from fedray.engine.host import CoordinatorHost
from fedray.engine.outcomes import InStore
from fedray.engine.pool import default_num_workers
from fedray.engine.spec import CoordinatorSpec

if TYPE_CHECKING:
    from fedray.engine.round_report import RoundReport

__all__ = ["CoordinatorLost", "LocalCoordinator", "RayCoordinator", "coordinator_spec", "open_coordinator",
           "test_payload"]


class CoordinatorLost(RuntimeError):
    """The coordinator actor died (its process was killed or exited, or its node was lost)."""


def test_payload(bundle) -> dict:
    """The test split as the coordinator evaluates it: images, labels and (when the data has them) domains."""
    t = bundle.test
    out = {"images": np.ascontiguousarray(t.images()), "labels": np.ascontiguousarray(t.labels)}
    if t.domains is not None:
        out["domains"] = np.ascontiguousarray(t.domains)
    return out


def coordinator_spec(run, test, num_workers: int, worker_cpus: float, worker_gpus: float,
                     workers: list | None = None) -> CoordinatorSpec:
    """The :class:`CoordinatorSpec` of the prepared ``run`` (:class:`fedray.driver.setup.Run`)."""
    cfg_dict = run.cfg.to_dict()
    cfg_dict.pop("source_path", None)
    return CoordinatorSpec(config=cfg_dict, partition_path=str(run.store.path), run_dir=str(run.rd.path), test=test,
                           num_workers=num_workers, worker_cpus=worker_cpus, worker_gpus=worker_gpus,
                           state_path=run.state_path, workers=workers)


def open_coordinator(run):
    """The coordinator of the prepared ``run``, for its backend (module docstring)."""
    return RayCoordinator(run) if run.cfg.engine.backend == "ray" else LocalCoordinator(run)


class LocalCoordinator(CoordinatorHost):
    """The coordinator in this process (``engine.backend: local``): the same object the Ray actor holds
    (:class:`~fedray.engine.host.CoordinatorHost`, whose methods are the coordinator's), built at once; it never
    dies apart from this process."""

    restarts = 0

    def __init__(self, run):
        super().__init__()
        n, wcpu, wgpu = default_num_workers(run.cfg, int(run.cfg.train.clients_per_round))
        self.setup(coordinator_spec(run, test_payload(run.bundle), n, wcpu, wgpu))
        self.in_flight: dict = {}

    def finish_in_flight(self) -> None:
        """Nothing is in flight after an interruption: the round ran in this thread."""
        return None

    def weights(self) -> np.ndarray:
        return self.get_weights()

    def restart(self) -> dict:
        raise RuntimeError("an in-process coordinator is never restarted (it dies with the driver)")

    def close(self) -> None:
        self.shutdown()


class RayCoordinator:
    """The coordinator as a Ray actor over ``ClientWorker`` actors. With ``run.early``, the actors it starts are
    the ones started while the driver loaded the data; a coordinator actor that died is replaced by
    :meth:`restart` (with a new pool: its workers died with it or are killed)."""

    heartbeat_s: float | None = None  # engine.heartbeat_s (None: the coordinator is not watched; :meth:`_await`)
    start_timeout_s = EngineConfig.start_timeout_s  # engine.start_timeout_s: how long a new actor may take to answer (:meth:`_await`)
    _answered = False  # the current actor answered a heartbeat: it is up (its start-up is not a hang)

    def __init__(self, run):
        import ray

        self.ray, self.run = ray, run
        self.heartbeat_s = run.cfg.engine.heartbeat_s
        self.start_timeout_s = run.cfg.engine.start_timeout_s
        self.test = InStore(ray.put(test_payload(run.bundle)))  # once per run: every restart reuses it
        self.in_flight: dict = {}  # the round the actor is running (it goes on after a Ctrl-C)
        self.restarts = 0  # coordinator actors replaced
        self.coord, self.worker_actors, self._setups = None, [], []  # the actors and their setup calls (ready())
        self._start(run.early.result() if run.early is not None else None)

    def _start(self, actors: Actors | None = None) -> None:
        """Give the client workers and a coordinator actor (in the initial state) that owns them their
        arguments, starting them first unless ``actors`` were started early."""
        actors = actors or start_actors(self.run.cfg)
        self.worker_actors, self.coord = actors.workers, actors.coord
        self._answered = False
        spec = coordinator_spec(self.run, self.test, actors.num_workers, actors.worker_cpus, actors.worker_gpus,
                                self.worker_actors)
        self._setups = [self.coord.setup.remote(spec),
                        *[w.setup.remote(spec.worker_spec()) for w in self.worker_actors]]

    def ready(self) -> dict:
        """The coordinator's ``ready`` (workers, parameters) once it and every client worker are set up. An actor
        that dies while they start (its node was lost, or is being lost while Ray still places actors on it)
        raises :class:`CoordinatorLost`: a restart starts them again, within ``engine.max_coordinator_restarts``.
        A client worker the coordinator's pool retired while it started (one that did not answer by
        ``engine.start_timeout_s``: killed and replaced there, :class:`~fedray.engine.pool.RayPool`) is no loss."""
        if self._setups:
            from ray import exceptions as rex

            try:
                self._get(self._setups[0])  # the coordinator's own errors first (it also waits for its workers)
                dead = []
                for i, ref in enumerate(self._setups[1:]):
                    try:
                        self.ray.get(ref)
                    except rex.RayActorError as e:
                        dead.append((f"w{i}", e))  # the pool's name of the i-th early worker
                if dead:
                    retired = {w["name"] for w in self.workers() if w["state"] == "retired"}
                    for name, err in dead:
                        if name not in retired:
                            raise err
            except rex.RayTaskError as e:  # the coordinator's setup found one of its new workers dead
                if not isinstance(getattr(e, "cause", None), rex.RayActorError):
                    raise
                raise CoordinatorLost(f"a client worker died while the coordinator started: {_reason(e)}") from e
            except rex.RayActorError as e:
                raise CoordinatorLost(f"an actor died while starting: {_reason(e)}") from e
            self._setups = []
        return self._get(self.coord.ready.remote())

    def restart(self) -> dict:
        """Replace a dead coordinator actor: kill what is left of it and of its workers (replacement workers
        died with it), start new ones in the initial state; what ``ready`` says."""
        self._kill()
        self.in_flight.clear()
        self.restarts += 1
        self._start()
        return self.ready()

    def _get(self, ref):
        """``ray.get`` of a coordinator call; the actor's death raises :class:`CoordinatorLost`, and so does its
        hanging (:meth:`_await`)."""
        from ray import exceptions as rex

        try:
            self._await(ref)
            out = self.ray.get(ref)
            # a call came back: the actor is up, and from now on a silence longer than heartbeat_s is a hang. Only a
            # ping answered while a call was pending counted before, and calls shorter than the ping interval (1 s)
            # left a coordinator stopped later the start-up's 600 s (found by bench/chaos.py)
            self._answered = True
            return out
        except rex.RayTaskError:  # an error raised inside the coordinator (it is alive): not a lost coordinator
            raise
        except rex.RayActorError as e:  # ActorDiedError, ActorUnavailableError
            raise CoordinatorLost(_reason(e)) from e
        except SystemError as e:
            # Ctrl-C or SIGTERM while this thread waits in Ray's compiled code: what the signal's handler raised (the
            # round loop's interruption) comes back wrapped, "returned a result with an exception set". Raised as
            # itself, the loop stops as interrupted (the round in flight finished, recorded, checkpointed); as a
            # SystemError the run failed and lost that round's checkpoint (found by bench/chaos.py)
            if e.__cause__ is None:
                raise
            raise e.__cause__ from None

    def _await(self, ref) -> None:
        """Wait for ``ref`` while the coordinator answers its heartbeat (:func:`~fedray.driver.launch.await_call`):
        one left unanswered for ``engine.heartbeat_s`` means a hung coordinator (stopped, deadlocked), and a new
        actor that has not answered by its start deadline (``engine.start_timeout_s``) is stopped, deadlocked or
        unplaced: it is killed and :class:`CoordinatorLost` raised, so the loop restarts it from the last
        checkpoint. With ``engine.heartbeat_s: null`` the coordinator is not watched (its first call, the early
        start's check, still has the start deadline)."""
        if self.heartbeat_s is None:
            return
        try:
            self._answered = await_call(self.ray, self.coord, ref, heartbeat_s=self.heartbeat_s,
                                        start_timeout_s=self.start_timeout_s, answered=self._answered)
        except ActorSilent as silent:
            kill_actors(self.ray, [self.coord])
            raise CoordinatorLost(f"the coordinator {silent}; killed" if silent.starting else
                                  f"the coordinator hung: {silent}; killed") from None

    def run_round(self, rnd: int) -> RoundReport:
        self.in_flight.update(round=rnd, ref=self.coord.run_round.remote(rnd), t0=time.perf_counter())
        report = self._get(self.in_flight["ref"])
        self.in_flight.clear()
        return report

    def finish_in_flight(self) -> tuple[int, RoundReport, float] | None:
        """After an interruption: the round the actor was running, finished (it goes on anyway)."""
        if not self.in_flight:
            return None
        f = dict(self.in_flight)
        self.in_flight.clear()
        return f["round"], self._get(f["ref"]), f["t0"]

    def state_dict(self) -> dict:
        return self._get(self.coord.state_dict.remote())

    def load_state_dict(self, st: dict) -> None:
        self._get(self.coord.load_state_dict.remote(st))

    def weights(self) -> np.ndarray:
        return self._get(self.coord.get_weights.remote())

    def weights_hash(self) -> str:
        return self._get(self.coord.weights_hash.remote())

    def workers(self) -> list[dict]:
        return self._get(self.coord.workers.remote())

    def node_id(self) -> str | None:
        return self._get(self.coord.node_id.remote())

    def pid(self) -> int:
        return self._get(self.coord.pid.remote())

    def _kill(self) -> None:
        kill_actors(self.ray, [self.coord, *self.worker_actors])

    def close(self) -> None:
        try:
            self._get(self.coord.shutdown.remote())
        finally:  # also when the coordinator is the thing that died: its workers would hold their CPUs
            self._kill()


def _reason(err: BaseException) -> str:
    """The first line of an error, without Ray's wrapping (``RayTaskError(X)`` keeps the cause)."""
    cause = getattr(err, "cause", None) or err
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"
