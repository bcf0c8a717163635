"""Runs grouped over seeds, for ``fedray report``: mean ± std per experiment and paper-style pivot tables.

Runs whose resolved configs differ only by ``seed`` are one experiment (``config_hash(cfg,
ignore=("seed",))``: the fields the run hash leaves out, such as ``output.*`` and the engine's worker
counts, are left out here too). The partition seed follows ``seed`` unless ``data.partition.seed`` is
set, so the seeds of a group differ in partition, client sampling and initialisation: what a paper
averages over.

A pivot table has one row per method (``algorithm.name``, with ``+server`` when the server optimizer is
not ``none``) and one column per setting (the other fields that vary between groups, e.g. ``α=0.05``);
its cells are mean ± std (sample std, ddof=1) of one metric over the seeds, written as Markdown, CSV
and LaTeX (booktabs, best cell per column in bold). ``fedray sweep`` names the rows and columns by config
fields instead (:func:`label_by`), and its cells may also show ``mean_last5`` or any per-round key of
metrics.jsonl reduced over the rounds (``last:analysis.effective_rank``, :func:`reduce_rounds`). A metric of
``eval.metrics`` (``balanced_accuracy``, or ``NAME.KEY`` of one that reports several values, e.g.
``per_class_accuracy.3``) shows its value at the last evaluated round, as ``accuracy`` does.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.config_paths import get_path, is_path
from fedray.reporting.rundir import RunDir

#: Metrics a cell can show; accuracies are fractions in the files, percentages in the tables.
METRICS = ("accuracy", "ema_accuracy", "best_accuracy", "rounds_to_target")
#: Also from each run's summary (fedray.reporting.report.summarize): the mean of the last five evaluated rounds.
SUMMARY_METRICS = ("mean_last5",)
#: ``REDUCTION:KEY``: any per-round key of metrics.jsonl (dotted for nested ones, e.g. analysis.effective_rank,
#: bytes.activations, domain_mean_accuracy) reduced over the rounds that have it.
REDUCTIONS = ("last", "mean", "max", "min", "last5")
#: A metric of ``eval.metrics`` (fedray.metrics.registry): NAME, or NAME.KEY of one that reports several values.
_EVAL_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)?")
#: Fields that make the method (the row); every other varying field makes the setting (the column).
METHOD_PREFIXES = ("algorithm.", "server.")
#: Short names of setting fields in column labels (otherwise the field's last component).
SHORT_NAMES = {"alpha": "α", "beta": "β"}
_LATEX_NAMES = {"α": r"$\alpha$", "β": r"$\beta$"}
_MISSING = object()  # a field a group's config does not have (e.g. a partitioner parameter of another partitioner)


@dataclass
class Stat:
    """Mean and sample std of ``n`` values out of ``total`` seeds (the others: not evaluated / target not reached)."""

    mean: float
    std: float
    n: int
    total: int


@dataclass
class Group:
    """The runs (one per seed) of one experiment."""

    key: str  # config_hash without the seed, or the run directory when it has no readable config
    fields: dict[str, Any]  # hashed_fields without the seed
    runs: list[RunDir] = field(default_factory=list)
    seeds: list[Any] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)  # fedray.reporting.report.summarize of each run
    metrics: list[list[dict]] = field(default_factory=list)  # metrics.jsonl rows of each run
    method: str = ""
    setting: str = ""

    @property
    def label(self) -> str:
        return f"{self.method} {self.setting}".strip()

    def values(self, metric: str, target: float | None = None) -> list[float]:
        """One value of ``metric`` per seed (NaN: not evaluated / target not reached)."""
        if metric == "rounds_to_target":
            if target is None:
                raise ValueError("rounds_to_target needs a target accuracy (--target)")
            return [rounds_to_target(rows, target) for rows in self.metrics]
        if ":" in metric:
            how, key = metric.split(":", 1)
            return [reduce_rounds(rows, key, how) for rows in self.metrics]
        return [float(v) if (v := _number(s.get(metric))) is not None else math.nan for s in self.summaries]

    def stat(self, metric: str, target: float | None = None) -> Stat:
        return mean_std(self.values(metric, target))


def rounds_to_target(rows: list[dict], target: float) -> float:
    """The first round whose accuracy reaches ``target``; NaN when none does."""
    return next((float(r["round"]) for r in rows if r.get("accuracy") is not None and r["accuracy"] >= target),
                math.nan)


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def reduce_rounds(rows: list[dict], key: str, how: str) -> float:
    """``how`` (one of :data:`REDUCTIONS`) of the dotted per-round ``key`` over the rounds that have it; NaN
    when none does."""
    vals = [float(v) for r in rows if (v := _number(get_path(r, key))) is not None]
    if not vals:
        return math.nan
    if how == "last5":
        vals = vals[-5:]
    return {"last": lambda: vals[-1], "max": lambda: max(vals), "min": lambda: min(vals)}.get(
        how, lambda: sum(vals) / len(vals))()


def is_eval_metric(metric: str) -> bool:
    """Whether ``metric`` names a metric of ``eval.metrics`` (NAME or NAME.KEY; not a key fedray's own rows use),
    which only the runs' configs can confirm."""
    from fedray.metrics.registry import RESERVED  # torch-free

    return bool(_EVAL_METRIC.fullmatch(metric)) and metric.split(".")[0] not in RESERVED


def check_metric(metric: str, target: float | None = None) -> None:
    """ValueError unless ``metric`` is one a table cell can show (with ``target`` where it needs one). A metric
    of ``eval.metrics`` (:func:`is_eval_metric`) passes: the callers check it against the runs' configs."""
    if metric in METRICS or metric in SUMMARY_METRICS:
        if metric == "rounds_to_target" and target is None:
            raise ValueError("rounds_to_target needs a target accuracy")
        return
    if is_eval_metric(metric):
        return
    how, _, key = metric.partition(":")
    if how not in REDUCTIONS or not is_path(key):
        raise ValueError(f"{metric!r}: expected one of {', '.join(METRICS + SUMMARY_METRICS)}, a metric of "
                         f"eval.metrics (NAME, or NAME.KEY of one with several values), or REDUCTION:KEY "
                         f"with REDUCTION one of {', '.join(REDUCTIONS)} and KEY a per-round metric "
                         f"(e.g. last:analysis.effective_rank)")


def mean_std(values: list[float]) -> Stat:
    """Mean and sample standard deviation (ddof=1; NaN for fewer than two values) of the non-NaN values."""
    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=np.float64)
    mean = float(a.mean()) if a.size else math.nan
    std = float(a.std(ddof=1)) if a.size > 1 else math.nan
    return Stat(mean, std, int(a.size), len(values))


