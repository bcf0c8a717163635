"""The ``fedray`` command line.

    fedray run CONFIG [a.b=c ...]        run an experiment (or --resume RUN_DIR)
    fedray run CONFIG --dry-run          print the resolved config and the run directory, run nothing
    fedray up / fedray down              keep a local Ray running between runs (faster start-up) / stop it
    fedray show RUN_DIR                  status, rounds, accuracy and last checkpoint of one run directory
    fedray partition CONFIG [a.b=c ...]  build a partition (manifest + per-client shards), print statistics
    fedray datasets [CONFIG]             list sources, partitioners, models, algorithms, metrics (and CONFIG's plugins')
    fedray data [list] / data fetch NAME datasets on this machine and their data.root / download one (README, Real data)
    fedray new NAME                      write a plugin project ./NAME (a method, a model, a config, a test)
    fedray report RUN_DIR [RUN_DIR ...]  tables (per run, mean ± std over seeds) and PNG plots from run directories
    fedray report SWEEP_DIR              a sweep's tables and report again, from its run directories
    fedray report --sweep FILE RUN_DIR.. a sweep file's tables (beside its paper's numbers) of its points' runs
    fedray tune STUDY.yaml [a.b=c ...]   hyper-parameter study over whole runs (docs/tuning.md)
    fedray scale SCALE.yaml [a.b=c ...]  client-count scaling sweep -> Parquet table + plots (docs/scaling.md)
    fedray sweep SWEEP.yaml [a.b=c ...]  grid of runs (methods x settings x seeds) -> sweep.parquet + tables (docs/sweep.md)
    fedray bench [NAME [ARGS ...]]       list / run the benchmarks of bench/ (docs/benchmarks.md)

``python -m fedray ...`` is the same command line. Options and a.b=c overrides of ``run``, ``partition``, ``sweep``,
``tune`` and ``scale`` may come in any order; ``sweep``, ``tune`` and ``scale`` share ``--output-dir``, ``--dry-run``
and ``--resume`` (:mod:`fedray.apps.arguments`).
"""

from __future__ import annotations

import time

#: When this interpreter reached fedray's command line, as ``(time.perf_counter(), time.process_time())``:
#: the ``fedray`` command, ``python -m fedray`` and ``jobs.train`` import this module before anything else
#: that takes time. :func:`process_start` tells from it whether the process start that /proc records is the
#: interpreter's own (the usual case) or a shell's that ran other steps before it exec'd the interpreter
#: (``scripts/demo.sh``; exec keeps the pid, and so the recorded start).
ENTERED = (time.perf_counter(), time.process_time())

import argparse  # noqa: E402
import sys  # noqa: E402


def _dry_run(args) -> int:
    """``fedray run CONFIG --dry-run``: the resolved config (as config.yaml would hold it) and the run
    directory, after the checks ``fedray run`` makes before any work; writes nothing."""
    from pathlib import Path

    from fedray.config import dump_config, load_config
    from fedray.reporting.claim import default_run_name
    from fedray.plugins import check_registries  # the names checks `fedray run` and `fedray tune` make first

    if args.resume or not args.config:
        print("fedray run: --dry-run needs a CONFIG file (not --resume)", file=sys.stderr)
        return 2
    cfg = load_config(args.config, args.overrides)
    if args.output_dir:
        cfg.output.root = args.output_dir
    check_registries(cfg, args.config)
    print(dump_config(cfg), end="")
    print(f"run directory: {Path(cfg.output.root) / default_run_name(cfg)}")
    print("fedray run: --dry-run: nothing was run or written", file=sys.stderr)
    return 0


#: Wall seconds a process may spend off the CPU before :data:`ENTERED` and still count as an interpreter
#: starting (reading its files, waiting for a busy CPU: about 0.02 s on an idle machine); more is a shell
#: that waited for earlier steps and then exec'd the interpreter.
EXEC_WAIT_S = 0.5


