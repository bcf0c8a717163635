"""The study driver: Optuna ask/tell in one process, each trial one whole FL run, several at once.

Concurrency design
------------------
The driver is the only process that talks to the Optuna storage. It keeps up to ``C`` trials in
flight, each in a driver thread (``ThreadPoolExecutor``) that calls
:func:`fedray.engine.runner.run_experiment` for that trial's config. With ``engine.backend: ray`` every
run starts its own ``Coordinator`` actor and its own pool of ``trial_resources.workers`` client-worker
actors (``engine.num_workers`` / ``worker_num_cpus`` / ``worker_num_gpus`` are set from
``trial_resources``), so a trial is a slice of the cluster and the heavy work happens in the actors, not
in the driver threads. ``C`` is ``concurrency`` capped so that the slices always fit the cluster at
once::

    cpus per trial = workers * cpus_per_worker + engine.coordinator_num_cpus
    gpus per trial = workers * gpus_per_worker
    C = min(concurrency, floor(cluster CPUs / cpus per trial), floor(cluster GPUs / gpus per trial))

(with ``engine.backend: local`` the in-process workers run one after another, so a trial counts as
``engine.torch_threads`` cores of this machine). Ray's scheduler enforces the resources of every actor;
the cap only makes sure that the ``C`` slices never wait for each other.

After every round a trial's ``on_round`` hook reports the objective's running value
(``trial.report(value, round)``) and asks ``trial.should_prune()``; a pruned trial stops at that round
(its run directory keeps the checkpoint and metrics) and is told ``PRUNED``. Storage calls from the trial
threads are serialised by one lock. Multi-objective studies report nothing and are never pruned.

Study directory (``<output_dir>/<name>/``)
------------------------------------------
``study.json`` (study name, storage URL with any password masked, study file, search-space hash,
one entry per driver session), ``journal.log`` (the default storage), ``driver.lock``, ``trials/trial-NNNN/``
(one run directory per trial; the trial's user attribute ``run_dir`` links it), ``_partitions/``, and
the outputs of :mod:`tuning.outputs` (``trials.csv``, ``trials.md``, ``best_config.yaml``, ``plots/``).

Resume
------
``--resume`` continues a study after a crash, a SIGKILL or Ctrl-C. An exclusive lock on
``driver.lock`` (released by the OS when a driver dies) guarantees that no other driver is running the
study on this host, so every trial still ``RUNNING`` in the storage belongs to a dead driver: it gets
the user attribute ``orphaned`` and is marked ``FAIL``, and the same parameters are enqueued once as a new
trial (user attribute ``retry_of`` = the old number; re-enqueueing is skipped when such a retry already
exists, so resuming twice never runs a point twice). Trials stopped by Ctrl-C/SIGTERM are handled the same
way (``interrupted``). Completed and pruned trials are kept and never re-run. The budget ``n_trials``
counts finished trials over all sessions (orphaned/interrupted ones excluded). Each session seeds the
sampler from ``(sampler.seed, number of trials already stored)`` so a resumed study does not replay the
proposals of the first session. The retried trial starts its FL run from round 1 in a new run directory.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import math
import os
import re
import signal
import socket
import threading
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from fedray.config import ConfigError, ExperimentConfig, from_dict
from fedray.core.io import LockHeld, exclusive_lock
from fedray.config_paths import get_path as dotted_get
from tuning.study import DERIVED_METRICS, StudySpec

DEFAULT_OUTPUT_DIR = "runs/studies"
STUDY_JSON = "study.json"


class MetricError(RuntimeError):
    """The objective metric is not produced by the runs (a study-level mistake: the study stops)."""


class StudyAborted(RuntimeError):
    """The study stopped early because trials kept failing or the objective metric is missing."""


# ------------------------------------------------------------------------------------------- metrics
class MetricTracker:
    """Computes the objective values from the per-round metric rows of one run."""

    def __init__(self, metrics: list[str]):
        self.metrics = list(metrics)
        self.accuracies: list[float] = []
        self.bytes_total = 0
        self.last: dict[str, float] = {}
        self.fresh: dict[str, bool] = {}

    def update(self, report: dict) -> None:
        acc = report.get("accuracy")
        if acc is not None:
            self.accuracies.append(float(acc))
        b = report.get("bytes") or {}
        self.bytes_total += int(b.get("broadcast", 0)) + int(b.get("upload", 0))
        for m in self.metrics:
            v = self._value(m, report)
            self.fresh[m] = v is not None
            if v is not None:
                self.last[m] = v

    def _value(self, metric: str, report: dict) -> float | None:
        if metric == "mean_last5":
            if report.get("accuracy") is None:
                return None
            tail = self.accuracies[-5:]
            return float(sum(tail) / len(tail))
        if metric == "bytes_total":
            return float(self.bytes_total)
        v = dotted_get(report, metric)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MetricError(f"objective.metric: {metric!r} is not a number in the round metrics (got {v!r})")
        return float(v)

    def check_present(self, report: dict, cfg: ExperimentConfig) -> None:
        """On a round where every key is present (an evaluation round that is also an analysis round
        when analysis is on), a round-key metric that is still missing will never appear."""
        if report.get("accuracy") is None:
            return
        ana = int(cfg.eval.analysis_every)
        if ana and int(report["round"]) % ana != 0 and int(report["round"]) != int(cfg.train.rounds):
            return
        for m in self.metrics:
            if m not in DERIVED_METRICS and m not in self.last:
                keys = sorted(k for k in report if k != "ledger")
                raise MetricError(f"objective.metric: {m!r} is not in the round metrics (keys: {', '.join(keys)}; "
                                  f"or one of {', '.join(DERIVED_METRICS)})")

    def intermediate(self) -> float | None:
        """The first objective's value after this round, if this round produced one."""
        m = self.metrics[0]
        return self.last.get(m) if self.fresh.get(m) else None

    def final(self) -> list[float]:
        missing = [m for m in self.metrics if m not in self.last]
        if missing:
            raise MetricError(f"objective.metric: {missing[0]!r} was never produced by the run")
        return [self.last[m] for m in self.metrics]


