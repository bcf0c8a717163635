"""A sweep table beside the paper's numbers: every cell's gap, and whether each of the paper's claims held.

A table of a sweep file (docs/sweep.md, "Beside a paper") may carry ``paper:``: the paper's value of each cell it
reports (``mean ± std`` over the paper's seeds, a bare mean where it gives no spread, ``-`` where it reports a
method that failed to converge; none at all where the sweep checks the paper's claims on other data), keyed by the
table's own row and column labels, for one of the table's metrics, and the paper's claims (``{row: scala, above: all}``: in every column the row's mean is above every other row's).
:func:`paper_markdown` writes, from the table's :class:`~fedray.reporting.seeds.Pivot` of that metric:

- per cell: fedray's mean ± std (n seeds), the paper's, ``fedray − paper`` and that gap in the paper's seed spread
  (``|gap| / σ_paper``), flagged ``outside`` when it is more than one spread: a number to investigate (protocol,
  model, metric), not to tune away;
- per claim and column: fedray's gap between the two rows, in its own seeds' spread of that gap (``√(s_a² + s_b²)``,
  with 2 seeds or more: a gap inside it may be noise), whether the claim held (fedray's row strictly above), the
  paper's gap and fedray's margin in the paper's spread of it (``√(σ_a² + σ_b²)`` of the two cells).

The parsing (:func:`parse_paper`) checks everything before any run starts (``fedray sweep --dry-run`` too): the
metric is one of the table's, every value parses, every claim names rows the table has; the labels are checked
against the points' labels by :mod:`fedray.apps.sweep_spec`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from fedray.core.errors import ConfigError
from fedray.reporting.seeds import Pivot, Stat, _is_acc, _scale_fmt, metric_title

__all__ = ["PAPER_KEYS", "paper_markdown", "paper_labels", "parse_paper"]

PAPER_KEYS = ("source", "metric", "cells", "claims")
_CLAIM_KEYS = ("row", "above", "columns")
_VALUE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(?:(?:±|\+-|\+/-)\s*(\d+(?:\.\d+)?))?\s*$")


def _parse_value(v: Any, where: str) -> dict:
    """A paper cell: ``{"mean": m, "std": s or None}``, or ``{"failed": True}`` for ``-`` (did not converge)."""
    if isinstance(v, bool):
        raise ConfigError(f"{where}: expected a number, 'mean ± std' or '-', got {v!r}")
    if isinstance(v, (int, float)):
        return {"mean": float(v), "std": None}
    if isinstance(v, str):
        if v.strip() == "-":
            return {"failed": True}
        m = _VALUE.match(v)
        if m:
            return {"mean": float(m.group(1)), "std": None if m.group(2) is None else float(m.group(2))}
    raise ConfigError(f"{where}: expected a number, 'mean ± std' or '-' (the paper reports no convergence), got {v!r}")


def parse_paper(raw: Any, where: str, metrics: list[str]) -> dict:
    """``paper:`` of a table, checked and normalised: ``{source, metric, cells: {row: {column: value}},
    claims: [{row, above: [rows] | "all", columns: [columns] | None}]}`` (values as :func:`_parse_value`)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping (source, metric, cells, claims), got {raw!r}")
    for k in raw:
        if k not in PAPER_KEYS:
            raise ConfigError(f"{where}.{k}: unknown field (known: {', '.join(PAPER_KEYS)})")
    metric = raw.get("metric", metrics[0])
    if metric not in metrics:
        raise ConfigError(f"{where}.metric: {metric!r} is not one of the table's metrics ({', '.join(metrics)})")
    if not _is_acc(metric):
        raise ConfigError(f"{where}.metric: {metric!r}: the paper's numbers are compared as accuracies in %")
    cells_raw = raw.get("cells", {})  # none: the claims alone (a sweep that checks a paper's claims on other data)
    if not isinstance(cells_raw, dict) or not (cells_raw or raw.get("claims")):
        raise ConfigError(f"{where}.cells: expected a mapping row -> {{column: value}} (or claims: alone), "
                          f"got {cells_raw!r}")
    cells: dict[str, dict[str, dict]] = {}
    for row, cols in cells_raw.items():
        if not isinstance(cols, dict) or not cols:
            raise ConfigError(f"{where}.cells.{row}: expected a mapping column -> value, got {cols!r}")
        cells[str(row)] = {str(c): _parse_value(v, f"{where}.cells.{row}.{c}") for c, v in cols.items()}
    claims = []
    for i, c in enumerate(raw.get("claims") or []):
        cw = f"{where}.claims[{i}]"
        if not isinstance(c, dict) or "row" not in c or "above" not in c:
            raise ConfigError(f"{cw}: expected {{row: ROW, above: all | [ROW, ...], columns: [COLUMN, ...]}}, got {c!r}")
        for k in c:
            if k not in _CLAIM_KEYS:
                raise ConfigError(f"{cw}.{k}: unknown field (known: {', '.join(_CLAIM_KEYS)})")
        above = c["above"]
        if above != "all" and (not isinstance(above, list) or not above):
            raise ConfigError(f"{cw}.above: expected all or a list of rows, got {above!r}")
        columns = c.get("columns")
        if columns is not None and (not isinstance(columns, list) or not columns):
            raise ConfigError(f"{cw}.columns: expected a list of columns, got {columns!r}")
        claims.append({"row": str(c["row"]), "above": above if above == "all" else [str(r) for r in above],
                       "columns": None if columns is None else [str(x) for x in columns]})
    source = raw.get("source", "")
    if not isinstance(source, str):
        raise ConfigError(f"{where}.source: expected a string (which paper, which table), got {source!r}")
    return {"source": source, "metric": metric, "cells": cells, "claims": claims}


