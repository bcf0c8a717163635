"""Client-count scaling experiments: ``fedray scale SCALE.yaml`` and ``python -m jobs.scale`` (docs/scaling.md has
the scale file, the columns and measured figures).

A *scale file* names a base experiment (``base:`` a config path and/or ``experiment:`` inline, ``overrides:``), the
rounds per point and the axes to sweep (``sweeps:``, a list of grids, or ``sweep:``, one grid; an axis a grid
leaves out takes ``defaults``). Axes: ``population`` (``data.partition.num_clients``, and the ``synthetic``
source's ``num_clients``), ``clients_per_round`` (``train.clients_per_round``), ``num_workers``
(``engine.num_workers``), ``multi_client`` (``engine.multi_client``) and ``fold_group`` (``engine.fold_group``:
``upload_mb`` falls by that factor). Every point is one short FL run, one at a time through
:class:`fedray.apps.launcher.Launcher`, whose round reports are reduced to one row of a table. Points are
de-duplicated; a point with more clients per round than clients, or a ``fold_group`` that is not a multiple of its
``multi_client``, is recorded as skipped; a ``fold_group`` above 1 for an algorithm that cannot fold partial sums
is refused when the scale file is read. Workers that do not fit the Ray cluster's CPUs get ``worker_num_cpus``
lowered so they do (recorded per point): on a small machine a worker sweep then measures over-subscription.

Outputs in the output directory: ``scaling.parquet`` (columns in :data:`COLUMNS`; rewritten after every point),
``scaling.csv``, ``scaling.md`` (the printed table), ``scale.yaml`` (the resolved scale file), ``plots/*.png``
(a plot is skipped when its axis has a single value), ``runs/`` (the run directories of the points) and
``scale.lock`` (one driver per output directory). The in-run measurements (object store, GPU) are in
:mod:`fedray.apps.probes`, the plots in :mod:`fedray.apps.scale_plots`.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedray.apps.launcher import Job, Launcher, RunOutcome, output_lock
from fedray.apps.probes import GpuSampler, ObjectStoreProbe
from fedray.apps.scale_plots import AXES, write_plots
from fedray.apps.sweep_spec import read_base
from fedray.config import ConfigError, apply_overrides, from_dict, read_config_file
from fedray.core.io import atomic_writer
from fedray.core.procinfo import proc_memory_mb
from fedray.core.ray_env import ensure_ray
from fedray.reporting.trackers import check_trackers

_AXIS_DEFAULTS = {"population": None, "clients_per_round": None, "num_workers": 2, "multi_client": 1, "fold_group": 1}
_SCALE_KEYS = {"name", "base", "experiment", "overrides", "rounds", "output", "ray", "defaults", "sweep", "sweeps"}

#: The columns of ``scaling.parquet``, in order, with their meaning (also rendered in docs/scaling.md).
COLUMNS: dict[str, str] = {
    "point": "index of the point in the sweep",
    "population": "clients in the population (data.partition.num_clients)",
    "clients_per_round": "clients sampled per round (train.clients_per_round)",
    "num_workers": "client workers (engine.num_workers)",
    "multi_client": "clients trained at once per worker (engine.multi_client)",
    "fold_group": "clients folded into one partial sum on a worker (engine.fold_group)",
    "worker_num_cpus": "CPUs reserved per worker (lowered when the workers would not fit the cluster)",
    "backend": "engine.backend (ray or local)",
    "source": "data.source",
    "model": "model.name",
    "algorithm": "algorithm.name",
    "num_params": "length of the flat weight vector (parameters and float buffers)",
    "rounds": "rounds run",
    "status": "ok, skipped: <why> or failed: <error>",
    "client_updates": "client updates in the measured rounds (rounds 2..R; round 1 when R = 1)",
    "samples": "training samples in the measured rounds",
    "client_updates_per_s": "client_updates / measured round seconds without evaluation",
    "samples_per_s": "samples / measured round seconds without evaluation",
    "round_s": "mean wall seconds of a measured round as the driver sees it (incl. evaluation)",
    "round1_s": "wall seconds of round 1 (cold start: first-touch kernels, worker warm-up)",
    "sample_s": "mean seconds sampling clients (coordinator)",
    "broadcast_s": "mean seconds putting the weights and payload into the object store",
    "train_s": "mean seconds of dispatch + client training, minus the fold",
    "aggregate_s": "mean seconds of the ordered fold + server optimizer step",
    "eval_s": "mean seconds evaluating the global model",
    "upload_mb": "mean MB of weight vectors the workers sent the coordinator per measured round",
    "overhead_s": "round_s minus the coordinator's own seconds (driver round trip, ledger write)",
    "startup_s": "seconds from the call to the first round (data, partition, engine start)",
    "total_s": "wall seconds of the whole point",
    "coordinator_rss_mb": "coordinator resident memory after the last round (MB)",
    "coordinator_peak_mb": "coordinator peak resident memory (VmHWM, MB; includes object-store pages it read)",
    "coordinator_anon_mb": "largest private (anonymous) memory of the coordinator at a round end (MB)",
    "workers_rss_mb": "sum of the workers' resident memory after the last round (MB)",
    "workers_peak_mb": "largest peak resident memory (VmHWM) of one worker (MB)",
    "driver_rss_mb": "resident memory of the process running the sweep after the point (MB)",
    "object_store_used_mb": "largest object-store use seen at round ends (MB; NaN without Ray)",
    "object_store_spilled_mb": "bytes spilled to disk by the object store during the point (MB)",
    "gpu_util_mean_pct": "mean GPU utilisation sampled every 0.5 s during the rounds (NaN without GPUs)",
    "gpu_util_max_pct": "largest sampled GPU utilisation (NaN without GPUs)",
    "gpu_mem_max_mb": "largest sampled GPU memory in use, all GPUs together (NaN without GPUs)",
    "speedup_vs_fewest_workers": "client_updates_per_s over that of the same point with the fewest workers",
    "accuracy": "test accuracy after the last round",
    "weights_hash": "hash of the final global weights",
}


# ------------------------------------------------------------------------------------------- scale file
@dataclass
class ScaleSpec:
    name: str
    base: dict  # experiment config as a dict (overrides applied)
    rounds: int
    output: Path
    ray: dict = field(default_factory=dict)
    points: list[dict] = field(default_factory=list)  # one {axis: value} per point
    source_path: str | None = None


def _int_list(field_name: str, value: Any) -> list[int]:
    vals = value if isinstance(value, list) else [value]
    if not vals:
        raise ConfigError(f"{field_name}: the list of values is empty")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{field_name}: values must be integers >= 1, got {v!r}")
    return [int(v) for v in vals]


def load_scale(path: str | Path | None = None, *, data: dict | None = None, output: str | Path | None = None,
               overrides: list[str] | None = None) -> ScaleSpec:
    """Read and validate a scale file (or the mapping ``data``), with ``overrides`` (``a.b=c``) of its base
    experiment after the file's own; errors name the offending field."""
    if data is None:
        if path is None:
            raise ConfigError("scale: give a scale file or its contents")
        data = read_config_file(path)
    data = dict(data)
    unknown = sorted(set(data) - _SCALE_KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown field in the scale file (known: {', '.join(sorted(_SCALE_KEYS))})")
    base = _base_experiment(data, Path(path).resolve().parent if path is not None else Path.cwd(), overrides or [])
    cfg = from_dict(base)  # the base experiment must be valid on its own
    check_trackers(cfg)  # a tracker library that is missing: refused before the first point
    rounds = data.get("rounds", 3)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds: expected an integer >= 1, got {rounds!r}")
    ray_args = data.get("ray") or {}
    if not isinstance(ray_args, dict):
        raise ConfigError(f"ray: expected a mapping of ray.init arguments, got {ray_args!r}")
    name = data.get("name") or (Path(path).stem if path is not None else "scale")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"name: expected a non-empty string, got {name!r}")
    out = output if output is not None else data.get("output") or f"scale-out/{name}"
    if not isinstance(out, (str, Path)):
        raise ConfigError(f"output: expected a directory path, got {out!r}")
    points = _sweep_points(data, _axis_defaults(data, cfg))
    _check_fold_groups(cfg, points)
    return ScaleSpec(name=name, base=base, rounds=int(rounds), output=Path(out), ray=dict(ray_args), points=points,
                     source_path=str(Path(path).resolve()) if path is not None else None)


