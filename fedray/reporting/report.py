"""`fedray report`: tables and PNG plots rebuilt from run directories (several runs side by side)."""

from __future__ import annotations

import io
import math
from pathlib import Path

from fedray.core.io import atomic_write_bytes, atomic_write_text
from fedray.core.owner import describe_device, describe_owner, read_run_status
from fedray.reporting.rundir import RunDir


def _label(rd: RunDir) -> str:
    try:
        import yaml

        cfg = yaml.safe_load((rd.path / "config.yaml").read_text())
        alg = cfg.get("algorithm", {}).get("name", "?")
        part = cfg.get("data", {}).get("partition", {})
        alpha = (part.get("params") or {}).get("alpha")
        return f"{alg}" + (f" α={alpha}" if alpha is not None else "") + f" [{rd.path.name}]"
    except Exception:  # noqa: BLE001
        return rd.path.name


def _eval_metrics(rd: RunDir) -> list[str]:
    """The run's ``eval.metrics`` (from its config.yaml; none when it cannot be read)."""
    try:
        import yaml

        names = ((yaml.safe_load((rd.path / "config.yaml").read_text()) or {}).get("eval") or {}).get("metrics")
    except Exception:  # noqa: BLE001 - a run without a readable config reports what it can
        return []
    return [n for n in names or [] if isinstance(n, str)]


def metric_values(rows: list[dict], names: list[str]) -> dict:
    """Each ``eval.metrics`` entry's value at the last round that evaluated it, as ``name`` (or ``name.key`` for
    each value of a metric with several), NaN where it was not a number."""
    out: dict = {}
    for name in names:
        last = next((r[name] for r in reversed(rows) if name in r), None)
        for key, v in (last.items() if isinstance(last, dict) else [(None, last)]):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            out[name if key is None else f"{name}.{key}"] = float(v) if ok else math.nan
    return out


#: what summarize() reports of every run; the other keys are the values of its eval.metrics
_SUMMARY_KEYS = ("run", "label", "rounds", "accuracy", "ema_accuracy", "best_accuracy", "best_round", "mean_last5",
                 "mean_round_s", "failures", "domain_accuracy", "domain_mean_accuracy")


def summarize(rd: RunDir) -> dict:
    rows = rd.read_metrics()
    evald = [r for r in rows if r.get("accuracy") is not None]
    last5 = [r["accuracy"] for r in evald[-5:]]
    best = max(evald, key=lambda r: r["accuracy"]) if evald else None
    out = {
        "run": rd.path.name,
        "label": _label(rd),
        "rounds": rows[-1]["round"] if rows else 0,
        "accuracy": evald[-1]["accuracy"] if evald else math.nan,
        "ema_accuracy": evald[-1].get("ema_accuracy", math.nan) if evald else math.nan,
        "best_accuracy": best["accuracy"] if best else math.nan,
        "best_round": best["round"] if best else None,
        "mean_last5": sum(last5) / len(last5) if last5 else math.nan,
        "mean_round_s": (sum(r.get("seconds_total", 0.0) for r in rows) / len(rows)) if rows else math.nan,
        "failures": sum(int(r.get("failures", 0)) for r in rows),
    }
    if evald and evald[-1].get("domain_accuracy"):
        out["domain_accuracy"] = evald[-1]["domain_accuracy"]
        out["domain_mean_accuracy"] = evald[-1].get("domain_mean_accuracy")
    out.update(metric_values(rows, _eval_metrics(rd)))
    return out