def paper_labels(paper: dict) -> tuple[set[str], set[str]]:
    """The row and column labels ``paper`` names (in its cells and claims), to check against the table's."""
    rows = set(paper["cells"])
    cols = {c for cs in paper["cells"].values() for c in cs}
    for c in paper["claims"]:
        rows.add(c["row"])
        rows |= set(c["above"]) if c["above"] != "all" else set()
        cols |= set(c["columns"] or [])
    return rows, cols


def _pct(st: Stat, metric: str) -> tuple[float, float]:
    scale, _ = _scale_fmt(metric)
    return scale * st.mean, scale * st.std


def _fmt(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return "-"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _paper_text(v: dict | None) -> str:
    if v is None:
        return ""
    if v.get("failed"):
        return "- (did not converge)"
    return _fmt(v["mean"]) + ("" if v["std"] is None else f" ± {_fmt(v['std'])}")


def _ours(st: Stat | None, metric: str) -> str:
    if st is None or st.n == 0:
        return "no finished run" if st is None else f"- (0/{st.total})"
    m, s = _pct(st, metric)
    seeds = f"{st.n} seed" + ("s" if st.n != 1 else "") + (f" of {st.total}" if st.n < st.total else "")
    return f"{_fmt(m)}" + ("" if math.isnan(s) else f" ± {_fmt(s)}") + f" ({seeds})"


def paper_markdown(p: Pivot, paper: dict) -> str:
    """The cells beside the paper's and the claims (module docstring), as Markdown."""
    metric = p.metric
    if not paper["cells"]:  # the claims alone
        return f"{paper['source'] or 'the paper'}: its claims on this sweep's runs, {metric_title(metric)}\n\n" + \
            _claims_markdown(p, paper)
    lines = [f"{paper['source'] or 'the paper'}: {metric_title(metric)} of fedray (mean ± sample std over the seeds "
             "run) beside the paper's (mean ± std over its seeds); a gap of more than one of the paper's spreads is "
             "marked *outside*", "",
             "| method | setting | fedray | paper | fedray − paper | in paper spreads |", "|---|---|---|---|---|---|"]
    outside = compared = spread = 0
    rows, cols = _rows(p, paper), _cols(p, paper)
    for r in rows:
        for c in cols:
            st = p.cells.get((r, c))
            pv = paper["cells"].get(r, {}).get(c)
            if st is None and pv is None:
                continue
            gap = spreads = ""
            if pv is not None and not pv.get("failed") and st is not None and st.n > 0:
                compared += 1
                d = _pct(st, metric)[0] - pv["mean"]
                gap = _fmt(d, signed=True)
                if pv["std"]:
                    spread += 1
                    k = abs(d) / pv["std"]
                    spreads = f"{k:.1f}" + (" *outside*" if k > 1 else "")
                    outside += k > 1
                else:
                    spreads = "(no spread given)"
            lines.append(f"| {r} | {c} | {_ours(st, metric)} | {_paper_text(pv)} | {gap} | {spreads} |")
    lines += ["", f"{compared} cells with both numbers, {spread} of them with the paper's spread; {outside} more "
                  "than one spread from the paper."]
    if paper["claims"]:
        lines += ["", _claims_markdown(p, paper)]
    return "\n".join(lines)


def _rows(p: Pivot, paper: dict) -> list[str]:
    """The table's rows, then those only the paper has (not run yet)."""
    return [*p.rows, *(r for r in paper["cells"] if r not in p.rows)]


def _cols(p: Pivot, paper: dict) -> list[str]:
    return [*p.cols, *dict.fromkeys(c for cs in paper["cells"].values() for c in cs if c not in p.cols)]


def _claims_markdown(p: Pivot, paper: dict) -> str:
    metric = p.metric
    numbers = bool(paper["cells"])  # the paper's gap and spreads exist only where it gave numbers for this data
    out = ["| claim | setting | fedray gap | in fedray's spreads | held |"
           + (" paper gap | fedray margin in paper spreads |" if numbers else ""),
           "|---|---|---|---|---|" + ("---|---|" if numbers else "")]
    tallies = []
    for cl in paper["claims"]:
        row = cl["row"]
        others = [r for r in _rows(p, paper) if r != row] if cl["above"] == "all" else cl["above"]
        held = failed = open_ = 0
        for c in cl["columns"] or _cols(p, paper):
            a = p.cells.get((row, c))
            pa = paper["cells"].get(row, {}).get(c)
            for o in others:
                b = p.cells.get((o, c))
                pb = paper["cells"].get(o, {}).get(c)
                ours = verdict = margin = own = ""
                if a is not None and b is not None and a.n > 0 and b.n > 0:
                    (ma, sa_), (mb, sb_) = _pct(a, metric), _pct(b, metric)
                    d = ma - mb
                    ours = _fmt(d, signed=True)
                    if a.n > 1 and b.n > 1 and (sa_ or sb_):  # the gap against the seeds' own spread
                        own = f"{d / math.hypot(sa_, sb_):+.1f}"
                    verdict = "yes" if d > 0 else "**no**"
                    held += d > 0
                    failed += d <= 0
                    sa, sb = (pa or {}).get("std"), (pb or {}).get("std")
                    if sa is not None and sb is not None and (sa or sb):
                        margin = f"{d / math.hypot(sa, sb):+.1f}"
                else:
                    verdict = "no number yet"
                    open_ += 1
                theirs = ""
                if pa and pb and not pa.get("failed"):
                    theirs = "(the other did not converge)" if pb.get("failed") else _fmt(pa["mean"] - pb["mean"], True)
                out.append(f"| {row} > {o} | {c} | {ours} | {own} | {verdict} |"
                           + (f" {theirs} | {margin} |" if numbers else ""))
        tallies.append(f"**{row} above {'every other row' if cl['above'] == 'all' else ', '.join(others)}"
                       f"{'' if cl['columns'] is None else ' in ' + ', '.join(cl['columns'])}**: held in {held}, "
                       f"failed in {failed}" + (f", {open_} without fedray's numbers (not run or not finished)" if open_ else ""))
    return "Claims (each row against each other row, per setting):\n\n" + "\n".join(out) + "\n\n" + \
        "\n".join(f"- {t}" for t in tallies)
