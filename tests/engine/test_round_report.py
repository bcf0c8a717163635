"""The round report (engine/round_report.py): one typed value, one row writer, bytes measured by the engine."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fedray.engine.round_report import ByteCounts, ClientTally, LedgerRow, Memory, RoundReport, arrays_nbytes


def _federated() -> RoundReport:
    r = RoundReport(round=3, num_clients=2, num_samples=50, loss=0.5, lr=0.01, receive_seconds=0.25,
                    bytes=ByteCounts(broadcast=80, upload=80, signals_broadcast=24, signals_upload=16),
                    seconds={"sample": 0.5, "train": 1.5}, ledger=[LedgerRow(client=4, round=3, failure="boom")])
    r.add_extra({"num_signals": 7}, "algorithm 'x'")
    r.evaluation = {"accuracy": 0.75}
    r.seconds = {**r.seconds, "eval": 1.0}
    r.memory, r.workers, r.failures, r.wall_seconds = Memory(1.0, 2.0, 3.0, 4.0, 5.0), 2, 1, 4.5
    return r


def test_a_federated_row_has_its_keys_in_the_order_of_the_metrics_file():
    row = _federated().as_row()
    assert list(row) == ["round", "num_clients", "num_samples", "loss", "dropped", "retries", "worker_restarts",
                         "stragglers_cancelled", "receive_seconds", "lr", "bytes", "bytes_signals", "num_signals",
                         "accuracy", "seconds", "seconds_total", "memory", "workers", "failures", "wall_seconds"]
    assert row["bytes"] == {"broadcast": 80, "upload": 80, "signals_broadcast": 24, "signals_upload": 16}
    assert row["bytes_signals"] == 40 and row["seconds_total"] == 3.0
    assert row["memory"] == {"coordinator_rss_mb": 1.0, "coordinator_peak_mb": 2.0, "coordinator_anon_mb": 3.0,
                             "workers_rss_mb": 4.0, "workers_peak_mb": 5.0}
    assert "ledger" not in row


def test_a_split_row_has_the_cut_bytes_and_their_total_and_no_signal_keys_without_signals():
    r = RoundReport(round=1, num_clients=4, num_samples=40, loss=1.0, lr=0.1,
                    bytes=ByteCounts(broadcast=10, upload=10, activations=7, labels=2, gradients=7))
    r.add_extra({"split": {"point": "block2"}, "client_loss": math.nan}, "the split program")
    row = r.as_row()
    assert list(row) == ["round", "num_clients", "num_samples", "loss", "dropped", "retries", "worker_restarts",
                         "stragglers_cancelled", "lr", "bytes", "split", "client_loss"]
    assert row["bytes"] == {"broadcast": 10, "upload": 10, "activations": 7, "labels": 2, "gradients": 7, "total": 36}


@pytest.mark.parametrize("name", ["loss", "bytes", "bytes_signals", "num_signals"])
def test_an_extra_key_never_replaces_a_key_of_the_row(name):
    r = _federated()
    before = r.as_row()
    with pytest.raises(ValueError, match=rf"round 3: algorithm 'y' returned '{name}', the name of a key"):
        r.add_extra({name: 1.0}, "algorithm 'y'")
    assert r.as_row() == before


def test_the_engine_counts_the_arrays_of_the_clients_extras():
    tally = ClientTally()
    protos = np.zeros((3, 4), np.float32)
    tally.add(SimpleNamespace(cid=5, num_samples=10, loss=1.0, extras={"protos": protos, "classes": np.arange(3),
                                                                     "n": 3, "nested": [protos, {"x": protos}]}))
    tally.add(SimpleNamespace(cid=6, num_samples=30, loss=3.0, extras={}))
    assert tally.upload_signals == 3 * protos.nbytes + np.arange(3).nbytes
    assert tally.clients == 2 and tally.loss == pytest.approx(2.5) and [e["cid"] for e in tally.extras] == [5]
    assert arrays_nbytes({"a": 1.0, "b": "text"}) == 0 and math.isnan(ClientTally().loss)


def test_a_ledger_row_as_a_dict_is_dataclasses_asdict_with_its_fields_in_order():
    import dataclasses

    for row in (LedgerRow(client=7, round=2, samples=3, loss=0.25, seconds=0.5, worker="w1", attempt=2),
                LedgerRow(client=4, round=3, failure="worker lost: boom")):
        d = row.as_dict()
        assert d == dataclasses.asdict(row)
        assert list(d) == [f.name for f in dataclasses.fields(LedgerRow)]
        d["client"] = -1  # a copy: the row is not changed through it
        assert row.client != -1
