"""The applications of the chaos harness (bench/chaos.py ``--variants sweep,tune``): a schedule runs ``fedray sweep``
over 2 points or ``fedray tune`` over a 2-point grid study instead of one ``fedray run``, and its faults strike the
application's driver (whose threads are the runs' drivers), its runs' Ray workers and coordinators, and its writes.
After each driver that exits non-zero the harness runs the same command with ``--resume``; once one exits 0 it checks:

- every run's result equals the fault-free application's (same command, no fault): each point's / grid value's
  final weights hash, and each trial's objective value; every run's ``metrics.jsonl`` and ledger hold every round
  once, ``run.json`` says ``finished``, no temporary file is left (as a single run's check);
- ``sweep.json`` / ``study.json``: no session still says ``running`` (a killed driver's reads ``killed``), the last
  one ``finished``;
- the study's journal loads (Optuna), no trial is left ``RUNNING``, every ``FAIL``ed trial (an orphan of a killed
  driver, an interrupted one, or one whose run failed) was run again (``retry_of``) and its ``run.json`` no longer
  says ``running``, and every grid value has a COMPLETE trial.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

APPS = ("sweep", "tune")
ROUNDS = 3  # per run (two runs per schedule)
LRS = [0.03, 0.05]


def write_files(app: str, base: dict, where: Path) -> Path:
    """The sweep or study file of ``app`` over ``base`` (an experiment config); its path. The outputs go to
    ``where/out``."""
    base = {**base, "train": {**base["train"], "rounds": ROUNDS}}
    base["output"] = {k: v for k, v in base["output"].items() if k not in ("root", "name")}
    where.mkdir(parents=True, exist_ok=True)
    if app == "sweep":
        data = {"name": "chaos", "base": base, "axes": {"train.lr": LRS}, "parallel": 1,
                "output_dir": str(where / "out"),
                "resources": {"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0}}
    else:
        data = {"name": "chaos", "base_config": base, "params": {"train.lr": {"choices": LRS}},
                "objective": {"metric": "accuracy", "direction": "maximize"}, "budget": {"n_trials": len(LRS)},
                "sampler": {"name": "grid", "seed": 0}, "pruner": "none", "concurrency": 1,
                "trial_resources": {"workers": 2, "cpus_per_worker": 0.5, "gpus_per_worker": 0},
                "output_dir": str(where / "out")}
    path = where / f"{app}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def command(app: str, spec: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "fedray", app, str(spec)] + (["--resume"] if resume else [])


def out_dir(app: str, spec: Path) -> Path:
    return spec.parent / "out" / ("chaos" if app == "tune" else "")


def run_dirs(app: str, spec: Path) -> list[Path]:
    """The run directories the application made so far (a run's has its run.json)."""
    root = out_dir(app, spec)
    return sorted(p.parent for p in root.rglob("run.json")) if root.is_dir() else []


def session_status(app: str, spec: Path) -> tuple[str | None, str | None]:
    """The last session's (status, reason) in sweep.json / study.json (None: none written yet)."""
    try:
        info = json.loads((out_dir(app, spec) / f"{'sweep' if app == 'sweep' else 'study'}.json").read_text())
        last = info["sessions"][-1]
    except (OSError, ValueError, KeyError, IndexError):
        return None, None
    from fedray.core.owner import settled_status

    status, why = settled_status(last.get("status"), last)  # a dead driver's "running" reads "killed"
    return status, why or last.get("reason") or last.get("error")


def results(app: str, spec: Path) -> dict[str, dict]:
    """lr -> {"hash", "value", "run_dir"} of every finished run (a tune trial's value from the journal)."""
    out: dict[str, dict] = {}
    for d in run_dirs(app, spec):
        try:
            lr = yaml.safe_load((d / "config.yaml").read_text())["train"]["lr"]
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out[repr(float(lr))] = {"hash": summary.get("weights_hash"), "run_dir": str(d)}
    if app == "tune":
        for t in _trials(spec):
            if t.state.name == "COMPLETE" and repr(float(t.params["train.lr"])) in out:
                out[repr(float(t.params["train.lr"]))]["value"] = t.values
    return out


def _trials(spec: Path) -> list:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(out_dir("tune", spec) / "journal.log")))
    return optuna.load_study(study_name="chaos", storage=storage).get_trials(deepcopy=False)


def check(app: str, spec: Path, reference: dict[str, dict], check_run) -> tuple[str, list[str]]:
    """(ending, problems) of an application whose last driver exited 0; ``check_run(run_dir, rounds, hash)`` is the
    single run's check."""
    problems: list[str] = []
    got = results(app, spec)
    if set(got) != set(reference):
        problems.append(f"{app}: finished runs for lr {sorted(got)}, the fault-free {app}'s {sorted(reference)}")
    ending = "identical"
    for lr, want in reference.items():
        if lr not in got:
            ending = "unfinished"
            continue
        e, p = check_run(Path(got[lr]["run_dir"]), ROUNDS, want["hash"])
        problems += [f"lr {lr}: {x}" for x in p]
        if e != "identical" or ("value" in want and got[lr].get("value") != want["value"]):
            ending = "other bits"
            if e == "identical":
                problems.append(f"silent wrong result: lr {lr}: objective {got[lr].get('value')}, "
                                f"the fault-free study's {want['value']}")
    name = "sweep.json" if app == "sweep" else "study.json"
    try:
        sessions = json.loads((out_dir(app, spec) / name).read_text())["sessions"]
    except (OSError, ValueError, KeyError) as e:
        return ending, problems + [f"{name} unreadable: {e}"]
    statuses = [s.get("status") for s in sessions]
    if "running" in statuses or statuses[-1:] != ["finished"]:
        problems.append(f"{name} sessions {statuses}: a dead driver's still says running, or the last not finished")
    if app == "tune":
        problems += _journal_problems(spec)
    return ending, problems


def _journal_problems(spec: Path) -> list[str]:
    try:
        trials = _trials(spec)
    except Exception as e:  # noqa: BLE001 - a journal that does not load is what this looks for
        return [f"the study's journal does not load: {type(e).__name__}: {e}"]
    problems = []
    for t in trials:
        if t.state.name == "RUNNING":
            problems.append(f"trial {t.number} still RUNNING in the journal")
        if t.state.name == "FAIL":  # orphaned, interrupted, or its run failed: a --resume runs it again
            if set(t.params) == {"train.lr"} and not any(r.user_attrs.get("retry_of") == t.number for r in trials):
                why = ("left by a killed or stopped driver" if t.user_attrs.get("orphaned")
                       or t.user_attrs.get("interrupted") else "failed")
                problems.append(f"trial {t.number} {why} was never run again: {t.user_attrs}")
            rd = t.user_attrs.get("run_dir")
            if rd and (Path(rd) / "run.json").is_file():
                status = json.loads((Path(rd) / "run.json").read_text()).get("status")
                if status == "running":
                    problems.append(f"orphaned trial {t.number}'s run.json still says running")
    complete = {repr(float(t.params["train.lr"])) for t in trials if t.state.name == "COMPLETE"}
    if complete != {repr(float(x)) for x in LRS}:
        problems.append(f"COMPLETE trials for lr {sorted(complete)}, the grid is {LRS}")
    return problems
