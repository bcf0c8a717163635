"""fedray.metrics.registry and the built-in metrics of eval.metrics: each against a naive reference (scikit-learn, or
a plain loop) on random inputs, additive over any cut into batches, their contract checks naming the metric, and the
one-process evaluation (fedray.metrics.evaluate) reducing them in batch order."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score, top_k_accuracy_score

from fedray.core.registry import RegistryError
from fedray.metrics.registry import (METRICS, MetricError, check_partial, check_reduced, reduce_metric, register_metric,
                                     row_values, sum_partials)
from tests.helpers import ROOT


def _data(seed: int, n: int, c: int, *, absent: tuple[int, ...] = ()):
    """Random logits (n, c) and labels; the classes ``absent`` never occur as a label."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g) * 2.0
    present = [k for k in range(c) if k not in absent]
    labels = torch.tensor(present)[torch.randint(len(present), (n,), generator=g)]
    logits[torch.arange(n), labels] += 1.5  # a model better than chance
    return logits, labels


def _value(name: str, logits, labels, cuts=(None,)) -> dict:
    """``name``'s row entries over the batches ``logits[a:b]`` of the cut points ``cuts``."""
    spec = METRICS[name]
    bounds = [0, *[c for c in cuts if c is not None], len(labels)]
    parts = [check_partial(name, spec.partial(logits[a:b], labels[a:b], None)) for a, b in zip(bounds, bounds[1:])]
    return reduce_metric(name, parts)


def _ece_reference(logits: torch.Tensor, labels: torch.Tensor, bins: int = 15) -> float:
    """Guo et al. (2017): confidence = max softmax probability; bins (lo, hi] of width 1/bins; sum over bins of
    |accuracy - mean confidence| weighted by the bin's share of the examples (a plain loop, float64)."""
    x = logits.double().numpy()
    p = np.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    conf, pred, y = p.max(1), p.argmax(1), labels.numpy()
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        members = [i for i in range(len(y)) if lo < conf[i] <= hi]
        if members:
            acc = sum(pred[i] == y[i] for i in members) / len(members)
            avg = sum(conf[i] for i in members) / len(members)
            total += abs(acc - avg) * len(members) / len(y)
    return total


@pytest.mark.parametrize("seed,n,c,absent", [(0, 300, 10, ()), (1, 257, 3, ()), (2, 400, 20, (4, 7, 19)),
                                             (3, 50, 100, ())])
def test_builtins_match_the_reference(seed, n, c, absent):
    logits, labels = _data(seed, n, c, absent=absent)
    y, pred = labels.numpy(), logits.argmax(1).numpy()
    got = {name: _value(name, logits, labels) for name in METRICS if METRICS.module(name) == "fedray.metrics.builtin"}
    assert got["balanced_accuracy"]["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred),
                                                                          rel=1e-12, abs=0)
    assert got["macro_f1"]["macro_f1"] == pytest.approx(f1_score(y, pred, average="macro", zero_division=0),
                                                        rel=1e-12, abs=0)
    top = top_k_accuracy_score(y, logits.numpy(), k=min(5, c), labels=list(range(c)))
    assert got["top5_accuracy"]["top5_accuracy"] == pytest.approx(top, rel=1e-12, abs=0)
    assert got["ece"]["ece"] == pytest.approx(_ece_reference(logits, labels), rel=1e-9, abs=1e-15)
    per = got["per_class_accuracy"]["per_class_accuracy"]
    assert sorted(per, key=int) == [str(k) for k in range(c) if (y == k).any()]  # classes of the test set only
    for key, v in per.items():
        assert v == ((pred == y) & (y == int(key))).sum() / (y == int(key)).sum()


def test_top5_with_fewer_than_five_classes_is_top_c():
    logits, labels = _data(4, 64, 2)
    assert _value("top5_accuracy", logits, labels) == {"top5_accuracy": 1.0}  # k = min(5, C) = 2


