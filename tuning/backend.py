"""Optuna set-up of a study: its storage (a journal file or an RDB URL), sampler, pruner and session seed, and the
little the driver reads back from Optuna (the budget's count, the best value so far). Optuna is imported here
only inside functions: ``fedray --help`` builds ``fedray tune``'s parser without it."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from fedray.config import ConfigError
from tuning.space import StudySpec


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
    # the file's seed in every session, not the session's: the sampler numbers the points in an order shuffled by
    # its seed and records each trial's point by number (grid_id), which a resumed session must read alike
    return _grid_sampler(optuna)({p.path: p.grid_values() for p in spec.params}, seed=s.seed)


def _grid_sampler(optuna):
    class GridSampler(optuna.samplers.GridSampler):
        """Optuna's grid sampler without its ``study.stop()`` once the grid is covered: Optuna allows that call only
        inside ``study.optimize``, and fedray asks and tells itself (the last trial's ``tell`` raised). fedray
        limits the budget to the grid's points itself (:func:`budget`)."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return GridSampler


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


def session_seed(seed: int, n_existing: int) -> int:
    """The sampler seed of a session: ``seed`` for a new study, derived from (seed, trials stored) after."""
    if n_existing == 0:
        return int(seed)
    import numpy as np

    return int(np.random.SeedSequence([int(seed), int(n_existing)]).generate_state(1)[0])


def budget(spec: StudySpec, log) -> int:
    """Trials to finish over all sessions: ``budget.n_trials``, at most the grid's points."""
    gs = spec.grid_size()
    if gs is not None and gs < spec.n_trials:
        log(f"[tune] grid sampler: budget limited to the {gs} grid points")
        return gs
    return spec.n_trials


def counted_trials(trials: list) -> list:
    """The trials that count toward the budget: complete, pruned and failed ones. Not the ones a stop or a dead driver
    left (re-run), nor a failed one that a ``--resume`` runs again (a trial enqueued with ``retry_of`` it and
    ``retry_reason`` ``failed``, :func:`tuning.trial.recover`): its re-run counts in its place."""
    from optuna.trial import TrialState

    rerun = {t.user_attrs["retry_of"] for t in trials if t.user_attrs.get("retry_reason") == "failed"}

    def counts(t) -> bool:
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            return True
        a = t.user_attrs
        return t.state == TrialState.FAIL and not (a.get("orphaned") or a.get("interrupted")) and t.number not in rerun

    return [t for t in trials if counts(t)]


def best_postfix(study, spec: StudySpec) -> dict:
    """The progress bar's ``best=``: the best value so far (single objective), else the Pareto front's size."""
    try:
        if spec.multi_objective:
            return {"pareto": len(study.best_trials)}
        return {"best": f"{study.best_value:.4g}"}
    except ValueError:  # no completed trial yet
        return {}
