"""One trial: its FL run (a :class:`fedray.apps.launcher.Job`), what it reports to the pruner after every round,
and what Optuna is told when it ends (:class:`TrialRun`); and the recovery of trials a stopped or dead driver left
(:func:`recover`)."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass

from fedray.apps.launcher import Job, RunOutcome, log_writer
from fedray.apps.slices import apply_slice
from fedray.config import ConfigError, ExperimentConfig, from_dict
from fedray.reporting.claim import settle_run_json
from tuning.objective import MetricError, MetricTracker
from tuning.space import StudySpec
from tuning.study_dir import StudyDir


@dataclass
class TrialOutcome:
    number: int
    state: str  # complete | pruned | fail | interrupted
    values: list[float] | None = None
    error: str | None = None
    fatal: bool = False  # a study-level mistake (the objective metric is missing): the study stops
    rounds: int = 0
    seconds: float = 0.0


def trial_config(spec: StudySpec, sdir: StudyDir, number: int, params: dict, slice_: dict) -> ExperimentConfig:
    """The experiment config of trial ``number``: base config + params + the trial's resources and outputs."""
    data = apply_slice(spec.config_with(params), slice_)
    out = data.setdefault("output", {})
    out["root"] = str(sdir.trials)
    out["name"] = sdir.trial_dir(number).name
    out["progress"] = False
    d = data.setdefault("data", {})
    if not d.get("cache_dir"):
        d["cache_dir"] = str(sdir.path / "_partitions")
    try:
        return from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"trial {number} ({params}): {e}") from None


