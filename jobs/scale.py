"""Scaling-sweep entry point for `ray job submit` (and for a laptop, unchanged).

    python -m jobs.scale --config jobs/configs/scale_small.yaml                 # local Ray on this machine
    ray job submit --working-dir . -- python -m jobs.scale --config jobs/configs/scale_full.yaml \\
        --output-dir /mnt/shared/fedray-scale

Runs every point of the scale file (docs/scaling.md) and writes scaling.parquet / .csv / .md and plots/*.png
into the output directory. Under a job the driver connects to the job's cluster (``RAY_ADDRESS``); on a
laptop it starts a private local Ray. Exit status 1 when a point failed (the table still has every row).
The table is rewritten after every point; after `ray job stop` (or a crash) ``--resume`` with the same
``--output-dir`` keeps the finished points and runs the rest. The last line printed names the output directory.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="scale file (YAML/TOML), relative to the working dir")
    ap.add_argument("--output-dir", help="output directory (default: the scale file's output field)")
    ap.add_argument("--dry-run", action="store_true", help="list the points and exit")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points a stopped sweep into the same output directory finished; run the rest")
    args = ap.parse_args(argv)

    from fedray.config import ConfigError
    from fedray.data.table import DataError
    from fedray.apps.scale import main_cli

    try:
        return main_cli(args.config, output=args.output_dir, dry_run=args.dry_run, resume=args.resume)
    except (ConfigError, DataError) as e:
        print(f"jobs.scale: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
