"""What client runtimes send back to the coordinator (wire types), and one way to describe an error."""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field

import numpy as np

from fedray.core.errors import ConfigError

__all__ = ["ClientOutcome", "SplitOutcome", "WorkerLost", "error_text", "is_fatal"]


class WorkerLost(RuntimeError):
    """The worker process running a task died (crash, kill, out of memory)."""


def is_fatal(err: BaseException) -> bool:
    """A client error that no retry can fix: a configuration error (e.g. an unknown feature tap)."""
    return isinstance(err, ConfigError)


def error_text(err: BaseException) -> str:
    """``"Type: message"`` then a short traceback: how a client's failure travels to the ledger (its first
    line) and to error messages."""
    return f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=8)}"


@dataclass
class ClientOutcome:
    """One client's result of a federated task: its trained weights, or ``error``."""

    cid: int
    pos: int  # position in the round's sampled order
    weights: np.ndarray | None
    num_samples: int
    loss: float
    seconds: float
    worker: str
    extras: dict = field(default_factory=dict)  # small per-client payloads for Algorithm.after_aggregate
    error: str | None = None
    fatal: bool = False  # the error is a configuration error: the run stops, no retry


@dataclass
class SplitOutcome:
    """One client's result of one split task: activations + labels (iterations) or weights (final)."""

    pos: int
    cid: int
    activations: np.ndarray | None = None
    labels: np.ndarray | None = None
    weights: np.ndarray | None = None
    num_samples: int = 0
    loss: float = math.nan
    seconds: float = 0.0
    worker: str = ""
    error: str | None = None
    fatal: bool = False  # the error is a configuration error: the run stops, no retry
