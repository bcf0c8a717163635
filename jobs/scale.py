"""Scaling-sweep entry point for `ray job submit` (and for a laptop, unchanged).

    python -m jobs.scale --config jobs/configs/scale_small.yaml                 # local Ray on this machine
    python -m jobs.scale --config jobs/configs/scale_small.yaml train.lr=0.1 --dry-run   # list the points
    ray job submit --working-dir . -- python -m jobs.scale --config jobs/configs/scale_full.yaml \\
        --output-dir /mnt/shared/fedray-scale

Runs every point of the scale file (docs/scaling.md) and writes scaling.parquet / .csv / .md and plots/*.png
into the output directory. Under a job the driver connects to the job's cluster (``RAY_ADDRESS``); on a
laptop it starts a private local Ray. Exit status 1 when a point failed (the table still has every row), 2 for a
bad scale file, 130 when stopped (Ctrl-C, `ray job stop`: the point running stops after its round in flight).
The table is rewritten after every point; after `ray job stop` (or a crash) ``--resume`` with the same
``--output-dir`` keeps the finished points and runs the rest. The last line printed names the output directory.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from fedray.apps.arguments import add_scale_arguments

    ap = argparse.ArgumentParser(prog="python -m jobs.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scale_arguments(ap, flag="--config")
    args = ap.parse_intermixed_args(argv)

    from fedray.apps.scale import main_cli
    from fedray.config import ConfigError
    from fedray.data.table import DataError

    try:
        return main_cli(args.scale, args.overrides, output=args.output_dir, dry_run=args.dry_run, resume=args.resume)
    except (ConfigError, DataError) as e:
        print(f"jobs.scale: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
