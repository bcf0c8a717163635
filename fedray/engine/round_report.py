"""The types a round hands back: one ledger row per client attempt, the round's report, the round program's
result, and the per-client statistics of the folded clients.

A :class:`RoundReport` is filled in three places, each with its own fields: the round program (counts, loss,
learning rate, the bytes it moved, ``extra``), the coordinator (``evaluation``, phase ``seconds``, ``memory``,
``workers``) and the driver (``failures``, ``wall_seconds``); :meth:`RoundReport.as_row` writes the one
``metrics.jsonl`` row (``docs/engine.md``). Byte counts are the engine's own measurement of the numpy arrays it
sends and receives: the weights, the algorithm's broadcast payload and the clients' extras.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ByteCounts", "ClientTally", "LedgerRow", "Memory", "RoundReport", "RoundResult", "TrainedClients",
           "arrays_nbytes"]


def arrays_nbytes(obj) -> int:
    """Bytes of every numpy array inside a (nested) dict / list / tuple; other values count 0."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(arrays_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(arrays_nbytes(v) for v in obj)
    return 0


@dataclass
class LedgerRow:
    """One attempt of one client in one round (``ledger/round-*.parquet``): ``failure`` is None when it
    succeeded, else the first line of the error; ``attempt`` counts from 1."""

    client: int
    round: int
    samples: int = 0
    loss: float = math.nan
    seconds: float = 0.0
    worker: str = ""
    failure: str | None = None
    attempt: int = 1

    def as_dict(self) -> dict:
        """The row as a dict (what ``dataclasses.asdict`` gives: every field is a scalar or a string, so no deep
        copy is needed; asdict's recursion took 0.27 s for a round of 10,000 clients, this 0.01 s)."""
        return {name: getattr(self, name) for name in _LEDGER_FIELDS}


_LEDGER_FIELDS = tuple(f.name for f in fields(LedgerRow))


@dataclass
class ByteCounts:
    """The bytes a round moved between the coordinator and the clients, as the engine measured them.

    ``broadcast``/``upload``: the weight vectors sent to the round's clients and received back (one per client,
    or per group with ``engine.fold_group``); ``signals_broadcast``: the arrays of the algorithm's payload
    (``Algorithm.broadcast``) times the clients that received it; ``signals_upload``: the arrays in the folded
    clients' extras (prototypes, contrastive signals, ...). The split program adds what crossed the cut:
    ``activations`` and ``labels`` up, ``gradients`` down."""

    broadcast: int = 0
    upload: int = 0
    signals_broadcast: int = 0
    signals_upload: int = 0
    activations: int | None = None
    labels: int | None = None
    gradients: int | None = None

    @property
    def signals(self) -> int:
        return self.signals_broadcast + self.signals_upload

    def as_dict(self) -> dict[str, int]:
        """The row's ``bytes``: signal bytes when the algorithm moved any, the cut's bytes and their ``total``
        for the split program."""
        out = {"broadcast": int(self.broadcast), "upload": int(self.upload)}
        if self.signals:
            out.update(signals_broadcast=int(self.signals_broadcast), signals_upload=int(self.signals_upload))
        if self.activations is not None:
            cut = {"activations": int(self.activations), "labels": int(self.labels or 0),
                   "gradients": int(self.gradients or 0)}
            out.update(cut, total=int(self.broadcast) + int(self.upload) + self.signals + sum(cut.values()))
        return out


class Memory(NamedTuple):
    """Memory at a round's end, MB: the coordinator's process (resident, peak, anonymous) and the workers'
    (resident summed over workers, largest peak)."""

    coordinator_rss_mb: float = math.nan
    coordinator_peak_mb: float = math.nan
    coordinator_anon_mb: float = math.nan
    workers_rss_mb: float = math.nan
    workers_peak_mb: float = math.nan


