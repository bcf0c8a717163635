"""Whether a run directory can take a new run: what ``fedray run`` and ``jobs.train`` check before anything
starts (Ray, data), and what :func:`fedray.engine.runner.setup_run` checks again when it claims the directory.

Light on purpose: the config hash and the directory's ``run.json``, no numpy, pyarrow, torch or Ray.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedray.config import ConfigError, ExperimentConfig, config_hash

__all__ = ["check_run_dir", "default_run_name", "run_dir_of"]


def default_run_name(cfg: ExperimentConfig) -> str:
    return cfg.output.name or f"{cfg.algorithm.name}-{config_hash(cfg)}"


def run_dir_of(cfg: ExperimentConfig) -> Path:
    """The run directory a new run of ``cfg`` uses: ``<output.root>/<output.name or algorithm-confighash>``."""
    return Path(cfg.output.root) / default_run_name(cfg)


def check_run_dir(path: str | Path, cfg: ExperimentConfig, *, overwrite: bool = False,
                  finished_ok: bool = False) -> bool:
    """Whether a new run of ``cfg`` may start in ``path``: True when it holds no run, or when ``overwrite``
    lets the new run delete the one it holds. With ``finished_ok``, False when it holds this same config's
    finished run (same config hash): nothing is left to do. Otherwise (a failed, interrupted or running run,
    or another config's) a ``ConfigError`` naming ``--resume`` and ``--overwrite``: a run directory is never
    reused silently."""
    path = Path(path)
    if overwrite or not (path / "run.json").is_file():
        return True
    try:
        info = json.loads((path / "run.json").read_text())
        status = info.get("status", "?")
    except (OSError, ValueError, AttributeError):
        info, status = {}, "unreadable run.json"
    same = info.get("config_hash") == config_hash(cfg)
    if finished_ok and status == "finished" and same:
        return False
    other = "" if same or not info.get("config_hash") else f" of another config (hash {info['config_hash']})"
    raise ConfigError(f"output: {path} already holds a run (status {status}){other}; continue it with "
                      f"`fedray run --resume {path}`, start it over with --overwrite (deletes its results), "
                      f"or choose another output.name / output.root")
