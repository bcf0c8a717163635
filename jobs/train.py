"""Training-run entry point for `ray job submit` (and for a laptop, unchanged).

    ray job submit --working-dir . --runtime-env cluster/runtime_env.yaml -- \
        python -m jobs.train --config jobs/configs/demo.yaml --output-dir /mnt/shared/fedray-runs
    python -m jobs.train --config jobs/configs/demo.yaml            # local Ray on this machine

The driver connects with plain ``ray.init()``: under a job the supervisor's ``RAY_ADDRESS`` is used,
on a laptop a local Ray starts. ``ray job stop`` sends SIGTERM; the run writes a checkpoint and the
job can be resubmitted with ``--resume RUN_DIR``. The last line printed names the run directory. A config whose
run directory already holds its finished run prints that run's result table and starts nothing (``--overwrite``
runs it again); a run directory holding a failed or interrupted run is refused before Ray starts. The process
ends as ``fedray run``'s does (:func:`fedray.core.process_exit.leave`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="experiment config (YAML/TOML), relative to the working dir")
    ap.add_argument("--output-dir", help="root of run directories (a path valid on the driver's node)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run")
    ap.add_argument("--overwrite", action="store_true",
                    help="start over in a run directory that already holds a run (deletes its results)")
    ap.add_argument("overrides", nargs="*", help="a.b=c config overrides")
    args = ap.parse_args(argv)

    from fedray.cli import FinishedRun, already_finished, process_start, run_with_early_start
    from fedray.config import ConfigError, load_config

    t0 = process_start()  # the start-up it reports counts from here, as `fedray run`'s does

    try:
        if args.resume:
            if not Path(args.resume).is_dir():
                raise ConfigError(f"--resume: run directory {args.resume!r} does not exist on this node "
                                  f"(cwd {os.getcwd()}); use a shared filesystem path")
            res = run_with_early_start(None, args.resume, t0=t0)
        else:
            if not args.config:
                raise ConfigError("--config: required (or --resume RUN_DIR)")
            if not Path(args.config).is_file():
                raise ConfigError(f"--config: file {args.config!r} not found in the job's working directory "
                                  f"{os.getcwd()} (was it excluded from the upload, or is the path relative to "
                                  f"another directory?)")
            cfg = load_config(args.config, args.overrides)
            if args.output_dir:
                cfg.output.root = args.output_dir
            if cfg.data.root and not Path(cfg.data.root).exists():
                from fedray.data.table import DataError  # pyarrow: not before Ray's early start

                raise DataError(f"data.root: {cfg.data.root!r} does not exist on the driver's node; on a cluster "
                                f"it must be a path every node sees (a shared filesystem mount)")
            res = run_with_early_start(cfg, t0=t0, overwrite=args.overwrite)
    except Exception as e:
        from fedray.data.table import DataError

        if not isinstance(e, (ConfigError, DataError)):
            raise
        print(f"jobs.train: error: {e}", file=sys.stderr)
        return 2
    if isinstance(res, FinishedRun):  # this config's run is already done: its table, nothing started
        already_finished(res, "jobs.train")
    print(f"run directory: {res.run_dir.resolve()}")
    return 130 if res.interrupted else 0


if __name__ == "__main__":
    # as the `fedray` command: after the atexit handlers and a flush, without freeing torch, pyarrow and Ray
    # module by module (0.3-0.8 s after the last line; fedray.core.process_exit)
    from fedray.core.process_exit import leave

    leave(main())