def _base_experiment(data: dict, here: Path, cli_overrides: list[str]) -> dict:
    """The base experiment of a scale file as a dict: ``base`` (a path relative to ``here``) merged with
    the inline ``experiment``, then the ``overrides``."""
    base: dict = {}
    if data.get("base") is not None:
        base = read_base(data["base"], here, inline=False)  # inline experiments go in `experiment:`
    if data.get("experiment") is not None:
        if not isinstance(data["experiment"], dict):
            raise ConfigError(f"experiment: expected a mapping (an inline experiment config), got {data['experiment']!r}")
        base = _deep_merge(base, data["experiment"])
    if not base and data.get("base") is None and data.get("experiment") is None:
        raise ConfigError("base: the scale file needs a base experiment (base: PATH or experiment: {...})")
    ovs = data.get("overrides") or []
    if not isinstance(ovs, list) or not all(isinstance(o, str) for o in ovs):
        raise ConfigError(f"overrides: expected a list of a.b=c strings, got {ovs!r}")
    return apply_overrides(base, [*ovs, *cli_overrides])


def _axis_defaults(data: dict, cfg) -> dict:
    """Each axis' value where a grid does not sweep it: the scale file's ``defaults``, else the base
    experiment's (``cfg``)."""
    defaults = dict(_AXIS_DEFAULTS)
    defaults.update(population=int(cfg.data.partition.num_clients), clients_per_round=int(cfg.train.clients_per_round),
                    multi_client=int(cfg.engine.multi_client), fold_group=int(cfg.engine.fold_group))
    if cfg.engine.num_workers is not None:
        defaults["num_workers"] = int(cfg.engine.num_workers)
    given = data.get("defaults") or {}
    if not isinstance(given, dict):
        raise ConfigError(f"defaults: expected a mapping of axis values, got {given!r}")
    for k, v in given.items():
        if k not in AXES:
            raise ConfigError(f"defaults.{k}: unknown axis (known: {', '.join(AXES)})")
        if isinstance(v, list):
            raise ConfigError(f"defaults.{k}: expected one integer (one default per axis), got the list {v!r}")
        defaults[k] = _int_list(f"defaults.{k}", v)[0]
    return defaults


