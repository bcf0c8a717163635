"""What a study leaves in its directory: the trials table, the best config and PNG plots.

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

Plots use matplotlib only (no plotly). Plots that cannot be drawn yet (too few trials) are skipped with
a message; they appear on the next call. Everything is written atomically, so the outputs can be rebuilt
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
from fedray.core.io import atomic_write_bytes, atomic_write_text
from tuning.study import StudySpec

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


def _short(path: str, spec: StudySpec | None = None) -> str:
    """``algorithm.params.lam`` -> ``lam`` for plot labels and file names (the whole path, with ``_`` for
    ``.``, when two parameters of ``spec`` end the same way)."""
    last = path.rsplit(".", 1)[-1]
    if spec is not None and sum(1 for p in spec.params if p.path.rsplit(".", 1)[-1] == last) > 1:
        return path.replace(".", "_")
    return last


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
              + f"# Run it with: fedray run <this file>\n")
    return header + yaml.safe_dump(data, sort_keys=False)


# -------------------------------------------------------------------------------------------- plots
def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    return path


def _figure(w=6.4, h=4.2):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h))


def _finished_value(t):
    """(value, pruned?) used in plots: the final value, or the last reported one of a pruned trial."""
    if t.state.name == "COMPLETE":
        return t.values[0], False
    if t.state.name == "PRUNED" and t.intermediate_values:
        return t.intermediate_values[max(t.intermediate_values)], True
    return None, False


def plot_history(study, spec: StudySpec, path: Path) -> Path | None:
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    if not any(t.state.name == "COMPLETE" for t in trials):
        return None
    n_obj = len(spec.objectives)
    fig = _figure(6.4, 3.6 * n_obj if spec.multi_objective else 4.2)
    for i, o in enumerate(spec.objectives):
        ax = fig.add_subplot(n_obj, 1, i + 1)
        xs = [t.number for t in trials if t.state.name == "COMPLETE"]
        ys = [t.values[i] for t in trials if t.state.name == "COMPLETE"]
        ax.scatter(xs, ys, color="tab:blue", label="complete", zorder=3)
        if i == 0:
            pr = [(t.number, _finished_value(t)[0]) for t in trials if t.state.name == "PRUNED" and t.intermediate_values]
            if pr:
                ax.scatter([a for a, _ in pr], [b for _, b in pr], color="tab:gray", marker="x",
                           label="pruned (last reported)", zorder=2)
        if not spec.multi_objective:
            best, bx, by = None, [], []
            for t in trials:
                if t.state.name != "COMPLETE":
                    continue
                v = t.values[0]
                if best is None or (v > best if o.direction == "maximize" else v < best):
                    best = v
                bx.append(t.number)
                by.append(best)
            ax.step(bx, by, where="post", color="tab:red", label="best so far")
        ax.set_xlabel("trial")
        ax.set_ylabel(o.metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{spec.name}: optimisation history")
    return _save(fig, path)


def plot_intermediate(study, spec: StudySpec, path: Path) -> Path | None:
    trials = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    if not trials:
        return None
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    colors = {"COMPLETE": "tab:blue", "PRUNED": "tab:gray", "FAIL": "tab:red", "RUNNING": "tab:orange"}
    seen = set()
    for t in sorted(trials, key=lambda t: t.number):
        steps = sorted(t.intermediate_values)
        st = t.state.name
        ax.plot(steps, [t.intermediate_values[s] for s in steps], color=colors.get(st, "black"), alpha=0.7,
                marker="." if len(steps) < 30 else None, label=None if st in seen else st.lower())
        seen.add(st)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{spec.objectives[0].metric} (reported)")
    ax.set_title(f"{spec.name}: values reported to the pruner")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


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


def plot_importance(imp: dict[str, float], spec: StudySpec, path: Path) -> Path:
    fig = _figure(6.4, 1.0 + 0.5 * len(imp))
    ax = fig.add_subplot(1, 1, 1)
    names = list(imp)[::-1]
    ax.barh([_short(n) for n in names], [imp[n] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        ax.text(imp[n], i, f" {imp[n]:.2f}", va="center", fontsize=8)
    ax.set_xlabel(f"importance for {spec.objectives[0].metric} (fANOVA, seed {IMPORTANCE_SEED})")
    ax.set_xlim(0, max(1.0, max(imp.values()) * 1.15))
    ax.set_title(f"{spec.name}: parameter importances")
    return _save(fig, path)


def _axis_values(p, trials):
    """Numeric plot coordinates of a parameter (categorical choices map to their index)."""
    if p.kind == "categorical":
        idx = {repr(c): i for i, c in enumerate(p.choices)}
        return [idx.get(repr(t.params.get(p.path)), math.nan) for t in trials]
    return [float(t.params[p.path]) for t in trials]


def _style_axis(ax, p, which: str) -> None:
    if p.kind == "categorical":
        ticks = list(range(len(p.choices)))
        (ax.set_xticks if which == "x" else ax.set_yticks)(ticks)
        (ax.set_xticklabels if which == "x" else ax.set_yticklabels)([str(c) for c in p.choices], fontsize=7)
    elif p.log:
        from matplotlib.ticker import LogFormatterSciNotation, NullFormatter

        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        axis = ax.xaxis if which == "x" else ax.yaxis
        axis.set_major_formatter(LogFormatterSciNotation())
        axis.set_minor_formatter(NullFormatter())  # minor labels of short log ranges overlap
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(_short(p.path))


def plot_slice(study, spec: StudySpec, path: Path) -> Path | None:
    trials = [t for t in study.get_trials(deepcopy=False)
              if t.state.name == "COMPLETE" and all(p.path in t.params for p in spec.params)]
    if not trials:
        return None
    n = len(spec.params)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = _figure(4.0 * cols, 3.3 * rows)
    ys = [t.values[0] for t in trials]
    nums = [t.number for t in trials]
    sc = None
    for i, p in enumerate(spec.params):
        ax = fig.add_subplot(rows, cols, i + 1)
        sc = ax.scatter(_axis_values(p, trials), ys, c=nums, cmap="viridis", s=22)
        _style_axis(ax, p, "x")
        if i % cols == 0:
            ax.set_ylabel(spec.objectives[0].metric)
        ax.grid(alpha=0.3)
    if sc is not None:
        fig.colorbar(sc, ax=fig.axes, label="trial", shrink=0.8)
    fig.suptitle(f"{spec.name}: slice plots")
    return _save(fig, path)


def plot_contour(study, spec: StudySpec, px, py, path: Path) -> Path | None:
    trials = [t for t in study.get_trials(deepcopy=False)
              if t.state.name == "COMPLETE" and px.path in t.params and py.path in t.params]
    if not trials:
        return None
    import numpy as np

    xs = np.asarray(_axis_values(px, trials), dtype=float)
    ys = np.asarray(_axis_values(py, trials), dtype=float)
    zs = np.asarray([t.values[0] for t in trials], dtype=float)
    fig = _figure(5.6, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    # interpolate in the parameters' own scale (log10 for log ranges), draw on the real axes
    tx = np.log10(xs) if px.log else xs
    ty = np.log10(ys) if py.log else ys
    if len(trials) >= 4 and len(set(tx)) > 1 and len(set(ty)) > 1:
        try:
            import matplotlib.tri as mtri

            tri = mtri.Triangulation(tx, ty)
            grid_x = np.linspace(tx.min(), tx.max(), 60)
            grid_y = np.linspace(ty.min(), ty.max(), 60)
            gx, gy = np.meshgrid(grid_x, grid_y)
            gz = mtri.LinearTriInterpolator(tri, zs)(gx, gy)
            cs = ax.contourf(10 ** gx if px.log else gx, 10 ** gy if py.log else gy, gz, levels=12,
                             cmap="viridis", alpha=0.85)
            fig.colorbar(cs, ax=ax, label=spec.objectives[0].metric)
        except (RuntimeError, ValueError):
            pass  # collinear or degenerate points: the scatter below still shows every trial
    sc = ax.scatter(xs, ys, c=zs, cmap="viridis", edgecolors="black", s=30, zorder=3)
    if len(fig.axes) == 1:
        fig.colorbar(sc, ax=ax, label=spec.objectives[0].metric)
    _style_axis(ax, px, "x")
    _style_axis(ax, py, "y")
    ax.set_title(f"{spec.name}: {_short(px.path)} vs {_short(py.path)}")
    return _save(fig, path)


def plot_pareto(study, spec: StudySpec, path: Path) -> Path | None:
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(spec.objectives) != 2 or not complete:
        return None
    front = {t.number for t in study.best_trials}
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    other = [t for t in complete if t.number not in front]
    best = sorted((t for t in complete if t.number in front), key=lambda t: t.values[0])
    if other:
        ax.scatter([t.values[0] for t in other], [t.values[1] for t in other], color="tab:gray", label="dominated")
    ax.plot([t.values[0] for t in best], [t.values[1] for t in best], "o-", color="tab:red", label="Pareto front")
    for t in best:
        ax.annotate(str(t.number), (t.values[0], t.values[1]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(f"{spec.objectives[0].metric} ({spec.objectives[0].direction})")
    ax.set_ylabel(f"{spec.objectives[1].metric} ({spec.objectives[1].direction})")
    ax.set_title(f"{spec.name}: Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


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
        written.append(plot_importance(imp, spec, plots / "importance.png"))
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
        out = plot_contour(study, spec, px, py, plots / f"contour_{_short(px.path, spec)}__{_short(py.path, spec)}.png")
        if out is not None:
            written.append(out)
    if spec.multi_objective:
        out = plot_pareto(study, spec, plots / "pareto.png")
        if out is not None:
            written.append(out)
    return written
