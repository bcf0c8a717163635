"""The coordinator actor's class: the process side of the driver's coordinator handle.

:class:`CoordinatorHost` is what runs in the coordinator actor's process (and, in-process, what
:class:`fedray.driver.handle.LocalCoordinator` is): it is started before the run's arguments exist, by the driver's
early start (:mod:`fedray.driver.launch`), so its module imports no torch; :meth:`CoordinatorHost.setup` builds the
:class:`~fedray.engine.coordinator.Coordinator`, which imports it.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedray.engine.round_report import RoundReport

__all__ = ["CoordinatorHost", "ray_coordinator_class"]


class CoordinatorHost:
    """The coordinator actor's process, started before the run's arguments exist (its class imports no torch,
    so the driver can start it): :meth:`setup` builds the :class:`~fedray.engine.coordinator.Coordinator` from
    a :class:`~fedray.engine.spec.CoordinatorSpec`; the other methods are the coordinator's, which the driver
    calls through :class:`fedray.driver.handle.RayCoordinator`."""

    def __init__(self):
        import fedray.engine.coordinator  # noqa: F401  (torch and the engine import now, not at setup)

        self.coord = None

    def check(self, cfg, meta) -> bool:
        """:func:`fedray.plugins.check_run` here, where the registries (torch) are imported anyway."""
        from fedray.plugins import check_run

        check_run(cfg, meta)
        return True

    def setup(self, spec) -> bool:
        from fedray.engine.coordinator import Coordinator

        self.coord = Coordinator(spec)
        return True

    def ready(self) -> dict:
        return self.coord.ready()

    def run_round(self, rnd: int) -> RoundReport:
        return self.coord.run_round(rnd)

    def state_dict(self) -> dict:
        return self.coord.state_dict()

    def load_state_dict(self, st: dict) -> None:
        self.coord.load_state_dict(st)

    def get_weights(self):
        return self.coord.get_weights()

    def weights_hash(self) -> str:
        return self.coord.weights_hash()

    def workers(self) -> list[dict]:
        return self.coord.workers()

    def node_id(self) -> str | None:
        return self.coord.node_id()

    def pid(self) -> int:
        return self.coord.pid()

    def shutdown(self) -> None:
        self.coord.shutdown()


@functools.cache
def ray_coordinator_class(ray):
    """:class:`CoordinatorHost` as a Ray actor class with ``ping`` in a concurrency group of its own (one thread):
    the driver's heartbeat (:meth:`fedray.driver.handle.RayCoordinator._get`), answered in the middle of a round."""

    class RayCoordinatorHost(CoordinatorHost):
        @ray.method(concurrency_group="heartbeat")
        def ping(self) -> bool:
            return True

    return ray.remote(concurrency_groups={"heartbeat": 1})(RayCoordinatorHost)
