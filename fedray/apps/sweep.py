"""``fedray sweep SWEEP.yaml`` and ``python -m jobs.sweep``: a grid of ordinary fedray runs, resumable, with tables.

Every point of the sweep file (:mod:`fedray.apps.sweep_spec`) is one ``run_experiment`` run in its own run
directory ``<output_dir>/runs/<algorithm>-<config hash>`` (the name ``fedray run`` gives the same config).
Several points run at once through :class:`fedray.apps.launcher.Launcher`, each with its own coordinator and
client workers, a slice of the Ray cluster sized as ``fedray tune`` sizes trials (:mod:`fedray.apps.slices`).

Outputs in the output directory: ``sweep.json`` (the resolved sweep: base config, points, tables; its driver
sessions, each with its pid, host and end: ``running``, ``finished``, ``interrupted``, ``crashed``, or ``killed``
when a later session found its driver dead),
``sweep.parquet`` (one row per point, :data:`COLUMNS`; rewritten atomically whenever a point ends),
``tables/<table>.<metric>.{md,csv,tex}`` and ``tables.md`` (the ``table:`` pivots, mean ± std over seeds,
by :mod:`fedray.reporting.seeds`), ``report/`` (``fedray report`` of all finished runs: per-run summary, groups,
curves with seed bands), ``logs/pNNN.log`` (each point's driver log) and ``runs/``.

``--resume`` (the output directory holds a sweep): finished points are kept and not run again; a point left
``running`` (its driver was killed) or ``interrupted`` continues from its last checkpoint (engine resume,
the same numbers as an uninterrupted run) or starts over when it has none (its run.json reads ``killed``
meanwhile: :func:`fedray.core.owner.read_run_status`); a ``failed`` point starts over
from round 1 (its error is kept in its old ``run.json`` only until then). An exclusive lock on
``sweep.lock`` guarantees that no other driver is running the sweep, so a ``running`` point is orphaned.

Testing aid: ``FEDRAY_SWEEP_KILL_AT=P:R`` SIGKILLs the sweep driver when point P records round R (before that
round's checkpoint), a deterministic crash for the resume tests.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fedray.apps.launcher import Job, Launcher, RunOutcome, output_lock
from fedray.apps.slices import apply_slice, plan_slices
from fedray.apps.sweep_spec import SweepSpec, TableSpec, load_sweep
from fedray.config import ConfigError, from_dict
from fedray.core.io import atomic_write_text, atomic_writer
from fedray.core.owner import crash_reason, owner_record, read_run_status, settle_sessions
from fedray.reporting.rundir import RunDir

RECORD = "sweep.json"
KILL_ENV = "FEDRAY_SWEEP_KILL_AT"

#: The columns of ``sweep.parquet`` after ``point`` and one column per varying field (named by the field).
COLUMNS: dict[str, str] = {
    "status": "pending, running, finished, failed or interrupted",
    "run_dir": "the point's run directory",
    "config_hash": "its config hash (the run directory's name after the algorithm)",
    "rounds": "rounds recorded",
    "rounds_total": "train.rounds",
    "accuracy": "test accuracy at the last evaluated round",
    "ema_accuracy": "EMA test accuracy at the last evaluated round",
    "best_accuracy": "best test accuracy over the rounds",
    "best_round": "the round of best_accuracy",
    "mean_last5": "mean test accuracy of the last five evaluated rounds",
    "seconds": "wall seconds of the run (the last session of a resumed run)",
    "resumed_from": "the checkpoint round a resumed point continued from (null: ran from round 1)",
    "error": "why a point failed",
}


@dataclass
class SweepResult:
    spec: SweepSpec
    rows: list[dict]
    files: list[Path] = field(default_factory=list)
    interrupted: bool = False

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "failed"]


# ------------------------------------------------------------------------------------------- rows
def _run_status(rd: RunDir) -> str | None:
    """A point's run status (None: not started); a run whose driver died says ``killed``
    (:func:`fedray.core.owner.read_run_status`)."""
    if not rd.holds_run():
        return None
    info, status, _ = read_run_status(rd.path)
    return status if info else "running"


def point_row(spec: SweepSpec, i: int, status: str, **extra) -> dict:
    """One row of sweep.parquet, the metrics read from the point's run directory (as fedray report does)."""
    from fedray.reporting.report import summarize

    p = spec.points[i]
    rd = RunDir(p.run_dir)
    row = {c: None for c in COLUMNS}
    row |= {"point": i, **p.values, "status": status, "run_dir": str(p.run_dir), "config_hash": p.hash,
           "rounds_total": p.rounds}
    if rd.metrics_path.exists():
        s = summarize(rd)
        row.update({k: s[k] for k in ("rounds", "accuracy", "ema_accuracy", "best_accuracy", "best_round",
                                      "mean_last5")})
    if (rd.path / "summary.json").is_file():
        row["seconds"] = rd.read_json("summary.json").get("total_seconds")
    row.update(extra)
    return row