def test_partial_sums_are_additive_over_any_cut():
    """Counts add exactly and float sums to rounding: the sums over batches of any size reduce to the numbers of
    one batch over the whole split."""
    logits, labels = _data(5, 500, 10)
    for name in ("balanced_accuracy", "macro_f1", "ece", "top5_accuracy", "per_class_accuracy"):
        whole = _value(name, logits, labels)
        for cuts in ((100, 200, 300, 400), (1, 499), (250,)):
            cut = _value(name, logits, labels, cuts)
            if name == "ece":
                assert cut["ece"] == pytest.approx(whole["ece"], rel=1e-12)
            else:
                assert cut == whole


def test_naming_rule_of_the_row_entries():
    assert row_values("ece", {"ece": 0.1}) == {"ece": 0.1}
    assert row_values("mine", {"": 0.5}) == {"mine": 0.5}
    assert row_values("margin", {"mean": 1.0, "rms": 2.0}) == {"margin": {"mean": 1.0, "rms": 2.0}}
    with pytest.raises(MetricError, match=r"metric 'margin'.*a single value goes under '' \(or 'margin'\) alone"):
        row_values("margin", {"": 1.0, "rms": 2.0})
    with pytest.raises(MetricError, match=r"the key 'a\.b'.*margin\.KEY in reports and margin/KEY in trackers"):
        row_values("margin", {"a.b": 1.0, "c": 2.0})


def test_contract_violations_name_the_metric():
    good = {"n": np.int64(3), "s": np.zeros(4)}
    with pytest.raises(MetricError, match=r"metric 'ece': partial must return a non-empty dict"):
        check_partial("ece", [1, 2])
    with pytest.raises(MetricError, match=r"metric 'ece': partial sum 's' must be counts or float sums.*dtype <U3"):
        check_partial("ece", {"s": "abc"})
    with pytest.raises(MetricError, match=r"metric 'ece': partial sum 's' must be counts or float sums.*complex"):
        check_partial("ece", {"s": np.ones(2, dtype=complex)})
    parts = [check_partial("ece", good), check_partial("ece", {"n": 1})]
    with pytest.raises(MetricError, match=r"metric 'ece': partial returned keys \['n'\] for test examples 5-9 but "
                                          r"\['n', 's'\] for the first batch"):
        sum_partials("ece", parts, ["test examples 0-4", "test examples 5-9"])
    parts[1] = check_partial("ece", {"n": 1, "s": np.zeros(5)})
    with pytest.raises(MetricError, match=r"partial sum 's' is float64\[5\] for batch 1 but float64\[4\] for the "
                                          r"first batch; a partial sum's shape .* must not depend on the batch"):
        sum_partials("ece", parts)
    parts[1] = check_partial("ece", {"n": 1.0, "s": np.zeros(4)})
    with pytest.raises(MetricError, match=r"partial sum 'n' is float64\[\] for batch 1 but int64\[\]"):
        sum_partials("ece", parts)
    assert check_partial("ece", {"t": torch.ones(2, dtype=torch.bool)})["t"].dtype == np.int64  # tensors, bools: counts
    with pytest.raises(MetricError, match=r"metric 'ece': reduce returned 'x' \(str\) for 'v'; values are numbers"):
        check_reduced("ece", {"v": "x"})
    with pytest.raises(MetricError, match=r"metric 'ece': reduce returned .* for 'v'; values are numbers"):
        check_reduced("ece", {"v": np.zeros(3)})
    assert check_reduced("ece", {"v": np.float32(0.5), "w": torch.tensor(2)}) == {"v": 0.5, "w": 2.0}


