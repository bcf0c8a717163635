"""Hyper-parameter study entry point for `ray job submit` (and for a laptop, unchanged).

    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
        python -m jobs.tune --study tuning/studies/fedrcl_lbt.yaml \
            --storage postgresql://optuna@db-host/optuna --output-dir /mnt/shared/fedray-studies
    python -m jobs.tune --study tuning/studies/fedrcl_lbt.yaml            # local Ray on this machine
    python -m jobs.tune --study tuning/studies/fedrcl_lbt.yaml --resume   # after a crash / SIGKILL / Ctrl-C
    python -m jobs.tune --study tuning/studies/fedrcl_lbt.yaml train.rounds=5 --dry-run   # list, run nothing

The driver connects with plain ``ray.init()`` (through ``fedray.core.ray_env.ensure_ray``) when the base
config's ``engine.backend`` is ``ray``: under a job the supervisor's ``RAY_ADDRESS`` is used, on a laptop
a local Ray starts; with ``engine.backend: local`` Ray is not used at all. Trials run concurrently on
slices of the cluster (see ``tuning/driver.py``); the study directory (``<output-dir>/<study name>/``)
holds the journal storage by default, one run directory per trial, the trials table, the best config and
the plots. Exit status: 0 done, 1 aborted (trials kept failing), 2 bad study file, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from tuning.cli import add_arguments, run_cli

    ap = argparse.ArgumentParser(prog="python -m jobs.tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, flag="--study")
    args = ap.parse_intermixed_args(argv)
    return run_cli(args, "jobs.tune")


if __name__ == "__main__":
    sys.exit(main())
