"""Sweep files for ``fedray sweep``: a base experiment, the axes to vary, and the tables to make (docs/sweep.md).

::

    name: fedrcl_mnist                     # default: the file's stem
    base: ../configs/fedrcl_mnist.yaml     # an experiment config (path relative to this file) or an inline mapping
    overrides: [train.rounds=80]           # a.b=c overrides of the base (then those of the command line)
    axes:                                  # dotted config field -> values; the points are their product
      data.partition.params.alpha: [0.05, 0.3]
      seed: [0, 1, 2]
    zip:                                   # fields that vary together (one mapping, or a list of them)
      algorithm.name: [fedavg, fedrcl]
      algorithm.params: [{weighting: uniform}, {weighting: uniform, lam: 0.7}]
    exclude: [{algorithm.name: fedavg, data.partition.params.alpha: 0.3}]
    output_dir: runs/sweeps/fedrcl_mnist   # default runs/sweeps/<name>
    parallel: 2                            # points at once (default: as many as the cluster fits)
    resources: {workers: 1, cpus_per_worker: 1, gpus_per_worker: 0}   # each point's slice (as fedray tune)
    table: {rows: algorithm.name, columns: data.partition.params.alpha, metric: [ema_accuracy, accuracy]}

:func:`load_sweep` checks everything before any run and raises :class:`ConfigError` naming the field
(``axes.algorithm.nmae: ...``), the point and field whose value fails the experiment's validation
(``point 3 (algorithm.name=fedrcl, seed=1): algorithm.params.lam: ...``), points that would be the same run,
and tables whose cells would mix two experiments. Nothing is written.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedray.config import (ConfigError, ExperimentConfig, anchor_to_file, apply_overrides, config_hash, from_dict,
                           hashed_fields, parse_override, read_config_file)
from fedray.config_paths import check_path, set_path
from fedray.reporting.claim import default_run_name
from fedray.plugins import check_registries
from fedray.reporting.seeds import check_metric, field_label

SWEEP_KEYS = ("name", "description", "base", "overrides", "axes", "zip", "exclude", "output_dir", "parallel",
              "resources", "table", "tables")
_TABLE_KEYS = ("name", "rows", "columns", "metric", "metrics", "target", "paper")
_RESOURCE_KEYS = ("workers", "cpus_per_worker", "gpus_per_worker")


@dataclass
class TableSpec:
    name: str
    rows: list[str]
    columns: list[str]
    metrics: list[str]
    target: float | None = None
    paper: dict | None = None  # the paper's cells and claims (fedray.reporting.paper.parse_paper), or none


@dataclass
class Point:
    index: int
    values: dict[str, Any]  # field -> value, for every axis and zipped field
    config: dict  # the experiment config of the point (as a dict, run directory under the sweep's runs/)
    hash: str  # config_hash: names the run directory, as `fedray run` with the same overrides would
    run_dir: Path
    rounds: int  # train.rounds

    def describe(self) -> str:
        return ", ".join(f"{k}={_short(v)}" for k, v in self.values.items())


@dataclass
class SweepSpec:
    name: str
    base: dict
    fields: list[str]  # the varying fields, in dimension order
    points: list[Point]
    output_dir: Path
    parallel: int | None
    resources: dict
    tables: list[TableSpec]
    description: str = ""
    source_path: str | None = None


def _short(v: Any) -> str:
    text = repr(v) if isinstance(v, str) and (not v or v.strip() != v) else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------- parsing
def _values(where: str, value: Any) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of values, got {type(value).__name__} {value!r}")
    if not value:
        raise ConfigError(f"{where}: the list of values is empty")
    return value


def _dimensions(data: dict) -> list[list[dict]]:
    """One list of {field: value} alternatives per dimension: every zip group, then every axis."""
    dims: list[list[dict]] = []
    seen: dict[str, str] = {}

    def claim(path: str, where: str) -> None:
        check_path(path, where, ExperimentConfig)
        for other, w in seen.items():
            if other == path or other.startswith(path + ".") or path.startswith(other + "."):
                raise ConfigError(f"{where}: {path} overlaps {w} ({other}); vary a field in one place only")
        seen[path] = where

    zips = data.get("zip") or []
    zips = [zips] if isinstance(zips, dict) else zips
    if not isinstance(zips, list):
        raise ConfigError(f"zip: expected a mapping of field -> values (or a list of them), got {zips!r}")
    for gi, group in enumerate(zips):
        gw = f"zip[{gi}]" if len(zips) > 1 else "zip"
        if not isinstance(group, dict) or not group:
            raise ConfigError(f"{gw}: expected a non-empty mapping of field -> values, got {group!r}")
        lengths = {}
        for path, vals in group.items():
            claim(str(path), f"{gw}.{path}")
            lengths[path] = len(_values(f"{gw}.{path}", vals))
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"{gw}: the fields vary together, so their lists need the same length; got "
                              + ", ".join(f"{p}: {n}" for p, n in lengths.items()))
        n = next(iter(lengths.values()))
        dims.append([{p: group[p][i] for p in group} for i in range(n)])
    axes = data.get("axes") or {}
    if not isinstance(axes, dict):
        raise ConfigError(f"axes: expected a mapping of field -> list of values, got {axes!r}")
    for path, vals in axes.items():
        claim(str(path), f"axes.{path}")
        dims.append([{path: v} for v in _values(f"axes.{path}", vals)])
    if not dims:
        raise ConfigError("axes: the sweep varies nothing (give axes: or zip:)")
    return dims


def _excluded(data: dict, fields: list[str], combos: list[dict]) -> list[bool]:
    rules = data.get("exclude") or []
    if not isinstance(rules, list):
        raise ConfigError(f"exclude: expected a list of {{field: value}} mappings, got {rules!r}")
    out = [False] * len(combos)
    for ri, rule in enumerate(rules):
        if not isinstance(rule, dict) or not rule:
            raise ConfigError(f"exclude[{ri}]: expected a non-empty mapping of field -> value, got {rule!r}")
        for k in rule:
            if k not in fields:
                raise ConfigError(f"exclude[{ri}].{k}: not a field of axes: or zip: (they are: {', '.join(fields)})")
        hits = [i for i, c in enumerate(combos) if all(c[k] == v for k, v in rule.items())]
        if not hits:
            raise ConfigError(f"exclude[{ri}]: {rule} matches no point of the sweep")
        for i in hits:
            out[i] = True
    return out


def read_base(base: Any, here: Path, *, inline: bool = True) -> dict:
    """The base experiment of a sweep or scale file as a dict: the config file ``base`` names (relative to
    ``here``; its relative ``data.root`` and ``plugins`` anchored to it as ``fedray run`` does:
    :func:`~fedray.config.anchor_to_file`) or, with ``inline``, a mapping given in place (anchored to ``here``)."""
    if isinstance(base, str):
        bp = Path(base).expanduser()
        bp = bp if bp.is_absolute() else here / bp
        if not bp.is_file():
            raise ConfigError(f"base: experiment config {str(bp)!r} does not exist")
        return anchor_to_file(read_config_file(bp), bp)
    if inline and isinstance(base, dict):
        return anchor_to_file(base, here / "sweep.yaml")  # relative to the sweep file's directory
    what = "the path of an experiment config" + (" or an inline config mapping" if inline else "")
    raise ConfigError(f"base: expected {what}, got {base!r}")


def _base(data: dict, here: Path, cli_overrides: list[str]) -> dict:
    cfg = read_base(data.get("base"), here)
    ovs = data.get("overrides") or []
    if not isinstance(ovs, list) or not all(isinstance(o, str) for o in ovs):
        raise ConfigError(f"overrides: expected a list of a.b=c strings, got {ovs!r}")
    cfg = apply_overrides(cfg, [*ovs, *cli_overrides])
    if (cfg.get("output") or {}).get("name"):
        raise ConfigError("base: output.name is set, but a sweep names each point's run directory by its config "
                          "hash (as fedray run does without output.name); remove it")
    try:
        from_dict(cfg)
    except ConfigError as e:
        raise ConfigError(f"base: {e}") from None
    return cfg


def _resources(data: dict) -> dict:
    res = data.get("resources") or {}
    if not isinstance(res, dict):
        raise ConfigError(f"resources: expected a mapping ({', '.join(_RESOURCE_KEYS)}), got {res!r}")
    for k, v in res.items():
        if k not in _RESOURCE_KEYS:
            raise ConfigError(f"resources.{k}: unknown field (known: {', '.join(_RESOURCE_KEYS)})")
        whole = k == "workers"
        if v is not None and (isinstance(v, bool) or not isinstance(v, int if whole else (int, float))
                              or v < (1 if whole else 0)):
            raise ConfigError(f"resources.{k}: expected {'an integer >= 1' if whole else 'a number >= 0'}, got {v!r}")
    return {k: res.get(k) for k in _RESOURCE_KEYS}


def _tables(data: dict, fields: list[str]) -> list[TableSpec]:
    if "table" in data and "tables" in data:
        raise ConfigError("tables: give table: (one) or tables: (a list), not both")
    raw = data.get("tables") if "tables" in data else data.get("table")
    raw = [] if raw is None else [raw] if isinstance(raw, dict) else raw
    if not isinstance(raw, list):
        raise ConfigError(f"tables: expected a list of table mappings, got {raw!r}")
    out = []
    for ti, t in enumerate(raw):
        tw = f"tables[{ti}]" if "tables" in data else "table"
        if not isinstance(t, dict):
            raise ConfigError(f"{tw}: expected a mapping (rows, columns, metric), got {t!r}")
        for k in t:
            if k not in _TABLE_KEYS:
                raise ConfigError(f"{tw}.{k}: unknown field (known: {', '.join(_TABLE_KEYS)})")
        axes = {}
        for k in ("rows", "columns"):
            v = t.get(k, [])
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ConfigError(f"{tw}.{k}: expected a field or a list of fields, got {v!r}")
            for f in v:
                check_path(f, f"{tw}.{k}", ExperimentConfig)
                if f == "seed":
                    raise ConfigError(f"{tw}.{k}: seed cannot label a row or column (cells are mean ± std over seeds)")
            axes[k] = v
        if not axes["rows"]:
            raise ConfigError(f"{tw}.rows: give the field(s) that name the rows, e.g. algorithm.name")
        metrics = t.get("metrics", t.get("metric", "accuracy"))
        metrics = [metrics] if isinstance(metrics, str) else metrics
        if not isinstance(metrics, list) or not metrics:
            raise ConfigError(f"{tw}.metric: expected a metric name or a non-empty list of them, got {metrics!r}")
        target = t.get("target")
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                                   or not 0 < target <= 1):
            raise ConfigError(f"{tw}.target: expected an accuracy in (0, 1], got {target!r}")
        for m in metrics:
            try:
                check_metric(m, target)
            except ValueError as e:
                raise ConfigError(f"{tw}.metric: {e}") from None
        name = t.get("name", "table" if len(raw) == 1 else f"table{ti + 1}")
        if not isinstance(name, str) or not name or "/" in name:
            raise ConfigError(f"{tw}.name: expected a file-name-safe string, got {name!r}")
        paper = None
        if t.get("paper") is not None:
            from fedray.reporting.paper import parse_paper

            paper = parse_paper(t["paper"], f"{tw}.paper", [str(m) for m in metrics])
        out.append(TableSpec(name, axes["rows"], axes["columns"], [str(m) for m in metrics],
                             None if target is None else float(target), paper))
    if len({t.name for t in out}) < len(out):
        raise ConfigError("tables: two tables have the same name")
    return out


def _check_cells(tables: list[TableSpec], points: list[Point], cfgs: list[ExperimentConfig]) -> None:
    """No table cell may hold two experiments (points that differ in more than the seed)."""
    flat = [hashed_fields(c, ignore=("seed",)) for c in cfgs]
    keys = [config_hash(c, ignore=("seed",)) for c in cfgs]
    for t in tables:
        cells: dict[tuple[str, str], int] = {}
        for p, fields, key in zip(points, flat, keys):
            cell = (field_label(fields, t.rows), field_label(fields, t.columns))
            first = cells.setdefault(cell, p.index)
            if first != p.index and keys[first] != key:
                diff = sorted(k for k in set(flat[first]) | set(fields) if flat[first].get(k) != fields.get(k))
                raise ConfigError(f"table {t.name!r}: points {first} ({points[first].describe()}) and {p.index} "
                                  f"({p.describe()}) would share the cell {cell} but differ in {', '.join(diff)}: "
                                  f"add the field to rows or columns, or a table per setting")


def _check_paper_labels(tables: list[TableSpec], cfgs: list[ExperimentConfig]) -> None:
    """Every row and column a table's ``paper:`` names is one of the table's labels (as the points make them):
    a misspelt label would leave the paper's number out of the comparison without a word."""
    from fedray.reporting.paper import paper_labels

    flat = [hashed_fields(c, ignore=("seed",)) for c in cfgs]
    for t in tables:
        if t.paper is None:
            continue
        rows = {field_label(f, t.rows) for f in flat}
        cols = {field_label(f, t.columns) for f in flat}
        want_rows, want_cols = paper_labels(t.paper)
        for kind, want, have in (("row", want_rows, rows), ("column", want_cols, cols)):
            for label in sorted(want - have):
                raise ConfigError(f"table {t.name!r}: paper: {kind} {label!r} is not one of the table's {kind}s "
                                  f"({', '.join(repr(x) for x in sorted(have))})")


