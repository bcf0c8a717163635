"""Evaluation metrics a config can select by name (``eval.metrics``): the built-ins of
:mod:`fedray.metrics.builtin` and the user's, registered with :func:`register_metric` (``fedray.register_metric``)
by a module named in the config's ``plugins`` (docs/extending.md, "Metrics").

A metric is a pair of functions:

- ``partial(logits, labels, domains) -> {key: array}`` runs on the client workers, once per evaluation batch
  (``eval.batch_size`` test examples, in the evaluation's model and device): ``logits`` a float tensor (B, C),
  ``labels`` an int64 tensor (B,), ``domains`` an int tensor (B,) of the test examples' domains or None. It
  returns ADDITIVE partial sums: counts and sums (int arrays are kept as int64, float arrays as float64, torch
  tensors are moved to numpy) whose keys and shapes do not depend on the batch (e.g. per-class counts of
  length C);
- ``reduce(sums) -> {key: float}`` runs once on the coordinator, on the sums of every batch of the test split
  added in batch order from the first (int64 exactly, float64 in that fixed order), so its numbers are the same
  bits for any number of workers, with Ray or in-process, and after a resume.

Names in ``metrics.jsonl`` (:func:`row_values`): a reduce that returns one value under ``""`` or under the
metric's own name gives the row key ``name`` (``balanced_accuracy``); any other keys make a group ``name: {key:
value}``, which trackers show as ``name/key`` and ``fedray report``, sweeps and ``fedray tune`` select as
``name.key`` (as ``domain_accuracy``). Metric names are identifiers that no engine key of a row uses.

Torch-free: a Ray run's driver imports this module (a plugin that registers a data source and a metric) and
never imports torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedray.core.registry import Registry, RegistryError, caller_module, first_line, is_builtin
from fedray.metrics.builtin import BUILTIN

__all__ = ["METRICS", "MetricError", "MetricSpec", "RESERVED", "check_partial", "check_reduced", "reduce_metric",
           "register_metric", "row_values", "sum_partials"]

#: keys of a metrics.jsonl row, summary.json, ``fedray report`` summaries and ``fedray tune``'s derived
#: objectives: a metric cannot take these names
RESERVED = frozenset({
    "round", "accuracy", "ema_accuracy", "loss", "test_loss", "lr", "num_clients", "num_samples", "failures",
    "retries", "wall_seconds", "seconds_total", "seconds", "bytes", "memory", "workers", "worker_restarts",
    "dropped", "stragglers_cancelled", "receive_seconds", "eval_retries", "eval_worker_restarts",
    "domain_accuracy", "domain_mean_accuracy", "analysis", "robustness", "features", "ledger", "client_loss",
    "bytes_signals", "num_signals", "weights_hash", "startup_seconds", "rounds_seconds", "mean_round_seconds",
    "total_seconds", "coordinator_restarts", "best_accuracy", "best_round", "mean_last5", "rounds_to_target",
    "bytes_total", "mean_round_s", "run", "label", "rounds", "metrics",
})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY = re.compile(r"[A-Za-z0-9_-]+")


class MetricError(ValueError):
    """A metric's partial or reduce broke its contract; the message names the metric."""


@dataclass(frozen=True)
class MetricSpec:
    """A registered metric (module docstring)."""

    name: str
    partial: Callable[..., Mapping]
    reduce: Callable[[dict], Mapping]
    description: str = ""


METRICS: Registry[MetricSpec] = Registry("metric", "fedray.register_metric")


def register_metric(name: str, partial: Callable[..., Mapping], reduce: Callable[[dict], Mapping], *,
                    description: str = "", module: str | None = None) -> MetricSpec:
    """Register the evaluation metric ``name`` (selected by ``eval.metrics: [name]``): ``partial(logits, labels,
    domains)`` gives one evaluation batch's additive sums, ``reduce(sums)`` the final numbers (module docstring).
    A name another module registered, or one a metrics row uses already (``accuracy``, ``loss``, ...), is
    refused."""
    owner = module or caller_module()
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RegistryError(f"register_metric: a metric's name is a key of metrics.jsonl and of fedray tune's "
                            f"objective: letters, digits and '_', not starting with a digit; got {name!r} "
                            f"(from {owner})")
    if name in RESERVED:
        raise RegistryError(f"register_metric: {name!r} is a key fedray's metrics rows or reports use already; "
                            f"choose another name (from {owner})")
    for what, fn in (("partial", partial), ("reduce", reduce)):
        if not callable(fn):
            raise RegistryError(f"register_metric: the {what} of metric {name!r} must be callable, got {fn!r}")
    return METRICS.add(name, MetricSpec(name, partial, reduce, first_line(description, partial)), owner)


def _who(name: str) -> str:
    owner = METRICS.module(name) if name in METRICS else "?"
    return f"metric {name!r}" + ("" if is_builtin(owner) else f" (plugin {owner})")