def test_registration_rules():
    def partial(logits, labels, domains):
        return {"n": len(labels)}

    with pytest.raises(RegistryError, match=r"metric 'ece' is registered by fedray.metrics.builtin \(built-in\); "
                                            r"mylab cannot register it again"):
        register_metric("ece", partial, lambda s: {"": 0.0}, module="mylab")
    for bad in ("accuracy", "loss", "domain_accuracy", "rounds_to_target"):
        with pytest.raises(RegistryError, match=f"{bad!r} is a key fedray's metrics rows or reports use already"):
            register_metric(bad, partial, lambda s: {"": 0.0}, module="mylab")
    for bad in ("a.b", "my metric", "3x", "a/b", ""):
        with pytest.raises(RegistryError, match="letters, digits and '_'"):
            register_metric(bad, partial, lambda s: {"": 0.0}, module="mylab")
    with pytest.raises(RegistryError, match="the reduce of metric 'x' must be callable"):
        register_metric("x", partial, None, module="mylab")
    with pytest.raises(TypeError, match=r"read-only: register 'x' with fedray.register_metric"):
        METRICS["x"] = object()
    assert "x" not in METRICS and not METRICS.plugin_names()


def test_a_metric_of_no_batch_is_nan():
    assert math.isnan(reduce_metric("ece", [])["ece"])


def test_one_process_evaluation_reduces_the_metrics_batch_by_batch():
    """fedray.metrics.evaluate: per-batch partial sums added in batch order (the sharded evaluation's order),
    so the numbers do not depend on how the batches are grouped into shards; domains reach the partials."""
    from fedray.data.sources import load_source
    from fedray.metrics import evaluate, evaluate_batches, reduce_evaluation
    from fedray.models import model_for_meta

    bundle = load_source("mnist5k", None)
    torch.manual_seed(0)
    model = model_for_meta("mlp", bundle.meta, hidden=[16])
    images, labels = bundle.test.images()[:300], np.ascontiguousarray(bundle.test.labels[:300])
    domains = np.arange(300) % 3
    seen = []

    def by_domain(logits, y, d):
        seen.append(None if d is None else d.tolist())
        return {"per_domain": np.bincount(d.numpy(), minlength=3)}

    register_metric("seen_domains", by_domain, lambda s: {str(k): float(v) for k, v in enumerate(s["per_domain"])},
                    module="tests.metrics")
    try:
        names = ["balanced_accuracy", "ece", "seen_domains"]
        ref = evaluate(model, images, labels, meta=bundle.meta, normalize=False, batch_size=64, domains=domains,
                       metrics=names)
        assert ref["seen_domains"] == {"0": 100.0, "1": 100.0, "2": 100.0}
        assert seen[0] == domains[:64].tolist() and len(seen) == 5  # 4 batches of 64 and one of 44
        parts = [evaluate_batches(model, images, labels, a, b, meta=bundle.meta, normalize=False, batch_size=64,
                                  metrics=names, domains=domains) for a, b in ((0, 128), (128, 192), (192, 300))]
        got = reduce_evaluation(parts, labels, meta=bundle.meta, metrics=names)
        assert {k: got[k] for k in names} == {k: ref[k] for k in names}  # the same bits
    finally:
        from fedray.core.registry import ALL

        ALL["metric"]._remove_owned_by("tests.metrics")


def test_the_registry_imports_no_torch():
    """A plugin that registers a data source and a metric is imported by a Ray run's driver, which never
    imports torch."""
    code = ("import json, sys, fedray; fedray.register_metric; from fedray.metrics import registry; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_field_keeps_every_config_hash():
    from fedray.config import config_hash, from_dict

    assert config_hash(from_dict({})) == config_hash(from_dict({"eval": {"metrics": []}}))
    assert config_hash(from_dict({})) != config_hash(from_dict({"eval": {"metrics": ["ece"]}}))
    from fedray.config import ConfigError

    with pytest.raises(ConfigError, match=r"eval.metrics\[1\]: 'ece' is listed twice"):
        from_dict({"eval": {"metrics": ["ece", "ece"]}})
    with pytest.raises(ConfigError, match=r"eval.metrics\[0\]: expected a metric name, got 3"):
        from_dict({"eval": {"metrics": [3]}})