class TrialRun:
    """Optuna trial ``trial`` as a run: :meth:`job` for the launcher, :meth:`finish` when it ends. Storage calls
    from the run's thread (report, should_prune) hold ``lock``, as the driver's do."""

    def __init__(self, trial, spec: StudySpec, sdir: StudyDir, slice_: dict, lock: threading.RLock, session: str,
                 log=print):
        self.trial, self.spec, self.sdir, self.slice, self.lock, self.log = trial, spec, sdir, slice_, lock, log
        self.number, self.params = trial.number, dict(trial.params)
        self.run_dir = sdir.trial_dir(self.number)
        self.tracker = MetricTracker([o.metric for o in spec.objectives])
        self.flags: dict = {}
        self.cfg: ExperimentConfig | None = None
        self.trial_log = log_writer(self.run_dir / "trial.log")
        with lock:
            trial.set_user_attr("run_dir", str(self.run_dir))
            trial.set_user_attr("started_at", time.time())
            trial.set_user_attr("session", session)

    def job(self) -> Job:
        return Job(self.number, log_path=self.run_dir / "trial.log", prepare=self._prepare, on_round=self._on_round)

    def _prepare(self) -> ExperimentConfig:
        if self.run_dir.exists():  # left by an older study of the same name whose storage was removed
            stale = self.run_dir.with_name(f"{self.run_dir.name}.stale-{int(time.time())}")
            self.run_dir.rename(stale)
            self.log(f"[tune] trial {self.number}: moved an old run directory aside to {stale}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.trial_log(f"trial {self.number} params {json.dumps(self.params, sort_keys=True)}")
        self.cfg = trial_config(self.spec, self.sdir, self.number, self.params, self.slice)
        return self.cfg

    def _on_round(self, report: dict) -> bool:
        try:
            self.tracker.update(report)
            self.tracker.check_present(report, self.cfg)
        except MetricError as e:
            self.flags["fatal"] = str(e)
            return True
        rnd = int(report["round"])
        self.flags["rounds"] = rnd
        if self.spec.pruning and rnd < int(self.cfg.train.rounds):
            # the last round is reported by tell() as the final value: a finished run is never pruned
            v = self.tracker.intermediate()
            if v is not None and math.isfinite(v):
                with self.lock:
                    self.trial.report(v, rnd)
                    prune = self.trial.should_prune()
                if prune:
                    self.flags["pruned"] = rnd
                    return True
        return False

    def finish(self, o: RunOutcome) -> TrialOutcome:
        """The trial's outcome from its run's, recorded in its user attributes and its log."""
        out = TrialOutcome(number=self.number, state="fail", rounds=o.rounds, seconds=o.seconds)
        if o.status == "failed":
            out.error = o.error
        elif "fatal" in self.flags:
            out.error, out.fatal = self.flags["fatal"], True
        elif o.status == "interrupted":
            out.state = "interrupted"
        elif "pruned" in self.flags:
            out.state = "pruned"
        else:
            try:
                values = self.tracker.final()
            except MetricError as e:
                out.error, out.fatal = str(e), True
            else:
                if all(math.isfinite(v) for v in values):
                    out.state, out.values = "complete", values
                else:
                    out.error = f"objective value is not finite: {values}"
        self.trial_log(f"trial {self.number} {out.state}" + (f": {out.error}" if out.error else ""))
        self._record(out)
        return out

    def _record(self, out: TrialOutcome) -> None:
        t = self.trial
        with self.lock:
            t.set_user_attr("finished_at", time.time())
            t.set_user_attr("seconds", out.seconds)
            t.set_user_attr("rounds", out.rounds or self.flags.get("rounds", 0))
            if out.state == "pruned":
                t.set_user_attr("pruned_at_round", self.flags["pruned"])
            if out.state == "interrupted":
                t.set_user_attr("interrupted", True)
            if out.error:
                t.set_user_attr("error", out.error[:2000])
            if out.fatal:  # an error of the study's config: a re-run gives the same (recover skips it)
                t.set_user_attr("fatal", True)
            if self.spec.multi_objective and out.values:
                t.set_user_attr("objectives", [ob.metric for ob in self.spec.objectives])


# ---------------------------------------------------------------------------------------------- recovery
def enqueue_retry(study, spec: StudySpec, number: int, params: dict, reason: str) -> bool:
    """Enqueue trial ``number``'s params once as a new trial (``retry_of``); False when a retry of it already exists
    or its params are incomplete (the driver died inside ``ask``)."""
    if set(params) != {p.path for p in spec.params}:
        return False
    for other in study.get_trials(deepcopy=False):
        if other.user_attrs.get("retry_of") == number:
            return False
    study.enqueue_trial(dict(params), user_attrs={"retry_of": number, "retry_reason": reason})
    return True


def first_line(text: str | None) -> str:
    """The first line of a recorded error (a trial's ``error`` attribute)."""
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "no error recorded"


def recover(study, spec: StudySpec, log) -> None:
    """At ``--resume`` (the driver lock is held: no other driver is alive): a trial still RUNNING was left by a dead
    driver, it is marked FAIL (``orphaned``), its run's run.json ``killed`` and its params enqueued once; an
    interrupted one is enqueued once; one whose run failed (not for an error of the study's config) is enqueued once,
    and its re-run, not it, counts toward the budget (:func:`tuning.backend.counted_trials`)."""
    from optuna.trial import TrialState

    storage = study._storage
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.RUNNING:
            queued = enqueue_retry(study, spec, t.number, t.params, "orphaned")  # enqueue first, then fail it
            storage.set_trial_user_attr(t._trial_id, "orphaned", True)
            study.tell(t.number, state=TrialState.FAIL)
            run_dir = t.user_attrs.get("run_dir")
            killed = settle_run_json(run_dir) if run_dir else None  # its run.json: killed, not running
            log(f"[tune] trial {t.number} was left running by a dead driver: marked FAIL"
                + (", re-enqueued with the same params" if queued else "")
                + (f"; its run {run_dir} marked killed" if killed else ""))
        elif t.state == TrialState.FAIL and (t.user_attrs.get("interrupted") or t.user_attrs.get("orphaned")):
            if enqueue_retry(study, spec, t.number, t.params, "interrupted"):
                log(f"[tune] trial {t.number} was interrupted: re-enqueued with the same params")
        elif t.state == TrialState.FAIL and not t.user_attrs.get("fatal"):
            # its run failed (a full disk, workers lost past their restarts, a diverged model): the session ended
            # with exit 1 naming it; the resume runs it once more, and the re-run counts in its place
            if enqueue_retry(study, spec, t.number, t.params, "failed"):
                log(f"[tune] trial {t.number} failed ({first_line(t.user_attrs.get('error'))}): re-enqueued with the "
                    f"same params")