def _num(v, fmt: str = "{:.4f}") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def describe_run(path: str | Path) -> str:
    """``fedray show``: a short summary of one run directory from its run.json, config.yaml, metrics.jsonl,
    summary.json and checkpoints/latest. Raises FileNotFoundError naming the missing file when ``path`` is
    not a run directory."""
    import shlex

    from fedray.config import from_dict, read_config_file

    rd = RunDir(path)
    if not rd.path.is_dir():
        raise FileNotFoundError(f"{str(path)!r}: no such directory")
    for name in ("run.json", "config.yaml"):
        if not (rd.path / name).is_file():
            raise FileNotFoundError(f"{str(path)!r} is not a run directory: {name} is missing")
    # what the run recorded, not checked against the code installed now (its plugins may have changed since)
    cfg = from_dict(read_config_file(rd.path / "config.yaml"), validate=False)
    run, status, reason = read_run_status(rd.path)  # a dead driver's "running" is "killed", with why
    s = summarize(rd)
    final = rd.read_json("summary.json") if (rd.path / "summary.json").is_file() else {}
    ckpt = rd.latest_checkpoint()
    lines = [
        f"run directory:   {rd.path}",
        f"status:          {status}" + (f" (its driver: {describe_owner(run['owner'])})"
                                        if status == "running" and run.get("owner") else ""),
        *([f"reason:          {reason}"] if reason and status != "finished" else []),
        f"algorithm:       {run.get('algorithm', cfg.algorithm.name)}",
        f"model:           {run.get('model', cfg.model.name)}",
        f"source:          {run.get('source', cfg.data.source)}",
        *([f"device:          {describe_device(run['device'])}"] if run.get("device") else []),
        f"rounds:          {s['rounds']} / {cfg.train.rounds}",
        f"accuracy:        {_num(s['accuracy'])} (last), {_num(s['ema_accuracy'])} (EMA)",
        f"best accuracy:   {_num(s['best_accuracy'])}"
        + (f" at round {s['best_round']}" if s["best_round"] is not None else ""),
        "last checkpoint: " + (f"round {RunDir.checkpoint_round(ckpt)} ({ckpt.name})" if ckpt else "none"),
    ]
    if final:
        lines.append(f"finished in:     {_num(final.get('total_seconds'), '{:.1f}')} s, "
                     f"weights {final.get('weights_hash', '-')}")
    for module, rec in (run.get("plugins") or {}).items():
        ver = f", {rec['distribution']} {rec['version']}" if rec.get("version") else ""
        lines.append(f"{'plugin:':17s}{module} {rec.get('digest')} ({rec.get('root')}{ver})")
    lines += _tracker_lines(rd)
    if status != "finished":
        lines.append(f"resume:          fedray run --resume {shlex.quote(str(rd.path))}")
    return "\n".join(lines)


def _tracker_lines(rd: RunDir) -> list[str]:
    """One line per experiment tracker of ``trackers.json``: its run, the rounds it holds, a failure."""
    if not (rd.path / "trackers.json").is_file():
        return []
    lines = []
    for name, st in sorted(rd.read_json("trackers.json").items()):
        where = st.get("tracking_uri") or f"{st.get('mode', '')} {st.get('project', '')} in {st.get('dir', '')}"
        text = f"{name + ':':17s}run {st.get('run_id')} ({where.strip()}), rounds 1-{st.get('last_round', 0)}"
        if st.get("error"):
            text += f", FAILED at {st['error']}"
        lines.append(text)
    return lines