def band(rows_per_run: list[list[dict]], key: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Per round: mean and sample std (0 where one run has the round) of ``key`` over runs, for a shaded curve."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for rows in rows_per_run:
        for r in rows:
            if r.get(key) is not None:
                by_round[int(r["round"])].append(float(r[key]))
    rounds = sorted(by_round)
    mean = np.array([np.mean(by_round[r]) for r in rounds])
    std = np.array([np.std(by_round[r], ddof=1) if len(by_round[r]) > 1 else 0.0 for r in rounds])
    return rounds, mean, std


# ------------------------------------------------------------------------------------------- grouping
def _run_fields(rd: RunDir) -> tuple[str, dict[str, Any], Any] | None:
    """(experiment key, hashed fields without the seed, seed) of a run; None without a readable config.yaml."""
    from fedray.config import ConfigError, config_hash, from_dict, hashed_fields, yaml_load

    try:
        cfg = from_dict(yaml_load((rd.path / "config.yaml").read_text()) or {}, validate=False)
    except (OSError, ConfigError, ValueError, TypeError):
        return None
    return config_hash(cfg, ignore=("seed",)), hashed_fields(cfg, ignore=("seed",)), cfg.seed


def group_runs(run_dirs: list[RunDir], summaries: list[dict]) -> tuple[list[Group], list[str]]:
    """The runs grouped over seeds (groups in the order of their first run), with each group's method and
    setting labels, and notes on runs left out of a group's statistics (a seed given twice)."""
    groups: dict[str, Group] = {}
    notes: list[str] = []
    for rd, summary in zip(run_dirs, summaries):
        got = _run_fields(rd)
        if got is None:
            key, fields, seed = str(rd.path), {}, None
            notes.append(f"{rd.path}: no readable config.yaml, reported as an experiment of its own")
        else:
            key, fields, seed = got
        g = groups.setdefault(key, Group(key, fields))
        if seed is not None and seed in g.seeds:
            first = g.runs[g.seeds.index(seed)]
            notes.append(f"{rd.path}: repeats seed {seed} of {first.path}; left out of the statistics")
            continue
        g.runs.append(rd)
        g.seeds.append(seed)
        g.summaries.append(summary)
        g.metrics.append(rd.read_metrics())
    out = list(groups.values())
    _label_groups(out)
    return out, notes


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt_value(x) for x in v) + "]"
    return str(v)


