"""A study's directory, ``<output_dir>/<name>/``: ``study.json`` (study name, storage URL with any password masked,
study file, search-space hash, one entry per driver session), ``journal.log`` (the default storage),
``driver.lock`` (one driver at a time), ``trials/trial-NNNN/`` (one run directory per trial), ``_partitions/``, and
the outputs of :mod:`tuning.outputs` (``trials.csv``, ``trials.md``, ``best_config.yaml``, ``plots/``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fedray.apps.launcher import output_lock
from fedray.config import ConfigError
from fedray.core.io import atomic_write_text
from fedray.core.owner import owner_record, settle_sessions
from tuning.backend import is_url, mask_url
from tuning.space import DEFAULT_OUTPUT_DIR, StudySpec

STUDY_JSON = "study.json"


class StudyDir:
    """The directory of study ``spec`` under ``output_dir`` (default: the study file's, else
    :data:`DEFAULT_OUTPUT_DIR`); ``storage``: the command line's ``--storage``."""

    def __init__(self, spec: StudySpec, output_dir: str | Path | None = None, storage: str | None = None):
        self.spec = spec
        self.path = (Path(output_dir or spec.output_dir or DEFAULT_OUTPUT_DIR) / spec.name).resolve()
        self.trials = self.path / "trials"
        self.cli_storage = storage

    def trial_dir(self, number: int) -> Path:
        return self.trials / f"trial-{number:04d}"

    def read(self) -> dict | None:
        """``study.json``, None when there is none (a new study)."""
        p = self.path / STUDY_JSON
        if not p.is_file():
            return None
        try:
            return json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: unreadable ({e}); fix or remove it") from None

    def write(self, info: dict) -> None:
        atomic_write_text(self.path / STUDY_JSON, json.dumps(info, indent=2, sort_keys=True) + "\n")

    def lock(self, session_id: str):
        """One driver per study: ``driver.lock`` (:func:`fedray.apps.launcher.output_lock`)."""
        return output_lock(self.path / "driver.lock", f"study {self.spec.name!r}", f"session {session_id}")

    def storage_url(self, recorded: dict | None) -> str:
        """The Optuna storage: the one ``recorded`` in study.json (when resuming; ``--storage`` must agree), else
        ``--storage``, the study file's, or ``journal.log`` here."""
        default = str(self.path / "journal.log")
        cli = self.cli_storage
        if recorded is None:
            s = cli or self.spec.storage
            if s is None:
                return default
            return s if is_url(s) else str(Path(s).resolve())
        rec = recorded.get("storage")
        if cli:
            if mask_url(cli) != rec and str(Path(cli).resolve()) != rec:
                raise ConfigError(f"--storage: {mask_url(cli)!r} differs from the storage {rec!r} recorded in "
                                  f"{self.path / STUDY_JSON}")
            return cli
        if self.spec.storage and is_url(self.spec.storage) and mask_url(self.spec.storage) == rec:
            return self.spec.storage
        if rec and "***@" in rec:
            raise ConfigError(f"--storage: the recorded storage {rec!r} has a masked password; pass the full URL with "
                              f"--storage")
        return rec or default

    def check_claim(self, exists: bool, recorded: dict | None, resume: bool, where: str) -> None:
        """A new study needs a fresh name and directory; ``resume`` an existing study with the same search space."""
        name = self.spec.name
        if resume:
            if not exists:
                raise ConfigError(f"--resume: no study named {name!r} in storage {where}")
            if recorded is not None and recorded.get("identity_hash") != self.spec.identity_hash():
                raise ConfigError(f"params: the search space or objectives differ from the ones study {name!r} was "
                                  f"created with ({self.path / STUDY_JSON}); start a new study (another name) "
                                  f"instead of resuming")
        elif exists:
            raise ConfigError(f"name: study {name!r} already exists in storage {where}; pass --resume to continue "
                              f"it, or choose another name")
        elif recorded is not None:
            raise ConfigError(f"name: the study directory {self.path} already holds a study ({STUDY_JSON}); pass "
                              f"--resume to continue it, or remove the directory")

    def open_session(self, recorded: dict | None, storage_url: str, session: dict) -> dict:
        """study.json with one more session (``session``: its id, seed, resources; the driver: pid, host, process
        start, :func:`fedray.core.owner.owner_record`), written; returns it. An earlier session still ``running``
        belongs to a dead driver (this one holds ``driver.lock``): it is marked ``killed`` with the reason."""
        spec = self.spec
        info = recorded or {"name": spec.name, "storage": mask_url(storage_url), "study_file": spec.source_path,
                            "base_config": spec.base_config_path, "identity_hash": spec.identity_hash(),
                            "directions": spec.directions, "created_at": time.time(), "sessions": []}
        for dead in settle_sessions(info.setdefault("sessions", []), lock_held=True):  # we hold driver.lock
            dead["found_by"] = session.get("id")
        info["sessions"].append({**owner_record(), "overrides": spec.overrides, "status": "running", **session})
        self.write(info)
        return info

    def close_session(self, info: dict, status: str, reason: str | None = None) -> None:
        """The session's end: its status and, for a session that crashed, why (the exception that ended it)."""
        info["sessions"][-1].update(ended_at=time.time(), status=status, **({"reason": reason} if reason else {}))
        self.write(info)
