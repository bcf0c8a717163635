#!/usr/bin/env python
"""Benchmark: the K = 10,000 point of issue 30 on a 3-node loopback Ray cluster, with the bytes between nodes.

Prints figures; makes no assertions. Starts a real multi-node Ray cluster on 127.0.0.1 the way the multi-node
tests do (``tests/integration/multinode.py``: token authentication on with fedray's token, every node pinned to
loopback, each node its own raylet, object store and workers): a head with 0 CPUs (the driver and the
coordinator) and two worker nodes with 1 CPU each, so fedray's two client workers (1 CPU each) land one per
node. Then runs one ``fedray scale`` sweep joining it (``engine.ray_address``), by default
``jobs/configs/scale_10k.yaml`` restricted to P = 10,000,000, K = 10,000 (``--population``, ``--clients``).

Bytes between nodes are measured, not estimated: every 0.5 s the TCP sockets of the cluster's processes are
read with ``ss -tinp`` (the kernel's ``bytes_acked`` per socket), every process is assigned to its node (the
node's raylet and GCS and their descendants; the driver to the head), and the bytes a socket sent are counted
between nodes when its peer socket belongs to a process of another node. Sockets open before the sweep count
from their value then; a socket closed between two samples loses at most its last 0.5 s. The engine's own
count of the weight vectors it sent and received (``bytes`` of ``metrics.jsonl``) is printed beside it.

Usage (outputs outside the repository; the 10-million point needs its partition, as bench_scale_rounds.py)::

    FEDRAY_CACHE_DIR=/work/scale/cache nice -n 5 python bench/bench_scale_cluster.py --output-dir /work/scale/cluster
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_SOCK = re.compile(r"^(?:ESTAB\s+)?\d+\s+\d+\s+(\S+)\s+(\S+)\s+users:\(\(\"[^\"]*\",pid=(\d+)")
_ACKED = re.compile(r"\bbytes_acked:(\d+)")


def _addr(a: str) -> str:
    return a.replace("[::ffff:", "").replace("]", "")


class SocketSampler:
    """Per socket (local address, peer address): its owner pid and the largest ``bytes_acked`` seen."""

    def __init__(self, node_of):
        self.node_of = node_of  # () -> {pid: node name}, refreshed each sample (workers start later)
        self.sent: dict[tuple[str, str], int] = {}
        self.base: dict[tuple[str, str], int] = {}
        self.owner: dict[str, int] = {}  # local address -> pid
        self.nodes: dict[int, str] = {}
        self.actors: dict[int, tuple[str, str]] = {}  # pid -> (fedray actor kind, node)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        self.nodes.update(self.node_of())
        self._actors()
        out = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True).stdout
        lines = out.splitlines()
        # ss -H prints the socket line, then its tcp_info on the next (indented) line
        for head, info in zip(lines, lines[1:]):
            if head[:1].isspace() or (m := _SOCK.match(head)) is None:
                continue
            local, peer, pid = _addr(m.group(1)), _addr(m.group(2)), int(m.group(3))
            if not local.startswith("127.0.0.1:") or pid not in self.nodes:
                continue
            a = _ACKED.search(info)
            if a is None:
                continue
            key = (local, peer)
            self.owner[local] = pid
            self.sent[key] = max(self.sent.get(key, 0), int(a.group(1)))

    def _actors(self) -> None:
        """The node of every fedray worker and coordinator process seen (by its Ray process title)."""
        for pid, node in self.nodes.items():
            if pid in self.actors:
                continue
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            for kind in ("RayClientWorker", "RayCoordinatorHost"):
                if kind in title:
                    self.actors[pid] = (kind, node)

    def start(self) -> None:
        self.sample()
        self.base = dict(self.sent)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()

    def between_nodes(self) -> dict[tuple[str, str], int]:
        """Bytes sent from node a to node b (a != b), by (a, b)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for (local, peer), sent in self.sent.items():
            a = self.nodes.get(self.owner.get(local, -1))
            b = self.nodes.get(self.owner.get(peer, -1))
            if a is None or b is None or a == b:
                continue
            out[(a, b)] += sent - self.base.get((local, peer), 0)
        return dict(out)