def _varying(groups: list[Group]) -> list[str]:
    """Fields (in config order) whose value is not the same in every group."""
    names = list(dict.fromkeys(k for g in groups for k in g.fields))
    return [k for k in names if len({repr(g.fields.get(k, _MISSING)) for g in groups}) > 1]


def _short_names(paths: list[str]) -> dict[str, str]:
    """A short name per field: its last component (α for alpha), the whole path where two would collide."""
    last = {p: SHORT_NAMES.get(p.rsplit(".", 1)[-1], p.rsplit(".", 1)[-1]) for p in paths}
    return {p: s if list(last.values()).count(s) == 1 else p for p, s in last.items()}


def _describe(fields: dict[str, Any], paths: list[str], short: dict[str, str]) -> str:
    return ", ".join(f"{short[p]}={_fmt_value(fields[p])}" for p in paths if p in fields)


def _label_groups(groups: list[Group]) -> None:
    """Method label: algorithm (+server optimizer), plus the method fields that tell apart groups of the same
    algorithm; setting label: the other fields that vary between groups."""
    varying = _varying(groups)
    setting_fields = [p for p in varying if not p.startswith(METHOD_PREFIXES)]
    short = _short_names(varying)
    by_base: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        if not g.fields:
            g.method, g.setting = str(g.runs[0].path), ""  # the path: unique, as the group's key
            continue
        server = g.fields.get("server.name", "none")
        base = str(g.fields.get("algorithm.name", "?")) + ("" if server == "none" else f"+{server}")
        by_base[base].append(g)
        g.setting = _describe(g.fields, setting_fields, short)
    for base, members in by_base.items():
        inner = [p for p in _varying(members) if p.startswith(METHOD_PREFIXES)]
        for g in members:
            extra = _describe(g.fields, inner, _short_names(inner))
            g.method = f"{base} ({extra})" if extra else base


def field_value(fields: dict[str, Any], path: str) -> str:
    """``path``'s value in a group's flattened fields as shown in a label: a mapping field (e.g.
    ``algorithm.params``) as its ``key=value`` pairs, a field the config does not hold as ``-``."""
    if path in fields:
        return _fmt_value(fields[path])
    inner = {k[len(path) + 1:]: v for k, v in fields.items() if k.startswith(path + ".")}
    return ",".join(f"{k}={_fmt_value(v)}" for k, v in sorted(inner.items())) if inner else "-"


def field_label(fields: dict[str, Any], paths: list[str]) -> str:
    """The label of a row or column named by ``paths``: ``...name`` fields as their bare values (e.g. ``fedrcl``),
    the others as ``short=value`` (e.g. ``α=0.05``), in parentheses after a name; a field the run's config does
    not hold is left out where a name already labels it (``fedavg`` beside ``fedccl (signals=local)``)."""
    names = [field_value(fields, p) for p in paths if p.rsplit(".", 1)[-1] == "name"]
    others = [p for p in paths if p.rsplit(".", 1)[-1] != "name"]
    short = _short_names(others)
    pairs = [f"{short[p]}={v}" for p in others if (v := field_value(fields, p)) != "-" or not names]
    if not names:
        return ", ".join(pairs)
    return " ".join(names) + (f" ({', '.join(pairs)})" if pairs else "")


