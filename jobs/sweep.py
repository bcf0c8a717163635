"""Sweep entry point for `ray job submit` (and for a laptop, unchanged): `fedray sweep` as a job.

    ray job submit --working-dir . -- python -m jobs.sweep jobs/sweeps/fedrcl_mnist.yaml \\
        --output-dir /mnt/shared/sweeps/fedrcl_mnist
    python -m jobs.sweep jobs/sweeps/fedrcl_mnist.yaml train.rounds=3 --dry-run   # list the points
    python -m jobs.sweep jobs/sweeps/fedrcl_mnist.yaml --resume              # after `ray job stop` / a crash

Runs every point of the sweep file (docs/sweep.md) and writes sweep.parquet, tables/ and report/ into the
output directory. With ``engine.backend: ray`` the driver connects through ``fedray.core.ray_env.ensure_ray``:
under a job the supervisor's ``RAY_ADDRESS`` (the job's cluster), on a laptop a private local Ray. Exit
status: 0 done, 1 a point failed (named on stderr), 2 bad sweep file (nothing written), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from fedray.apps.arguments import add_sweep_arguments

    ap = argparse.ArgumentParser(prog="python -m jobs.sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_arguments(ap)
    args = ap.parse_intermixed_args(argv)

    from fedray.apps.sweep import main_cli
    from fedray.config import ConfigError
    from fedray.core.ray_env import RayConnectError
    from fedray.data.table import DataError

    try:
        return main_cli(args.sweep, args.overrides, output_dir=args.output_dir, dry_run=args.dry_run,
                        resume=args.resume, prog="jobs.sweep")
    except (ConfigError, DataError, FileNotFoundError) as e:
        print(f"jobs.sweep: error: {e}", file=sys.stderr)
        return 2
    except RayConnectError as e:
        print(f"jobs.sweep: error: cannot join Ray: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
