"""``fedray sweep SWEEP.yaml`` and ``python -m jobs.sweep``: a grid of ordinary fedray runs, resumable, with tables.

Every point of the sweep file (:mod:`fedray.apps.sweep_spec`) is one ``run_experiment`` run in its own run
directory ``<output_dir>/runs/<algorithm>-<config hash>`` (the name ``fedray run`` gives the same config).
Several points run at once, each in a driver thread with its own coordinator and client workers, a slice of
the Ray cluster sized as ``fedray tune`` sizes trials (:mod:`fedray.apps.slices`).

Outputs in the output directory: ``sweep.json`` (the resolved sweep: base config, points, tables),
``sweep.parquet`` (one row per point, :data:`COLUMNS`; rewritten atomically whenever a point ends),
``tables/<table>.<metric>.{md,csv,tex}`` and ``tables.md`` (the ``table:`` pivots, mean ± std over seeds,
by :mod:`fedray.reporting.seeds`), ``report/`` (``fedray report`` of all finished runs: per-run summary, groups,
curves with seed bands), ``logs/pNNN.log`` (each point's driver log) and ``runs/``.

``--resume`` (the output directory holds a sweep): finished points are kept and not run again; a point left
``running`` (its driver was killed) or ``interrupted`` continues from its last checkpoint (engine resume,
the same numbers as an uninterrupted run) or starts over when it has none; a ``failed`` point starts over
from round 1 (its error is kept in its old ``run.json`` only until then). An exclusive lock on
``sweep.lock`` guarantees that no other driver is running the sweep, so a ``running`` point is orphaned.

Testing aid: ``FEDRAY_SWEEP_KILL_AT=P:R`` SIGKILLs the sweep driver when point P records round R (before that
round's checkpoint), a deterministic crash for the resume tests.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fedray.apps.slices import apply_slice, plan_slices
from fedray.apps.sweep_spec import SweepSpec, TableSpec, load_sweep
from fedray.config import ConfigError, from_dict
from fedray.core.io import LockHeld, atomic_write_text, atomic_writer, exclusive_lock
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
    if not rd.holds_run():
        return None
    try:
        return str(rd.read_json("run.json").get("status", "running"))
    except (OSError, ValueError):
        return "running"


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
    from fedray.engine.setup import prepare_data
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


class _Runner:
    def __init__(self, spec: SweepSpec, slices: dict):
        self.spec, self.slices = spec, slices
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.rows: list[dict] = []
        kill = os.environ.get(KILL_ENV, "")
        try:
            self.kill_at = tuple(int(x) for x in kill.split(":")) if kill else None
        except ValueError:
            raise ConfigError(f"{KILL_ENV}={kill!r}: expected POINT:ROUND (a testing aid)") from None
        (spec.output_dir / "logs").mkdir(parents=True, exist_ok=True)

    def plan(self, i: int, resume: bool) -> tuple[str, dict, int | None]:
        """What point ``i`` needs: ``keep`` (finished), ``resume`` (from its checkpoint) or ``run`` (from round
        1), with the run_experiment keywords and the checkpoint round it resumes from."""
        p = self.spec.points[i]
        rd = RunDir(p.run_dir)
        status = _run_status(rd) if resume else None
        if status == "finished":
            return "keep", {}, None
        ck = rd.latest_checkpoint() if status in ("running", "interrupted", "stopped") else None
        if ck is not None:
            return "resume", {"resume": p.run_dir}, RunDir.checkpoint_round(ck)
        cfg = from_dict(apply_slice(json.loads(json.dumps(p.config)), self.slices))
        return "run", {"cfg": cfg, "overwrite": status is not None}, None

    def update(self, i: int, row: dict) -> None:
        """Row ``i`` of sweep.parquet, rewritten atomically (from any thread)."""
        with self.lock:
            self.rows[i] = row
            write_parquet(self.spec, self.rows, self.spec.output_dir / "sweep.parquet")

    def run_point(self, i: int, kw: dict, start: int | None) -> dict:
        """Run point ``i`` (resuming from checkpoint round ``start``, or None); its row is in sweep.parquet
        (status running, then its end) before this thread takes the next point."""
        self.update(i, {**self.rows[i], "status": "running"})
        row = self._run(i, kw, start)
        self.update(i, row)
        return row

    def _run(self, i: int, kw: dict, start: int | None) -> dict:
        from fedray.engine.runner import run_experiment

        path = self.spec.output_dir / "logs" / f"p{i:03d}.log"

        def plog(msg: str) -> None:
            with open(path, "a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")

        def on_round(report: dict) -> bool:
            if self.kill_at == (i, int(report["round"])):
                os.kill(os.getpid(), signal.SIGKILL)
            return self.stop.is_set()

        t0 = time.perf_counter()
        try:
            res = run_experiment(progress=False, log=plog, on_round=on_round, **kw)
        except Exception as e:  # noqa: BLE001 - one failed point must not stop the others
            cause = getattr(e, "cause", None) or e  # a Ray task error keeps the coordinator's exception
            lines = str(cause).strip().splitlines()
            reason = f"{type(cause).__name__}: {lines[0] if lines else ''}"[:500]
            plog(f"failed: {reason}")
            return point_row(self.spec, i, "failed", error=reason, resumed_from=start,
                             seconds=time.perf_counter() - t0)
        status = "interrupted" if (res.interrupted or res.stopped_early) else "finished"
        return point_row(self.spec, i, status, resumed_from=start)


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
    holder = f"pid {os.getpid()} on {socket.gethostname()}"
    try:
        with exclusive_lock(out / "sweep.lock", holder, f"sweep {out}"):
            return _run_locked(spec, resume, cap, slices, log)
    except LockHeld as e:
        raise ConfigError(str(e)) from None


def _run_locked(spec: SweepSpec, resume: bool, cap: int, slices: dict, log) -> SweepResult:
    from fedray.reporting.progress import ProgressBar

    out = spec.output_dir
    _prepare(spec, log)
    atomic_write_text(out / RECORD, json.dumps(_record(spec, slices), indent=1, default=str) + "\n")
    runner = _Runner(spec, slices)
    rows = runner.rows
    todo = []
    for p in spec.points:
        what, kw, start = runner.plan(p.index, resume)
        rows.append(point_row(spec, p.index, "finished" if what == "keep" else "pending"))
        if what != "keep":
            todo.append((p.index, what, kw, start))
    kept = len(spec.points) - len(todo)
    log(f"[sweep] {spec.name}: {len(spec.points)} points ({kept} finished earlier, kept), {cap} at a time, "
        f"{slices['workers']} worker(s) each -> {out}")
    write_parquet(spec, rows, out / "sweep.parquet")
    result = SweepResult(spec, rows)
    # points done / all on a terminal (the [sweep] lines print above it); the lines alone otherwise
    bar = ProgressBar(len(spec.points), "point", desc=f"sweep {spec.name}", initial=kept, log=log)
    prev = None
    if threading.current_thread() is threading.main_thread():
        def on_sigterm(signum, frame):
            raise KeyboardInterrupt()

        prev = signal.signal(signal.SIGTERM, on_sigterm)

    def settle(fut, i: int) -> None:
        r = fut.result()  # already in sweep.parquet: a killed sweep keeps what it has
        acc = "" if r.get("accuracy") is None or math.isnan(r["accuracy"]) else f" accuracy {r['accuracy']:.4f}"
        how = "" if r.get("resumed_from") is None else f" (resumed from round {r['resumed_from']})"
        bar.update(1, finished=sum(row["status"] == "finished" for row in rows))
        bar.write(f"[sweep] point {i} {spec.points[i].describe()}: {r['status']}{acc}{how}"
                  + (f": {r['error']}" if r.get("error") else ""))

    try:
        with cf.ThreadPoolExecutor(max_workers=cap, thread_name_prefix="fedray-point") as pool:
            running = {}
            for i, _what, kw, start in todo:
                running[pool.submit(runner.run_point, i, kw, start)] = i
            try:
                while running:
                    finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                    for fut in finished:
                        settle(fut, running.pop(fut))
            except KeyboardInterrupt:
                result.interrupted = True
                runner.stop.set()
                bar.write(f"[sweep] interrupted: the running points stop after their round in flight "
                          f"(checkpointed); continue with --resume")
                for fut in list(running):
                    fut.cancel()
                for fut in cf.as_completed([f for f in running if not f.cancelled()]):
                    settle(fut, running.pop(fut))
    finally:
        bar.close()
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)
    if not result.interrupted:
        _, result.files = _final_outputs(spec, rows, log)
    result.files.insert(0, out / "sweep.parquet")
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