def _sweep_points(data: dict, defaults: dict) -> list[dict]:
    """The de-duplicated points ({axis: value}) of the scale file's ``sweep`` / ``sweeps`` grids."""
    if "sweep" in data and "sweeps" in data:
        raise ConfigError("sweeps: give either sweep (one grid) or sweeps (a list of grids), not both")
    grids = data.get("sweeps") if "sweeps" in data else [data.get("sweep") or {}]
    if not isinstance(grids, list) or not grids:
        raise ConfigError(f"sweeps: expected a non-empty list of grids, got {grids!r}")
    points: list[dict] = []
    seen = set()
    for gi, grid in enumerate(grids):
        where = "sweep" if "sweeps" not in data else f"sweeps[{gi}]"
        if not isinstance(grid, dict):
            raise ConfigError(f"{where}: expected a mapping axis -> list of values, got {grid!r}")
        for k in grid:
            if k not in AXES:
                raise ConfigError(f"{where}.{k}: unknown axis (known: {', '.join(AXES)})")
        lists = [_int_list(f"{where}.{a}", grid[a]) if a in grid else [defaults[a]] for a in AXES]
        for combo in itertools.product(*lists):
            key = tuple(combo)
            if key in seen:
                continue
            seen.add(key)
            points.append(dict(zip(AXES, combo)))
    return points


def _check_fold_groups(cfg, points: list[dict]) -> None:
    """A ``fold_group`` above 1 needs an algorithm that can fold partial sums: refused before any point runs."""
    g = max((p["fold_group"] for p in points), default=1)
    if g > 1:
        from fedray.engine.programs.fold_group import check_fold_group

        probe = copy.copy(cfg)
        probe.engine = copy.copy(cfg.engine)
        probe.engine.fold_group = g
        try:
            check_fold_group(probe)
        except ConfigError as e:
            raise ConfigError(f"fold_group: a point has fold_group {g}, but {e}") from None