# ------------------------------------------------------------------------------------ storage, etc.
def mask_url(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def is_url(storage: str) -> bool:
    return "://" in storage


def make_storage(storage: str):
    """An Optuna storage from a URL (RDB: postgresql://, mysql://, sqlite:///) or a journal file path."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if is_url(storage):
        if "***@" in storage:
            raise ConfigError(f"--storage: {storage!r} has a masked password; pass the full URL with --storage")
        return optuna.storages.RDBStorage(storage)
    path = Path(storage)
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def make_sampler(spec: StudySpec, seed: int):
    import optuna

    s = spec.sampler
    if s.name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=bool(s.options.get("multivariate", True)),
                constant_liar=bool(s.options.get("constant_liar", True)),
                n_startup_trials=int(s.options.get("n_startup_trials", 10)))
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.GridSampler({p.path: p.grid_values() for p in spec.params}, seed=seed)


def make_pruner(spec: StudySpec):
    import optuna

    p = spec.pruner
    if not spec.pruning:
        return optuna.pruners.NopPruner()
    o = dict(p.options)
    patience = o.pop("patience", None)
    if p.name == "hyperband":
        pruner = optuna.pruners.HyperbandPruner(min_resource=int(o.get("min_resource", 1)),
                                                max_resource=int(o.get("max_resource", spec.max_rounds())),
                                                reduction_factor=int(o.get("reduction_factor", 3)))
    else:
        pruner = optuna.pruners.MedianPruner(n_startup_trials=int(o.get("n_startup_trials", 5)),
                                             n_warmup_steps=int(o.get("n_warmup_steps", 0)),
                                             interval_steps=int(o.get("interval_steps", 1)),
                                             n_min_trials=int(o.get("n_min_trials", 1)))
    if patience is not None:
        pruner = optuna.pruners.PatientPruner(pruner, patience=int(patience))
    return pruner


def grid_size(spec: StudySpec) -> int | None:
    if spec.sampler.name != "grid":
        return None
    n = 1
    for p in spec.params:
        n *= len(p.grid_values())
    return n


def session_seed(seed: int, n_existing: int) -> int:
    """The sampler seed of a session: ``seed`` for a new study, derived from (seed, trials stored) after."""
    if n_existing == 0:
        return int(seed)
    import numpy as np

    return int(np.random.SeedSequence([int(seed), int(n_existing)]).generate_state(1)[0])


def _error_line(e: BaseException) -> str:
    """``Type: message`` on one line: the last line of multi-line messages (e.g. a Ray task's traceback),
    without terminal colour codes; the whole traceback goes to the trial's ``trial.log``."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"


@dataclass
class TrialOutcome:
    number: int
    state: str  # complete | pruned | fail | interrupted
    values: list[float] | None = None
    error: str | None = None
    fatal: bool = False
    rounds: int = 0
    seconds: float = 0.0


@dataclass
class StudyResult:
    study_name: str
    study_dir: Path
    storage: str
    trials: list = field(default_factory=list)  # FrozenTrial
    outputs: list[Path] = field(default_factory=list)
    interrupted: bool = False
    concurrency: int = 1

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out


def _counts_toward_budget(t) -> bool:
    from optuna.trial import TrialState

    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return t.state == TrialState.FAIL and not (t.user_attrs.get("orphaned") or t.user_attrs.get("interrupted"))


# --------------------------------------------------------------------------------------------- driver
class StudyRunner:
    """Runs a :class:`StudySpec` to its budget (see the module docstring)."""

    def __init__(self, spec: StudySpec, *, storage: str | None = None, resume: bool = False,
                 output_dir: str | Path | None = None, log=print):
        self.spec = spec
        self.resume = resume
        self.log = log
        root = Path(output_dir or spec.output_dir or DEFAULT_OUTPUT_DIR)
        self.study_dir = (root / spec.name).resolve()
        self.trials_root = self.study_dir / "trials"
        self._cli_storage = storage
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.session_id = uuid.uuid4().hex[:12]
        self._lock_file = None

    # ------------------------------------------------------------------ study directory bookkeeping
    def _read_study_json(self) -> dict | None:
        p = self.study_dir / STUDY_JSON
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: unreadable ({e}); fix or remove it") from None

    def _write_study_json(self, info: dict) -> None:
        from fedray.core.io import atomic_write_text

        atomic_write_text(self.study_dir / STUDY_JSON, json.dumps(info, indent=2, sort_keys=True) + "\n")

    def _resolve_storage(self, recorded: dict | None) -> str:
        default = str(self.study_dir / "journal.log")
        if recorded is not None:
            rec = recorded.get("storage")
            if self._cli_storage:
                if mask_url(self._cli_storage) != rec and str(Path(self._cli_storage).resolve()) != rec:
                    raise ConfigError(f"--storage: {mask_url(self._cli_storage)!r} differs from the storage "
                                      f"{rec!r} recorded in {self.study_dir / STUDY_JSON}")
                return self._cli_storage
            if self.spec.storage and is_url(self.spec.storage) and mask_url(self.spec.storage) == rec:
                return self.spec.storage
            if rec and "***@" in rec:
                raise ConfigError(f"--storage: the recorded storage {rec!r} has a masked password; pass the full "
                                  f"URL with --storage")
            return rec or default
        s = self._cli_storage or self.spec.storage
        if s is None:
            return default
        return s if is_url(s) else str(Path(s).resolve())

    @contextlib.contextmanager
    def _driver_lock(self):
        """One driver per study: ``driver.lock`` in the study directory (fedray.core.io.exclusive_lock)."""
        holder = f"pid {os.getpid()} on {socket.gethostname()}, session {self.session_id}"
        try:
            with exclusive_lock(self.study_dir / "driver.lock", holder, f"study {self.spec.name!r}"):
                yield
        except LockHeld as e:  # another live driver holds it
            raise ConfigError(str(e)) from None

    # ------------------------------------------------------------------------------ trial configs
    def _resources(self, cfg0: ExperimentConfig) -> tuple[int, dict]:
        """(effective concurrency, resource description) for this cluster (fedray.apps.slices)."""
        from fedray.apps.slices import plan_slices

        r = self.spec.trial_resources
        return plan_slices(cfg0, self.spec.concurrency, workers=r.workers, cpus_per_worker=r.cpus_per_worker,
                           gpus_per_worker=r.gpus_per_worker, field="trial_resources")

    def trial_config(self, number: int, params: dict) -> ExperimentConfig:
        """The experiment config of trial ``number``: base config + params + the trial's resources/outputs."""
        from fedray.apps.slices import apply_slice

        data = apply_slice(self.spec.config_with(params), self._res)
        out = data.setdefault("output", {})
        out["root"] = str(self.trials_root)
        out["name"] = f"trial-{number:04d}"
        out["progress"] = False
        d = data.setdefault("data", {})
        if not d.get("cache_dir"):
            d["cache_dir"] = str(self.study_dir / "_partitions")
        try:
            return from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"trial {number} ({params}): {e}") from None

    # ---------------------------------------------------------------------------------- one trial
    def _run_trial(self, trial) -> TrialOutcome:
        from fedray.engine.runner import run_experiment

        n = trial.number
        params = dict(trial.params)
        run_dir = self.trials_root / f"trial-{n:04d}"
        started = time.time()
        with self._lock:
            trial.set_user_attr("run_dir", str(run_dir))
            trial.set_user_attr("started_at", started)
            trial.set_user_attr("session", self.session_id)
        tracker = MetricTracker([o.metric for o in self.spec.objectives])
        flags: dict = {}
        out = TrialOutcome(number=n, state="fail")
        log_path = run_dir / "trial.log"

        def tlog(msg: str) -> None:
            try:
                with open(log_path, "a") as f:
                    f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")
            except OSError:
                pass

        try:
            if run_dir.exists():  # left by an older study of the same name whose storage was removed
                stale = run_dir.with_name(f"{run_dir.name}.stale-{int(started)}")
                run_dir.rename(stale)
                self.log(f"[tune] trial {n}: moved an old run directory aside to {stale}")
            run_dir.mkdir(parents=True, exist_ok=True)
            tlog(f"trial {n} params {json.dumps(params, sort_keys=True)}")
            cfg = self.trial_config(n, params)

            def on_round(report: dict) -> bool:
                try:
                    tracker.update(report)
                    tracker.check_present(report, cfg)
                except MetricError as e:
                    flags["fatal"] = str(e)
                    return True
                flags["rounds"] = int(report["round"])
                if self._stop.is_set():
                    flags["interrupted"] = True
                    return True
                if self.spec.pruning and int(report["round"]) < int(cfg.train.rounds):
                    # the last round is reported by tell() as the final value: a finished run is never pruned
                    v = tracker.intermediate()
                    if v is not None and math.isfinite(v):
                        with self._lock:
                            trial.report(v, int(report["round"]))
                            prune = trial.should_prune()
                        if prune:
                            flags["pruned"] = int(report["round"])
                            return True
                return False

            result = run_experiment(cfg, progress=False, log=tlog, on_round=on_round)
            out.rounds = len(result.rounds)
            if "fatal" in flags:
                out.error, out.fatal = flags["fatal"], True
            elif flags.get("interrupted") or result.interrupted:
                out.state = "interrupted"
            elif "pruned" in flags:
                out.state = "pruned"
            else:
                values = tracker.final()
                if all(math.isfinite(v) for v in values):
                    out.state, out.values = "complete", values
                else:
                    out.error = f"objective value is not finite: {values}"
        except MetricError as e:
            out.error, out.fatal = str(e), True
        except Exception as e:  # noqa: BLE001 - a failed trial is recorded, the study goes on
            out.error = _error_line(e)
            tlog(traceback.format_exc())
        finished = time.time()
        out.seconds = finished - started
        tlog(f"trial {n} {out.state}" + (f": {out.error}" if out.error else ""))
        with self._lock:
            trial.set_user_attr("finished_at", finished)
            trial.set_user_attr("seconds", out.seconds)
            trial.set_user_attr("rounds", out.rounds or flags.get("rounds", 0))
            if out.state == "pruned":
                trial.set_user_attr("pruned_at_round", flags["pruned"])
            if out.state == "interrupted":
                trial.set_user_attr("interrupted", True)
            if out.error:
                trial.set_user_attr("error", out.error[:2000])
            if self.spec.multi_objective and out.values:
                trial.set_user_attr("objectives", [o.metric for o in self.spec.objectives])
        return out

    # ---------------------------------------------------------------------------------- recovery
    def _enqueue_retry(self, study, number: int, params: dict, reason: str) -> bool:
        """Enqueue trial ``number``'s params once as a new trial (``retry_of``); False when a retry of it
        already exists or its params are incomplete (the driver died inside ``ask``)."""
        if set(params) != {p.path for p in self.spec.params}:
            return False
        for other in study.get_trials(deepcopy=False):
            if other.user_attrs.get("retry_of") == number:
                return False
        study.enqueue_trial(dict(params), user_attrs={"retry_of": number, "retry_reason": reason})
        return True

    def _recover(self, study) -> None:
        from optuna.trial import TrialState

        storage = study._storage
        for t in study.get_trials(deepcopy=False):
            if t.state == TrialState.RUNNING:
                # no live driver holds the lock: this trial's driver is dead; enqueue first, then fail it
                queued = self._enqueue_retry(study, t.number, t.params, "orphaned")
                storage.set_trial_user_attr(t._trial_id, "orphaned", True)
                study.tell(t.number, state=TrialState.FAIL)
                self.log(f"[tune] trial {t.number} was left running by a dead driver: marked FAIL"
                         + (", re-enqueued with the same params" if queued else ""))
            elif t.state == TrialState.FAIL and (t.user_attrs.get("interrupted") or t.user_attrs.get("orphaned")):
                if self._enqueue_retry(study, t.number, t.params, "interrupted"):
                    self.log(f"[tune] trial {t.number} was interrupted: re-enqueued with the same params")

    # ---------------------------------------------------------------------------------------- run
    def run(self) -> StudyResult:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        spec = self.spec
        with self._driver_lock():
            recorded = self._read_study_json()
            storage_url = self._resolve_storage(recorded if self.resume else None)
            storage = make_storage(storage_url)
            exists = spec.name in optuna.get_all_study_names(storage)
            where = mask_url(storage_url)
            if self.resume:
                if not exists:
                    raise ConfigError(f"--resume: no study named {spec.name!r} in storage {where}")
                if recorded is not None and recorded.get("identity_hash") != spec.identity_hash():
                    raise ConfigError(f"params: the search space or objectives differ from the ones study "
                                      f"{spec.name!r} was created with ({self.study_dir / STUDY_JSON}); start a new "
                                      f"study (another name) instead of resuming")
            else:
                if exists:
                    raise ConfigError(f"name: study {spec.name!r} already exists in storage {where}; pass --resume "
                                      f"to continue it, or choose another name")
                if recorded is not None:
                    raise ConfigError(f"name: the study directory {self.study_dir} already holds a study "
                                      f"({STUDY_JSON}); pass --resume to continue it, or remove the directory")

            cfg0 = from_dict(spec.config_with({}))
            cap, self._res = self._resources(cfg0)
            if exists:
                study = optuna.load_study(study_name=spec.name, storage=storage)
                if list(study.directions) != [getattr(optuna.study.StudyDirection, d.upper()) for d in spec.directions]:
                    raise ConfigError(f"objective: the stored study {spec.name!r} has directions "
                                      f"{[d.name.lower() for d in study.directions]}, the study file {spec.directions}")
            n_existing = len(study.get_trials(deepcopy=False)) if exists else 0
            seed = session_seed(spec.sampler.seed, n_existing)
            study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                        sampler=make_sampler(spec, seed), pruner=make_pruner(spec),
                                        load_if_exists=True)
            info = recorded if (self.resume and recorded) else {
                "name": spec.name, "storage": mask_url(storage_url), "study_file": spec.source_path,
                "base_config": spec.base_config_path, "identity_hash": spec.identity_hash(),
                "directions": spec.directions, "created_at": time.time(), "sessions": []}
            session = {"id": self.session_id, "pid": os.getpid(), "host": socket.gethostname(),
                       "started_at": time.time(), "resume": self.resume, "sampler_seed": seed,
                       "resources": self._res, "status": "running"}
            info.setdefault("sessions", []).append(session)
            self._write_study_json(info)
            if not exists:
                study.set_user_attr("study_dir", str(self.study_dir))
                study.set_user_attr("study_file", spec.source_path)
                for point in spec.enqueue:
                    study.enqueue_trial(point, user_attrs={"enqueued": True}, skip_if_exists=True)
            if self.resume:
                self._recover(study)
            if self._res.get("note"):
                self.log(f"[tune] {self._res['note']}")
            elif cap < spec.concurrency:
                self.log(f"[tune] concurrency capped at {cap} (asked {spec.concurrency}): a trial needs "
                         f"{self._res['cpus_per_trial']:g} CPUs / {self._res['gpus_per_trial']:g} GPUs of "
                         f"{self._res['cluster_cpus']:g} / {self._res['cluster_gpus']:g}")
            budget = spec.n_trials
            gs = grid_size(spec)
            if gs is not None and gs < budget:
                budget = gs
                self.log(f"[tune] grid sampler: budget limited to the {gs} grid points")
            self.log(f"[tune] study {spec.name!r} in {self.study_dir} | storage {where} | {cap} trial(s) at once, "
                     f"{self._res['workers']} worker(s) each | budget {budget} trials")
            status = "finished"
            try:
                interrupted, aborted = self._loop(study, cap, budget)
                if interrupted:
                    status = "interrupted"
                elif aborted:
                    status = "aborted"
            except BaseException:
                status = "crashed"
                raise
            finally:
                session["ended_at"] = time.time()
                session["status"] = status
                self._write_study_json(info)
                outputs: list[Path] = []
                try:
                    from tuning.outputs import write_outputs

                    outputs = write_outputs(study, spec, self.study_dir, log=self.log)
                except Exception as e:  # noqa: BLE001 - outputs must not hide the study's own result
                    self.log(f"[tune] could not write the study outputs: {type(e).__name__}: {e}")
            result = StudyResult(spec.name, self.study_dir, mask_url(storage_url),
                                 trials=study.get_trials(deepcopy=False), outputs=outputs,
                                 interrupted=interrupted, concurrency=cap)
            if aborted:
                raise StudyAborted(aborted)
            return result

    def _loop(self, study, cap: int, budget: int) -> tuple[bool, str | None]:
        """Keep ``cap`` trials in flight until the budget/timeout; returns (interrupted, abort reason)."""
        from optuna.trial import TrialState

        from fedray.reporting.progress import ProgressBar

        spec = self.spec
        done = sum(1 for t in study.get_trials(deepcopy=False) if _counts_toward_budget(t))
        deadline = time.monotonic() + spec.timeout_s if spec.timeout_s else None
        # trials done / budget on a terminal (the [tune] lines print above it); the lines alone otherwise
        bar = ProgressBar(budget, "trial", desc=f"study {spec.name}", initial=min(done, budget), log=self.log)
        say = bar.write
        dists = spec.distributions()
        running: dict = {}
        failures = 0
        abort: str | None = None
        interrupted = False

        prev = None
        if threading.current_thread() is threading.main_thread():
            def on_sigterm(signum, frame):
                raise KeyboardInterrupt()

            prev = signal.signal(signal.SIGTERM, on_sigterm)

        def settle(fut, trial) -> None:
            nonlocal done, failures, abort
            out: TrialOutcome = fut.result()
            with self._lock:
                if out.state == "complete":
                    study.tell(trial, out.values if spec.multi_objective else out.values[0])
                elif out.state == "pruned":
                    study.tell(trial, state=TrialState.PRUNED)
                elif out.state == "interrupted":
                    self._enqueue_retry(study, trial.number, trial.params, "interrupted")
                    study.tell(trial, state=TrialState.FAIL)
                else:
                    study.tell(trial, state=TrialState.FAIL)
            if out.state != "interrupted":
                done += 1
            if out.state == "fail":
                failures += 1
                if out.fatal:
                    abort = f"trial {out.number} failed: {out.error}"
                elif failures >= spec.max_consecutive_failures:
                    abort = (f"{failures} trials failed in a row (budget.max_consecutive_failures); last: trial "
                             f"{out.number}: {out.error}")
            elif out.state in ("complete", "pruned"):
                failures = 0
            what = {"complete": f"value {out.values}", "pruned": f"pruned after round {out.rounds}",
                    "interrupted": "interrupted (re-enqueued)", "fail": f"FAILED: {out.error}"}[out.state]
            say(f"[tune] trial {out.number} {what} ({out.rounds} rounds, {out.seconds:.1f} s)")
            if bar.active:
                with self._lock:
                    best = _best_postfix(study, spec)
                bar.update(0 if out.state == "interrupted" else 1, **best)

        try:
            with cf.ThreadPoolExecutor(max_workers=cap, thread_name_prefix="fedray-trial") as pool:
                try:
                    while True:
                        while (abort is None and len(running) < cap and done + len(running) < budget
                               and (deadline is None or time.monotonic() < deadline)):
                            with self._lock:
                                trial = study.ask(dists)
                            say(f"[tune] trial {trial.number} started: {json.dumps(trial.params, sort_keys=True)}")
                            running[pool.submit(self._run_trial, trial)] = trial
                        if not running:
                            break
                        finished, _ = cf.wait(list(running), return_when=cf.FIRST_COMPLETED)
                        for fut in finished:
                            settle(fut, running.pop(fut))
                except KeyboardInterrupt:
                    interrupted = True
                    self._stop.set()
                    say(f"[tune] interrupted: stopping {len(running)} running trial(s) at their next round "
                        f"(they are re-enqueued for --resume)")
                    for fut in cf.as_completed(list(running)):
                        settle(fut, running.pop(fut))
        finally:
            bar.close()
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)
        if abort:
            self.log(f"[tune] study stopped: {abort}")
        return interrupted, abort