def process_start() -> float:
    """The start of this process's interpreter, as a ``time.perf_counter()`` value: ``fedray run`` reports its
    start-up from there, interpreter and imports included, as the plain loop it is compared with does
    (docs/benchmarks.md).

    Normally the process's start from /proc (:func:`fedray.core.procinfo.proc_age_seconds`). But ``exec``
    keeps the pid, and with it the start /proc records: ``scripts/demo.sh`` runs its set-up (a minute the
    first time) and then execs ``fedray`` in the same process. An interpreter's own start is CPU work, so
    when the wall time before this module was imported (:data:`ENTERED`) exceeds the process's CPU time by
    more than :data:`EXEC_WAIT_S`, the process waited for something else first: the start is then that
    moment less the CPU time used so far (the interpreter's start, plus the few milliseconds a shell
    computes itself). Where /proc is missing: that moment."""
    from fedray.core.procinfo import proc_age_seconds

    entered, cpu = ENTERED
    age = proc_age_seconds()
    if age is None:
        return entered
    start = time.perf_counter() - age
    if entered - start - cpu > EXEC_WAIT_S:
        return max(start, entered - cpu)
    return start


def run_command(args, t0: float | None = None, log=print):
    """The work of ``fedray run`` (``args`` from :func:`build_parser`, with a CONFIG or ``--resume``): the
    :class:`~fedray.driver.runner.RunResult`. ``bench/workload_fedray.py`` runs the same code."""
    from fedray.config import load_config

    cfg = None
    if not args.resume:
        cfg = load_config(args.config, args.overrides)
        if args.output_dir:
            cfg.output.root = args.output_dir
    return run_with_early_start(cfg, args.resume, t0=t0, address=args.address, warm=not args.no_warm, log=log,
                                progress=not args.quiet, overwrite=args.overwrite)


class FinishedRun:
    """What :func:`run_with_early_start` returns when the run directory of a new run already holds this same
    config's finished run: nothing was started (no Ray, no data), as ``make`` leaves a built target alone."""

    interrupted = False

    def __init__(self, run_dir):
        from pathlib import Path

        self.run_dir = Path(run_dir)


def run_with_early_start(cfg, resume=None, *, t0: float | None, address: str | None = None, warm: bool = False,
                         log=print, **run_kw):
    """Begin Ray's early start (Ray and the run's actors, in the background), then import the runner and
    run: ``fedray run`` and ``jobs.train`` (``ray job submit``). Nothing before the early start imports
    torch, nor anything after it on a Ray run (tests/test_cli_imports.py). ``run_kw``: more of :func:`~fedray.driver.runner.run_experiment`'s.

    First, before anything starts, the run directory of a new run (:func:`fedray.reporting.claim.check_run_dir`):
    one that holds this config's finished run returns a :class:`FinishedRun`; one that holds another run
    (failed, interrupted, another config's) raises ``ConfigError``, unless ``overwrite``."""
    if cfg is not None and resume is None:
        from fedray.reporting.claim import check_run_dir, run_dir_of

        path = run_dir_of(cfg)
        if not check_run_dir(path, cfg, overwrite=run_kw.get("overwrite", False), finished_ok=True):
            return FinishedRun(path)
    from fedray.driver.launch import early_start

    early = early_start(cfg, resume, address, warm=warm, log=log, t0=t0)
    from fedray.driver.runner import run_experiment

    return run_experiment(cfg, resume=resume, ray_address=address, warm=warm, early=early, t0=t0, log=log,
                          **run_kw)


def result_table(run_dir) -> str:
    """The table ``fedray run`` prints at the end of a run (:func:`fedray.reporting.report.format_table`)."""
    from fedray.reporting.report import format_table, summarize
    from fedray.reporting.rundir import RunDir

    return format_table([summarize(RunDir(run_dir))])


def already_finished(res: FinishedRun, prog: str, table: bool = True) -> None:
    """What ``fedray run`` and ``jobs.train`` print for a :class:`FinishedRun`: its result table (unless not
    ``table``) and that nothing was run."""
    if table:
        print(result_table(res.run_dir))
    print(f"{prog}: {res.run_dir} already holds this config's finished run: nothing was run; add --overwrite to "
          f"run it again (deletes its results)", file=sys.stderr)


