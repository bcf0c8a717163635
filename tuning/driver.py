"""The study driver: Optuna ask/tell in one process, each trial one whole FL run, several at once.

The driver is the only process that talks to the Optuna storage. It keeps up to ``C`` trials in flight through
:class:`fedray.apps.launcher.Launcher`, which runs each trial's FL run in a driver thread; with ``engine.backend:
ray`` every run starts its own coordinator and ``trial_resources.workers`` client workers, a slice of the cluster
(:mod:`fedray.apps.slices`): ``C`` is ``concurrency`` capped so that the slices fit the cluster together. After
every round a trial reports the objective's running value and asks whether to prune (:mod:`tuning.trial`); storage
calls from the trial threads are serialised by one lock. Multi-objective studies report nothing and are never
pruned.

Resume: ``--resume`` continues a study after a crash, a SIGKILL or Ctrl-C. The driver lock (``driver.lock``,
:mod:`tuning.study_dir`) guarantees that no other driver runs the study on this host, so every trial still
``RUNNING`` belongs to a dead driver: it is marked ``FAIL`` (``orphaned``) and its parameters are enqueued once as a
new trial (``retry_of``); trials stopped by Ctrl-C/SIGTERM likewise (``interrupted``), and trials whose run failed
(a session that ends with any exits 1 naming them), whose re-runs then count in their place. Completed and pruned
trials are kept and never re-run. The budget ``n_trials`` counts finished trials over all sessions. Each session seeds the
sampler from ``(sampler.seed, number of trials already stored)``, so a resumed study does not replay the proposals
of the first session.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fedray.apps.launcher import Launcher, RunOutcome
from fedray.apps.slices import plan_slices
from fedray.config import ConfigError, ExperimentConfig, from_dict
from fedray.core.owner import crash_reason
from tuning.backend import (best_postfix, budget, counted_trials, make_pruner, make_sampler, make_storage,
                            mask_url, session_seed)
from tuning.outputs import write_outputs
from tuning.space import StudySpec
from tuning.study import load_study
from tuning.study_dir import STUDY_JSON, StudyDir
from tuning.trial import TrialOutcome, TrialRun, enqueue_retry, recover


class StudyAborted(RuntimeError):
    """The study stopped early because trials kept failing or the objective metric is missing."""


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
    def failed(self) -> list:
        """Trials whose run failed and that count toward the budget: the study's outputs leave them out, the command
        exits 1 naming them, and ``--resume`` runs each once more (:func:`tuning.trial.recover`)."""
        return [t for t in counted_trials(self.trials) if t.state.name == "FAIL"]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out


class StudyRunner:
    """Runs a :class:`StudySpec` to its budget (see the module docstring)."""

    def __init__(self, spec: StudySpec, *, storage: str | None = None, resume: bool = False,
                 output_dir: str | Path | None = None, log=print):
        self.spec, self.resume, self.log = spec, resume, log
        self.dir = StudyDir(spec, output_dir, storage)
        self.study_dir = self.dir.path
        self._lock = threading.RLock()
        self.session_id = uuid.uuid4().hex[:12]
        self._res: dict = {}

    def _driver_lock(self):
        return self.dir.lock(self.session_id)

    def _resources(self, cfg0: ExperimentConfig) -> tuple[int, dict]:
        """(effective concurrency, resource description) for this cluster (fedray.apps.slices)."""
        r = self.spec.trial_resources
        return plan_slices(cfg0, self.spec.concurrency, workers=r.workers, cpus_per_worker=r.cpus_per_worker,
                           gpus_per_worker=r.gpus_per_worker, field="trial_resources")

    def run(self) -> StudyResult:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with self._driver_lock():
            study, info, url, cap, n_trials = self._open()
            status, interrupted, aborted, reason = "crashed", False, None, None
            try:
                interrupted, aborted = self._loop(study, cap, n_trials)
                status = "interrupted" if interrupted else "aborted" if aborted else "finished"
            except BaseException as e:  # recorded, then raised: the session says why it crashed
                reason = crash_reason(e)
                raise
            finally:
                self.dir.close_session(info, status, reason)
                outputs: list[Path] = []
                try:
                    outputs = write_outputs(study, self.spec, self.study_dir, log=self.log)
                except Exception as e:  # noqa: BLE001 - outputs must not hide the study's own result
                    self.log(f"[tune] could not write the study outputs: {type(e).__name__}: {e}")
            if aborted:
                raise StudyAborted(aborted)
            return StudyResult(self.spec.name, self.study_dir, mask_url(url), trials=study.get_trials(deepcopy=False),
                               outputs=outputs, interrupted=interrupted, concurrency=cap)

    def _open(self) -> tuple:
        """The study (created, or loaded to resume) and its session in study.json: (study, info, storage URL, trials
        at once, budget)."""
        import optuna

        spec = self.spec
        recorded = self.dir.read()
        url = self.dir.storage_url(recorded if self.resume else None)
        storage = make_storage(url)
        exists = spec.name in optuna.get_all_study_names(storage)
        self.dir.check_claim(exists, recorded, self.resume, mask_url(url))
        cap, self._res = self._resources(from_dict(spec.config_with({})))
        n_existing = 0
        if exists:
            stored = optuna.load_study(study_name=spec.name, storage=storage)
            if list(stored.directions) != [getattr(optuna.study.StudyDirection, d.upper()) for d in spec.directions]:
                raise ConfigError(f"objective: the stored study {spec.name!r} has directions "
                                  f"{[d.name.lower() for d in stored.directions]}, the study file {spec.directions}")
            n_existing = len(stored.get_trials(deepcopy=False))
        seed = session_seed(spec.sampler.seed, n_existing)
        study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                    sampler=make_sampler(spec, seed), pruner=make_pruner(spec), load_if_exists=True)
        info = self.dir.open_session(recorded if self.resume else None, url, {
            "id": self.session_id, "resume": self.resume, "sampler_seed": seed, "resources": self._res})
        if not exists:
            study.set_user_attr("study_dir", str(self.study_dir))
            study.set_user_attr("study_file", spec.source_path)
            for point in spec.enqueue:
                study.enqueue_trial(point, user_attrs={"enqueued": True}, skip_if_exists=True)
        if self.resume:
            recover(study, spec, self.log)
        if self._res.get("note"):
            self.log(f"[tune] {self._res['note']}")
        elif cap < spec.concurrency:
            self.log(f"[tune] concurrency capped at {cap} (asked {spec.concurrency}): a trial needs "
                     f"{self._res['cpus_per_trial']:g} CPUs / {self._res['gpus_per_trial']:g} GPUs of "
                     f"{self._res['cluster_cpus']:g} / {self._res['cluster_gpus']:g}")
        n_trials = budget(spec, self.log)
        self.log(f"[tune] study {spec.name!r} in {self.study_dir} | storage {mask_url(url)} | {cap} trial(s) at once, "
                 f"{self._res['workers']} worker(s) each | budget {n_trials} trials")
        return study, info, url, cap, n_trials

    def _loop(self, study, cap: int, n_trials: int) -> tuple[bool, str | None]:
        """Keep ``cap`` trials in flight until the budget/timeout; returns (interrupted, abort reason)."""
        from optuna.trial import TrialState

        spec = self.spec
        state = {"done": len(counted_trials(study.get_trials(deepcopy=False))),
                 "failures": 0, "abort": None}
        deadline = time.monotonic() + spec.timeout_s if spec.timeout_s else None
        # trials done / budget on a terminal (the [tune] lines print above it); the lines alone otherwise
        launcher = Launcher(cap, tag="tune", total=n_trials, unit="trial", desc=f"study {spec.name}",
                            initial=min(state["done"], n_trials), log=self.log)
        dists = spec.distributions()
        running: dict[int, TrialRun] = {}

        def next_job():
            if (state["abort"] is not None or state["done"] + len(running) >= n_trials
                    or (deadline is not None and time.monotonic() >= deadline)):
                return None
            with self._lock:
                trial = study.ask(dists)
            launcher.say(f"[tune] trial {trial.number} started: {json.dumps(trial.params, sort_keys=True)}")
            run = running[trial.number] = TrialRun(trial, spec, self.dir, self._res, self._lock, self.session_id,
                                                   log=self.log)
            return run.job()

        def settle(o: RunOutcome) -> None:
            run = running.pop(o.key)
            out = run.finish(o)
            with self._lock:
                if out.state == "complete":
                    study.tell(run.trial, out.values if spec.multi_objective else out.values[0])
                elif out.state == "pruned":
                    study.tell(run.trial, state=TrialState.PRUNED)
                else:
                    if out.state == "interrupted":
                        enqueue_retry(study, spec, run.number, run.params, "interrupted")
                    study.tell(run.trial, state=TrialState.FAIL)
            self._count(out, state)
            what = {"complete": f"value {out.values}", "pruned": f"pruned after round {out.rounds}",
                    "interrupted": "interrupted (re-enqueued)", "fail": f"FAILED: {out.error}"}[out.state]
            launcher.say(f"[tune] trial {out.number} {what} ({out.rounds} rounds, {out.seconds:.1f} s)")
            if launcher.bar.active:
                with self._lock:
                    best = best_postfix(study, spec)
                launcher.advance(0 if out.state == "interrupted" else 1, **best)

        interrupted = launcher.run(next_job, settle, stopping=" (they are re-enqueued for --resume)")
        if state["abort"]:
            self.log(f"[tune] study stopped: {state['abort']}")
        return interrupted, state["abort"]

    def _count(self, out: TrialOutcome, state: dict) -> None:
        """The budget and the failure streak after a trial; the reason to stop the study, if any."""
        if out.state != "interrupted":
            state["done"] += 1
        if out.state == "fail":
            state["failures"] += 1
            if out.fatal:
                state["abort"] = f"trial {out.number} failed: {out.error}"
            elif state["failures"] >= self.spec.max_consecutive_failures:
                state["abort"] = (f"{state['failures']} trials failed in a row (budget.max_consecutive_failures); "
                                  f"last: trial {out.number}: {out.error}")
        elif out.state in ("complete", "pruned"):
            state["failures"] = 0


def tune(study_path: str | Path, *overrides: str, storage: str | None = None, resume: bool = False,
         output_dir: str | Path | None = None, outputs_only: bool = False, log=print) -> StudyResult:
    """Load a study file, with ``overrides`` (``a.b=c``) of its base config, and run it (``fedray tune``,
    ``python -m jobs.tune``, ``fedray.tune``). ``outputs_only`` rebuilds the table, best config and plots from the
    storage without running trials."""
    spec = load_study(study_path, overrides=list(overrides))
    runner = StudyRunner(spec, storage=storage, resume=resume, output_dir=output_dir, log=log)
    if outputs_only:
        return rebuild_outputs(runner)
    return runner.run()


def rebuild_outputs(runner: StudyRunner) -> StudyResult:
    import optuna

    recorded = runner.dir.read()
    if recorded is None:
        raise ConfigError(f"--outputs-only: {runner.study_dir / STUDY_JSON} not found (has the study run?)")
    url = runner.dir.storage_url(recorded)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=runner.spec.name, storage=make_storage(url))
    outputs = write_outputs(study, runner.spec, runner.study_dir, log=runner.log)
    return StudyResult(runner.spec.name, runner.study_dir, mask_url(url), trials=study.get_trials(deepcopy=False),
                       outputs=outputs)