def _best_postfix(study, spec: StudySpec) -> dict:
    """The progress bar's ``best=``: the best value so far (single objective), else the Pareto front's size."""
    try:
        if spec.multi_objective:
            return {"pareto": len(study.best_trials)}
        return {"best": f"{study.best_value:.4g}"}
    except ValueError:  # no completed trial yet
        return {}


def tune(study_path: str | Path, *, storage: str | None = None, resume: bool = False,
         output_dir: str | Path | None = None, outputs_only: bool = False, log=print) -> StudyResult:
    """Load a study file and run it (``fedray tune`` / ``python -m jobs.tune``).

    ``outputs_only`` rebuilds the table, best config and plots from the storage without running trials."""
    from tuning.study import load_study

    spec = load_study(study_path)
    runner = StudyRunner(spec, storage=storage, resume=resume, output_dir=output_dir, log=log)
    if outputs_only:
        return rebuild_outputs(runner)
    return runner.run()


def rebuild_outputs(runner: StudyRunner) -> StudyResult:
    import optuna

    from tuning.outputs import write_outputs

    recorded = runner._read_study_json()
    if recorded is None:
        raise ConfigError(f"--outputs-only: {runner.study_dir / STUDY_JSON} not found (has the study run?)")
    url = runner._resolve_storage(recorded)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=runner.spec.name, storage=make_storage(url))
    outputs = write_outputs(study, runner.spec, runner.study_dir, log=runner.log)
    return StudyResult(runner.spec.name, runner.study_dir, mask_url(url), trials=study.get_trials(deepcopy=False),
                       outputs=outputs)