def _cmd_run(args) -> int:
    if args.dry_run:
        return _dry_run(args)
    if not args.resume and not args.config:
        print("fedray run: give a CONFIG file or --resume RUN_DIR", file=sys.stderr)
        return 2
    res = run_command(args, t0=process_start())
    if isinstance(res, FinishedRun):
        already_finished(res, "fedray run", table=not args.quiet)
    elif res.rounds and not args.quiet:
        print(result_table(res.run_dir))
    print(f"run directory: {res.run_dir}")
    return 130 if res.interrupted else 0


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _cmd_up(args) -> int:
    from fedray.core.ray_up import up

    up(num_cpus=args.num_cpus, num_gpus=args.num_gpus, object_store_memory=args.object_store_memory,
       idle_workers=args.idle_workers)
    return 0


def _cmd_down(args) -> int:
    from fedray.core.ray_up import down

    down()
    return 0


def _cmd_show(args) -> int:
    from fedray.reporting.report import describe_run

    print(describe_run(args.run_dir))
    return 0


def _cmd_partition(args) -> int:
    from fedray.config import load_config
    from fedray.data.stats import format_summary, partition_summary, plot_label_distribution
    from fedray.driver.setup import prepare_data

    from fedray.plugins import check_driver

    cfg = load_config(args.config, args.overrides)
    if args.output_dir:
        cfg.data.cache_dir = args.output_dir
    check_driver(cfg)  # the data source and partitioner exist (a plugin's are imported)
    from fedray.data.stats import client_rows, format_client_rows, plot_client_summary, write_client_table

    bundle, store = prepare_data(cfg, print)
    print(format_summary(partition_summary(store)))
    print()
    rows = client_rows(store, None if args.clients < 0 else args.clients)
    print(format_client_rows(rows, None, total=store.num_clients))
    table = write_client_table(store, store.path / "clients.csv")
    summary_png = plot_client_summary(store, store.path / "client_summary.png")
    png = store.path / "label_distribution.png"
    plot_label_distribution(store, png)
    print(f"partition {store.hash}: {store.num_clients} clients -> {store.path}")
    print(f"per-client table: {table}")
    print(f"label distribution plot: {png}")
    print(f"client sizes and classes held (every client): {summary_png}")
    if args.plot:
        heat = plot_label_distribution(store, store.path / "label_heatmap.png", kind="heatmap")
        print(f"label distribution heat map: {heat}")
    return 0


def _cmd_datasets(args) -> int:
    from fedray.algorithms import ALGORITHMS, SERVER_OPTIMIZERS
    from fedray.core.params import param_lines
    from fedray.core.registry import is_builtin
    from fedray.data.partition import PARTITIONERS
    from fedray.data.sources import SOURCES
    from fedray.models import MODELS

    if args.config or args.plugin:
        from pathlib import Path

        from fedray.config import from_dict, load_config, resolve_plugins
        from fedray.plugins import load_plugins

        cfg = load_config(args.config) if args.config else from_dict({})
        if args.plugin:  # paths on the command line are relative to the working directory
            extra = [str(Path(p).resolve()) if p.endswith(".py") or "/" in p else p for p in args.plugin]
            cfg.plugins, cfg.plugin_code = [*cfg.plugins, *extra], {}
            resolve_plugins(cfg, str(Path(args.config).resolve().parent) if args.config else None)
        load_plugins(cfg)

    def entry(reg, name: str, text: str, params=None) -> None:
        """One registry entry: its name, first description line and the plugin it comes from, then its
        parameters (default, rule, doc)."""
        text = (text or "").strip()
        owner = reg.module(name)
        origin = "" if is_builtin(owner) else f"  [plugin {owner}]"
        print(f"  {name:18s} {text.splitlines()[0] if text else ''}{origin}")
        for line in param_lines(params or {}, indent=" " * 23):
            print(line)

    print("data sources (data.source; data.params):")
    for name, spec in sorted(SOURCES.items()):
        entry(SOURCES, name, spec.description, spec.params)
    print("\npartitioners (data.partition.name; data.partition.params):")
    for name, spec in sorted(PARTITIONERS.items()):
        entry(PARTITIONERS, name, spec.doc, spec.params)
    print("\nmodels (model.name):")
    for name, spec in MODELS.items():
        entry(MODELS, name, spec.description)
    print("\nalgorithms (algorithm.name; algorithm.params):")
    for name, cls in sorted(ALGORITHMS.items()):
        entry(ALGORITHMS, name, cls.description, cls.params_spec)
    print("\nserver optimizers (server.name; server.params):")
    for name, cls in SERVER_OPTIMIZERS.items():
        entry(SERVER_OPTIMIZERS, name, cls.description, cls.params_spec)
    from fedray.metrics.registry import METRICS

    print("\nevaluation metrics (eval.metrics):")
    for name, spec in sorted(METRICS.items()):
        entry(METRICS, name, spec.description)
    return 0