def _deep_merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def point_config(spec: ScaleSpec, point: dict, cluster_cpus: float | None = None) -> dict:
    """The experiment config (a dict) of one point: the base with the point's axes, ``spec.rounds``
    rounds, run directories under ``<output>/runs``, no checkpoints, TensorBoard or progress bars."""
    cfg = copy.deepcopy(spec.base)
    data = cfg.setdefault("data", {})
    part = data.setdefault("partition", {})
    part["num_clients"] = int(point["population"])
    if data.get("source") == "synthetic":
        data.setdefault("params", {})["num_clients"] = int(point["population"])
    cfg.setdefault("train", {})
    cfg["train"]["clients_per_round"] = int(point["clients_per_round"])
    cfg["train"]["rounds"] = int(spec.rounds)
    eng = cfg.setdefault("engine", {})
    eng["num_workers"] = int(point["num_workers"])
    eng["multi_client"] = int(point["multi_client"])
    eng["fold_group"] = int(point["fold_group"])
    if cluster_cpus is not None and eng.get("backend", "ray") == "ray":
        per = float(eng.get("worker_num_cpus", 1.0))
        coord = float(eng.get("coordinator_num_cpus", 0.0))
        room = max(0.0, cluster_cpus - coord)
        if per * point["num_workers"] > room + 1e-9:
            eng["worker_num_cpus"] = math.floor(room / point["num_workers"] * 1000) / 1000
    out = cfg.setdefault("output", {})
    out["root"] = str(spec.output / "runs")
    out["name"] = "p{:03d}-P{}-K{}-W{}-m{}".format(point.get("index", 0), point["population"],
                                                  point["clients_per_round"], point["num_workers"],
                                                  point["multi_client"]) + \
        (f"-g{point['fold_group']}" if point["fold_group"] > 1 else "")
    out["checkpoint_every"] = 0
    out["tensorboard"] = False
    out["progress"] = False
    return cfg


# ------------------------------------------------------------------------------------------- running
def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else math.nan


def summarize_point(point: dict, cfg: dict, res, seen: dict) -> dict:
    """Reduce one run's round reports (``res.rounds``) and the sampled figures to a table row."""
    rounds = res.rounds
    measured = rounds[1:] if len(rounds) > 1 else rounds
    secs = [r.get("seconds", {}) for r in measured]
    wall = [float(r.get("wall_seconds", r.get("seconds_total", math.nan))) for r in measured]
    no_eval = [w - float(s.get("eval", 0.0)) for w, s in zip(wall, secs)]
    updates = int(sum(int(r.get("num_clients", 0)) for r in measured))
    samples = int(sum(int(r.get("num_samples", 0)) for r in measured))
    busy = float(sum(no_eval))
    mem = [r.get("memory") or {} for r in rounds]
    last = mem[-1] if mem else {}
    row = {
        "client_updates": updates,
        "samples": samples,
        "client_updates_per_s": updates / busy if busy > 0 else math.nan,
        "samples_per_s": samples / busy if busy > 0 else math.nan,
        "round_s": _mean(wall),
        "round1_s": float(rounds[0].get("wall_seconds", math.nan)) if rounds else math.nan,
        "upload_mb": _mean(float((r.get("bytes") or {}).get("upload", math.nan)) / 1e6 for r in measured),
        **{f"{k}_s": _mean(s.get(k) for s in secs) for k in ("sample", "broadcast", "train", "aggregate", "eval")},
        "overhead_s": _mean(w - float(r.get("seconds_total", math.nan)) for w, r in zip(wall, measured)),
        "startup_s": float(res.startup_seconds),
        "coordinator_rss_mb": float(last.get("coordinator_rss_mb", math.nan)),
        "coordinator_peak_mb": float(last.get("coordinator_peak_mb", math.nan)),
        "coordinator_anon_mb": max((float(m.get("coordinator_anon_mb", math.nan)) for m in mem), default=math.nan),
        "workers_rss_mb": float(last.get("workers_rss_mb", math.nan)),
        "workers_peak_mb": float(last.get("workers_peak_mb", math.nan)),
        "object_store_used_mb": max(seen["store_used"], default=math.nan),
        "object_store_spilled_mb": (seen["spilled"][-1] - seen["spilled0"]) if seen["spilled"] else math.nan,
        "accuracy": float(res.accuracy),
        "weights_hash": res.weights_hash,
    }
    return row