def add_arguments(ap) -> None:
    """The options shared by ``fedray tune`` and ``python -m jobs.tune``."""
    ap.add_argument("--storage", help="Optuna storage: a URL (postgresql://user@host/db) or a journal file path "
                                      "(default: the study file's storage, else <study dir>/journal.log)")
    ap.add_argument("--resume", action="store_true",
                    help="continue an existing study (after a crash, SIGKILL or Ctrl-C): finished trials are kept, "
                         "trials left running are marked FAIL and re-run once with the same params")
    ap.add_argument("--output-dir", help=f"parent of the study directory (default: the study file's output_dir, "
                                         f"else {DEFAULT_OUTPUT_DIR})")
    ap.add_argument("--outputs-only", action="store_true",
                    help="only rebuild trials.csv/md, best_config.yaml and plots/ from the storage")


def run_cli(args, prog: str) -> int:
    """Shared body of the two command lines: run, print a summary, map errors to exit codes."""
    import sys

    from fedray.data.table import DataError

    try:
        res = tune(args.study, storage=args.storage, resume=args.resume, output_dir=args.output_dir,
                   outputs_only=args.outputs_only)
    except (ConfigError, DataError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except StudyAborted as e:
        print(f"{prog}: study aborted: {e}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{v} {k.lower()}" for k, v in sorted(res.counts.items())) or "no trials"
    print(f"study {res.study_name}: {counts} | storage {res.storage}")
    for p in res.outputs:
        print(f"wrote {p}")
    print(f"study directory: {res.study_dir}")
    return 130 if res.interrupted else 0