def _cmd_new(args) -> int:
    from fedray.scaffold import new_project

    root = new_project(args.name, args.dir)
    print(f"wrote {root}: run `fedray run {root / 'exp.yaml'}`, test with `cd {root} && python -m pytest -q`")
    return 0


def _cmd_report(args) -> int:
    from pathlib import Path

    from fedray.reporting.report import report

    default_table = args.metric == "accuracy" and args.target is None
    try:
        if args.sweep:
            from fedray.apps.sweep import tables_of

            if not default_table:
                raise ValueError("with --sweep the tables are the sweep file's (its metrics and target)")
            text, files = tables_of(args.sweep, args.runs, args.out or "report")
        elif len(args.runs) == 1 and (Path(args.runs[0]) / "sweep.json").is_file():
            from fedray.apps.sweep import rebuild_report

            if args.out or not default_table:
                raise ValueError("a sweep directory's tables and report are rebuilt in place from its sweep file's "
                                 "tables: --out, --metric and --target apply to run directories")
            text, files = rebuild_report(args.runs[0])
        else:
            text, files = report(args.runs, args.out, metric=args.metric, target=args.target)
    except ValueError as e:  # ConfigError included
        print(f"fedray report: error: {e}", file=sys.stderr)
        return 2
    print(text)
    for f in files:
        print(f"wrote {f}")
    return 0


def _cmd_scale(args) -> int:
    from fedray.apps.scale import main_cli

    return main_cli(args.scale, args.overrides, output=args.output_dir, dry_run=args.dry_run, resume=args.resume)


def _cmd_sweep(args) -> int:
    from fedray.apps.sweep import main_cli

    return main_cli(args.sweep, args.overrides, output_dir=args.output_dir, dry_run=args.dry_run,
                    resume=args.resume)


