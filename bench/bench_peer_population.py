"""What a population of P clients costs Flower's simulation engine before its first round (issue 30 item 5).

``flwr.simulation.run_simulation(num_supernodes=P)`` registers every SuperNode in its in-memory LinkState
before any round (Flower's ``_register_nodes``: a node record with a random 32-byte key and a heartbeat
acknowledgement per node), and then builds one run-info store with a Context per node. This times the
registration alone, in a process of its own per P, and prints wall seconds, CPU seconds and the growth of the
process's peak RSS, so the P that Flower can reach on this machine can be read off (docs/scaling.md, "Peers").
It runs in Flower's virtualenv (``bench/.flower-venv``, made by ``fedray bench workload --flower``); started
from another Python it re-runs itself there. Figures only, no assertions.

    .venv/bin/fedray bench peer_population 1000 10000 100000
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOWER_PY = HERE / ".flower-venv" / "bin" / "python"


def _one(p: int) -> dict:
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager

    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    nodes = _register_nodes(num_nodes=p, state_factory=factory)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert len(nodes) == p
    return {"P": p, "wall_s": wall, "cpu_s": cpu, "rss_growth_mib": grow}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(_one(int(argv[1]))))
        return
    pops = [int(a) for a in argv] or [1000, 10000, 100000]
    try:
        import flwr  # noqa: F401
        py = sys.executable
    except ImportError:
        if not FLOWER_PY.exists():
            sys.exit(f"{FLOWER_PY} missing: create it with `fedray bench workload --flower`")
        py = str(FLOWER_PY)
    print(f"{'P':>10s} {'wall s':>8s} {'CPU s':>8s} {'RSS +MiB':>9s} {'CPU us/node':>11s} {'KiB/node':>9s}")
    for p in pops:  # one process per P: the peak RSS of one does not hide the next
        out = subprocess.run([py, __file__, "--one", str(p)], capture_output=True, text=True, check=True,
                             env=dict(os.environ, FLWR_TELEMETRY_ENABLED="0"))
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{p:>10,d} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} {r['rss_growth_mib']:9.0f} "
              f"{1e6 * r['cpu_s'] / p:11.1f} {1024 * r['rss_growth_mib'] / p:9.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