def _array(name: str, key: str, v) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor, on any device
        v = v.detach().cpu().numpy()
    try:
        a = np.asarray(v)
    except Exception as e:  # noqa: BLE001 - whatever the value is, say which metric returned it
        raise MetricError(f"{_who(name)}: partial sum {key!r} is not an array of numbers "
                          f"({type(e).__name__}: {e})") from None
    if a.dtype.kind in "biu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "f":
        return a.astype(np.float64, copy=False)
    raise MetricError(f"{_who(name)}: partial sum {key!r} must be counts or float sums, got {type(v).__name__} "
                      f"of dtype {a.dtype}")


def check_partial(name: str, out) -> dict[str, np.ndarray]:
    """A partial's result as ``{key: int64 or float64 array}``; a MetricError naming the metric unless it is a
    non-empty mapping of string keys to numbers."""
    if not isinstance(out, Mapping) or not out:
        raise MetricError(f"{_who(name)}: partial must return a non-empty dict of partial sums, got {out!r:.200}")
    bad = [k for k in out if not isinstance(k, str) or not k]
    if bad:
        raise MetricError(f"{_who(name)}: partial returned the key {bad[0]!r}; keys are non-empty strings")
    return {k: _array(name, k, v) for k, v in out.items()}


def sum_partials(name: str, batches: Sequence[dict[str, np.ndarray]], where: Sequence[str] = ()) -> dict:
    """The batches' partial sums added in order from the first (int64 exactly, float64 in this order); a
    MetricError naming the metric and the batch (``where[i]``, e.g. ``examples 500-999``) whose keys, shapes or
    kinds differ from the first batch's."""
    acc: dict[str, np.ndarray] = {}
    for i, part in enumerate(batches):
        at = where[i] if i < len(where) else f"batch {i}"
        if i == 0:
            acc = {k: np.array(v, copy=True) for k, v in part.items()}
            continue
        if set(part) != set(acc):
            raise MetricError(f"{_who(name)}: partial returned keys {sorted(part)} for {at} but {sorted(acc)} for "
                              f"the first batch; every batch must return the same keys")
        for k, v in part.items():
            if v.shape != acc[k].shape or v.dtype != acc[k].dtype:
                raise MetricError(f"{_who(name)}: partial sum {k!r} is {v.dtype}{list(v.shape)} for {at} but "
                                  f"{acc[k].dtype}{list(acc[k].shape)} for the first batch; a partial sum's shape "
                                  f"(and kind: count or float) must not depend on the batch")
            acc[k] = acc[k] + v
    return acc


def check_reduced(name: str, out) -> dict[str, float]:
    """A reduce's result as ``{key: float}``; a MetricError naming the metric unless it is a non-empty mapping
    of string keys to real numbers."""
    if not isinstance(out, Mapping) or not out:
        raise MetricError(f"{_who(name)}: reduce must return a non-empty dict of numbers, got {out!r:.200}")
    values = {}
    for k, v in out.items():
        if not isinstance(k, str):
            raise MetricError(f"{_who(name)}: reduce returned the key {k!r}; keys are strings")
        size = v.numel() if hasattr(v, "numel") else getattr(v, "size", 1)  # a torch tensor, a numpy array
        if hasattr(v, "item") and size == 1:
            v = v.item()  # a numpy or torch scalar
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MetricError(f"{_who(name)}: reduce returned {v!r:.100} ({type(v).__name__}) for {k!r}; "
                              f"values are numbers")
        values[k] = float(v)
    return values


def row_values(name: str, values: dict[str, float]) -> dict:
    """The metrics.jsonl entries of ``name``'s reduced ``values``: ``{name: v}`` for a single value keyed
    ``""`` or ``name``, else ``{name: {key: v}}`` (module docstring)."""
    keys = list(values)
    if len(keys) == 1 and keys[0] in ("", name):
        return {name: values[keys[0]]}
    if "" in keys or name in keys:
        raise MetricError(f"{_who(name)}: reduce returned {sorted(keys)}: a single value goes under '' (or "
                          f"{name!r}) alone; several values each under a key of their own")
    bad = [k for k in keys if not _KEY.fullmatch(k)]
    if bad:
        raise MetricError(f"{_who(name)}: reduce returned the key {bad[0]!r}; keys of several values are letters, "
                          f"digits, '_' and '-' (they become {name}.KEY in reports and {name}/KEY in trackers)")
    return {name: dict(values)}


def reduce_metric(name: str, batches: Sequence[dict[str, np.ndarray]], where: Sequence[str] = ()) -> dict:
    """``name``'s metrics.jsonl entries from its partial sums of every batch of the test split, in order (NaN
    without a batch)."""
    if not batches:
        return {name: math.nan}
    sums = sum_partials(name, batches, where)
    return row_values(name, check_reduced(name, METRICS[name].reduce(sums)))


for _name, (_partial, _reduce, _text) in BUILTIN.items():
    register_metric(_name, _partial, _reduce, description=_text, module="fedray.metrics.builtin")