def _ensure_ray(spec: ScaleSpec, cfg) -> float | None:
    """Start (or reuse) Ray for Ray-backend sweeps; returns the cluster's CPUs (None without Ray)."""
    if cfg.engine.backend != "ray":
        return None
    import ray

    # without an address (engine.ray_address, RAY_ADDRESS) a private local instance, never a `ray start`
    # cluster found on this host
    from fedray.plugins import plugin_py_modules

    ensure_ray(cfg.engine.object_store_memory, address=cfg.engine.ray_address, log_to_driver=False,
               configure_logging=False, py_modules=plugin_py_modules(cfg), **spec.ray)
    return float(ray.cluster_resources().get("CPU", 1.0))


class _Point:
    """One point of the sweep: its table row so far, its run (:class:`~fedray.apps.launcher.Job`) and the probes
    sampled around it (object store at every round end, GPUs every 0.5 s)."""

    def __init__(self, spec: ScaleSpec, point: dict, cluster_cpus: float | None):
        self.cfg = point_config(spec, point, cluster_cpus)
        base = from_dict(spec.base)
        self.row = {"point": int(point["index"]), **{a: int(point[a]) for a in AXES},
                    "worker_num_cpus": float(self.cfg["engine"].get("worker_num_cpus", base.engine.worker_num_cpus)),
                    "backend": base.engine.backend, "source": base.data.source, "model": base.model.name,
                    "algorithm": base.algorithm.name, "num_params": -1, "rounds": int(spec.rounds), "status": "ok"}
        if point["clients_per_round"] > point["population"]:
            self.row["status"] = (f"skipped: {point['clients_per_round']} clients per round > population "
                                  f"{point['population']}")
        elif point["fold_group"] > 1 and point["fold_group"] % point["multi_client"]:
            self.row["status"] = (f"skipped: fold_group {point['fold_group']} is not a multiple of multi_client "
                                  f"{point['multi_client']}")

    def job(self) -> Job:
        """The point's run (the sweep owns its run directories: a point run again starts over), probes started."""
        cfg = from_dict(self.cfg)
        self.probe, self.gpu = ObjectStoreProbe(), GpuSampler()
        _, spilled0 = self.probe.read()
        self.seen = {"store_used": [], "spilled": [], "spilled0": spilled0 if not math.isnan(spilled0) else 0.0}
        self.gpu.start()
        return Job(self.row["point"], config=cfg, overwrite=True, on_round=self._on_round)

    def _on_round(self, report: dict) -> None:
        used, spilled = self.probe.read()
        if not math.isnan(used):
            self.seen["store_used"].append(used)
            self.seen["spilled"].append(spilled)

    def finish(self, o: RunOutcome) -> dict | None:
        """The point's row from its outcome; None for a run the batch's stop interrupted (not measured)."""
        gpu = self.gpu.stop()
        row = {**self.row, "total_s": o.seconds}
        if o.status == "failed":
            row["status"] = f"failed: {o.error}"[:300]
            return row
        if o.status != "finished":
            return None
        row.update(gpu)
        row.update(summarize_point(row, self.cfg, o.result, self.seen))
        try:  # length of the flat float32 weight vector (parameters and float buffers)
            row["num_params"] = int(np.load(o.run_dir / "final_weights.npy", mmap_mode="r").shape[0])
        except (OSError, ValueError):
            pass
        row["driver_rss_mb"] = proc_memory_mb(os.getpid())[0]
        return row


