"""The command line the batch applications share: ``fedray sweep``, ``fedray tune`` and ``fedray scale`` (and their
``ray job submit`` entry points ``python -m jobs.sweep | jobs.tune | jobs.scale``)::

    fedray COMMAND FILE.yaml [a.b=c ...] [--output-dir DIR] [--dry-run] [--resume]

``a.b=c`` overrides of the base experiment may stand anywhere on the line (the parsers are intermixed);
``--dry-run`` lists the runs that would start (points, trials) and where, running and writing nothing; ``--resume``
continues the batch in its output directory; progress is a bar on a terminal and one line per run otherwise
(:class:`fedray.apps.launcher.Launcher`). Only argparse here: ``fedray --help`` builds every parser without the
engine.
"""

from __future__ import annotations

__all__ = ["add_batch_arguments", "add_scale_arguments", "add_sweep_arguments"]


def add_batch_arguments(ap, dest: str, metavar: str, what: str, *, output_dir: str, dry_run: str, resume: str,
                        flag: str | None = None) -> None:
    """The shared shape: the file (positional, or the option ``flag`` such as ``--study``), the overrides,
    ``--output-dir``, ``--dry-run`` and ``--resume``, with each command's own help."""
    if flag:
        ap.add_argument(flag, dest=dest, metavar=metavar, required=True, help=what)
    else:
        ap.add_argument(dest, metavar=metavar, help=what)
    ap.add_argument("overrides", nargs="*", metavar="a.b=c",
                    help="overrides of the base experiment, anywhere on the line (e.g. train.rounds=3)")
    ap.add_argument("--output-dir", help=output_dir)
    ap.add_argument("--dry-run", action="store_true", help=dry_run)
    ap.add_argument("--resume", action="store_true", help=resume)


def add_sweep_arguments(ap) -> None:
    """``fedray sweep`` and ``python -m jobs.sweep``."""
    add_batch_arguments(
        ap, "sweep", "SWEEP.yaml", "sweep file (docs/sweep.md)",
        output_dir="the sweep's directory (default: the sweep file's output_dir, else runs/sweeps/<name>)",
        dry_run="list the points and their run directories; run nothing",
        resume="continue the sweep in --output-dir: finished points kept, interrupted ones continue from their "
               "checkpoints, failed ones start over")


def add_scale_arguments(ap, flag: str | None = None) -> None:
    """``fedray scale`` and ``python -m jobs.scale`` (``flag="--config"``)."""
    add_batch_arguments(
        ap, "scale", "SCALE.yaml", "scale file (docs/scaling.md)", flag=flag,
        output_dir="output directory (default: the scale file's output field)",
        dry_run="list the points and the output directory; run nothing",
        resume="keep the points an interrupted sweep into the same output directory finished; run the rest")