_INT_COLUMNS = ("point", "rounds", "rounds_total", "best_round", "resumed_from")
_STR_COLUMNS = ("status", "run_dir", "config_hash", "error")


def _arrow_column(values: list, name: str = ""):
    """A column of sweep.parquet: fixed types for :data:`COLUMNS`, inferred for the sweep's fields."""
    import pyarrow as pa

    if name in _INT_COLUMNS:
        return pa.array([None if v is None else int(v) for v in values], type=pa.int64())
    if name in _STR_COLUMNS:
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    if name in COLUMNS:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.bool_())
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.int64())
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    if all(isinstance(v, str) for v in present):
        return pa.array(values, type=pa.string())
    return pa.array([None if v is None else json.dumps(v, sort_keys=True, default=str) for v in values],
                    type=pa.string())  # lists and mappings (e.g. algorithm.params) as JSON


def write_parquet(spec: SweepSpec, rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = ["point", *spec.fields, *COLUMNS]
    table = pa.Table.from_arrays([_arrow_column([r.get(n) for r in rows], n) for n in names], names=names)
    meta = {"fedray.columns": json.dumps(COLUMNS), "fedray.fields": json.dumps(spec.fields)}
    table = table.replace_schema_metadata({k.encode(): v.encode() for k, v in meta.items()})
    with atomic_writer(path) as f:
        pq.write_table(table, f)


# ------------------------------------------------------------------------------------------- tables
def _metric_file(metric: str) -> str:
    return metric.replace(":", "-")


def write_tables(tables: list[TableSpec], run_dirs: list[Path], out: Path, notes: list[str] = ()) -> tuple[str, list[Path]]:
    """The sweep's pivot tables (mean ± std over seeds) of the finished runs into ``out/tables`` and
    ``out/tables.md``; returns (Markdown of all, files written)."""
    from fedray.reporting.report import summarize
    from fedray.reporting.seeds import group_runs, label_by, pivot, pivot_csv, pivot_latex, pivot_markdown

    rds = [RunDir(p) for p in run_dirs]
    groups, group_notes = group_runs(rds, [summarize(rd) for rd in rds])
    parts, files = [], []
    for t in tables:
        label_by(groups, t.rows, t.columns)
        for m in t.metrics:
            piv = pivot(groups, m, t.target, first_seen=True)
            base = out / "tables" / f"{t.name}.{_metric_file(m)}"
            md = pivot_markdown(piv)
            for suffix, text in ((".md", md + "\n"), (".csv", pivot_csv(piv)), (".tex", pivot_latex(piv))):
                atomic_write_text(base.with_name(base.name + suffix), text)
                files.append(base.with_name(base.name + suffix))
            parts.append(f"## {t.name}: {m}\n\n{md}\n")
            if t.paper is not None and t.paper["metric"] == m:  # beside the paper's numbers, with its claims
                from fedray.reporting.paper import paper_markdown

                text = paper_markdown(piv, t.paper)
                path = out / "tables" / f"{t.name}.paper.md"
                atomic_write_text(path, text + "\n")
                files.append(path)
                parts.append(f"## {t.name}: {m} beside the paper\n\n{text}\n")
    text = "\n".join(parts) + "".join(f"\nnote: {n}" for n in [*notes, *group_notes])
    atomic_write_text(out / "tables.md", text + "\n")
    return text, [out / "tables.md", *files]


def _final_outputs(spec: SweepSpec, rows: list[dict], log) -> tuple[str, list[Path]]:
    from fedray.reporting.report import report

    done = [spec.points[r["point"]].run_dir for r in rows if r["status"] == "finished"]
    notes = [f"point {r['point']} ({spec.points[r['point']].describe()}) is {r['status']}, left out"
             for r in rows if r["status"] != "finished"]
    if not done:
        log("[sweep] no finished point: no tables")
        return "", []
    text, files = write_tables(spec.tables, done, spec.output_dir, notes) if spec.tables else ("", [])
    _, more = report(done, spec.output_dir / "report")
    return text, [*files, *more]


def tables_of(sweep_file: str | Path, run_dirs: list[str | Path], out: str | Path) -> tuple[str, list[Path]]:
    """``fedray report --sweep FILE RUN_DIR ...``: the sweep file's tables (with the paper's numbers where it gives
    them) of those run directories that are its points and finished, wherever they are (e.g. the small outputs
    kept in ``docs/results/<sweep>/``, gathered over several machines); the others are named in a note."""
    spec = load_sweep(sweep_file)
    if not spec.tables:
        raise ConfigError(f"{sweep_file}: the sweep file has no tables: (nothing to make)")
    names = {p.run_dir.name: p for p in spec.points}
    own = {(Path(out) / "tables.md").resolve(), (Path(out) / "tables").resolve()}  # what an earlier call wrote here
    done, notes = [], []
    for d in run_dirs:
        path = Path(d)
        if not path.exists():
            raise ConfigError(f"{str(d)!r}: no such run directory")
        if path.resolve() in own:  # `--out docs/results/<sweep>` over `docs/results/<sweep>/*`
            continue
        if not (path / "config.yaml").is_file():  # a glob over a results folder also names its tables.md, tables/
            notes.append(f"{path}: not a run directory (no config.yaml), left out")
        elif path.name not in names:
            notes.append(f"{path}: not a point of {spec.name} (another config), left out")
        elif (status := _run_status(RunDir(path))) != "finished":
            notes.append(f"{path}: {status}, left out")
        else:
            done.append(path)
    if not done:
        raise ConfigError(f"none of the {len(run_dirs)} run directories is a finished point of {spec.name}")
    done.sort(key=lambda path: names[path.name].index)  # rows and columns in the sweep's order, as its own tables
    missing = len(spec.points) - len({p.name for p in done})
    notes.append(f"{len({p.name for p in done})} of the sweep's {len(spec.points)} points finished here; "
                 f"{missing} not (yet)")
    return write_tables(spec.tables, done, Path(out), notes)


def rebuild_report(sweep_dir: str | Path) -> tuple[str, list[Path]]:
    """``fedray report SWEEP_DIR``: the tables and report of a sweep again, from its record and run directories."""
    from fedray.reporting.report import report

    out = Path(sweep_dir)
    rec = json.loads((out / RECORD).read_text())
    tables = [TableSpec(**t) for t in rec.get("tables", [])]
    done = [Path(p["run_dir"]) for p in rec["points"] if _run_status(RunDir(p["run_dir"])) == "finished"]
    missing = [p for p in rec["points"] if Path(p["run_dir"]) not in done]
    if not done:
        raise ConfigError(f"{out}: no point of the sweep has finished")
    notes = [f"point {p['index']} ({p['run_dir']}) has not finished, left out" for p in missing]
    text, files = write_tables(tables, done, out, notes) if tables else ("", [])
    rtext, more = report(done, out / "report")
    return text or rtext, [*files, *more]


# ------------------------------------------------------------------------------------------- running
def _record(spec: SweepSpec, slices: dict) -> dict:
    return {"name": spec.name, "description": spec.description, "source": spec.source_path, "fields": spec.fields,
            "base": spec.base, "resources": slices, "tables": [asdict(t) for t in spec.tables],
            "points": [{"index": p.index, "values": p.values, "hash": p.hash, "run_dir": str(p.run_dir)}
                       for p in spec.points]}


#: What a sweep stopped before its first run (a missing dataset) leaves; running it again needs no --resume.
_LEFT_BEFORE_RUNS = {"_partitions", "sweep.lock"}


def _claim(spec: SweepSpec, resume: bool) -> None:
    out = spec.output_dir
    if resume:
        if not (out / RECORD).is_file():
            raise ConfigError(f"--resume: {out} holds no sweep ({RECORD} is missing); run it without --resume")
        return
    if (out / RECORD).is_file():
        raise ConfigError(f"output_dir: {out} already holds a sweep; continue it with --resume, or choose another "
                          f"output_dir (--output-dir)")
    if out.exists() and any(p.name not in _LEFT_BEFORE_RUNS for p in out.iterdir()):
        raise ConfigError(f"output_dir: {out} exists and is not empty; choose another output_dir (--output-dir)")


def _prepare(spec: SweepSpec, log) -> None:
    """Each distinct partition built once (before the threads would race for it) and each point's model
    checked against its data: a missing dataset or a bad model option fails here, before any training."""
    from fedray.driver.setup import prepare_data
    from fedray.plugins import check_model

    stores: dict[str, object] = {}
    for p in spec.points:
        cfg = from_dict(p.config)
        key = json.dumps([cfg.to_dict()["data"], cfg.partition_seed], sort_keys=True, default=str)
        if key not in stores:
            stores[key] = prepare_data(cfg, log)[1]
        try:
            check_model(cfg, stores[key].meta)
        except ConfigError as e:
            raise ConfigError(f"point {p.index} ({p.describe()}): {e}") from None


def _kill_at() -> tuple[int, int] | None:
    """The testing aid's (point, round), from :data:`KILL_ENV`."""
    kill = os.environ.get(KILL_ENV, "")
    try:
        return tuple(int(x) for x in kill.split(":")) if kill else None
    except ValueError:
        raise ConfigError(f"{KILL_ENV}={kill!r}: expected POINT:ROUND (a testing aid)") from None


def _job(spec: SweepSpec, i: int, slices: dict, resume: bool, kill_at) -> tuple[Job | None, int | None]:
    """Point ``i``'s run: None when it finished earlier (kept), else its job (continued from its checkpoint or
    run from round 1), with the checkpoint round it resumes from."""
    p = spec.points[i]
    rd = RunDir(p.run_dir)
    status = _run_status(rd) if resume else None
    if status == "finished":
        return None, None

    def on_round(report: dict) -> None:
        if kill_at == (i, int(report["round"])):
            os.kill(os.getpid(), signal.SIGKILL)

    log_path = spec.output_dir / "logs" / f"p{i:03d}.log"
    ck = rd.latest_checkpoint() if status in ("running", "killed", "interrupted", "stopped") else None
    if ck is not None:
        return Job(i, resume=p.run_dir, log_path=log_path, on_round=on_round), RunDir.checkpoint_round(ck)
    cfg = from_dict(apply_slice(json.loads(json.dumps(p.config)), slices))
    return Job(i, config=cfg, overwrite=status is not None, log_path=log_path, on_round=on_round), None


def run_sweep(spec: SweepSpec, *, resume: bool = False, log=print) -> SweepResult:
    """Run (or, with ``resume``, continue) every point of ``spec``; see the module docstring."""
    _claim(spec, resume)
    base = from_dict(spec.points[0].config)
    res = spec.resources
    cap, slices = plan_slices(base, spec.parallel or len(spec.points), workers=res["workers"],
                              cpus_per_worker=res["cpus_per_worker"], gpus_per_worker=res["gpus_per_worker"],
                              field="resources")
    if slices["note"]:
        log(f"[sweep] {slices['note']}")
    elif spec.parallel and cap < spec.parallel:
        log(f"[sweep] parallel capped at {cap} (asked {spec.parallel}): a point needs {slices['cpus_per_trial']:g} "
            f"CPUs and {slices['gpus_per_trial']:g} GPUs of {slices['cluster_cpus']:g} / {slices['cluster_gpus']:g}")
    out = spec.output_dir
    out.mkdir(parents=True, exist_ok=True)
    with output_lock(out / "sweep.lock", f"sweep {out}"):
        return _run_locked(spec, resume, cap, slices, log)


def _run_locked(spec: SweepSpec, resume: bool, cap: int, slices: dict, log) -> SweepResult:
    out = spec.output_dir
    kill_at = _kill_at()
    _prepare(spec, log)
    record = _record(spec, slices)
    record["sessions"] = _sessions(out, resume, log)
    _write_record(out, record)
    try:
        result = _run_points(spec, resume, cap, slices, kill_at, log)
    except BaseException as e:
        record["sessions"][-1].update(status="crashed", ended_at=time.time(), reason=crash_reason(e))
        _write_record(out, record)
        raise
    record["sessions"][-1].update(status="interrupted" if result.interrupted else "finished", ended_at=time.time(),
                                  failed_points=[r["point"] for r in result.failed])
    _write_record(out, record)
    return result


def _write_record(out: Path, record: dict) -> None:
    atomic_write_text(out / RECORD, json.dumps(record, indent=1, default=str) + "\n")


def _sessions(out: Path, resume: bool, log) -> list[dict]:
    """sweep.json's driver sessions with this one (``running``); an earlier one still ``running`` belongs to a dead
    driver (this one holds sweep.lock): marked ``killed`` with the reason."""
    sessions: list[dict] = []
    if resume and (out / RECORD).is_file():
        try:
            sessions = list(json.loads((out / RECORD).read_text()).get("sessions", []))
        except (OSError, ValueError):
            sessions = []
    for dead in settle_sessions(sessions, lock_held=True):
        log(f"[sweep] an earlier session of this sweep: {dead['reason']}")
    return [*sessions, {**owner_record(), "resume": resume, "status": "running"}]


def _run_points(spec: SweepSpec, resume: bool, cap: int, slices: dict, kill_at, log) -> SweepResult:
    out = spec.output_dir
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    todo: list[Job] = []
    starts: dict[int, int | None] = {}
    for p in spec.points:
        job, starts[p.index] = _job(spec, p.index, slices, resume, kill_at)
        rows.append(point_row(spec, p.index, "finished" if job is None else "pending"))
        if job is not None:
            todo.append(job)
    kept = len(spec.points) - len(todo)
    log(f"[sweep] {spec.name}: {len(spec.points)} points ({kept} finished earlier, kept), {cap} at a time, "
        f"{slices['workers']} worker(s) each -> {out}")
    parquet = out / "sweep.parquet"
    write_parquet(spec, rows, parquet)
    result = SweepResult(spec, rows)
    # points done / all on a terminal (the [sweep] lines print above it); the lines alone otherwise
    launcher = Launcher(cap, tag="sweep", total=len(spec.points), unit="point", desc=f"sweep {spec.name}",
                        initial=kept, log=log)
    pending = iter(todo)

    def next_job() -> Job | None:
        job = next(pending, None)
        if job is not None:  # in sweep.parquet before it starts: a killed sweep shows it running
            rows[job.key] = {**rows[job.key], "status": "running"}
            write_parquet(spec, rows, parquet)
        return job

    def settle(o: RunOutcome) -> None:
        i, how = o.key, starts[o.key]
        if o.status == "failed":
            r = point_row(spec, i, "failed", error=o.error, resumed_from=how, seconds=o.seconds)
        else:
            r = point_row(spec, i, "finished" if o.status == "finished" else "interrupted", resumed_from=how)
        rows[i] = r
        write_parquet(spec, rows, parquet)  # at once: a killed sweep keeps what it has
        acc = "" if r.get("accuracy") is None or math.isnan(r["accuracy"]) else f" accuracy {r['accuracy']:.4f}"
        since = "" if how is None else f" (resumed from round {how})"
        launcher.advance(1, finished=sum(row["status"] == "finished" for row in rows))
        launcher.say(f"[sweep] point {i} {spec.points[i].describe()}: {r['status']}{acc}{since}"
                     + (f": {r['error']}" if r.get("error") else ""))

    result.interrupted = launcher.run(next_job, settle, stopping=" (checkpointed); continue with --resume")
    if not result.interrupted:
        _, result.files = _final_outputs(spec, rows, log)
    result.files.insert(0, parquet)
    return result


def _dry_run(spec: SweepSpec, log) -> int:
    for p in spec.points:
        status = _run_status(RunDir(p.run_dir))
        log(f"{p.index:4d}  {p.describe()}\n      -> {p.run_dir}" + (f" [{status}]" if status else ""))
    log(f"{len(spec.points)} points -> {spec.output_dir}" + (f"; tables: {', '.join(t.name for t in spec.tables)}"
                                                              if spec.tables else ""))
    return 0


def main_cli(path: str, overrides: list[str] | None = None, *, output_dir: str | None = None,
             dry_run: bool = False, resume: bool = False, prog: str = "fedray sweep", log=print) -> int:
    """Shared body of ``fedray sweep`` and ``python -m jobs.sweep``: exit 0 done, 1 some point failed (named),
    130 interrupted; bad sweep files raise ConfigError (exit 2 in the callers)."""
    import sys

    spec = load_sweep(path, overrides=overrides, output_dir=output_dir)
    if dry_run:
        return _dry_run(spec, log)
    result = run_sweep(spec, resume=resume, log=log)
    for f in result.files:
        log(f"wrote {f}")
    if (spec.output_dir / "tables.md").is_file() and not result.interrupted:
        log((spec.output_dir / "tables.md").read_text())
    log(f"sweep output directory: {spec.output_dir}")
    if result.interrupted:
        return 130
    if result.failed:
        names = "; ".join(f"point {r['point']} ({spec.points[r['point']].describe()}): {r.get('error')}"
                          for r in result.failed)
        print(f"{prog}: {len(result.failed)} point(s) failed: {names}", file=sys.stderr)
        return 1
    return 0