def add_speedups(rows: list[dict]) -> None:
    """``speedup_vs_fewest_workers`` for every ok row: its throughput over that of the ok row with the
    same population, clients per round, multi_client and fold_group and the fewest workers."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["population"], r["clients_per_round"], r["multi_client"], r["fold_group"]), []).append(r)
    for r in rows:
        r["speedup_vs_fewest_workers"] = math.nan
    for g in groups.values():
        ref = min(g, key=lambda r: r["num_workers"])
        for r in g:
            base = ref.get("client_updates_per_s", math.nan)
            r["speedup_vs_fewest_workers"] = r["client_updates_per_s"] / base if base and base > 0 else math.nan


def to_table(rows: list[dict]):
    """A pyarrow Table with exactly :data:`COLUMNS` (missing values as null / NaN)."""
    import pyarrow as pa

    ints = {"point", "population", "clients_per_round", "num_workers", "multi_client", "fold_group", "num_params", "rounds",
            "client_updates", "samples"}
    strs = {"backend", "source", "model", "algorithm", "status", "weights_hash"}
    arrays = []
    for c in COLUMNS:
        vals = [r.get(c) for r in rows]
        if c in ints:
            arrays.append(pa.array([None if v is None else int(v) for v in vals], type=pa.int64()))
        elif c in strs:
            arrays.append(pa.array([None if v is None else str(v) for v in vals], type=pa.string()))
        else:
            arrays.append(pa.array([math.nan if v is None else float(v) for v in vals], type=pa.float64()))
    table = pa.Table.from_arrays(arrays, names=list(COLUMNS))
    return table.replace_schema_metadata({b"fedray.columns": json.dumps(COLUMNS).encode()})


def format_rows(rows: list[dict]) -> str:
    """A Markdown table of the main columns."""
    cols = [("population", "P", "{:d}"), ("clients_per_round", "K", "{:d}"), ("num_workers", "W", "{:d}"),
            ("multi_client", "m", "{:d}"), ("fold_group", "g", "{:d}"), ("client_updates_per_s", "upd/s", "{:.1f}"),
            ("samples_per_s", "samples/s", "{:.0f}"), ("round_s", "round s", "{:.3f}"), ("train_s", "train", "{:.3f}"),
            ("aggregate_s", "aggr", "{:.3f}"), ("eval_s", "eval", "{:.3f}"), ("upload_mb", "upload MB", "{:.0f}"),
            ("startup_s", "start s", "{:.1f}"),
            ("coordinator_peak_mb", "coord MB", "{:.0f}"), ("workers_peak_mb", "worker MB", "{:.0f}"),
            ("object_store_used_mb", "store MB", "{:.0f}"), ("speedup_vs_fewest_workers", "speed-up", "{:.2f}"),
            ("status", "status", "{}")]
    lines = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("-")
            else:
                try:
                    cells.append(fmt.format(v))
                except (ValueError, TypeError):
                    cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- entry point
def _point_key(row: dict) -> tuple:
    """The axes' values of a point or a table row (a table written before the fold_group axis: 1)."""
    return tuple(int(row.get(a) or 1) if a == "fold_group" else int(row[a]) for a in AXES)


def _scale_record(spec: ScaleSpec) -> dict:
    return {"name": spec.name, "rounds": spec.rounds, "ray": spec.ray, "experiment": spec.base,
            "points": spec.points, "source": spec.source_path}


def finished_points(spec: ScaleSpec) -> dict[tuple, dict]:
    """Rows with status ``ok`` of an earlier sweep into ``spec.output``, by point (the axes' values), for
    ``--resume``. The earlier sweep must have measured the same experiment for the same number of rounds
    (its ``scale.yaml``); otherwise a :class:`ConfigError` says what changed."""
    import pyarrow.parquet as pq
    import yaml

    table, record = spec.output / "scaling.parquet", spec.output / "scale.yaml"
    if not table.is_file() or not record.is_file():
        return {}
    prev = yaml.safe_load(record.read_text()) or {}
    now = yaml.safe_load(yaml.safe_dump(_scale_record(spec), sort_keys=False))
    for key in ("experiment", "rounds"):
        if prev.get(key) != now.get(key):
            raise ConfigError(f"--resume: {key} differs from the sweep already in {spec.output} ({record}); "
                              "resume with the same scale file or write to a new --output-dir")
    done = {}
    for row in pq.read_table(str(table)).to_pylist():
        if row.get("status") == "ok":
            done[_point_key(row)] = row
    return done


def run_scale(spec: ScaleSpec, log=print, resume: bool = False) -> tuple[list[dict], list[Path]]:
    """Run every point of ``spec`` (in order, one at a time: :class:`~fedray.apps.launcher.Launcher`), write the
    table, the plots and the resolved scale file into ``spec.output``; returns (rows, files written). With
    ``resume`` the points an earlier sweep into the same output directory finished (status ok) are kept, not run
    again; failed ones run again. Ctrl-C or SIGTERM stop the point running after its round in flight: the rows
    then end before the last point, and the table, the CSV and the plots hold the points measured."""
    out = spec.output
    out.mkdir(parents=True, exist_ok=True)
    with output_lock(out / "scale.lock", f"scale {out}"):
        return _run_locked(spec, log, resume)


