"""fedray on a real multi-node Ray cluster (loopback, token auth; tests/integration/multinode.py): workers spread
over the nodes, the coordinator on the head, objects crossing nodes, and nodes lost mid-round with and without
spare capacity, the coordinator's node lost, every worker node lost. Each run ends with the weights of the
same config run in-process (bit for bit) or with a clear error, never a hang.

Joining a cluster by address is exercised by every run here (``ray_address=``, what ``fedray run --address``
passes); that a run without an address never attaches to a running cluster is
tests/core/test_ray_env.py::test_plain_fedray_run_does_not_attach_to_a_running_head.
A node is removed while one of its clients is in flight: the ``hang`` fault blocks that client and names its
node (``WhenHung``), so the loss happens at a known point of the round.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

import pytest

from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import ROOT, run_quiet, small_config
from tests.integration.multinode import WhenHung

pytestmark = pytest.mark.ray

ROUNDS = 3
BASE = dict(train__rounds=ROUNDS, eval__every=ROUNDS, engine__backend="ray", engine__num_workers=2,
            output__checkpoint_every=1)


@pytest.fixture(scope="module")
def local(tmp_path_factory, partition_cache):
    """The same config in-process: its final weights' hash and the clients each round sampled."""
    tmp = tmp_path_factory.mktemp("local")
    res = run_quiet(small_config(tmp, partition_cache, **{**BASE, "engine__backend": "local"}))
    rows = RunDir(res.run_dir).read_ledger().to_pylist()
    return {"hash": res.weights_hash, "sampled": {r: [x["client"] for x in rows if x["round"] == r]
                                                  for r in range(1, ROUNDS + 1)}}


def _cfg(tmp_path, partition_cache, **over):
    from fedray.config import from_dict

    return from_dict(small_config(tmp_path, partition_cache, **{**BASE, **over}))


def _run(mn, cfg, **kw):
    return run_experiment(cfg, progress=False, log=lambda *a: None, ray_address=mn.address, **kw)


def _live(workers: list[dict]) -> list[dict]:
    return [w for w in workers if w["state"] == "live"]


def _wait_live(engine, n: int, timeout: float = 120.0) -> list[dict]:
    """Between rounds: until ``n`` workers are live (a replacement starting on a node with room)."""
    deadline = time.monotonic() + timeout
    while True:
        workers = engine.workers()
        if len(_live(workers)) >= n or time.monotonic() > deadline:
            return workers
        time.sleep(0.2)