def node_processes(mn, driver_pid: int | None) -> dict[int, str]:
    """pid -> node name for the cluster's processes (each node's processes and their descendants)."""
    import psutil

    nodes = [("head", mn.cluster.head_node)] + [(name, node) for name, node in mn.nodes.values()]
    out: dict[int, str] = {}
    for name, node in nodes:
        for infos in node.all_processes.values():
            for info in infos:
                pid = info.process.pid
                out[pid] = name
                try:
                    for c in psutil.Process(pid).children(recursive=True):
                        out[c.pid] = name
                except psutil.Error:
                    pass
    if driver_pid is not None:
        out[driver_pid] = "head"
        try:
            for c in psutil.Process(driver_pid).children(recursive=True):
                out.setdefault(c.pid, "head")
        except psutil.Error:
            pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="jobs/configs/scale_10k.yaml")
    ap.add_argument("--output-dir", required=True, type=Path)
    ap.add_argument("--population", type=int, default=10_000_000)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("overrides", nargs="*", help="a.b=c overrides passed to fedray scale")
    args = ap.parse_args()

    from tests.integration.multinode import MultiNodeCluster

    mn = MultiNodeCluster()
    t0 = time.perf_counter()
    mn.start(workers=2)
    print(f"cluster up in {time.perf_counter() - t0:.1f} s at {mn.address}: head (0 CPUs), "
          f"{', '.join(name for name, _ in mn.nodes.values())} (1 CPU each)", flush=True)
    import ray

    ray.shutdown()  # the sweep's driver joins the cluster; this process only watches it
    # one point: a scale file restricted to the population and clients per round asked for
    spec = Path(args.config).read_text()
    spec = re.sub(r"^sweeps?:.*\Z", "", spec, flags=re.M | re.S)
    spec += f"sweep: {{population: [{args.population}], clients_per_round: [{args.clients}]}}\n"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    cfg = args.output_dir / "cluster_point.yaml"
    cfg.write_text(spec)
    cmd = [sys.executable, "-m", "fedray.cli", "scale", str(cfg), f"engine.ray_address={mn.address}",
           "--output-dir", str(args.output_dir), *args.overrides]
    print("$", " ".join(cmd), flush=True)
    proc = None
    sampler = SocketSampler(lambda: node_processes(mn, None if proc is None else proc.pid))
    try:
        sampler.start()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("[scale]"):
                print(line.rstrip(), flush=True)
        rc = proc.wait()
        sampler.stop()
    finally:
        mn.shutdown()
    if rc not in (0, 1):
        print(f"fedray scale exited {rc}")
        return 1
    _report(args.output_dir, sampler)
    return 0


def _report(out: Path, sampler: SocketSampler) -> None:
    import pandas as pd

    d = pd.read_parquet(out / "scaling.parquet")
    for _, r in d.iterrows():
        if r.status != "ok":
            print(f"point {int(r.point)}: {r.status}")
            continue
        print(f"\nP={int(r.population):,} K={int(r.clients_per_round):,}: {r.client_updates_per_s:.1f} upd/s, "
              f"{1e3 / r.client_updates_per_s:.3f} ms per update, round {r.round_s:.3f} s (train {r.train_s:.3f}, "
              f"aggregate {r.aggregate_s:.3f}, eval {r.eval_s:.3f}, overhead {r.overhead_s:.3f}), coordinator "
              f"private {r.coordinator_anon_mb:.1f} MiB, worker peak {r.workers_peak_mb:.0f} MiB, "
              f"store {r.object_store_used_mb:.0f} MiB")
    engine = defaultdict(int)
    rounds = 0
    for m in sorted(out.glob("runs/p*/metrics.jsonl")):
        for line in m.read_text().splitlines():
            row = json.loads(line)
            rounds += 1
            for k, v in row.get("bytes", {}).items():
                engine[k] += int(v)
    between = sampler.between_nodes()
    total = sum(between.values())
    print(f"\nbytes between nodes (TCP, measured, {rounds} rounds and the point's start-up and evaluation): "
          f"{total / 2**20:,.1f} MiB")
    for (a, b), n in sorted(between.items()):
        print(f"  {a} -> {b}: {n / 2**20:,.1f} MiB")
    print("engine's count of weight vectors over the same rounds: "
          + ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in engine.items()))
    where: dict[tuple[str, str], int] = defaultdict(int)
    for kind, node in sampler.actors.values():
        where[(kind, node)] += 1
    print("fedray processes by node (Ray process titles): "
          + ", ".join(f"{kind} on {node}: {n}" for (kind, node), n in sorted(where.items())))


if __name__ == "__main__":
    sys.exit(main())
