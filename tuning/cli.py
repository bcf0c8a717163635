"""``fedray tune`` and ``python -m jobs.tune``: a study's command line, in the shape every batch command shares
(:mod:`fedray.apps.arguments`), its dry run and its exit statuses::

    fedray tune STUDY.yaml [a.b=c ...] [--output-dir DIR] [--dry-run] [--resume] [--storage URL] [--outputs-only]

Only argparse and the study's types at import: ``fedray --help`` builds this parser without Optuna or the engine,
which :func:`run_cli` imports when a study runs."""

from __future__ import annotations

import itertools
import json
import sys

from fedray.apps.arguments import add_batch_arguments
from fedray.config import ConfigError, from_dict
from tuning.backend import mask_url
from tuning.space import DEFAULT_OUTPUT_DIR, StudySpec

#: grid points listed by the dry run (a larger grid is counted, not listed)
DRY_RUN_GRID_LINES = 50


def add_arguments(ap, flag: str | None = None) -> None:
    """The options of ``fedray tune`` and (``flag="--study"``) ``python -m jobs.tune``."""
    add_batch_arguments(
        ap, "study", "STUDY.yaml", "study file (docs/tuning.md)", flag=flag,
        output_dir=f"parent of the study directory (default: the study file's output_dir, else {DEFAULT_OUTPUT_DIR})",
        dry_run="list the search space, the trials known in advance (enqueued, a grid's points), the budget and the "
                "study directory; run and write nothing",
        resume="continue an existing study (after a crash, SIGKILL or Ctrl-C): finished trials are kept, trials left "
               "running are marked FAIL and re-run once with the same params")
    ap.add_argument("--storage", help="Optuna storage: a URL (postgresql://user@host/db) or a journal file path "
                                      "(default: the study file's storage, else <study dir>/journal.log)")
    ap.add_argument("--outputs-only", action="store_true",
                    help="only rebuild trials.csv/md, best_config.yaml and plots/ from the storage")


def dry_run(spec: StudySpec, *, output_dir=None, storage: str | None = None, resume: bool = False, log=print) -> int:
    """What ``fedray tune --dry-run`` prints: the study's search space, objective, sampler, pruner and budget, the
    trials known before any runs (enqueued points; every point of a grid), the slice of each trial, the study
    directory and storage. Nothing is run or written."""
    from tuning.study_dir import StudyDir  # with the launcher's lock: the engine, not needed by the parser

    base = from_dict(spec.base_config)
    sdir = StudyDir(spec, output_dir, storage)
    recorded = sdir.read()
    url = sdir.storage_url(recorded if resume else None)
    log(f"study {spec.name}" + (f": {spec.description}" if spec.description else ""))
    log(f"base config: {spec.base_config_path or 'inline'}" + (f" + {' '.join(spec.overrides)}" if spec.overrides else "")
        + f" -> {base.algorithm.name} on {base.data.source}, {spec.max_rounds()} rounds at most per trial")
    log(f"search space ({len(spec.params)} parameter(s)):")
    width = max(len(p.path) for p in spec.params)
    for p in spec.params:
        log(f"  {p.path:<{width}}  {p.describe()}")
    objectives = ", ".join(f"{o.metric} ({o.direction})" for o in spec.objectives)
    grid = spec.grid_size()
    n_trials = min(spec.n_trials, grid) if grid is not None else spec.n_trials
    log(f"objective: {objectives} | sampler {spec.sampler.name} (seed {spec.sampler.seed}) | pruner "
        f"{spec.pruner.name if spec.pruning else 'none'} | budget {n_trials} trials"
        + (f", {spec.timeout_s:g} s" if spec.timeout_s else ""))
    _known_trials(spec, grid, n_trials, log)
    r = spec.trial_resources
    workers = r.workers or base.engine.num_workers or 1
    log(f"trials at once: up to {spec.concurrency}, {workers} worker(s) each ({base.engine.backend} backend; fewer "
        f"when the cluster is smaller)")
    log(f"study directory: {sdir.path} (trials in {sdir.trials}/trial-NNNN/) | storage {mask_url(url)}")
    if recorded is not None:
        log("a study is there already: " + ("--resume continues it" if resume else "run with --resume to continue it"))
    return 0


def _known_trials(spec: StudySpec, grid: int | None, n_trials: int, log) -> None:
    """The trials known before any runs: the enqueued points, then every point of a grid sampler's grid."""
    if spec.enqueue:
        log(f"enqueued first ({len(spec.enqueue)}):")
        for point in spec.enqueue:
            log(f"  {json.dumps(point, sort_keys=True)}")
    if grid is None:
        log(f"then {spec.sampler.name} proposals up to the budget")
        return
    values = [p.grid_values() for p in spec.params]
    log(f"grid of {grid} point(s) (the grid sampler visits them in its own order):")
    for combo in itertools.islice(itertools.product(*values), min(n_trials, DRY_RUN_GRID_LINES)):
        log(f"  {json.dumps(dict(zip([p.path for p in spec.params], combo)), sort_keys=True)}")
    if n_trials > DRY_RUN_GRID_LINES:
        log(f"  ... ({n_trials - DRY_RUN_GRID_LINES} more)")


def run_cli(args, prog: str) -> int:
    """Shared body of the two command lines: run (or list with ``--dry-run``), print a summary, map errors to exit
    codes: 0 done, 1 study aborted or a trial's run failed, 2 a bad study file or arguments, 130 interrupted."""
    from fedray.data.table import DataError
    from tuning.driver import StudyAborted, tune
    from tuning.study import load_study
    from tuning.trial import first_line

    try:
        if args.dry_run:
            spec = load_study(args.study, overrides=args.overrides)
            code = dry_run(spec, output_dir=args.output_dir, storage=args.storage, resume=args.resume)
            print(f"{prog}: --dry-run: nothing was run or written", file=sys.stderr)
            return code
        res = tune(args.study, *args.overrides, storage=args.storage, resume=args.resume,
                   output_dir=args.output_dir, outputs_only=args.outputs_only)
    except (ConfigError, DataError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except StudyAborted as e:
        print(f"{prog}: study aborted: {e}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{v} {k.lower()}" for k, v in sorted(res.counts.items())) or "no trials"
    print(f"study {res.study_name}: {counts} | storage {res.storage}")
    for p in res.outputs:
        print(f"wrote {p}")
    print(f"study directory: {res.study_dir}")
    if res.interrupted:
        return 130
    if res.failed and not args.outputs_only:  # a grid point or sample without a value: never a quiet success
        print(f"{prog}: {len(res.failed)} trial(s) failed and are left out of the study's outputs; --resume runs each "
              f"once more:", file=sys.stderr)
        for t in res.failed:
            print(f"  trial {t.number} {json.dumps(t.params, sort_keys=True)}: {first_line(t.user_attrs.get('error'))}",
                  file=sys.stderr)
        return 1
    return 0
