"""A real multi-node Ray cluster on this machine, for the tests of fedray on several nodes (the ``multinode``
fixture of tests/integration/conftest.py).

``ray.cluster_utils.Cluster`` on 127.0.0.1 with fedray's local settings (token authentication on with fedray's
token, every node pinned to loopback): a head with 0 CPUs (the driver and, by default, the coordinator run
there) and worker nodes ``n1``, ``n2``, ... with 1 CPU and a custom resource of their name, so a test can tell
where an actor runs. Nodes are removed the hard way (``remove_node(allow_graceful=False)``: SIGKILL of the
node's raylet, its workers die with it); the head's health checks are fast, so the GCS declares a removed node
dead within seconds.

The test session's own Ray (``ray_session``) lives in the same pytest process, and a process joins one Ray
instance at a time: :meth:`MultiNodeCluster.start` shuts the session's instance down (when it was up), and
:meth:`MultiNodeCluster.shutdown` starts it again, so the modules after this one find it as before. The
cluster's files (and the address file Ray writes for ``ray.init()`` without an address) live in a private
temp directory, never in the machine's shared ``/tmp/ray``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

#: The GCS declares a node dead after about period x threshold without an answer (Ray's default is ~30 s).
HEALTH_CHECKS = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000,
                 "health_check_timeout_ms": 1000, "health_check_failure_threshold": 4}


class MultiNodeCluster:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="frmn-", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.cluster = None
        self.head_id = ""
        self.nodes: dict[str, tuple[str, object]] = {}  # alive worker nodes: node id -> (name, Node)
        self.names: dict[str, str] = {}  # every node id ever -> name ("head", "n1", ...)
        self._count = 0
        self._env: dict[str, str | None] = {}
        self._session_ray = False

    @property
    def address(self) -> str:
        return self.cluster.address

    def start(self, workers: int = 3) -> MultiNodeCluster:
        import ray
        from ray.cluster_utils import Cluster

        from fedray.core.ray_env import _pin_loopback, _refresh_ray_config, local_ray_env

        self._session_ray = ray.is_initialized()
        if self._session_ray:
            ray.shutdown()
        env = {**local_ray_env(), "RAY_TMPDIR": self.tmp}
        self._env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the nodes' processes inherit token auth, loopback, the temp dir
        _refresh_ray_config()
        _pin_loopback()
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "num_gpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False,
            "object_store_memory": 200 << 20, "_system_config": HEALTH_CHECKS})
        self.head_id = self.cluster.head_node.node_id
        self.names[self.head_id] = "head"
        for _ in range(workers):
            self.add()
        return self

    def add(self) -> str:
        """A new worker node (1 CPU, resource ``n<k>``); its node id."""
        self._count += 1
        name = f"n{self._count}"
        node = self.cluster.add_node(num_cpus=1, num_gpus=0, resources={name: 1.0}, node_ip_address="127.0.0.1",
                                     object_store_memory=150 << 20)
        self.nodes[node.node_id] = (name, node)
        self.names[node.node_id] = name
        return node.node_id

    def ensure(self, n: int) -> None:
        """At least ``n`` alive worker nodes."""
        while len(self.nodes) < n:
            self.add()

    def remove(self, node_id: str) -> str:
        """Kill worker node ``node_id`` (SIGKILL of its processes); its name."""
        name, node = self.nodes.pop(node_id)
        self.cluster.remove_node(node, allow_graceful=False)
        return name

    def name_of(self, node_id: str | None) -> str:
        return self.names.get(node_id or "", f"unknown node {node_id}")

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            for _, node in list(self.nodes.values()):
                self.cluster.remove_node(node, allow_graceful=False)
            if self.cluster.head_node is not None:
                self.cluster.remove_node(self.cluster.head_node, allow_graceful=False)
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self._session_ray:
            from tests.helpers import start_test_ray

            start_test_ray()


class WhenHung:
    """Calls ``action(node_id)`` from a thread as soon as a ``hang`` fault (``engine.fault_injection: {kind:
    hang, round, client}``) has its client's worker blocked, with that worker's node: the client's task is in
    flight there, so removing that node is a mid-round node loss at a known point, not after a sleep."""

    def __init__(self, run_root: Path, rnd: int, cid: int, action, timeout: float = 240.0):
        self.pattern, self.action, self.timeout = f"*/faults/hang-r{rnd}-c{cid}", action, timeout
        self.root, self.node, self.error = Path(run_root), None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            found = list(self.root.glob(self.pattern))
            if found:
                self.node = found[0].read_text()
                try:
                    self.action(self.node)
                except Exception as e:  # noqa: BLE001 - reported by done()
                    self.error = e
                return
            self._stop.wait(0.05)

    def done(self) -> str:
        """The hung worker's node id, once the action ran (raises what the action raised)."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise self.error
        assert self.node is not None, f"no {self.pattern} under {self.root}: the hang fault never fired"
        return self.node
