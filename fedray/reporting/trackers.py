"""Experiment trackers: an MLflow run and a Weights & Biases run that mirror a fedray run directory.

What a tracker receives is decided here, once, for every tracker (TensorBoard included):
:func:`scalar_metrics` turns one ``metrics.jsonl`` row into ``{name: float}`` (nested groups as
``group/key``, e.g. ``seconds/train``, ``domain_accuracy/photo``), logged with step = round, and
:func:`flat_params` turns the resolved config into dotted parameters. The per-run bookkeeping (which tracker
run a run directory continues, which rounds it already has, what to do when one fails) is the engine's
:class:`fedray.reporting.callbacks.Trackers`; this module only speaks to the libraries.

Each library is an optional extra (``pip install 'fedray[mlflow]'``, ``'fedray[wandb]'``); a config that
turns on a tracker whose library is missing is refused by :func:`check_trackers` before any work.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from fedray.config import ConfigError, ExperimentConfig

__all__ = ["MlflowTracker", "WandbTracker", "check_trackers", "flat_params", "open_trackers", "scalar_metrics"]

#: what each tracker needs: (config field, import name, extra, distribution that provides it)
_LIBRARIES = {"mlflow": ("output.mlflow", "mlflow", "mlflow", "mlflow-skinny"),
              "wandb": ("output.wandb", "wandb", "wandb", "wandb")}
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")  # MLflow's rule for metric and param names


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def scalar_metrics(row: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of one metrics row, flat: numeric fields as they are named (``round``, the step, left
    out), numeric leaves of nested mappings as ``group/key``. Strings, lists, booleans, None and non-finite
    values (which ``metrics.jsonl`` stores as null) are left out."""
    out: dict[str, float] = {}
    for k, v in row.items():
        name = f"{prefix}{k}"
        if not prefix and k == "round":
            continue
        if isinstance(v, dict):
            out.update(scalar_metrics(v, f"{name}/"))
        elif _is_number(v):
            out[name] = float(v)
    return out


def flat_params(cfg: dict, prefix: str = "") -> dict[str, str]:
    """A resolved config as ``{dotted.field: text}``: strings as they are, everything else as JSON
    (``0.05``, ``null``, ``true``, ``["crop", "flip"]``); an empty mapping as ``{}``."""
    out: dict[str, str] = {}
    for k, v in cfg.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flat_params(v, name))
        else:
            out[name] = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return out


def _import(name: str):
    """The tracker library ``name`` (``mlflow`` / ``wandb``), or a ConfigError naming the extra."""
    field, module, extra, dist = _LIBRARIES[name]
    try:
        return __import__(module)
    except ImportError as e:
        raise ConfigError(f"{field}.enabled: the {module} package is not installed ({e}); install it with "
                          f"pip install 'fedray[{extra}]' (the {dist} package)") from None


def check_trackers(cfg: ExperimentConfig) -> None:
    """Every tracker the config turns on can be imported (before any work)."""
    for name in _LIBRARIES:
        if getattr(cfg.output, name).enabled:
            _import(name)


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


class MlflowTracker:
    """One MLflow run through ``MlflowClient`` (explicit run ids: no global active run, so concurrent
    fedray runs in one process, e.g. a study's trials, never mix). Default store: a SQLite database in the
    run directory (``mlflow/mlflow.db``, artifacts in ``mlflow/artifacts``), which needs no server and no
    network; MLflow 3 refuses plain ``file:`` stores unless ``MLFLOW_ALLOW_FILE_STORE=true``."""

    name = "mlflow"

    def __init__(self, spec, run_dir: Path, run_name: str):
        self.spec, self.run_dir, self.run_name = spec, Path(run_dir).resolve(), spec.run_name or run_name
        self.default_store = spec.tracking_uri is None
        self.uri = spec.tracking_uri or f"sqlite:///{self.run_dir / 'mlflow' / 'mlflow.db'}"
        self.client = None
        self.run_id: str | None = None

    def start(self, state: dict, config: dict, tags: dict[str, str], log) -> dict:
        """Continue the run ``state`` names (same store), else create one logging ``config`` (the resolved
        config) as parameters and ``tags``; its state for trackers.json, with ``new: True`` when the run is
        new (it then holds no rounds)."""
        _import("mlflow")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        if self.default_store:
            import logging

            (self.run_dir / "mlflow").mkdir(parents=True, exist_ok=True)
            logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial tables"
        self.client = MlflowClient(tracking_uri=self.uri)
        old = state.get("run_id") if state.get("tracking_uri") == self.uri else None
        if old:
            try:
                self.client.get_run(old)
                self.run_id = old
                self.client.update_run(old, status="RUNNING")
                return {"run_id": old, "tracking_uri": self.uri, "new": False}
            except MlflowException as e:
                log(f"[fedray] mlflow: the run {old} recorded in trackers.json is not in {self.uri} "
                    f"({str(e).splitlines()[0]}); starting a new MLflow run with every recorded round")
        exp = self.client.get_experiment_by_name(self.spec.experiment)
        if exp is None:
            exp_id = self.client.create_experiment(self.spec.experiment, artifact_location=self._artifact_root())
        else:
            exp_id = exp.experiment_id
        self.run_id = self.client.create_run(exp_id, run_name=self.run_name, tags=tags).info.run_id
        self._log_params(flat_params(config))
        return {"run_id": self.run_id, "tracking_uri": self.uri, "experiment_id": exp_id, "new": True}

    def _artifact_root(self) -> str | None:
        """Where a new experiment keeps its artifacts: beside a local SQLite store (for the default store,
        ``<run dir>/mlflow/artifacts``). MLflow's own default for such a store, ``./mlruns`` of the current
        directory, would scatter artifacts wherever fedray was started. None for a tracking server (it decides)."""
        if self.uri.startswith("sqlite:///"):
            return (Path(self.uri[len("sqlite:///"):]).resolve().parent / "artifacts").as_uri()
        return None

    def _log_params(self, params: dict[str, str]) -> None:
        """Within MLflow's limits: 100 per call, names of its allowed characters, values cut at 6000
        characters (config.yaml, logged as an artifact at the end, has every value whole)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        items = []
        for k, v in params.items():
            if len(v) > MAX_PARAM_VAL_LENGTH:
                v = v[:MAX_PARAM_VAL_LENGTH - 40] + " ... (cut; see config.yaml artifact)"
            items.append(Param(_BAD_KEY_CHARS.sub("_", k)[:MAX_ENTITY_KEY_LENGTH], v))
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=chunk)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        ts = int(time.time() * 1000)
        items = [Metric(_BAD_KEY_CHARS.sub("_", k), v, ts, step) for k, v in metrics.items()]
        for chunk in _chunks(items, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=chunk)

    def finish(self, status: str, final: dict, files: list[Path], tags: dict[str, str]) -> None:
        """Final metrics (``final/<key>``), run.json fields as tags, the run's files as artifacts, status
        FINISHED (also a run stopped early on purpose), FAILED, or KILLED (interrupted; resumable)."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, v[:8000]) for k, v in tags.items()])
        fin = scalar_metrics(final)
        if fin:
            self.log(int(final.get("round") or 0), {f"final/{k}": v for k, v in fin.items()})
        for f in files:
            if f.is_file():
                self.client.log_artifact(self.run_id, str(f))
        self.client.set_terminated(self.run_id, {"failed": "FAILED", "interrupted": "KILLED"}.get(status, "FINISHED"))