def _point_line(i: int, n: int, point: dict) -> str:
    return (f"[scale] point {i + 1}/{n}: population {point['population']:,}, {point['clients_per_round']} "
            f"clients/round, {point['num_workers']} workers, multi_client {point['multi_client']}"
            + (f", fold_group {point['fold_group']}" if point["fold_group"] > 1 else ""))


def _run_locked(spec: ScaleSpec, log, resume: bool) -> tuple[list[dict], list[Path]]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq
    import yaml

    out = spec.output
    done = finished_points(spec) if resume else {}
    (out / "scale.yaml").write_text(yaml.safe_dump(_scale_record(spec), sort_keys=False))
    rows: list[dict] = []
    # points done / total on a terminal (the [scale] lines print above it); the lines alone otherwise
    launcher = Launcher(1, tag="scale", total=len(spec.points), unit="point", desc=f"scale {spec.name}", log=log)
    todo = iter(enumerate(spec.points))
    running: dict[int, _Point] = {}
    ray: dict = {}

    def record(row: dict) -> None:
        rows.append(row)
        add_speedups(rows)
        with atomic_writer(out / "scaling.parquet") as f:  # after every point: a crashed sweep keeps what it measured
            pq.write_table(to_table(rows), f)
        ok = row.get("status") == "ok"
        launcher.advance(1, **({"upd/s": f"{row['client_updates_per_s']:.1f}"} if ok else {"last": row["status"][:20]}))

    def next_job() -> Job | None:
        for i, point in todo:
            point = {**point, "index": i}
            if _point_key(point) in done:
                launcher.say(_point_line(i, len(spec.points), point) + " (measured earlier, kept)")
                record({"fold_group": point["fold_group"], **done[_point_key(point)], "point": i})
                continue
            launcher.say(_point_line(i, len(spec.points), point))
            if not ray:  # Ray is started only when a point has to run
                ray["cpus"] = _ensure_ray(spec, from_dict(point_config(spec, point)))
            p = _Point(spec, point, ray["cpus"])
            if p.row["status"] != "ok":
                record(p.row)
                continue
            running[i] = p
            return p.job()
        return None

    def settle(o: RunOutcome) -> None:
        row = running.pop(o.key).finish(o)
        if row is None:
            return
        if row["status"] == "ok":
            launcher.say(f"[scale]   {row['client_updates_per_s']:.1f} client updates/s, round {row['round_s']:.3f} s, "
                         f"coordinator peak {row['coordinator_peak_mb']:.0f} MB, start-up {row['startup_s']:.1f} s")
        else:
            launcher.say(f"[scale] point {o.key}: {row['status']}")
        record(row)

    launcher.run(next_job, settle, stopping="; --resume measures it and the points after it")
    table = to_table(rows)
    with atomic_writer(out / "scaling.csv") as f:
        pacsv.write_csv(table, f)
    md = format_rows(rows)
    (out / "scaling.md").write_text(md + "\n")
    files = [out / "scaling.parquet", out / "scaling.csv", out / "scaling.md"]
    files += write_plots(rows, out / "plots")
    return rows, files


def _dry_run(spec: ScaleSpec, log) -> int:
    for i, p in enumerate(spec.points):
        log(f"{i:3d}  population {p['population']:>7,}  clients/round {p['clients_per_round']:>5}  "
            f"workers {p['num_workers']}  multi_client {p['multi_client']}  fold_group {p['fold_group']}")
    log(f"{len(spec.points)} points x {spec.rounds} rounds -> {spec.output} (run directories in {spec.output / 'runs'})")
    return 0


def main_cli(config: str, overrides: list[str] | None = None, *, output: str | None = None, dry_run: bool = False,
             resume: bool = False, log=print) -> int:
    """Shared body of ``fedray scale`` and ``python -m jobs.scale``: exit 0 done, 1 a point failed, 130 interrupted;
    a bad scale file raises ConfigError (exit 2 in the callers)."""
    spec = load_scale(config, output=output, overrides=overrides)
    if dry_run:
        return _dry_run(spec, log)
    rows, files = run_scale(spec, log=log, resume=resume)
    print(format_rows(rows))
    for f in files:
        print(f"wrote {f}")
    print(f"scale output directory: {spec.output}")
    if len(rows) < len(spec.points):  # stopped by Ctrl-C / SIGTERM before the last point
        return 130
    failed = [r for r in rows if str(r.get("status", "")).startswith("failed")]
    return 1 if failed else 0