def label_by(groups: list[Group], rows: list[str], columns: list[str]) -> None:
    """Label groups for a table whose rows and columns are named by these config fields (``fedray sweep``)."""
    for g in groups:
        g.method, g.setting = field_label(g.fields, rows), field_label(g.fields, columns)


# ------------------------------------------------------------------------------------------- tables
def _is_acc(metric: str) -> bool:
    """Shown as a percentage: the accuracies (and any per-round key or eval.metrics value ending in ``accuracy``)."""
    if metric in METRICS or metric in SUMMARY_METRICS:
        return metric != "rounds_to_target"
    return metric.rsplit(".", 1)[-1].endswith("accuracy")


def _scale_fmt(metric: str, mean: float = math.nan) -> tuple[float, str]:
    """(scale, format) of a cell: accuracies in % with 2 decimals, rounds with 1, any other key with four
    significant digits of its mean (the std with as many decimals)."""
    if _is_acc(metric):
        return 100.0, "{:.2f}"
    if metric == "rounds_to_target":
        return 1.0, "{:.1f}"
    digits = 3 - math.floor(math.log10(abs(mean))) if mean and math.isfinite(mean) else 3
    return 1.0, f"{{:.{min(max(digits, 0), 8)}f}}"


def _cell_parts(st: Stat, metric: str) -> tuple[str, str | None, str]:
    """(mean, std or None, suffix) as shown: accuracies in %, rounds with one decimal; a suffix
    ``(k/n)`` when only k of n seeds count (target not reached, run never evaluated)."""
    if st.n == 0:
        return ("not reached" if metric == "rounds_to_target" else "-"), None, f" (0/{st.total})"
    scale, fmt = _scale_fmt(metric, st.mean)
    std = None if math.isnan(st.std) else fmt.format(scale * st.std)
    return fmt.format(scale * st.mean), std, (f" ({st.n}/{st.total})" if st.n < st.total else "")


def format_cell(st: Stat, metric: str) -> str:
    mean, std, suffix = _cell_parts(st, metric)
    return mean + suffix if std is None and st.n == 0 else f"{mean} ± {std or '–'}{suffix}"


def metric_title(metric: str, target: float | None = None) -> str:
    if metric == "rounds_to_target":
        return f"rounds to {target:g} accuracy"
    if ":" in metric:
        how, key = metric.split(":", 1)
        what = {"last": "last", "mean": "mean over rounds of", "max": "largest", "min": "smallest",
                "last5": "mean of the last five rounds of"}[how]
        return f"{what} {key}" + (" (%)" if _is_acc(metric) else "")
    if metric not in METRICS and metric not in SUMMARY_METRICS:  # a metric of eval.metrics
        return f"final {metric}" + (" (%)" if _is_acc(metric) else "")
    return {"accuracy": "final accuracy (%)", "ema_accuracy": "EMA accuracy (%)",
            "best_accuracy": "best accuracy (%)", "mean_last5": "mean accuracy of the last five rounds (%)"}[metric]