class WandbTracker:
    """One W&B run, ``offline`` by default (no network: the run is written under ``<dir>/wandb/`` and
    ``wandb sync`` uploads it later). The run id is chosen here and kept in trackers.json before the run
    starts, so a resumed fedray run continues the same W&B run (offline, each process writes its own
    ``offline-run-*`` folder of that id; ``wandb sync`` uploads them in order as one run)."""

    name = "wandb"

    def __init__(self, spec, run_dir: Path, run_name: str):
        self.spec, self.run_dir, self.run_name = spec, Path(run_dir).resolve(), spec.run_name or run_name
        self.dir = Path(spec.dir).expanduser().resolve() if spec.dir else self.run_dir
        self.run = None

    def start(self, state: dict, config: dict, tags: dict[str, str], log) -> dict:
        """Continue (``resume="allow"``) the run ``state`` names, else start one with a new id; ``config``
        (the resolved config, nested) and ``tags`` (under ``fedray_run``) as its config."""
        wandb = _import("wandb")
        import secrets
        import string

        run_id = state.get("run_id") or "".join(secrets.choice(string.ascii_lowercase + string.digits)
                                                for _ in range(8))  # W&B's id form
        self.dir.mkdir(parents=True, exist_ok=True)
        # no system-metrics sampler, no machine / git / code / requirements capture, no console capture,
        # quiet: the tracker records what fedray records; "create_new": trials of a study run side by side
        settings = wandb.Settings(x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                                  console="off", save_code=False, disable_git=True, x_save_requirements=False,
                                  silent=True, reinit="create_new")
        self.run = wandb.init(project=self.spec.project, entity=self.spec.entity, mode=self.spec.mode,
                              dir=str(self.dir), id=run_id, name=self.run_name, resume="allow",
                              config={**config, "fedray_run": tags}, settings=settings)
        return {"run_id": run_id, "project": self.spec.project, "mode": self.spec.mode, "dir": str(self.dir),
                "new": not state.get("run_id")}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def finish(self, status: str, final: dict, files: list[Path], tags: dict[str, str]) -> None:
        """Final metrics (``final/<key>``) and the run.json fields (``fedray/<key>``) into the summary (the
        resolved config is the run's config already); exit code 0 (finished, stopped), 1 (failed), or
        preempted + 130 (interrupted: a resume continues it)."""
        fin = scalar_metrics(final)
        self.run.summary.update({**{f"final/{k}": v for k, v in fin.items()},
                                 **{f"fedray/{k}": v for k, v in tags.items()}})
        if status == "interrupted":
            self.run.mark_preempting()
        self.run.finish(exit_code={"failed": 1, "interrupted": 130}.get(status, 0))


def open_trackers(cfg: ExperimentConfig, run_dir: Path, run_name: str) -> list:
    """The trackers the config turns on (not started)."""
    out = []
    if cfg.output.mlflow.enabled:
        out.append(MlflowTracker(cfg.output.mlflow, run_dir, run_name))
    if cfg.output.wandb.enabled:
        out.append(WandbTracker(cfg.output.wandb, run_dir, run_name))
    return out
