"""Whether a run directory can take a new run: what ``fedray run`` and ``jobs.train`` check before anything
starts (Ray, data), and what :func:`fedray.driver.runner.setup_run` checks again when it claims the directory.

Light on purpose: the config hash and the directory's ``run.json``, no numpy, pyarrow, torch or Ray. A
``running`` run.json names its driver (``owner``, :mod:`fedray.core.owner`): a run whose driver is dead reads as
``killed``, and one whose driver lives is never written over.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fedray.config import ConfigError, ExperimentConfig, config_hash
from fedray.core.io import atomic_write_text
from fedray.core.owner import describe_owner, owner_state, read_run_status

__all__ = ["check_run_dir", "default_run_name", "live_owner", "refuse_live_owner", "run_dir_of", "settle_run_json"]


def default_run_name(cfg: ExperimentConfig) -> str:
    return cfg.output.name or f"{cfg.algorithm.name}-{config_hash(cfg)}"


def run_dir_of(cfg: ExperimentConfig) -> Path:
    """The run directory a new run of ``cfg`` uses: ``<output.root>/<output.name or algorithm-confighash>``."""
    return Path(cfg.output.root) / default_run_name(cfg)


def live_owner(info: dict) -> dict | None:
    """The owner of a run.json that says ``running`` when that process is alive and is not this one (a run ended
    in this process without recording it, e.g. by a second Ctrl-C, is over)."""
    owner = info.get("owner")
    if info.get("status") != "running" or owner_state(owner) != "alive" or not isinstance(owner, dict):
        return None
    return None if owner["pid"] == os.getpid() else owner


def refuse_live_owner(path: str | Path, info: dict) -> None:
    """ConfigError when a live driver is running the run in ``path``: a second one would write over its files."""
    owner = live_owner(info)
    if owner is not None:
        raise ConfigError(f"output: {path} is being run by a live driver ({describe_owner(owner)}); wait for it to "
                          f"end, or stop it (Ctrl-C, SIGTERM) and then resume it with `fedray run --resume {path}`")


def settle_run_json(path: str | Path) -> str | None:
    """Write ``killed`` and the reason into the run.json of ``path`` when it says ``running`` and its driver is dead
    (a study's orphaned trials at ``--resume``); returns the reason then, else None."""
    info, status, why = read_run_status(path)
    if info.get("status") != "running" or status != "killed":
        return None
    info.update(status="killed", error=why)
    atomic_write_text(Path(path) / "run.json", json.dumps(info, indent=2, sort_keys=True) + "\n")
    return why


def check_run_dir(path: str | Path, cfg: ExperimentConfig, *, overwrite: bool = False,
                  finished_ok: bool = False) -> bool:
    """Whether a new run of ``cfg`` may start in ``path``: True when it holds no run, or when ``overwrite``
    lets the new run delete the one it holds. With ``finished_ok``, False when it holds this same config's
    finished run (same config hash): nothing is left to do. Otherwise (a failed, interrupted, killed or running run,
    or another config's) a ``ConfigError`` naming ``--resume`` and ``--overwrite``: a run directory is never
    reused silently. A run whose driver still lives is refused even with ``overwrite``."""
    path = Path(path)
    if not (path / "run.json").is_file():
        return True
    info, status, _ = read_run_status(path)
    refuse_live_owner(path, info)
    if overwrite:
        return True
    same = info.get("config_hash") == config_hash(cfg)
    if finished_ok and status == "finished" and same:
        return False
    other = "" if same or not info.get("config_hash") else f" of another config (hash {info['config_hash']})"
    raise ConfigError(f"output: {path} already holds a run (status {status}){other}; continue it with "
                      f"`fedray run --resume {path}`, start it over with --overwrite (deletes its results), "
                      f"or choose another output.name / output.root")
