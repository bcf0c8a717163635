"""fedray.engine.evaluation: evaluation sharded over the workers, reduced in shard order (fake pool)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch

from fedray.core.weights import FlatParams
from fedray.data.sources import load_source
from fedray.engine.dispatch import RoundAborted, RunAborted
from fedray.engine.evaluation import ShardedEvaluation, evaluate_shards, shard_ranges
from fedray.metrics import evaluate
from fedray.models import model_for_meta
from tests.engine.fakes import ShuffledPool


@pytest.fixture(scope="module")
def setup():
    bundle = load_source("mnist5k", None)
    torch.manual_seed(0)
    model = model_for_meta("mlp", bundle.meta, hidden=[32])
    flat = FlatParams(model, torch.device("cpu"))
    weights = flat.read().copy()
    n = 437  # a last shard shorter than the batch
    rng = np.random.default_rng(0)
    test = {"images": np.ascontiguousarray(bundle.test.images()[:n]),
            "labels": np.ascontiguousarray(bundle.test.labels[:n]),
            "domains": rng.integers(0, 3, n)}
    meta = dataclasses.replace(bundle.meta, domains=("a", "b", "c"))
    model.train()
    return model, flat, weights, test, meta


def replica(setup, batch_size, metrics=()):
    model, flat, _, _, meta = setup
    cfg = types.SimpleNamespace(data=types.SimpleNamespace(normalize=False),
                                eval=types.SimpleNamespace(batch_size=batch_size, metrics=list(metrics)),
                                engine=types.SimpleNamespace(max_client_retries=1, max_worker_restarts=5))
    return types.SimpleNamespace(cfg=cfg, model=model, flat=flat, meta=meta, device=torch.device("cpu"))


class Pool(ShuffledPool):
    """Workers that evaluate on one shared replica; ``lose`` first shards whose task loses its worker once;
    ``broken`` shards that always raise."""

    def __init__(self, rp, size, seed, lose=(), broken=()):
        super().__init__(size, seed)
        self.rp = rp
        self.lose, self.broken = set(lose), set(broken)
        self.submitted = []

    def run(self, widx, method, w, test, shards, analysis):
        assert method == "evaluate_shards"
        self.submitted.append((widx, [s[0] for s in shards]))
        if shards[0][0] in self.lose:
            self.lose.discard(shards[0][0])
            return None
        # a fresh weight vector per task, as a new worker would see it: the replica's own weights are scrambled
        self.rp.flat.load(np.zeros_like(w))
        outs = evaluate_shards(self.rp, w, test, shards, analysis, f"w{widx}")
        for o in outs:
            if o.pos in self.broken:
                o.part, o.error = None, "RuntimeError: shard broke\ntrace"
        return outs


def test_shards_are_batches_by_index_whatever_the_workers():
    assert shard_ranges(437, 100) == [(0, 100), (100, 200), (200, 300), (300, 400), (400, 437)]
    assert shard_ranges(0, 100) == []


@pytest.mark.parametrize("analysis", [False, True])
def test_sharded_evaluation_equals_one_process_evaluation_bit_for_bit(setup, analysis):
    model, flat, weights, test, meta = setup
    flat.load(weights)
    ref = evaluate(model, test["images"], test["labels"], meta=meta, normalize=False, batch_size=50,
                   domains=test["domains"], return_features=analysis)
    for size, seed, lose in ((1, 0, ()), (2, 1, ()), (4, 2, (0, 4)), (3, 3, (8,))):
        pool = Pool(replica(setup, 50), size, seed, lose=lose)
        out, counters = ShardedEvaluation(pool, replica(setup, 50).cfg, test, meta).run(1, weights, analysis)
        assert counters["worker_restarts"] == len(lose) and pool.restarts == len(lose)
        assert out["accuracy"] == ref["accuracy"] and out["test_loss"] == ref["test_loss"]
        assert out["domain_accuracy"] == ref["domain_accuracy"]
        assert out["domain_mean_accuracy"] == ref["domain_mean_accuracy"]
        if analysis:
            assert np.array_equal(out["features"], ref["features"])
        # the model in train mode before stays in train mode (the workers train with the same replica)
        assert model.training


def test_a_shard_that_keeps_failing_aborts_the_round(setup):
    _, _, weights, test, meta = setup
    rp = replica(setup, 100)
    pool = Pool(rp, 2, 0, broken={2})
    with pytest.raises(RoundAborted, match=r"round 4: item 2 \(an evaluation shard\) failed 2 times"):
        ShardedEvaluation(pool, rp.cfg, test, meta).run(4, weights)
    assert sum(2 in shards for _, shards in pool.submitted) == 2  # retried once (max_client_retries=1), no drop


def test_a_test_split_already_in_the_store_is_not_put_again(setup):
    """The driver puts the test split into the object store for the coordinator; the evaluation hands that
    reference to the workers instead of putting a second copy (only the round's weights are put)."""
    _, _, weights, test, meta = setup
    rp = replica(setup, 100)

    class Counting(Pool):
        def put(self, obj):
            self.puts = getattr(self, "puts", []) + [type(obj).__name__]
            return obj

    given = Counting(rp, 2, 0)
    ShardedEvaluation(given, rp.cfg, test, meta, test_ref=test).run(1, weights)
    ShardedEvaluation(given, rp.cfg, test, meta, test_ref=test).run(2, weights)
    assert given.puts == ["ndarray", "ndarray"]  # the weights of each evaluation, never the split
    own = Counting(rp, 2, 0)
    ev = ShardedEvaluation(own, rp.cfg, test, meta)
    ev.run(1, weights)
    ev.run(2, weights)
    assert own.puts == ["dict", "ndarray", "ndarray"]  # without one: the split once, at the first evaluation


def test_eval_metrics_are_bit_identical_to_one_process_whatever_the_workers(setup):
    """eval.metrics (the built-ins, and a metric of per-domain float sums whose last bits depend on the order
    they are added in) computed on the workers per batch and added in shard order on the coordinator: the same
    bits as one process evaluating the whole split, for any number of workers and lost workers."""
    from fedray.core.registry import ALL
    from fedray.metrics.registry import register_metric

    def margin(logits, labels, domains):
        m = (logits.max(1).values - logits.gather(1, labels.reshape(-1, 1)).squeeze(1)).double()
        return {"sum": torch.zeros(3, dtype=torch.float64).index_add_(0, domains.long(), m),
                "n": torch.bincount(domains.long(), minlength=3)}

    register_metric("test_margin", margin, lambda s: {str(d): s["sum"][d] / s["n"][d] for d in range(3)},
                    module="tests.engine.test_evaluation")
    try:
        model, flat, weights, test, meta = setup
        names = ["balanced_accuracy", "macro_f1", "ece", "top5_accuracy", "per_class_accuracy", "test_margin"]
        flat.load(weights)
        ref = evaluate(model, test["images"], test["labels"], meta=meta, normalize=False, batch_size=50,
                       domains=test["domains"], metrics=names)
        assert set(ref["test_margin"]) == {"0", "1", "2"} and 0 <= ref["ece"] <= 1
        for size, seed, lose in ((1, 0, ()), (2, 1, ()), (4, 2, (0, 4)), (3, 3, (8,))):
            rp = replica(setup, 50, names)
            out, _ = ShardedEvaluation(Pool(rp, size, seed, lose=lose), rp.cfg, test, meta).run(1, weights)
            assert {k: out[k] for k in names} == {k: ref[k] for k in names}
            assert out["accuracy"] == ref["accuracy"] and out["test_loss"] == ref["test_loss"]
    finally:
        ALL["metric"]._remove_owned_by("tests.engine.test_evaluation")


def test_without_eval_metrics_the_evaluation_is_what_it_was(setup):
    _, _, weights, test, meta = setup
    rp = replica(setup, 100)
    out, _ = ShardedEvaluation(Pool(rp, 2, 0), rp.cfg, test, meta).run(1, weights)
    assert set(out) == {"accuracy", "test_loss", "domain_accuracy", "domain_mean_accuracy"}


def test_a_metric_breaking_its_contract_stops_the_round_naming_it(setup):
    from fedray.core.registry import ALL
    from fedray.metrics.registry import MetricError, register_metric

    register_metric("test_shapes", lambda logits, labels, d: {"n": torch.ones(len(labels))},  # shape: the batch's
                    lambda s: {"": float(s["n"].sum())}, module="tests.engine.test_evaluation")
    register_metric("test_text", lambda logits, labels, d: {"n": "many"}, lambda s: {"": 0.0},
                    module="tests.engine.test_evaluation")
    try:
        _, _, weights, test, meta = setup
        rp = replica(setup, 100, ["test_shapes"])  # found where the shards' sums are added, on the coordinator
        with pytest.raises(MetricError, match=r"metric 'test_shapes' \(plugin tests.engine.test_evaluation\): "
                                              r"partial sum 'n' is float64\[37\] for test examples 400-436 but "
                                              r"float64\[100\] for the first batch"):
            ShardedEvaluation(Pool(rp, 2, 0), rp.cfg, test, meta).run(1, weights)
        rp = replica(setup, 100, ["test_text"])  # found on the worker: the shard fails, is not retried, the round stops
        pool = Pool(rp, 2, 0)
        with pytest.raises(RunAborted, match=r"round 1: .*MetricError: metric 'test_text' \(plugin "
                                             r"tests.engine.test_evaluation\): partial sum 'n' must be counts or float "
                                             r"sums, got str"):
            ShardedEvaluation(pool, rp.cfg, test, meta).run(1, weights)
        assert sum(0 in shards for _, shards in pool.submitted) == 1  # no retry: the same input fails the same way
    finally:
        ALL["metric"]._remove_owned_by("tests.engine.test_evaluation")