def format_groups(groups: list[Group], target: float | None = None, extra: tuple[str, ...] = ()) -> str:
    """Markdown: one row per group with the number of seeds and mean ± std of each metric (and of ``extra``)."""
    metrics = [m for m in METRICS if m != "rounds_to_target" or target is not None]
    metrics += [m for m in extra if m not in metrics]
    cols = ["experiment", "seeds"] + [metric_title(m, target) for m in metrics]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for g in groups:
        cells = [g.label, str(len(g.runs))] + [format_cell(g.stat(m, target), m) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class Pivot:
    metric: str
    target: float | None
    rows: list[str]  # methods
    cols: list[str]  # settings
    cells: dict[tuple[str, str], Stat]

    def best(self) -> set[tuple[str, str]]:
        """The best cell(s) of each column: highest mean accuracy; fewest rounds among the cells where the
        most seeds reached the target."""
        out = set()
        for c in self.cols:
            have = [(r, st) for r in self.rows if (st := self.cells.get((r, c))) is not None and st.n > 0]
            if not have:
                continue
            if _is_acc(self.metric):
                score = {r: -st.mean for r, st in have}
            elif self.metric == "rounds_to_target":
                score = {r: (-st.n / st.total, st.mean) for r, st in have}
            else:  # a loss, a byte count, a rank: which end is best depends on the key
                continue
            top = min(score.values())
            out |= {(r, c) for r in score if score[r] == top}
        return out


def pivot(groups: list[Group], metric: str = "accuracy", target: float | None = None, *,
          first_seen: bool = False) -> Pivot:
    """Rows = methods (first-seen order), columns = settings (ordered by the varying fields' values, or with
    ``first_seen`` in the order the groups come in, e.g. a sweep's axis values)."""
    check_metric(metric, target)
    setting_fields = [p for p in _varying(groups) if not p.startswith(METHOD_PREFIXES)]

    def order(g: Group) -> tuple:
        vals = [g.fields.get(p, _MISSING) for p in setting_fields]
        return tuple((2, "") if v is _MISSING or v is None else (0, v) if isinstance(v, (int, float))
                     else (1, repr(v)) for v in vals)

    rows = list(dict.fromkeys(g.method for g in groups))
    cols = list(dict.fromkeys(g.setting or metric_title(metric, target)
                              for g in (groups if first_seen else sorted(groups, key=order))))
    cells = {}
    for g in groups:
        cell = (g.method, g.setting or metric_title(metric, target))
        if cell in cells:  # a guard: the labels name every field that tells groups apart
            raise ValueError(f"two experiments would share the table cell {cell}: {g.label}")
        cells[cell] = g.stat(metric, target)
    return Pivot(metric, target, rows, cols, cells)


def pivot_markdown(p: Pivot) -> str:
    best = p.best()
    lines = [f"{metric_title(p.metric, p.target)}, mean ± std over seeds", "",
             "| method | " + " | ".join(p.cols) + " |", "|" + "---|" * (len(p.cols) + 1)]
    for r in p.rows:
        cells = []
        for c in p.cols:
            st = p.cells.get((r, c))
            text = "" if st is None else format_cell(st, p.metric)
            cells.append(f"**{text}**" if (r, c) in best else text)
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def csv_number(v: float) -> str:
    """A CSV cell: the float in full precision, empty for NaN (no value: one seed's std, target not reached)."""
    return "" if math.isnan(v) else repr(float(v))


def pivot_csv(p: Pivot) -> str:
    """One row per method; per setting: mean, std (empty for one seed), n (seeds counted), seeds. Accuracies
    as fractions, as in metrics.jsonl."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["method"] + [f"{c} {k}" for c in p.cols for k in ("mean", "std", "n", "seeds")])

    for r in p.rows:
        row = [r]
        for c in p.cols:
            st = p.cells.get((r, c))
            row += ["", "", "", ""] if st is None else [csv_number(st.mean), csv_number(st.std), st.n, st.total]
        w.writerow(row)
    return buf.getvalue()


def _latex_escape(text: str) -> str:
    out = "".join("\\" + ch if ch in "&%$#_{}" else r"\textasciitilde{}" if ch == "~"
                  else r"\textasciicircum{}" if ch == "^" else r"\textbackslash{}" if ch == "\\" else ch
                  for ch in text)
    for sym, tex in _LATEX_NAMES.items():
        out = out.replace(sym, tex)
    return out


def pivot_latex(p: Pivot) -> str:
    """A booktabs tabular (\\usepackage{booktabs}); the best cell of each column in bold."""
    best = p.best()
    lines = [f"% {metric_title(p.metric, p.target)}, mean $\\pm$ std over seeds (fedray report)",
             r"\begin{tabular}{l" + "c" * len(p.cols) + "}", r"\toprule",
             "Method & " + " & ".join(_latex_escape(c) for c in p.cols) + r" \\", r"\midrule"]
    for r in p.rows:
        cells = []
        for c in p.cols:
            st = p.cells.get((r, c))
            if st is None:
                cells.append("")
                continue
            mean, std, suffix = _cell_parts(st, p.metric)
            text = mean if std is None and st.n == 0 else f"{mean} $\\pm$ {std or '--'}"
            cells.append((rf"\textbf{{{text}}}" if (r, c) in best else text) + suffix)
        lines.append(_latex_escape(r) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