def _hang(rnd: int, cid: int) -> dict:
    return {"engine__fault_injection": {"kind": "hang", "round": rnd, "client": cid}}


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_the_cluster_is_locked_down_like_fedrays_own_ray(multinode):
    """Every node listens on loopback only, and the GCS refuses a client without the cluster's token."""
    import ray  # noqa: F401  (puts Ray's vendored psutil on sys.path)
    import psutil

    me = psutil.Process()
    socks = []
    for p in me.children(recursive=True):
        try:
            socks += [(p.name(), c.laddr.ip) for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
    assert sum(name == "raylet" for name, _ in socks) >= 4, socks  # the head's and the worker nodes'
    assert not [s for s in socks if not _loopback(s[1])], socks
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    host, port = multinode.address.rsplit(":", 1)
    probe = f"from fedray.core.ray_env import _check_reachable; _check_reachable('{multinode.address}', '{host}', {port})"
    r = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode != 0 and "refused the connection" in r.stderr, r.stderr[-2000:]


def test_workers_spread_over_the_nodes_coordinator_on_the_head_and_bits_match(multinode, tmp_path, partition_cache,
                                                                               local, engines):
    """3 one-CPU worker nodes, 3 workers: one per node. The driver joined the cluster by its address, the
    coordinator runs on the driver's node, the head, so the weights it puts go to workers on other nodes and
    their updates come back across nodes; the final weights are the in-process run's."""
    import ray

    multinode.ensure(3)
    seen = {}

    def on_round(report):
        if report["round"] == 1:
            seen.update(coordinator=engines[0].node_id(), workers=engines[0].workers(),
                        driver=ray.get_runtime_context().get_node_id(), gcs=ray.get_runtime_context().gcs_address)

    res = _run(multinode, _cfg(tmp_path, partition_cache, engine__num_workers=3), on_round=on_round)
    assert res.weights_hash == local["hash"]
    assert seen["gcs"] == multinode.address  # joined the multi-node cluster named, not a local instance
    assert seen["coordinator"] == seen["driver"] == multinode.head_id
    where = sorted(multinode.name_of(w["node"]) for w in _live(seen["workers"]))
    assert len(where) == 3 and len(set(where)) == 3 and "head" not in where, where  # every worker elsewhere
    assert all(r["workers"] == 3 and r["worker_restarts"] == 0 for r in res.rounds)
    assert res.rounds[0]["bytes"]["broadcast"] > 0  # what crossed from the head to the worker nodes


def test_node_lost_mid_round_with_spare_capacity_is_replaced_elsewhere(multinode, tmp_path, partition_cache, local,
                                                                      engines):
    """2 workers on 3 nodes; the node of a worker with a client in flight in round 2 dies: the round goes on,
    the client re-runs, the replacement starts on the spare node and trains in round 3; same weights."""
    multinode.ensure(3)
    cid = local["sampled"][2][3]
    killed = WhenHung(tmp_path / "runs", 2, cid, multinode.remove)
    after = {}

    def on_round(report):
        if report["round"] == 2:
            after["workers"] = _wait_live(engines[0], 2)

    res = _run(multinode, _cfg(tmp_path, partition_cache, **_hang(2, cid)), on_round=on_round)
    dead = killed.done()
    assert res.weights_hash == local["hash"]
    live = _live(after["workers"])
    assert len(live) == 2 and all(w["node"] in multinode.nodes for w in live), after
    new = [w for w in live if "." in w["name"]]  # a replacement (w0.1, w1.1, ...)
    assert new and new[0]["node"] != dead
    ledger = RunDir(res.run_dir).read_ledger().to_pylist()
    lost = [r for r in ledger if r["failure"]]
    assert [(r["round"], r["client"]) for r in lost] == [(2, cid)] and "worker lost" in lost[0]["failure"]
    assert any(r["round"] == 3 and r["worker"] == new[0]["name"] and not r["failure"] for r in ledger)
    assert res.rounds[1]["worker_restarts"] >= 1 and res.rounds[2]["workers"] == 2


def test_node_lost_without_spare_capacity_shrinks_the_pool_then_grows_back(multinode, tmp_path, partition_cache,
                                                                          local, engines):
    """3 workers on 3 one-CPU nodes; one node dies mid-round 2 and no node has room for a replacement: the round
    finishes on the 2 workers left (the lost client re-runs on one of them) instead of waiting. When a node
    joins after round 2, the waiting replacement starts there and round 3 has 3 workers again. Same weights,
    run.json ``finished``."""
    while len(multinode.nodes) > 3:
        multinode.remove(next(iter(multinode.nodes)))
    multinode.ensure(3)
    cid = local["sampled"][2][2]
    killed = WhenHung(tmp_path / "runs", 2, cid, multinode.remove)
    seen = {}

    def on_round(report):
        if report["round"] == 2:
            seen["shrunk"] = engines[0].workers()
            seen["new_node"] = multinode.add()  # capacity returns
            seen["grown"] = _wait_live(engines[0], 3)

    res = _run(multinode, _cfg(tmp_path, partition_cache, engine__num_workers=3, **_hang(2, cid)), on_round=on_round)
    dead = killed.done()
    assert res.weights_hash == local["hash"]
    assert [r["workers"] for r in res.rounds] == [3, 2, 3]  # shrank in round 2, grew back for round 3
    states = [w["state"] for w in seen["shrunk"]]
    assert states.count("live") == 2 and "starting" in states, seen["shrunk"]  # the replacement had nowhere to go
    grown = _live(seen["grown"])
    assert len(grown) == 3 and seen["new_node"] in {w["node"] for w in grown} and dead not in {w["node"] for w in grown}
    ledger = RunDir(res.run_dir).read_ledger().to_pylist()
    r2 = [r for r in ledger if r["round"] == 2 and r["client"] == cid]
    assert [bool(r["failure"]) for r in r2] == [True, False]  # lost, then re-run on a survivor
    assert RunDir(res.run_dir).read_json("run.json")["status"] == "finished"


def test_coordinator_node_lost_restarts_from_the_checkpoint(multinode, tmp_path, partition_cache, local, engines):
    """With ``engine.coordinator_placement: any`` and half a CPU, the coordinator runs on a worker node (the
    head has none). That node dies mid-round 2: the driver starts a new coordinator and pool on the nodes
    left, from the round-1 checkpoint, and the run ends with the uninterrupted run's weights."""
    multinode.ensure(3)
    cid = local["sampled"][2][1]
    seen = {}

    def kill_coordinator(_hung_node):
        seen["killed"] = seen["coordinator"]
        multinode.remove(seen["coordinator"])

    killed = WhenHung(tmp_path / "runs", 2, cid, kill_coordinator)

    def on_round(report):
        seen.setdefault("coordinator", engines[0].node_id())
        seen["last"] = engines[0].node_id()

    cfg = _cfg(tmp_path, partition_cache, engine__coordinator_placement="any", engine__coordinator_num_cpus=0.5,
               engine__worker_num_cpus=0.5, **_hang(2, cid))
    res = _run(multinode, cfg, on_round=on_round)
    killed.done()
    assert multinode.name_of(seen["killed"]) != "head"
    assert res.weights_hash == local["hash"] and res.coordinator_restarts >= 1
    assert seen["last"] != seen["killed"]
    rd = RunDir(res.run_dir)
    assert [r["round"] for r in rd.read_metrics()] == list(range(1, ROUNDS + 1))
    assert rd.read_json("run.json")["status"] == "finished"


def test_every_worker_node_lost_fails_the_run_clearly(multinode, tmp_path, partition_cache, local):
    """Every worker node dies mid-round 2: no worker is left and none can start, so the run fails (not waits)
    with the lost workers named; run.json ``failed`` with the reason, the round-1 checkpoint kept."""
    multinode.ensure(2)
    cid = local["sampled"][2][0]
    killed = WhenHung(tmp_path / "runs", 2, cid, lambda _node: [multinode.remove(n) for n in list(multinode.nodes)])
    with pytest.raises(Exception, match=r"round 2: no client worker left: workers lost: w\d \(node ") as err:
        _run(multinode, _cfg(tmp_path, partition_cache, **_hang(2, cid)))
    killed.done()
    assert "no alive Ray node can host a replacement" in str(err.value)
    run_dir = next((tmp_path / "runs").iterdir())
    info = RunDir(run_dir).read_json("run.json")
    assert info["status"] == "failed" and "no client worker left" in info["error"]
    assert RunDir(run_dir).load_checkpoint()["round"] == 1
    assert not (run_dir / "summary.json").exists()
