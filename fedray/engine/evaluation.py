"""Evaluation of the global model sharded over the client workers.

The test split is cut into fixed shards by index, one evaluation batch (``eval.batch_size`` examples) each,
so the shards depend on the split and the batch size only, never on the number of workers. The test split is
in the object store once (the driver's copy, or put at the first evaluation) and the round's weights are
put once per evaluation; each worker
evaluates the shards of its task on its replica (:func:`evaluate_shards`) and returns, per shard, the batch's
cross-entropy sum, the per-example correct flags, for the feature analysis the embeddings and, for the metrics
of ``eval.metrics`` (:mod:`fedray.metrics.registry`), the batch's partial sums. The coordinator reduces them in
shard order (:func:`fedray.metrics.reduce_evaluation`): the float64 loss sum and the metrics' partial sums add
the batches in the same order as an evaluation in one process, and the counts are exact, so accuracy, loss,
per-domain accuracy, the analysis and the metrics are bit-identical to :func:`fedray.metrics.evaluate` over
the whole split in one process, with any number of workers, with Ray or in-process, and after a resume.

Tasks group consecutive shards (about two tasks per worker) for scheduling only. They run through the
:class:`~fedray.engine.dispatch.TaskScheduler`: a worker lost during evaluation is replaced and its shards
run again on whichever worker is idle; a shard that raises is retried, and after
``engine.max_client_retries`` failed attempts the round is aborted (a shard cannot be dropped).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedray.engine.dispatch import ClientItem, FailurePolicy, Task, TaskScheduler
from fedray.engine.outcomes import EvalOutcome, error_text, is_fatal
from fedray.metrics import evaluate_batches, reduce_evaluation

__all__ = ["ShardedEvaluation", "evaluate_shards", "shard_ranges"]


def shard_ranges(n: int, batch_size: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of every shard of an ``n``-example test split: one evaluation batch each."""
    bs = max(1, int(batch_size))
    return [(i, min(i + bs, n)) for i in range(0, n, bs)]


def evaluate_shards(replica, weights, test: dict, shards: list, analysis: bool, name: str) -> list[EvalOutcome]:
    """Worker side: load ``weights`` into ``replica``'s model and evaluate each ``(shard, start, stop)``."""
    rp, cfg = replica, replica.cfg
    rp.flat.load(np.asarray(weights))
    out = []
    for pos, start, stop in shards:
        t0 = time.perf_counter()
        try:
            part = evaluate_batches(rp.model, test["images"], test["labels"], int(start), int(stop), meta=rp.meta,
                                    normalize=bool(cfg.data.normalize), batch_size=int(cfg.eval.batch_size),
                                    device=rp.device, return_features=analysis, metrics=cfg.eval.metrics,
                                    domains=test.get("domains"))
            out.append(EvalOutcome(pos=int(pos), part=part, seconds=time.perf_counter() - t0, worker=name))
        except Exception as e:  # noqa: BLE001 - reported per shard, the coordinator retries or aborts
            out.append(EvalOutcome(pos=int(pos), part=None, seconds=time.perf_counter() - t0, worker=name,
                                   error=error_text(e), fatal=is_fatal(e)))
    return out


class ShardedEvaluation:
    """Coordinator side: evaluate weights on the test split over ``pool``'s workers (module docstring)."""

    def __init__(self, pool, cfg, test: dict, meta, test_ref=None):
        """``test_ref``: ``test`` already in the pool's object store (the driver put it); else it is put at the
        first evaluation."""
        self.pool, self.cfg, self.test, self.meta = pool, cfg, test, meta
        self._test_ref = test_ref

    def run(self, rnd: int, weights: np.ndarray, analysis: bool = False) -> tuple[dict, dict]:
        """(metrics as :func:`fedray.metrics.evaluate` gives them, counters: retries and worker restarts)."""
        labels = self.test["labels"]
        shards = shard_ranges(int(labels.shape[0]), int(self.cfg.eval.batch_size))
        if self._test_ref is None:
            self._test_ref = self.pool.put(self.test)
        w_ref = self.pool.put(np.ascontiguousarray(weights, dtype=np.float32))
        per_task = max(1, math.ceil(len(shards) / (2 * max(1, self.pool.size))))
        tasks = [Task(tuple(ClientItem(p, p) for p in range(i, min(i + per_task, len(shards)))))
                 for i in range(0, len(shards), per_task)]
        e = self.cfg.engine
        policy = FailurePolicy(int(e.max_client_retries), int(e.max_worker_restarts), can_drop=False)
        sched = TaskScheduler(self.pool, policy, rnd, record_success=False)
        parts: dict[int, dict] = {}

        def submit(widx: int, task: Task):
            items = [(int(it[0]), *shards[int(it[0])]) for it in task.items]  # (shard, start, stop)
            return self.pool.submit(widx, "evaluate_shards", w_ref, self._test_ref, items, analysis)

        def on_outcome(out: EvalOutcome) -> None:
            assert out.part is not None  # an outcome with an error never reaches here (the scheduler retries it)
            parts[out.pos] = out.part

        sched.run(tasks, submit, on_outcome, label=" (an evaluation shard)")
        out = reduce_evaluation([parts[p] for p in range(len(shards))], labels, meta=self.meta,
                                domains=self.test.get("domains"), return_features=analysis,
                                metrics=self.cfg.eval.metrics, batch_size=int(self.cfg.eval.batch_size))
        return out, {"retries": sched.retries, "worker_restarts": sched.worker_restarts}
