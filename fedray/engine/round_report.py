"""The types a round program hands back: one ledger row per client attempt, the round's result, and the
per-client statistics of the folded clients."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["ClientTally", "LedgerRow", "RoundResult"]


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
        return asdict(self)


@dataclass
class RoundResult:
    """What a round program returns to the coordinator: the new server state and the round's report
    fields (``seconds`` holds the program's phases; the coordinator adds evaluation and memory)."""

    weights: np.ndarray
    algo_state: dict
    report: dict
    ledger: list[LedgerRow] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)


class ClientTally:
    """Per-client statistics of the folded clients, accumulated in sampled order."""

    def __init__(self):
        self.loss_sum, self.samples, self.clients = 0.0, 0, 0
        self.extras: list[dict] = []

    def add(self, out) -> None:
        self.loss_sum += out.loss * out.num_samples
        self.samples += out.num_samples
        self.clients += 1
        if out.extras:
            self.extras.append({"cid": out.cid, "num_samples": out.num_samples, **out.extras})