@dataclass
class RoundReport:
    """One round's report (module docstring); ``extra`` holds what a program or algorithm adds (the split
    program's ``split`` and loss parts, ``Algorithm.round_metrics``), ``evaluation`` the evaluation's numbers."""

    round: int
    num_clients: int
    num_samples: int
    loss: float
    lr: float
    bytes: ByteCounts = field(default_factory=ByteCounts)
    dropped: list[int] = field(default_factory=list)
    retries: int = 0
    worker_restarts: int = 0
    stragglers_cancelled: int = 0
    receive_seconds: float | None = None  # federated program: seconds spent taking results from the store
    extra: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # the round's phases, in order
    memory: Memory | None = None
    workers: int | None = None
    ledger: list[LedgerRow] = field(default_factory=list)  # written to ledger/round-*.parquet, not to the row
    failures: int | None = None
    wall_seconds: float | None = None

    def add_extra(self, values: dict, source: str) -> None:
        """Add ``values`` to ``extra``; a name the row already holds is refused, naming ``source`` (one
        would silently replace the other)."""
        taken = self.names()
        for key, value in values.items():
            if key in taken:
                raise ValueError(f"round {self.round}: {source} returned {key!r}, the name of a key of the round's "
                                 f"report; use another name")
            self.extra[key] = value
            taken.add(key)

    def names(self) -> set[str]:
        """The keys of :meth:`as_row` so far."""
        return set(self.as_row())

    def as_row(self) -> dict[str, Any]:
        """The ``metrics.jsonl`` row, keys in the order the row has always had."""
        row: dict[str, Any] = {
            "round": self.round, "num_clients": self.num_clients, "num_samples": self.num_samples, "loss": self.loss,
            "dropped": self.dropped, "retries": self.retries, "worker_restarts": self.worker_restarts,
            "stragglers_cancelled": self.stragglers_cancelled}
        if self.receive_seconds is not None:
            row["receive_seconds"] = self.receive_seconds
        row["lr"] = self.lr
        row["bytes"] = self.bytes.as_dict()
        if self.bytes.signals:
            row["bytes_signals"] = self.bytes.signals
        row.update(self.extra)
        row.update(self.evaluation)
        if self.seconds:
            row["seconds"] = dict(self.seconds)
            row["seconds_total"] = float(sum(self.seconds.values()))
        if self.memory is not None:
            row["memory"] = self.memory._asdict()
        if self.workers is not None:
            row["workers"] = self.workers
        if self.failures is not None:
            row["failures"] = self.failures
        if self.wall_seconds is not None:
            row["wall_seconds"] = self.wall_seconds
        return row


@dataclass
class RoundResult:
    """What a round program returns to the coordinator: the new server state and the round's report (the
    program's part: its ``seconds`` hold the program's phases, its ``ledger`` the client attempts)."""

    weights: np.ndarray
    algo_state: dict
    report: RoundReport


class ClientTally:
    """Per-client statistics of the folded clients, accumulated in sampled order; ``upload_signals``: the
    bytes of the arrays in their extras."""

    def __init__(self):
        self.loss_sum, self.samples, self.clients = 0.0, 0, 0
        self.upload_signals = 0
        self.extras: list[dict] = []

    def add(self, out) -> None:
        self.loss_sum += out.loss * out.num_samples
        self.samples += out.num_samples
        self.clients += 1
        if out.extras:
            self.upload_signals += arrays_nbytes(out.extras)
            self.extras.append({"cid": out.cid, "num_samples": out.num_samples, **out.extras})

    @property
    def loss(self) -> float:
        """The folded clients' training loss, weighted by their samples (NaN without samples)."""
        return self.loss_sum / self.samples if self.samples else math.nan


@dataclass
class TrainedClients:
    """What running a federated round's clients gave (client by client, or by groups with ``engine.fold_group``):
    the folded average, the folded clients' tally and the scheduler's counts."""

    avg: np.ndarray | None
    tally: ClientTally
    fold_seconds: float
    dropped: list[int]
    retries: int
    worker_restarts: int
    ledger: list[LedgerRow]
    receive_seconds: float
    cancelled: int = 0
    uploads: int | None = None  # weight vectors received; None: one per folded client
