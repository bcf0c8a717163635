"""The 3-node loopback cluster of the chaos harness (bench/chaos.py ``--cluster``): a head and two worker nodes on
127.0.0.1, token authentication on (fedray's settings for a local Ray, :func:`fedray.core.ray_env.local_ray_env`),
started by the harness process with Ray's ``ray.cluster_utils.Cluster`` as tests/integration/multinode.py does (``ray
start --address`` refuses to join a node with Ray's loopback pin on, and without it Ray swaps 127.0.0.1 for the
machine's outward address); every schedule's driver joins it with ``RAY_ADDRESS`` (as ``fedray run --address``
does), its coordinator on the head (``engine.coordinator_placement: driver``), its workers on any node.

The fault ``raylet_sigkill`` SIGKILLs a worker node's raylet (its workers die with it); the GCS declares the node
dead within a few seconds (fast health checks); the node is started again before the next driver (a resume), as an
operator would. The Ray processes of the cluster are the raylets' descendants: the moment faults look for actors
there too, and the leak check after a schedule is that no ``ClientWorker`` / ``CoordinatorHost`` actor process of
it outlives it (Ray ends a job's actors when its driver goes).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import psutil

#: the GCS declares a node dead after about period x threshold without an answer (Ray's default is ~30 s)
HEALTH = {"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
          "health_check_failure_threshold": 4}


class LoopbackCluster:
    def __init__(self, workers: int = 2, cpus_per_worker: int = 2):
        self.temp = tempfile.mkdtemp(prefix="fcc-", dir="/tmp")  # short: Ray's socket paths have a length limit
        self.workers = workers
        self.cpus = cpus_per_worker
        self.cluster: Any = None
        self.nodes: dict[str, Any] = {}  # worker node name -> its ray._private.node.Node
        self.restarts = 0
        from fedray.core.ray_env import local_ray_env

        self.env = {**local_ray_env(), "RAY_TMPDIR": self.temp, "RAY_USAGE_STATS_ENABLED": "0",
                    # the nodes' Ray workers import fedray from the harness's tree, as the drivers do
                    "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                   os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}

    @property
    def address(self) -> str:
        return self.cluster.address

    def start(self) -> LoopbackCluster:
        from ray.cluster_utils import Cluster

        from fedray.core.ray_env import _pin_loopback, _refresh_ray_config

        os.environ.pop("RAY_ADDRESS", None)
        os.environ.update(self.env)  # the nodes' processes inherit token auth, loopback, the temp dir
        _refresh_ray_config()
        _pin_loopback()
        try:
            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "num_gpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False,
                "object_store_memory": 200 << 20, "_system_config": HEALTH})
            for i in range(1, self.workers + 1):
                self.start_node(f"n{i}")
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(num_cpus=self.cpus, num_gpus=0, node_ip_address="127.0.0.1",
                                                 object_store_memory=150 << 20)

    @staticmethod
    def _raylet_pid(node) -> int | None:
        procs = node.all_processes.get("raylet") or []
        if not procs or procs[0].process.poll() is not None:
            return None
        return procs[0].process.pid

    def raylet(self, name: str) -> int | None:
        return self._raylet_pid(self.nodes[name])

    def roots(self) -> list[psutil.Process]:
        """The processes whose descendants are the cluster's Ray workers (every live raylet of it)."""
        out = []
        for node in [self.cluster.head_node, *self.nodes.values()]:
            pid = self._raylet_pid(node)
            try:
                out += [psutil.Process(pid)] if pid else []
            except psutil.Error:
                continue
        return out

    def kill_raylet(self, pick: int) -> str | None:
        """SIGKILL the raylet of one worker node (by ``pick``); what was done, None when none is alive."""
        alive = [n for n in sorted(self.nodes) if self.raylet(n) is not None]
        if not alive:
            return None
        name = alive[pick % len(alive)]
        pid = self.raylet(name)
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL the raylet of worker node {name} (pid {pid})"

    def heal(self) -> list[str]:
        """Start again every worker node whose raylet is dead (before the next driver); their names."""
        dead = [n for n in sorted(self.nodes) if self.raylet(n) is None]
        for name in dead:
            self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)
            self.start_node(name)
            self.restarts += 1
        return dead

    def actors(self, patterns) -> list[psutil.Process]:
        """The cluster's live actor processes whose titles match one of ``patterns``."""
        out = []
        for root in self.roots():
            try:
                kids = root.children(recursive=True)
            except psutil.Error:
                continue
            for p in kids:
                try:
                    title = " ".join(p.cmdline())
                    if any(pat.match(title) for pat in patterns) and p.status() != psutil.STATUS_ZOMBIE:
                        out.append(p)
                except psutil.Error:
                    continue
        return out

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
        shutil.rmtree(self.temp, ignore_errors=True)
