"""What client runtimes send back to the coordinator (wire types), and one way to describe an error."""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedray.core.errors import ConfigError, TransientError

if TYPE_CHECKING:
    import torch

__all__ = ["DETERMINISM_HINT", "GPU_OOM_HINT", "ClientOutcome", "EvalOutcome", "GroupOutcome", "InStore",
           "SplitOutcome", "WorkerLost", "error_hint", "error_text", "is_fatal"]


@dataclass(frozen=True)
class InStore:
    """An object already in Ray's object store, handed to an actor by reference: a bare ``ObjectRef`` argument
    would arrive resolved, and the actor could only pass it on by putting a second copy."""

    ref: object


class WorkerLost(RuntimeError):
    """The worker process running a task died (crash, kill, out of memory)."""


#: errors of a client that a retry may not meet again: the environment's, not the code's
TRANSIENT = (TransientError, OSError, MemoryError, TimeoutError)


def is_fatal(err: BaseException) -> bool:
    """A client error that no retry can fix, so the run stops at once with the client's traceback: every error
    raised by the client's code (a configuration error, a TypeError or AttributeError of an algorithm, model or
    plugin: a client's work is seeded, so a retry raises it again), but not the transient ones (:data:`TRANSIENT`:
    injected faults, I/O, running out of memory, torch's OutOfMemoryError included). A worker process that dies
    is not an error of a client (:class:`WorkerLost`): it is replaced and its clients re-run."""
    if isinstance(err, ConfigError):
        return True
    return not (isinstance(err, TRANSIENT) or type(err).__name__ == "OutOfMemoryError")


#: what a worker out of GPU memory is told: the share of the GPU that ran out is the config's (a worker's
#: torch.cuda.set_per_process_memory_fraction is its engine.worker_num_gpus; fedray/engine/replica.py)
GPU_OOM_HINT = ("engine.worker_num_gpus: this worker ran out of GPU memory; a worker may use engine.worker_num_gpus "
                "of the GPU's memory, so give each one a larger share (fewer workers per GPU: engine.worker_num_gpus "
                "or engine.workers_per_gpu) or lower train.batch_size / eval.batch_size")
#: what an op without a deterministic kernel is told under engine.deterministic: true
DETERMINISM_HINT = "engine.deterministic: true asks for deterministic kernels only, and this op has none"


def error_hint(err: BaseException) -> str | None:
    """The config field behind ``err`` when the error is one of the environment's that the config decides: torch's
    CUDA out-of-memory error (the worker's GPU share, :data:`GPU_OOM_HINT`) and an op refused by torch's
    deterministic mode (:data:`DETERMINISM_HINT`); None for any other."""
    if type(err).__name__ == "OutOfMemoryError" and "CUDA" in str(err):
        return GPU_OOM_HINT
    if isinstance(err, RuntimeError) and "does not have a deterministic implementation" in str(err):
        return DETERMINISM_HINT
    return None


def error_text(err: BaseException) -> str:
    """``"Type: message"`` then a short traceback: how a client's failure travels to the ledger (its first
    line) and to error messages. An error the config decides (:func:`error_hint`) names its field first."""
    hint = error_hint(err)
    head = f"{type(err).__name__}: {hint}. {err}" if hint else f"{type(err).__name__}: {err}"
    return f"{head}\n{traceback.format_exc(limit=8)}"


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
    activations: np.ndarray | torch.Tensor | None = None  # a tensor where the worker shares the coordinator's process
    labels: np.ndarray | torch.Tensor | None = None
    weights: np.ndarray | None = None
    num_samples: int = 0
    loss: float = math.nan
    seconds: float = 0.0
    worker: str = ""
    error: str | None = None
    fatal: bool = False  # the error is a configuration error: the run stops, no retry


@dataclass
class GroupOutcome:
    """One task of ``engine.fold_group: g`` consecutive sampled clients: their partial sum and their outcomes.

    ``weights`` is ``sum_k a_k w_k`` over the members in sampled order (float32, ``a_k`` as the coordinator's
    ordered fold computes it), None when a member failed; ``members`` are the clients' outcomes without
    weights (statistics, extras, ledger), up to and including the first failed one."""

    pos: int  # the group's first sampled position
    weights: np.ndarray | None
    members: list[ClientOutcome]


@dataclass
class EvalOutcome:
    """One test shard's sums (:func:`fedray.metrics.evaluate_batches`), or ``error``."""

    pos: int  # shard index
    part: dict | None
    seconds: float
    worker: str
    error: str | None = None
    fatal: bool = False

    @property
    def cid(self) -> int:  # the scheduler counts attempts per item id: a shard's is its index
        return self.pos
