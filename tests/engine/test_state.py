"""Per-client state on disk (fedray/engine/state.py): a checkpoint prunes the clients that trained since the last
one, not every client that ever trained; a resume scans them all."""

from __future__ import annotations

import numpy as np

from fedray.driver.callbacks import Checkpointer
from fedray.engine.state import ClientStateStore
from fedray.reporting.rundir import RunDir


def _versions(store: ClientStateStore, cids) -> dict[int, list[int]]:
    return {c: store.versions(c) for c in cids}


def test_prune_of_named_clients_leaves_the_others_and_a_full_prune_equals_it(tmp_path):
    store = ClientStateStore(tmp_path / "s")
    for cid, rounds in {3: [1, 2, 4], 1500: [2, 3], 7: [1]}.items():
        for r in rounds:
            store.save(cid, r, {"g": np.full(2, r, np.float32)})
    store.prune(keep_from_round=5, clients=[3, 3, 99])  # 99 never trained: nothing to do
    assert _versions(store, [3, 1500, 7]) == {3: [4], 1500: [2, 3], 7: [1]}
    assert store.load(3, 5)["g"].tolist() == [4, 4] and store.load(1500, 5)["g"].tolist() == [3, 3]
    store.prune(keep_from_round=5)
    assert _versions(store, [3, 1500, 7]) == {3: [4], 1500: [3], 7: [1]}
    store.prune(keep_from_round=5, drop_after_round=2, clients=[])  # named none: nothing, even on resume
    assert store.versions(1500) == [3]
    store.prune(keep_from_round=3, drop_after_round=2)  # a resume at round 3: versions after round 2 go
    assert _versions(store, [3, 1500, 7]) == {3: [], 1500: [], 7: [1]}


def test_checkpointer_prunes_the_clients_of_the_ledgers_since_the_last_checkpoint(tmp_path):
    rd = RunDir(tmp_path / "run").create()
    store = ClientStateStore(rd.state_path)
    for cid, rounds in {1: [1, 3], 2: [2, 3], 5: [1, 2]}.items():
        for r in rounds:
            store.save(cid, r, {"g": np.zeros(1, np.float32)})
    for r, cids in {1: [1, 5], 2: [2, 5], 3: [1, 2]}.items():
        rd.write_ledger(r, [{"client": c, "round": r} for c in cids])

    class Engine:
        def state_dict(self):
            return {"round": 3, "weights": np.zeros(1, np.float32)}

    class Loop:
        engine = Engine()

    ck = Checkpointer(rd, every=1, keep=2, rounds=3, state_path=rd.state_path)
    ck.last = 2
    ck.save(Loop(), 3)  # round 3's clients only: 1 and 2; client 5 (rounds 1, 2) is not looked at
    assert _versions(store, [1, 2, 5]) == {1: [3], 2: [3], 5: [1, 2]} and ck.last == 3
    (rd.path / "ledger" / "round-000003.parquet").unlink()
    ck.last = 2
    ck.save(Loop(), 3)  # a ledger is missing: every client is pruned
    assert _versions(store, [1, 2, 5]) == {1: [3], 2: [3], 5: [2]}