def _check_eval_metrics(tables: list[TableSpec], points: list[Point], cfgs: list[ExperimentConfig]) -> None:
    """A table metric naming a metric of ``eval.metrics`` (``balanced_accuracy``, ``per_class_accuracy.3``) needs
    it in every point's ``eval.metrics``: otherwise its cells could never be filled."""
    from fedray.reporting.seeds import METRICS, SUMMARY_METRICS, is_eval_metric

    for t in tables:
        for m in t.metrics:
            if m in METRICS or m in SUMMARY_METRICS or not is_eval_metric(m):
                continue
            for p, cfg in zip(points, cfgs):
                if m.split(".")[0] not in cfg.eval.metrics:
                    raise ConfigError(f"table {t.name!r}: metric {m!r} is not a table metric and not in "
                                      f"eval.metrics of point {p.index} ({p.describe()}); add it there (e.g. "
                                      f"eval.metrics: [{m.split('.')[0]}]) or choose a metric table cells can show")


def load_sweep(path: str | Path | None = None, *, data: dict | None = None, overrides: list[str] | None = None,
               output_dir: str | Path | None = None) -> SweepSpec:
    """Read and check a sweep file (or the mapping ``data``): every point's config is built and validated
    (registries included) before anything runs or is written."""
    if data is None:
        if path is None:
            raise ConfigError("sweep: give a sweep file or its contents")
        data = read_config_file(path)
    here = Path(path).resolve().parent if path is not None else Path.cwd()
    for k in data:
        if k not in SWEEP_KEYS:
            raise ConfigError(f"{k}: unknown field in the sweep file (known: {', '.join(SWEEP_KEYS)})")
    if "base" not in data:
        raise ConfigError("base: the sweep needs a base experiment (a config path or an inline mapping)")
    name = data.get("name") or (Path(path).stem if path is not None else "sweep")
    if not isinstance(name, str) or "/" in name:
        raise ConfigError(f"name: expected a file-name-safe string, got {name!r}")
    base = _base(data, here, list(overrides or []))
    dims = _dimensions(data)
    fields = [f for d in dims for f in d[0]]
    for ov in [*(data.get("overrides") or []), *(overrides or [])]:  # an axis' values would silently win
        path = ".".join(parse_override(ov)[0])
        clash = [f for f in fields if f == path or f.startswith(path + ".") or path.startswith(f + ".")]
        if clash:
            raise ConfigError(f"override {ov!r}: {clash[0]} varies in the sweep (axes: / zip:); change its values there")
    combos = [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*dims)]
    dropped = _excluded(data, fields, combos)
    out = Path(output_dir if output_dir is not None else data.get("output_dir") or f"runs/sweeps/{name}")
    parallel = data.get("parallel")
    if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
        raise ConfigError(f"parallel: expected an integer >= 1 (points at once), got {parallel!r}")
    points, cfgs, by_hash = [], [], {}
    for values in (c for c, drop in zip(combos, dropped) if not drop):
        i = len(points)
        cfg = copy.deepcopy(base)
        for k, v in values.items():
            set_path(cfg, k, v)
        cfg.setdefault("output", {})["root"] = str(out / "runs")
        cfg["output"]["progress"] = False
        if not (cfg.get("data") or {}).get("cache_dir"):
            cfg.setdefault("data", {})["cache_dir"] = str(out / "_partitions")
        desc = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
        try:
            ec = from_dict(cfg)
            check_registries(ec)
        except ConfigError as e:
            raise ConfigError(f"point {i} ({desc}): {e}") from None
        h = config_hash(ec)
        if h in by_hash:
            raise ConfigError(f"points {by_hash[h]} ({points[by_hash[h]].describe()}) and {i} ({desc}) are the "
                              f"same run (config hash {h}): they differ only in fields that do not change results "
                              f"or not at all")
        by_hash[h] = i
        points.append(Point(i, values, cfg, h, out / "runs" / default_run_name(ec), int(ec.train.rounds)))
        cfgs.append(ec)
    if not points:
        raise ConfigError("exclude: every point of the sweep is excluded")
    tables = _tables(data, fields)
    _check_cells(tables, points, cfgs)
    _check_paper_labels(tables, cfgs)
    _check_eval_metrics(tables, points, cfgs)
    description = data.get("description") or ""
    return SweepSpec(name=name, base=base, fields=fields, points=points, output_dir=out, parallel=parallel,
                     resources=_resources(data), tables=tables, description=str(description),
                     source_path=str(Path(path).resolve()) if path is not None else None)
