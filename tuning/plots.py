"""The PNG plots of a study (matplotlib only, no plotly), drawn from its Optuna trials: the history of the objective,
the values reported to the pruner, parameter importances, slices, contours over pairs of parameters and the Pareto
front. A plot that cannot be drawn yet (too few trials) returns None; :func:`tuning.outputs.write_outputs` draws
them all."""

from __future__ import annotations

import io
import math
from pathlib import Path

from fedray.core.io import atomic_write_bytes
from tuning.space import StudySpec


def short_name(path: str, spec: StudySpec | None = None) -> str:
    """``algorithm.params.lam`` -> ``lam`` for plot labels and file names (the whole path, with ``_`` for
    ``.``, when two parameters of ``spec`` end the same way)."""
    last = path.rsplit(".", 1)[-1]
    if spec is not None and sum(1 for p in spec.params if p.path.rsplit(".", 1)[-1] == last) > 1:
        return path.replace(".", "_")
    return last


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


def plot_importance(imp: dict[str, float], spec: StudySpec, path: Path, seed: int) -> Path:
    fig = _figure(6.4, 1.0 + 0.5 * len(imp))
    ax = fig.add_subplot(1, 1, 1)
    names = list(imp)[::-1]
    ax.barh([short_name(n) for n in names], [imp[n] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        ax.text(imp[n], i, f" {imp[n]:.2f}", va="center", fontsize=8)
    ax.set_xlabel(f"importance for {spec.objectives[0].metric} (fANOVA, seed {seed})")
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
    (ax.set_xlabel if which == "x" else ax.set_ylabel)(short_name(p.path))


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
    ax.set_title(f"{spec.name}: {short_name(px.path)} vs {short_name(py.path)}")
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