def format_table(summaries: list[dict]) -> str:
    cols = ["label", "rounds", "accuracy", "ema_accuracy", "mean_last5", "best_accuracy", "mean_round_s", "failures"]
    cols += list(dict.fromkeys(k for s in summaries for k in s if k not in _SUMMARY_KEYS and "." not in k))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in summaries:
        cells = []
        for c in cols:
            v = s.get(c)
            cells.append(f"{v:.4f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    doms = [s for s in summaries if s.get("domain_accuracy")]
    if doms:
        names = sorted({d for s in doms for d in s["domain_accuracy"]})
        lines += ["", "| run | " + " | ".join(names) + " | mean |", "|" + "---|" * (len(names) + 2)]
        for s in doms:
            da = s["domain_accuracy"]
            lines.append(f"| {s['label']} | " + " | ".join(f"{da.get(n, math.nan):.4f}" for n in names)
                         + f" | {s.get('domain_mean_accuracy', math.nan):.4f} |")
    return "\n".join(lines)


def _save_fig(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def _curve(ax, label: str, rounds, mean, std=None) -> None:
    """One line; with ``std`` a shaded mean ± std band in the line's colour."""
    (line,) = ax.plot(rounds, mean, label=label)
    if std is not None:
        import numpy as np

        mean, std = np.asarray(mean, dtype=float), np.asarray(std, dtype=float)
        ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def plot_runs(run_dirs: list[RunDir], out_dir: Path, groups: list | None = None) -> list[Path]:
    """accuracy.png and loss.png (one line per run, or, when ``groups`` (fedray.reporting.seeds.Group) hold
    several seeds, one line per group with a mean ± std band over its seeds), then per-domain accuracy and
    feature-analysis plots per run when the runs logged them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedray.reporting.seeds import band

    written = []
    series = [(rd, rd.read_metrics()) for rd in run_dirs]
    if groups and any(len(g.runs) > 1 for g in groups):
        def curves(key):
            return [(f"{g.label} (n={len(g.runs)})", *band(g.metrics, key)) for g in groups]
        bands = " (mean ± std over seeds)"
    else:
        def curves(key):
            return [(_label(rd), [r["round"] for r in rows if r.get(key) is not None],
                     [r[key] for r in rows if r.get(key) is not None], None) for rd, rows in series]
        bands = ""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("accuracy", "ema_accuracy")):
        for curve in curves(key):
            _curve(ax, *curve)
    axes[0].set_title("test accuracy" + bands)
    axes[1].set_title("EMA-0.9 test accuracy" + bands)
    for ax in axes:
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    _save_fig(fig, out_dir / "accuracy.png")
    plt.close(fig)
    written.append(out_dir / "accuracy.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for curve in curves("loss"):
        _curve(ax, *curve)
    ax.set_title("mean client training loss" + bands)
    ax.set_xlabel("round")
    ax.legend(fontsize=7)
    _save_fig(fig, out_dir / "loss.png")
    plt.close(fig)
    written.append(out_dir / "loss.png")

    # per-domain accuracy when present
    dom_runs = [(rd, rows) for rd, rows in series if any(r.get("domain_accuracy") for r in rows)]
    if dom_runs:
        fig, axes = plt.subplots(1, len(dom_runs), figsize=(5.5 * len(dom_runs), 4), squeeze=False)
        for ax, (rd, rows) in zip(axes[0], dom_runs):
            ev = [r for r in rows if r.get("domain_accuracy")]
            for name in sorted(ev[-1]["domain_accuracy"]):
                ax.plot([r["round"] for r in ev], [r["domain_accuracy"].get(name) for r in ev], label=name)
            ax.plot([r["round"] for r in ev], [r.get("domain_mean_accuracy") for r in ev], "k--", label="mean")
            ax.set_title(_label(rd), fontsize=8)
            ax.legend(fontsize=7)
        _save_fig(fig, out_dir / "domain_accuracy.png")
        plt.close(fig)
        written.append(out_dir / "domain_accuracy.png")

    # feature-analysis metrics when logged (effective rank, covariance traces, VCI)
    ana_runs = [(rd, rows) for rd, rows in series if any(r.get("analysis") for r in rows)]
    if ana_runs:
        keys = sorted({k for _, rows in ana_runs for r in rows for k in (r.get("analysis") or {})})
        fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for rd, rows in ana_runs:
                ev = [r for r in rows if (r.get("analysis") or {}).get(key) is not None]
                ax.plot([r["round"] for r in ev], [r["analysis"][key] for r in ev], label=_label(rd))
            ax.set_title(key)
            ax.set_xlabel("round")
        axes[0][-1].legend(fontsize=7)
        _save_fig(fig, out_dir / "analysis.png")
        plt.close(fig)
        written.append(out_dir / "analysis.png")
    return written


def report(paths: list[str | Path], out: str | Path | None = None, *, metric: str = "accuracy",
           target: float | None = None) -> tuple[str, list[Path]]:
    """Per-run summary (summary.md / summary.csv), runs grouped over seeds (groups.md / groups.csv), the
    methods x settings pivot of ``metric`` (table.md / table.csv / table.tex) and the plots, into ``out``.
    Returns the text to print (the per-run table; with several runs also the group and pivot tables) and
    the files written."""
    from fedray.reporting.seeds import (METRICS, check_metric, format_groups, group_runs, is_eval_metric, pivot,
                                        pivot_csv, pivot_latex, pivot_markdown)

    if metric == "rounds_to_target" and target is None:
        raise ValueError("--metric rounds_to_target needs --target ACCURACY")
    try:
        check_metric(metric, target)
    except ValueError as e:
        raise ValueError(f"--metric {e}") from None
    if target is not None and not 0 < target <= 1:
        raise ValueError(f"--target {target!r}: expected an accuracy in (0, 1]")
    run_dirs = []
    for p in paths:
        rd = RunDir(p)
        if not rd.metrics_path.exists():
            raise FileNotFoundError(f"{str(p)!r} is not a run directory with metrics.jsonl")
        run_dirs.append(rd)
    out_dir = Path(out) if out else (run_dirs[0].path / "report" if len(run_dirs) == 1 else Path("report"))
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(rd) for rd in run_dirs]
    extra = () if metric in METRICS else (metric,)
    if is_eval_metric(metric) and not any(metric in s for s in summaries):
        have = sorted({k for s in summaries for k in s if k not in _SUMMARY_KEYS})
        raise ValueError(f"--metric {metric!r}: no run recorded it (the runs' eval.metrics values: "
                         f"{', '.join(have) or 'none'})")
    table = format_table(summaries)
    atomic_write_text(out_dir / "summary.md", table + "\n")
    columns = list(dict.fromkeys(k for s in summaries for k in s if k != "domain_accuracy"))
    atomic_write_text(out_dir / "summary.csv", _csv(summaries, columns))

    unfinished = _unfinished(run_dirs, summaries)
    groups, notes = group_runs(run_dirs, summaries)
    notes = [*unfinished, *notes]
    grouped = format_groups(groups, target, extra)
    atomic_write_text(out_dir / "groups.md", grouped + "\n" + "".join(f"\nnote: {n}" for n in notes))
    atomic_write_text(out_dir / "groups.csv", _csv(_group_rows(groups, target, extra)))
    piv = pivot(groups, metric, target)
    pivot_md = pivot_markdown(piv)
    atomic_write_text(out_dir / "table.md", pivot_md + "\n")
    atomic_write_text(out_dir / "table.csv", pivot_csv(piv))
    atomic_write_text(out_dir / "table.tex", pivot_latex(piv))
    pngs = plot_runs(run_dirs, out_dir, groups)
    text = table + ("".join(f"\nnote: {n}" for n in unfinished) if len(run_dirs) == 1 else "")
    if len(run_dirs) > 1:
        text += "\n\n" + grouped + "\n\n" + pivot_md + "".join(f"\nnote: {n}" for n in notes)
    files = [out_dir / n for n in ("summary.md", "summary.csv", "groups.md", "groups.csv", "table.md",
                                   "table.csv", "table.tex")]
    return text, [*files, *pngs]


def _unfinished(run_dirs: list[RunDir], summaries: list[dict]) -> list[str]:
    """One note per run that has not finished: its status (a dead driver's ``running`` is ``killed``) and why."""
    notes = []
    for rd, s in zip(run_dirs, summaries):
        _, status, reason = read_run_status(rd.path)
        if status != "finished":
            notes.append(f"{rd.path.name} is {status} after round {s['rounds']}" + (f" ({reason})" if reason else "")
                         + f"; `fedray run --resume {rd.path}` continues it")
    return notes


def _csv(rows: list[dict], fieldnames: list[str] | None = None) -> str:
    import csv

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fieldnames or list(dict.fromkeys(k for r in rows for k in r)),
                       extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def _group_rows(groups: list, target: float | None, extra: tuple[str, ...] = ()) -> list[dict]:
    """groups.csv: per group its labels, seeds, run directories and mean / std / n of each metric (and of
    ``extra``)."""
    from fedray.reporting.seeds import METRICS, csv_number

    rows = []
    for g in groups:
        row = {"experiment": g.label, "method": g.method, "setting": g.setting, "key": g.key,
               "seeds": len(g.runs), "seed_values": " ".join(str(s) for s in g.seeds),
               "runs": " ".join(rd.path.name for rd in g.runs)}
        for m in (*METRICS, *extra):
            if m == "rounds_to_target" and target is None:
                continue
            st = g.stat(m, target)
            row.update({f"{m}_mean": csv_number(st.mean), f"{m}_std": csv_number(st.std), f"{m}_n": st.n})
        rows.append(row)
    return rows
