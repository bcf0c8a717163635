"""fedray.engine.programs.fold_group: partial sums on the workers (``engine.fold_group``), on a fake pool."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fedray.config import from_dict
from fedray.core.errors import ConfigError
from fedray.engine.client.partial import run_partial_sum
from fedray.engine.outcomes import ClientOutcome
from fedray.engine.programs.federated import FederatedProgram
from fedray.engine.programs.fold_group import check_fold_group, train_groups
from tests.engine.fakes import ShuffledPool
from tests.helpers import small_config

DIM = 4099
SIZES = np.array([7, 3, 11, 5, 9, 1, 13, 4, 6, 8, 2, 10, 12, 5, 3, 7, 9, 4, 6, 8, 1, 2, 3], np.int64)


def client_vector(cid: int) -> np.ndarray:
    return np.random.default_rng([7, cid]).standard_normal(DIM).astype(np.float32)


class Runtime:
    """A worker's client runtime: client ``cid``'s model is :func:`client_vector`; ``raises`` scripts failures
    as {cid: times it raises before succeeding} (shared by every worker of a pool)."""

    def __init__(self, raises: dict):
        self.raises = raises

    def run(self, rnd, weights, payload, chunk, hints):
        out = []
        for pos, cid in chunk:
            if self.raises.get(cid, 0) > 0:
                self.raises[cid] -= 1
                out.append(ClientOutcome(cid=cid, pos=pos, weights=None, num_samples=0, loss=float("nan"),
                                         seconds=0.0, worker="w", error=f"ValueError: client {cid} broke"))
                continue
            out.append(ClientOutcome(cid=cid, pos=pos, weights=client_vector(cid), num_samples=int(SIZES[cid]),
                                     loss=0.1 * cid, seconds=0.0, worker="w", extras={"seen": cid}))
        return out


class Pool(ShuffledPool):
    """``lose`` names the first positions whose task loses its worker on the first submission."""

    def __init__(self, size: int, order_seed: int, raises: dict | None = None, lose: set | None = None):
        super().__init__(size, order_seed)
        self.runtime = Runtime(dict(raises or {}))
        self.lose = set(lose or ())
        self.uploads = 0

    def run(self, widx, method, rnd, w, p, items, hints):
        first = items[0][0]
        if first in self.lose:
            self.lose.discard(first)
            return None
        if method == "run_group":
            res = run_partial_sum(self.runtime, rnd, w, p, items, hints)
            self.uploads += res.weights is not None
        else:
            res = self.runtime.run(rnd, w, p, items, hints)
            self.uploads += sum(o.weights is not None for o in res)
        return res


def program(pool, g: int, retries: int = 2, dropped_fraction: float = 0.0) -> FederatedProgram:
    eng = types.SimpleNamespace(over_selection=0, round_deadline_s=None, reorder_window=None,
                                max_client_retries=retries, max_dropped_fraction=dropped_fraction,
                                max_worker_restarts=10, chunk_size=1, multi_client=1, fold_group=g)
    cfg = types.SimpleNamespace(engine=eng, train=types.SimpleNamespace(clients_per_round=17))
    return FederatedProgram(cfg=cfg, algorithm=types.SimpleNamespace(client_weight=lambda n: float(n)),
                            server_opt=None, pool=pool, sizes=SIZES, num_params=DIM)


SAMPLED = [int(c) for c in np.random.default_rng(3).permutation(len(SIZES))[:17]]


def naive(g: int, sampled=SAMPLED, skip=()) -> np.ndarray:
    """The reference: a_k = n_k / sum(n), partial sums of g consecutive clients in sampled order, added in order."""
    total = float(sum(float(SIZES[c]) for c in sampled))
    acc, kept = None, 0.0
    for i in range(0, len(sampled), g):
        part = None
        for c in sampled[i:i + g]:
            if c in skip:
                continue
            v = client_vector(c) * (float(SIZES[c]) / total)
            part = v if part is None else part + v
            kept += float(SIZES[c])
        if part is not None:
            acc = part.copy() if acc is None else acc + part
    if kept != total:
        acc *= np.float32(total / kept)
    return acc


def test_group_fold_equals_the_naive_reference_and_g1_equals_the_client_fold():
    ref = program(Pool(2, 0), 1).train(1, SAMPLED, None, None, None)
    one = train_groups(program(Pool(2, 1), 1), 1, SAMPLED, None, None, None)
    assert np.array_equal(one.avg, ref.avg)  # g = 1 through the workers' partial sums: the same bits
    assert np.array_equal(ref.avg, naive(1))
    for g in (5, 10):
        out = train_groups(program(Pool(2, 2), g), 1, SAMPLED, None, None, None)
        assert np.array_equal(out.avg, naive(g))
        np.testing.assert_allclose(out.avg, ref.avg, rtol=1e-5, atol=1e-6)  # float rounding only
        assert out.uploads == -(-len(SAMPLED) // g) and out.tally.clients == len(SAMPLED)
        assert out.tally.samples == int(SIZES[SAMPLED].sum()) and out.tally.loss == ref.tally.loss
        assert [e["cid"] for e in out.tally.extras] == SAMPLED  # per-client extras still arrive, in sampled order
        assert sorted(r.client for r in out.ledger) == sorted(SAMPLED)


@pytest.mark.parametrize("g", [3, 5])
def test_group_fold_bit_identical_across_workers_completion_order_and_worker_loss(g):
    hashes = set()
    for size in (1, 2, 4):
        for seed in range(3):
            lose = {g} if seed == 1 else set()  # the second group's worker dies once
            out = train_groups(program(Pool(size, seed, lose=lose), g), 1, SAMPLED, None, None, None)
            hashes.add(out.avg.tobytes())
            assert out.worker_restarts == len(lose)
    assert len(hashes) == 1


def test_a_member_that_raises_reruns_its_group_and_the_result_is_unchanged():
    clean = train_groups(program(Pool(2, 0), 5), 1, SAMPLED, None, None, None)
    bad = SAMPLED[6]
    out = train_groups(program(Pool(2, 0, raises={bad: 1}), 5), 1, SAMPLED, None, None, None)
    assert np.array_equal(out.avg, clean.avg)
    assert out.retries == 1 and out.dropped == []
    rows = [r for r in out.ledger if r.client == bad]
    assert [(r.failure is None, r.attempt) for r in rows] == [(False, 1), (True, 2)]


def test_a_member_dropped_after_its_retries_leaves_its_group_summed_without_it():
    bad = SAMPLED[6]
    pool = Pool(2, 5, raises={bad: 99})
    out = train_groups(program(pool, 5, retries=1, dropped_fraction=0.5), 1, SAMPLED, None, None, None)
    assert out.dropped == [bad] and out.tally.clients == len(SAMPLED) - 1
    assert np.array_equal(out.avg, naive(5, skip={bad}))
    # a whole group dropped: skipped, the others folded and renormalised
    whole = set(SAMPLED[15:17])
    out = train_groups(program(Pool(2, 6, raises={c: 99 for c in whole}), 5, retries=0, dropped_fraction=0.5), 1,
                       SAMPLED, None, None, None)
    assert sorted(out.dropped) == sorted(whole) and np.array_equal(out.avg, naive(5, skip=whole))


def test_fold_group_refused_for_per_client_state_split_and_stragglers(tmp_path, partition_cache):
    for algo in ("feddyn", "moon"):
        cfg = from_dict(small_config(tmp_path, partition_cache, algorithm__name=algo, engine__fold_group=5))
        with pytest.raises(ConfigError, match=r"engine.fold_group: 5: algorithm '%s' keeps per-client state" % algo):
            check_fold_group(cfg)
    cfg = from_dict(small_config(tmp_path, partition_cache, algorithm__name="scala", engine__fold_group=5))
    with pytest.raises(ConfigError, match=r"engine.fold_group: 5 needs the federated round program"):
        check_fold_group(cfg)
    check_fold_group(from_dict(small_config(tmp_path, partition_cache, algorithm__name="fedprox",
                                            engine__fold_group=5)))
    with pytest.raises(ConfigError, match=r"engine.fold_group: 5 sums clients on the workers, but straggler"):
        from_dict(small_config(tmp_path, partition_cache, engine__fold_group=5, engine__over_selection=0.2))
    with pytest.raises(ConfigError, match=r"engine.fold_group: 4 must be a multiple of engine.multi_client"):
        from_dict(small_config(tmp_path, partition_cache, engine__fold_group=4, engine__multi_client=3))