def bench_scripts() -> dict:
    """name -> path of the repository's ``bench/bench_<name>.py`` scripts (empty outside a source checkout:
    the benchmarks are not installed with the package)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "bench"
    return {p.stem[len("bench_"):]: p for p in sorted(root.glob("bench_*.py"))} if root.is_dir() else {}


def _cmd_bench(args) -> int:
    import ast
    import subprocess

    scripts = bench_scripts()
    if not scripts:
        print("fedray bench: no bench/ folder next to this fedray package; the benchmarks ship with the source "
              "repository (run from a checkout: bash scripts/setup.sh)", file=sys.stderr)
        return 2
    if args.name is None:
        for name, path in scripts.items():
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            print(f"{name:14s} {doc.splitlines()[0] if doc else ''}")
        print("run one: fedray bench NAME [ARGS ...]  (ARGS go to the script; fedray bench NAME --help)")
        return 0
    if args.name not in scripts:
        print(f"fedray bench: unknown benchmark {args.name!r} (known: {', '.join(scripts)})", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(scripts[args.name]), *args.args])


def _cmd_tune(args) -> int:
    from tuning.cli import run_cli

    return run_cli(args, "fedray tune")


#: Subcommands whose positional a.b=c overrides may be mixed with options (argparse's intermixed parsing).
INTERMIXED = ("run", "partition", "sweep", "tune", "scale")


def _add_experiment_commands(sub) -> None:
    r = sub.add_parser("run", help="run an experiment from a YAML/TOML config (or resume one)",
                       description="Run one FL experiment. Overrides take the form a.b=c, e.g. "
                                   "train.rounds=20 data.partition.params.alpha=0.1 engine.backend=local. "
                                   "Ctrl-C (or SIGTERM, e.g. `ray job stop`) writes a checkpoint and stops; "
                                   "--resume RUN_DIR continues to the same result as an uninterrupted run. "
                                   "Options and overrides may come in any order.")
    r.add_argument("config", nargs="?", help="experiment config (YAML or TOML)")
    r.add_argument("overrides", nargs="*", help="a.b=c overrides")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its last checkpoint")
    r.add_argument("--output-dir", help="root directory for run directories (output.root)")
    r.add_argument("-q", "--quiet", action="store_true", help="no per-round progress")
    r.add_argument("--address", metavar="HOST:PORT",
                   help="join exactly this Ray cluster (its GCS address; engine.ray_address, RAY_ADDRESS); "
                        "default: a private local Ray on 127.0.0.1 with token authentication")
    r.add_argument("--no-warm", action="store_true",
                   help="ignore the Ray that `fedray up` keeps running and start a private one (also "
                        "FEDRAY_NO_WARM=1)")
    r.add_argument("--overwrite", action="store_true",
                   help="start over in a run directory that already holds a run (deletes its results)")
    r.add_argument("--dry-run", action="store_true",
                   help="print the resolved config and the run directory it would use; run and write nothing")
    r.set_defaults(func=_cmd_run)

    up = sub.add_parser("up", help="start a local Ray that stays up, so `fedray run` starts faster",
                        description="Start a local Ray (127.0.0.1 only, token authentication on, its own ports "
                                    "and temp dir) that stays up between runs: `fedray run` without an address "
                                    "joins it (and says so) instead of starting Ray each time; `fedray run "
                                    "--no-warm` ignores it; `fedray down` stops it. Its worker processes import "
                                    "torch and fedray before they take work.")
    up.add_argument("--num-cpus", type=int, help="logical CPUs of the node (default: the machine's cores)")
    up.add_argument("--num-gpus", type=int, help="GPUs of the node (default: what Ray detects)")
    up.add_argument("--object-store-memory", type=int, metavar="BYTES", help="object store size (default: Ray's)")
    up.add_argument("--idle-workers", type=_non_negative_int, metavar="N",
                    help="worker processes kept started and idle, with torch and fedray imported, for the next "
                         "run's actors; refilled as each run exits; about 250 MB each (default: CPUs + 1, a "
                         "default run's workers and coordinator; 0: none)")
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="stop the Ray that `fedray up` started",
                          description="Stop exactly the processes of the Ray `fedray up` started (never another "
                                      "Ray of the machine) and remove its record.")
    down.set_defaults(func=_cmd_down)

    sh = sub.add_parser("show", help="summary of one run directory: status, rounds, accuracy, last checkpoint",
                        description="Print RUN_DIR's status, algorithm, model, source, rounds done / configured, "
                                    "last / EMA / best accuracy, last checkpoint and, unless it finished, the "
                                    "command that resumes it.")
    sh.add_argument("run_dir", metavar="RUN_DIR")
    sh.set_defaults(func=_cmd_show)

    pa = sub.add_parser("partition", help="partition a dataset into packed client files and print statistics",
                        description="Load the config's data source, run its partitioner and write the packed "
                                    "partition (a client index, a manifest and a few large Arrow IPC files), "
                                    "clients.csv (every client), a label-distribution plot of the first clients "
                                    "and client_summary.png (sizes and classes held over every client). Reuses "
                                    "an identical existing partition.")
    pa.add_argument("config")
    pa.add_argument("overrides", nargs="*")
    pa.add_argument("--output-dir", help="partition cache directory (data.cache_dir)")
    pa.add_argument("--clients", type=int, default=20, metavar="N",
                    help="print the first N clients' statistics (-1: all; every client is in clients.csv)")
    pa.add_argument("--plot", action="store_true",
                    help="also write label_heatmap.png next to clients.csv: a clients x classes heat map of "
                         "sample counts")
    pa.set_defaults(func=_cmd_partition)


def _add_report_commands(sub) -> None:
    d = sub.add_parser("datasets", help="list data sources, partitioners, models, algorithms and metrics",
                       description="List every registered data source, partitioner, model, algorithm, "
                                   "server optimizer and evaluation metric with a one-line description; with a "
                                   "CONFIG (or --plugin), "
                                   "its plugins' entries too, each with the module it comes from.")
    d.add_argument("config", nargs="?", metavar="CONFIG", help="an experiment config whose plugins: to list")
    d.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="a plugin module (or path) to list as well; repeatable")
    d.set_defaults(func=_cmd_datasets)

    n = sub.add_parser("new", help="write a plugin project: a method, a model, a config and a test",
                       description="Write ./NAME/: a package NAME registering an algorithm and a model, exp.yaml "
                                   "naming it in plugins:, a test of its loss and a two-round run, a README "
                                   "(docs/extending.md). An existing directory is refused.")
    n.add_argument("name", metavar="NAME", help="the plugin's module name (a lower-case Python identifier)")
    n.add_argument("--dir", default=".", help="where to create NAME/ (default: the working directory)")
    n.set_defaults(func=_cmd_new)

    rep = sub.add_parser("report", help="tables and PNG plots from one or more run directories",
                         description="Summarise run directories side by side: summary.md / summary.csv (one "
                                     "row per run); runs whose configs differ only by seed grouped, with mean ± "
                                     "std over seeds (groups.md / groups.csv); a methods x settings table of "
                                     "--metric (table.md / table.csv / table.tex); accuracy and loss curves "
                                     "(shaded mean ± std bands when there are several seeds), per-domain "
                                     "accuracy and feature-analysis metrics when the runs logged them.")
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rep.add_argument("--out", help="output directory (default RUN_DIR/report, or ./report for several runs)")
    rep.add_argument("--sweep", metavar="SWEEP.yaml", help="this sweep file's tables (and paper: comparison) of "
                     "those RUN_DIRs that are its finished points, wherever they lie, into --out (default ./report)")
    rep.add_argument("--metric", default="accuracy",
                     help="what the cells of the methods x settings table (table.md/csv/tex) show, mean ± std "
                          "over seeds: accuracy (final, the default), ema_accuracy, best_accuracy, "
                          "rounds_to_target, mean_last5, a metric of the runs' eval.metrics (e.g. "
                          "balanced_accuracy, per_class_accuracy.3: its final value) or REDUCTION:KEY of a "
                          "per-round key (e.g. max:macro_f1, last:analysis.effective_rank)")
    rep.add_argument("--target", type=float, metavar="ACCURACY",
                     help="also report rounds to reach this test accuracy (e.g. 0.8): the first round whose "
                          "accuracy reaches it; seeds that never do are counted as not reached")
    rep.set_defaults(func=_cmd_report)


def _add_study_commands(sub) -> None:
    """``tune``, ``scale`` and ``sweep``: one command-line shape (:mod:`fedray.apps.arguments`), and ``bench``."""
    from fedray.apps.arguments import add_scale_arguments, add_sweep_arguments
    from tuning.cli import add_arguments as add_tune_arguments

    tu = sub.add_parser("tune", help="hyper-parameter study (Optuna) over whole FL runs, trials in parallel",
                        description="Run the Optuna study described by STUDY.yaml (docs/tuning.md): each trial is "
                                    "one FL run, pruned per round, several trials at once on slices of the Ray "
                                    "cluster; writes trials.csv/md, best_config.yaml and plots/ into the study "
                                    "directory. --resume continues a crashed or interrupted study.")
    add_tune_arguments(tu)
    tu.set_defaults(func=_cmd_tune)

    sc = sub.add_parser("scale", help="client-count scaling sweep: throughput, latency split, memory -> table + plots",
                        description="Run the sweep described by SCALE.yaml (docs/scaling.md): population size, clients "
                                    "per round, client workers and engine.multi_client; one short run per point. "
                                    "Writes scaling.parquet/csv/md and plots/*.png into the output directory.")
    add_scale_arguments(sc)
    sc.set_defaults(func=_cmd_scale)

    sw = sub.add_parser("sweep", help="grid of runs (methods x settings x seeds), resumable -> sweep.parquet + "
                                      "mean ± std tables",
                        description="Run every point of SWEEP.yaml (docs/sweep.md): each point one ordinary fedray run "
                                    "in <output_dir>/runs/, several at once on slices of the Ray cluster. Writes "
                                    "sweep.parquet (one row per point, after every point), the table: pivots (mean ± "
                                    "std over seeds) as tables/*.md/csv/tex and a fedray report of the runs. Exit 1 "
                                    "when a point failed (named), 2 for a bad sweep file (nothing written).")
    add_sweep_arguments(sw)
    sw.set_defaults(func=_cmd_sweep)

    be = sub.add_parser("bench", help="list or run the benchmarks of bench/ (they print figures, never assert)",
                        description="Without NAME: list the benchmark scripts of the repository's bench/ folder. "
                                    "With NAME: run bench/bench_NAME.py with the remaining arguments, e.g. "
                                    "`fedray bench workload --flower`. Measured figures: docs/benchmarks.md.")
    be.add_argument("name", nargs="?", metavar="NAME")
    be.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    be.set_defaults(func=_cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedray", description="Federated-learning simulation on Ray.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    _add_experiment_commands(sub)
    _add_report_commands(sub)
    from fedray.data.commands import add_data_commands  # argparse only: `fedray --help` stays fast
    add_data_commands(sub)
    _add_study_commands(sub)
    return p


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse the command line; the subcommands of :data:`INTERMIXED` accept options after their
    overrides (``fedray run c.yaml a.b=c --quiet``) and overrides after options
    (``fedray run c.yaml --output-dir X a.b=c``), which plain ``parse_args`` rejects."""
    if argv and argv[0] in INTERMIXED:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, sys.argv[1:] if argv is None else list(argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as e:
        return _failed(args, e)


def console() -> None:
    """The ``fedray`` command (console script, ``python -m fedray``): :func:`main`, then the process ends
    without the interpreter's teardown (:func:`fedray.core.process_exit.leave`: 0.3-0.8 s of freeing torch,
    pyarrow and Ray after the last result is written). An exception that escapes :func:`main` ends it the
    usual way, with its traceback."""
    code = main()
    from fedray.core.process_exit import leave

    leave(code)


def _failed(args, e: Exception) -> int:
    """Exit status and one line for the errors a user can fix; anything else propagates (imported here, not
    at start: pyarrow for DataError alone costs 0.2 s of every command's start)."""
    from fedray.core.errors import ConfigError, DiskFull
    from fedray.core.ray_env import RayConnectError
    from fedray.data.table import DataError
    from fedray.engine.dispatch import RoundAborted, RunAborted

    if isinstance(e, (ConfigError, DataError, FileNotFoundError)):
        print(f"fedray {args.command}: error: {e}", file=sys.stderr)
        return 2
    if isinstance(e, RayConnectError):
        print(f"fedray {args.command}: error: cannot join Ray: {e}", file=sys.stderr)
        return 2
    if isinstance(e, (RoundAborted, RunAborted, DiskFull)):
        cause = getattr(e, "cause", None) or e  # a Ray task error keeps the coordinator's exception as its cause
        print(f"fedray {args.command}: run failed: {cause}", file=sys.stderr)
        return 1
    raise e


if __name__ == "__main__":
    console()
