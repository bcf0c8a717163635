"""What a study leaves in its directory: the trials table, the best config and the PNG plots (:mod:`tuning.plots`).

``write_outputs(study, spec, study_dir)`` writes

- ``trials.csv`` and ``trials.md``: one row per trial (number, state, objective value(s), every parameter,
  rounds run, seconds, start time, pruning round, retry links, error, run directory);
- ``best_config.yaml``: the base config with the best trial's values set, ready for ``fedray run``
  (single objective); for a multi-objective study ``pareto/trial-NNNN.yaml`` for every Pareto-optimal trial;
- ``plots/history.png`` (objective per trial and best so far), ``plots/intermediate.png`` (the per-round
  values the pruner saw), ``plots/importance.png`` (fANOVA parameter importances with a fixed seed;
  needs at least two complete trials), ``plots/slice.png`` (objective against each parameter),
  ``plots/contour_A__B.png`` for each pair of numeric parameters (e.g. lam/beta/tau), and
  ``plots/pareto.png`` for two-objective studies.

Plots that cannot be drawn yet (too few trials) are skipped with a message; they appear on the next call. Everything is written atomically, so the outputs can be rebuilt
at any time (``fedray tune STUDY.yaml --outputs-only``), also while a study runs.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import time
from pathlib import Path

import yaml

from fedray.config import from_dict
from fedray.core.io import atomic_write_text
from tuning.plots import (plot_contour, plot_history, plot_importance, plot_intermediate, plot_pareto, plot_slice,
                          short_name)
from tuning.space import StudySpec

IMPORTANCE_SEED = 0
IMPORTANCE_TREES = 64  # fANOVA random-forest size (Optuna's default)
MAX_CONTOUR_PARAMS = 4


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.4g}"
    return str(v)


def _metric_names(spec: StudySpec) -> list[str]:
    return [o.metric for o in spec.objectives]


def trial_rows(study, spec: StudySpec) -> list[dict]:
    """One mapping per trial, ordered by trial number (the columns of ``trials.csv``)."""
    rows = []
    metrics = _metric_names(spec)
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        ua = t.user_attrs
        row = {"number": t.number, "state": t.state.name}
        values = t.values if t.values is not None else [None] * len(metrics)
        if t.state.name == "PRUNED" and t.intermediate_values:
            values = [t.intermediate_values[max(t.intermediate_values)]] + [None] * (len(metrics) - 1)
        for m, v in zip(metrics, values):
            row[m] = v
        for p in spec.params:
            row[p.path] = t.params.get(p.path)
        started = ua.get("started_at")
        row.update({
            "rounds": ua.get("rounds"),
            "seconds": ua.get("seconds"),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else None,
            "pruned_at_round": ua.get("pruned_at_round"),
            "retry_of": ua.get("retry_of"),
            "note": "orphaned" if ua.get("orphaned") else ("interrupted" if ua.get("interrupted") else None),
            "error": ua.get("error"),
            "run_dir": ua.get("run_dir"),
        })
        rows.append(row)
    return rows


def _csv(rows: list[dict]) -> str:
    if not rows:
        return ""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def _markdown(rows: list[dict], study, spec: StudySpec) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    lines = [f"# Study `{spec.name}`", ""]
    if spec.description:
        lines += [spec.description, ""]
    objs = ", ".join(f"{o.metric} ({o.direction})" for o in spec.objectives)
    lines.append(f"Objective{'s' if spec.multi_objective else ''}: {objs}. Trials: "
                 + (", ".join(f"{v} {k.lower()}" for k, v in sorted(counts.items())) or "none") + ".")
    best = best_trials(study, spec)
    if best and not spec.multi_objective:
        b = best[0]
        params = ", ".join(f"`{k}` = {_fmt(v)}" for k, v in b.params.items())
        lines.append(f"Best: trial {b.number}, {spec.objectives[0].metric} = {_fmt(b.value)} ({params}).")
    elif best:
        lines.append(f"Pareto-optimal trials: {', '.join(str(b.number) for b in best)}.")
    lines.append("")
    if rows:
        cols = [c for c in rows[0] if c not in ("run_dir",)]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
        for r in rows:
            cells = [_fmt(r[c]).replace("|", "\\|").replace("\n", " ")[:120] for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("Pruned trials show the last value they reported. Run directories: `trials/trial-NNNN/` "
                     "(column `run_dir` of trials.csv).")
    return "\n".join(lines) + "\n"


def best_trials(study, spec: StudySpec) -> list:
    """[best trial] for a single objective, the Pareto front for several; [] without complete trials."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return []
    if spec.multi_objective:
        return sorted(study.best_trials, key=lambda t: t.number)
    return [study.best_trial]


