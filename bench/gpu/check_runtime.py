"""Start Ray from an unpacked runtime of bench/gpu/prepare.sh and run one actor: proof that the pruned tree holds what
``ray.init`` and an actor import (prepare.sh --check; run_all.sh's first step on the GPU machine).

    python bench/gpu/check_runtime.py SITE_DIR [--json OUT.json]

``SITE_DIR`` goes first on ``sys.path`` (and on the ``PYTHONPATH`` the Ray processes inherit), so this Ray is the
tree's even where another is installed. Prints one JSON line: Ray's version and file, the actor's answer, seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    site = os.path.abspath(argv[0])
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t0 = time.perf_counter()
    import ray

    if not os.path.abspath(ray.__file__).startswith(site + os.sep):
        raise SystemExit(f"check_runtime: ray came from {ray.__file__}, not from {site}")
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    t_init = time.perf_counter() - t0

    @ray.remote(num_cpus=1)
    class Probe:
        def where(self) -> dict:
            import ray as r

            return {"pid": os.getpid(), "ray_file": r.__file__, "python": sys.version.split()[0]}

    info = ray.get(Probe.remote().where.remote(), timeout=120)
    ray.shutdown()
    if not os.path.abspath(info["ray_file"]).startswith(site + os.sep):
        raise SystemExit(f"check_runtime: the actor imported ray from {info['ray_file']}")
    res = {"ray_version": ray.__version__, "ray_file": ray.__file__, "actor": info, "init_s": round(t_init, 2),
           "total_s": round(time.perf_counter() - t0, 2)}
    print(json.dumps(res))
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