def best_config_text(spec: StudySpec, trial) -> str:
    """The base config with ``trial``'s values set, as YAML with a provenance header (validated)."""
    data = spec.config_with(dict(trial.params))
    out = data.get("output")
    if isinstance(out, dict):
        out.pop("name", None)
    from_dict(data)  # the file must load with load_config
    values = ", ".join(f"{m} = {_fmt(v)}" for m, v in zip(_metric_names(spec), trial.values or []))
    header = (f"# Best configuration of study {spec.name!r}: trial {trial.number} ({values}).\n"
              f"# Base config: {spec.base_config_path or 'inline in ' + str(spec.source_path)}; tuned values:\n"
              + "".join(f"#   {k}: {v!r}\n" for k, v in trial.params.items())
              + "# Run it with: fedray run <this file>\n")
    return header + yaml.safe_dump(data, sort_keys=False)


def param_importances(study, spec: StudySpec) -> tuple[dict[str, float] | None, str | None]:
    """(importances, None) or (None, why they cannot be computed yet)."""
    import optuna

    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(complete) < 2:
        return None, f"parameter importances need at least 2 complete trials (have {len(complete)})"
    varied = [p.path for p in spec.params if len({repr(t.params.get(p.path)) for t in complete}) > 1]
    if not varied:
        return None, "parameter importances need trials that differ in at least one parameter"
    if len({t.values[0] for t in complete}) == 1:
        return None, "parameter importances need complete trials with different objective values"
    try:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(n_trees=IMPORTANCE_TREES,
                                                                      seed=IMPORTANCE_SEED), params=varied,
            target=(lambda t: t.values[0]) if spec.multi_objective else None)
    except (RuntimeError, ValueError) as e:
        return None, f"parameter importances could not be computed: {e}"
    return dict(imp), None


# ------------------------------------------------------------------------------------------- entry
def write_outputs(study, spec: StudySpec, study_dir: str | Path, *, log=print) -> list[Path]:
    """Write the table, the best config(s) and the plots into ``study_dir``; returns the files written."""
    study_dir = Path(study_dir)
    plots = study_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    rows = trial_rows(study, spec)
    atomic_write_text(study_dir / "trials.csv", _csv(rows))
    atomic_write_text(study_dir / "trials.md", _markdown(rows, study, spec))
    written += [study_dir / "trials.csv", study_dir / "trials.md"]

    best = best_trials(study, spec)
    if not best:
        log("[tune] no complete trial yet: no best config")
    elif not spec.multi_objective:
        atomic_write_text(study_dir / "best_config.yaml", best_config_text(spec, best[0]))
        written.append(study_dir / "best_config.yaml")
    else:
        for t in best:
            p = study_dir / "pareto" / f"trial-{t.number:04d}.yaml"
            atomic_write_text(p, best_config_text(spec, t))
            written.append(p)

    for fn, name in ((plot_history, "history.png"), (plot_intermediate, "intermediate.png"),
                     (plot_slice, "slice.png")):
        out = fn(study, spec, plots / name)
        if out is not None:
            written.append(out)
    imp, why = param_importances(study, spec)
    if imp is not None:
        written.append(plot_importance(imp, spec, plots / "importance.png", IMPORTANCE_SEED))
        atomic_write_text(study_dir / "importance.yaml", yaml.safe_dump(
            {"evaluator": "fanova", "seed": IMPORTANCE_SEED, "n_trees": IMPORTANCE_TREES, "target": spec.objectives[0].metric,
             "importances": {k: float(v) for k, v in imp.items()}}, sort_keys=False))
        written.append(study_dir / "importance.yaml")
    else:
        log(f"[tune] {why}: plots/importance.png skipped")
    numeric = [p for p in spec.params if p.kind != "categorical"]
    if len(numeric) > MAX_CONTOUR_PARAMS:
        order = list(imp) if imp else []
        numeric = sorted(numeric, key=lambda p: order.index(p.path) if p.path in order else len(order))
        numeric = numeric[:MAX_CONTOUR_PARAMS]
    for px, py in itertools.combinations(numeric, 2):
        out = plot_contour(study, spec, px, py, plots / f"contour_{short_name(px.path, spec)}__{short_name(py.path, spec)}.png")
        if out is not None:
            written.append(out)
    if spec.multi_objective:
        out = plot_pareto(study, spec, plots / "pareto.png")
        if out is not None:
            written.append(out)
    return written
