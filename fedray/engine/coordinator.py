"""The coordinator: global model, server state, sampling, dispatch, ordered aggregation, evaluation.

With the Ray backend it runs as an actor (``num_cpus=engine.coordinator_num_cpus``, 0 by default) that
owns the worker pool; the driver calls ``run_round`` once per round and gets a small report back. With
the local backend the same class runs in the driver process over in-process workers.

Determinism. Round ``r`` samples with ``default_rng([seed, r])`` and every client draws from generators
keyed by (seed, round, client, purpose), so a client's update does not depend on which worker runs it
or when. Updates are folded in *sampled order* (``new = a_1 w_1``, then ``new += a_k w_k``, float32),
whatever order they finish in: results that arrive early wait in a reorder buffer, and dispatch never
runs more than ``reorder_window`` clients ahead of the fold, so at most that many client results are
held at once (memory bounded, independent of clients per round). The result is bit-identical for any
number of workers, for the Ray and in-process backends, and after a crash and resume. The default task
size (``engine.chunk_size``) is capped so that the window and the returning tasks hold about 256 MB of
updates at most, whatever the clients per round; with ``engine.multi_client: m`` tasks are rounded up
to whole groups of m consecutive sampled clients (fedray.engine.multiclient).
"""

from __future__ import annotations

import heapq
import math
import os
import time
from collections import defaultdict

import numpy as np
import torch

from fedray.engine.pool import LocalPool, RayPool, WorkerLost
from fedray.engine.worker import WorkerSpec


# Default budget for client updates held by the coordinator at once (default chunk size; see _chunk_size).
_HELD_UPDATES_BYTES = 256 << 20


def worker_spec(cfg_dict: dict, partition_path: str, state_path: str | None, run_dir: str,
                worker_gpus: float) -> WorkerSpec:
    """What every ClientWorker of a run is built from (used by the coordinator and by the driver when it
    starts the Ray workers itself)."""
    device = "auto" if cfg_dict["engine"]["device"] in ("auto", "cuda") and worker_gpus > 0 else "cpu"
    return WorkerSpec(config=cfg_dict, partition_path=partition_path, state_path=state_path, run_dir=run_dir,
                      device=device, gpu_fraction=worker_gpus or None)


class Coordinator:
    def __init__(self, cfg_dict: dict, partition_path: str, run_dir: str, test_data: dict,
                 num_workers: int, worker_cpus: float, worker_gpus: float, state_path: str | None,
                 workers: list | None = None):
        from fedray.algorithms import build_algorithm, build_server_optimizer
        from fedray.config import from_dict
        from fedray.data.store import PartitionStore
        from fedray.core.weights import FlatParams
        from fedray.models import model_for_meta

        cfg = from_dict(cfg_dict, validate=False)
        self.cfg = cfg
        torch.set_num_threads(max(1, int(cfg.engine.torch_threads)))
        self.store = PartitionStore.open(partition_path)
        self.meta = self.store.meta
        self.sizes = np.asarray(self.store.sizes, dtype=np.int64)
        self.algorithm = build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
        self.server_opt = build_server_optimizer(cfg.server.name, cfg.server.lr, cfg.server.params)
        self.device = torch.device("cuda" if (cfg.engine.device in ("auto", "cuda") and torch.cuda.is_available())
                                   else "cpu")
        # initial global model: torch.manual_seed(seed) immediately followed by construction
        torch.manual_seed(int(cfg.seed))
        self.model = model_for_meta(cfg.model.name, self.meta, **cfg.model.params)
        self.flat = FlatParams(self.model, self.device)
        self.weights = self.flat.read()
        self.layout = self.flat.layout
        self.algo_state = self.algorithm.init_state(self.weights)
        self.test = test_data
        self.ema: float | None = None
        self.round = 0
        self.run_dir = run_dir
        spec = worker_spec(cfg_dict, partition_path, state_path, run_dir, worker_gpus)
        if cfg.engine.backend == "ray":
            self.pool = RayPool(spec, num_workers, worker_cpus, worker_gpus, actors=workers)
        else:
            self.pool = LocalPool(spec, num_workers)
        self.num_workers = num_workers

    # ------------------------------------------------------------------------------- API
    def ready(self) -> dict:
        return {"workers": self.pool.size, "num_params": int(self.layout.size)}

    def get_weights(self) -> np.ndarray:
        return self.weights

    def weights_hash(self) -> str:
        from fedray.core.weights import weights_hash

        return weights_hash(self.layout, self.weights)

    def state_dict(self) -> dict:
        return {
            "round": self.round,
            "weights": self.weights.copy(),
            "server_opt": self.server_opt.state_dict(),
            "algorithm_state": self.algo_state,
            "ema": self.ema,
        }

    def load_state_dict(self, st: dict) -> None:
        self.round = int(st["round"])
        self.weights = np.asarray(st["weights"], dtype=np.float32).copy()
        self.server_opt.load_state_dict(st["server_opt"])
        self.algo_state = st["algorithm_state"]
        self.ema = st["ema"]

    def shutdown(self) -> None:
        self.pool.shutdown()

    def memory(self) -> dict:
        """Resident memory (MB) of this process now, at peak (VmHWM) and its private part (RssAnon; the rest
        is mostly object-store pages it read), and of the client workers (sum of current RSS, largest
        peak), each read from /proc by the process itself. In every round report as ``memory``."""
        from fedray.core.procinfo import proc_status

        st = proc_status(os.getpid())
        if self.pool.kind == "ray":
            import ray

            try:
                w = ray.get([a.memory.remote() for a in self.pool.workers], timeout=30)
            except Exception:  # noqa: BLE001 - a worker died after the round: the next round replaces it
                w = [{"rss_mb": math.nan, "peak_mb": math.nan}]
        else:
            w = [{"rss_mb": st.get("VmRSS", math.nan), "peak_mb": st.get("VmHWM", math.nan)}] if self.pool.size else []
        return {"coordinator_rss_mb": st.get("VmRSS", math.nan), "coordinator_peak_mb": st.get("VmHWM", math.nan),
                "coordinator_anon_mb": st.get("RssAnon", math.nan),
                "workers_rss_mb": float(sum(x["rss_mb"] for x in w)) if w else math.nan,
                "workers_peak_mb": float(max(x["peak_mb"] for x in w)) if w else math.nan}

    # ------------------------------------------------------------------------------- round
    def sample(self, rnd: int) -> list[int]:
        n = len(self.sizes)
        k = int(self.cfg.train.clients_per_round)
        e = self.cfg.engine
        if e.over_selection > 0:
            k = min(n, int(math.ceil(k * (1.0 + e.over_selection))))
        sampled = np.random.default_rng([int(self.cfg.seed), rnd]).choice(n, size=k, replace=False)
        return [int(c) for c in sampled if self.sizes[c] > 0]

    def run_round(self, rnd: int) -> dict:
        if self.algorithm.program == "split":  # SCALA / SplitFed: fedray.engine.split
            from fedray.engine.split import run_split_round

            return run_split_round(self, rnd)
        cfg = self.cfg
        secs = {}
        t0 = time.perf_counter()
        sampled = self.sample(rnd)
        secs["sample"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        bw = self.server_opt.broadcast_weights(self.weights)
        payload = dict(self.algorithm.broadcast(rnd, bw, self.algo_state))
        payload.update(self.server_opt.client_extras())
        w_ref = self.pool.put(bw)
        p_ref = self.pool.put(payload)
        secs["broadcast"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        agg = self._dispatch_and_fold(rnd, sampled, w_ref, p_ref)
        secs["train"] = time.perf_counter() - t0 - agg["fold_seconds"]

        t0 = time.perf_counter()
        avg = agg["avg"]
        if avg is not None:
            new = self.server_opt.step(self.weights, avg)
            new, self.algo_state = self.algorithm.after_aggregate(rnd, new, agg["extras"], self.algo_state)
            self.weights = np.ascontiguousarray(new, dtype=np.float32)
        secs["aggregate"] = time.perf_counter() - t0 + agg["fold_seconds"]
        self.round = rnd

        report = {
            "round": rnd,
            "num_clients": agg["num_clients"],
            "num_samples": agg["num_samples"],
            "loss": agg["loss"],
            "dropped": agg["dropped"],
            "retries": agg["retries"],
            "worker_restarts": agg["worker_restarts"],
            "stragglers_cancelled": agg["cancelled"],
            "lr": float(cfg.train.lr) * float(cfg.train.lr_decay) ** (rnd - 1),
            "bytes": {
                "broadcast": int(bw.nbytes) * len(sampled),
                "upload": int(bw.nbytes) * agg["num_clients"],
            },
        }
        round_metrics = getattr(self.algorithm, "round_metrics", None)  # optional hook (e.g. FedCCL signal bytes)
        if round_metrics is not None:
            for key, value in round_metrics(rnd, self.algo_state, len(sampled)).items():
                if key == "bytes":
                    report["bytes"].update(value)
                else:
                    report[key] = value
        t0 = time.perf_counter()
        last = rnd == int(cfg.train.rounds)
        if rnd % int(cfg.eval.every) == 0 or last:
            ana = int(cfg.eval.analysis_every)
            report.update(self.evaluate(analysis=bool(ana) and (rnd % ana == 0 or last)))
            self.ema = _ema(self.ema, report["accuracy"], cfg.eval.ema)
            report["ema_accuracy"] = self.ema
        if cfg.eval.adversarial:
            from fedray.metrics.robustness import robustness_due

            if robustness_due(cfg.eval.adversarial, rnd, last):
                report["robustness"] = self.robustness()
        secs["eval"] = time.perf_counter() - t0
        report["seconds"] = secs
        report["seconds_total"] = float(sum(secs.values()))
        report["memory"] = self.memory()
        report["ledger"] = agg["ledger"]
        return report

    def evaluate(self, analysis: bool = False) -> dict:
        """Accuracy (+ per domain) of the global model; with ``analysis`` also the FedRCL feature metrics
        (covariance traces, effective rank, VCI) of its test-set embeddings."""
        from fedray.metrics import evaluate

        self.flat.load(self.weights)
        out = evaluate(self.model, self.test["images"], self.test["labels"], meta=self.meta,
                       normalize=bool(self.cfg.data.normalize), batch_size=int(self.cfg.eval.batch_size),
                       domains=self.test.get("domains"), device=self.device, return_features=analysis)
        if analysis:
            from fedray.metrics.analysis import feature_analysis

            out["analysis"] = feature_analysis(out.pop("features"), self.test["labels"])
        return out

    def robustness(self) -> dict:
        """Clean / FGSM / PGD accuracy of the global model under ``eval.adversarial`` (FedCCL Table 8)."""
        from fedray.metrics.robustness import robustness_report

        self.flat.load(self.weights)
        return robustness_report(self.model, self.test["images"], self.test["labels"], self.cfg.eval.adversarial,
                                 meta=self.meta, normalize=bool(self.cfg.data.normalize),
                                 batch_size=int(self.cfg.eval.batch_size), device=self.device, seed=int(self.cfg.seed))

    # ------------------------------------------------------------------------------- dispatch
    def _chunk_size(self, k: int) -> int:
        c = self.cfg.engine.chunk_size
        if c:
            c = int(c)
        else:
            # about 4 tasks per worker and round, but no more clients per task than keep the updates held at
            # once (reorder window ~ 2 x workers x chunk, plus the tasks returning) within _HELD_UPDATES_BYTES,
            # so the coordinator's memory stays flat as clients per round grow
            held = max(1, _HELD_UPDATES_BYTES // max(1, 4 * int(self.layout.size)))
            cap = max(1, held // (3 * self.pool.size))
            c = max(1, min(int(math.ceil(k / (4 * self.pool.size))), cap))
        m = int(getattr(self.cfg.engine, "multi_client", 1) or 1)
        if m > 1:  # whole groups of m consecutive sampled clients per task (fedray.engine.multiclient)
            given = bool(self.cfg.engine.chunk_size)
            c = (int(math.ceil(c / m)) if given else max(1, c // m)) * m
        return c

    def _dispatch_and_fold(self, rnd: int, sampled: list[int], w_ref, p_ref) -> dict:
        """Run every sampled client once (with retries) and fold the results in sampled order."""
        e = self.cfg.engine
        collect_all = e.over_selection > 0 or e.round_deadline_s is not None
        target = min(len(sampled), int(self.cfg.train.clients_per_round))
        k = len(sampled)
        chunk = self._chunk_size(k)
        window = int(e.reorder_window or max(2 * self.pool.size * chunk, chunk + 1))
        # priority queue of (first position, [(pos, cid), ...])
        queue = [(i, [(p, sampled[p]) for p in range(i, min(i + chunk, k))]) for i in range(0, k, chunk)]
        heapq.heapify(queue)
        idle = list(range(self.pool.size))
        inflight: dict = {}  # handle -> (widx, chunk)
        attempts: dict[int, int] = defaultdict(int)
        results: dict[int, object] = {}  # pos -> ClientOutcome | None (dropped)
        ledger: list[dict] = []
        next_fold = 0
        acc = None
        weights = {p: self.algorithm.client_weight(int(self.sizes[c])) for p, c in enumerate(sampled)}
        total_w = float(sum(weights.values()))
        kept_w = 0.0
        fold_seconds = 0.0
        loss_sum, n_sum, n_clients = 0.0, 0, 0
        extras: list[dict] = []
        dropped: list[int] = []
        retries = 0
        restarts0 = self.pool.restarts
        done_ok = 0
        cancelled = 0
        deadline = time.perf_counter() + e.round_deadline_s if e.round_deadline_s is not None else None

        def fold_ready():
            nonlocal next_fold, acc, kept_w, fold_seconds, loss_sum, n_sum, n_clients
            while next_fold in results:
                out = results.pop(next_fold)
                if out is not None:
                    t = time.perf_counter()
                    a = weights[next_fold] / total_w
                    if acc is None:
                        acc = out.weights * a
                    else:
                        acc += out.weights * a
                    fold_seconds += time.perf_counter() - t
                    kept_w += weights[next_fold]
                    loss_sum += out.loss * out.num_samples
                    n_sum += out.num_samples
                    n_clients += 1
                    if out.extras:
                        extras.append({"cid": out.cid, "num_samples": out.num_samples, **out.extras})
                next_fold += 1

        def record(out, failure=None):
            ledger.append({
                "client": out.cid, "round": rnd, "samples": int(out.num_samples), "loss": float(out.loss),
                "seconds": float(out.seconds), "worker": out.worker, "failure": failure,
                "attempt": attempts[out.cid] + 1,
            })

        def retry_or_drop(pos, cid, reason, push=True):
            nonlocal retries
            attempts[cid] += 1
            if attempts[cid] > int(e.max_client_retries):
                results[pos] = None
                dropped.append(cid)
                return False
            retries += 1
            if push:
                heapq.heappush(queue, (pos, [(pos, cid)]))
            return True

        while queue or inflight:
            if collect_all and done_ok >= target:
                break
            while idle and queue and (collect_all or queue[0][0] < next_fold + window):
                first, items = heapq.heappop(queue)
                widx = idle.pop()
                h = self.pool.submit(widx, rnd, w_ref, p_ref, items)
                inflight[h] = (widx, items)
            timeout = None
            if deadline is not None:
                timeout = max(0.0, deadline - time.perf_counter())
            ready = self.pool.wait(list(inflight), timeout=timeout)
            if not ready and deadline is not None and time.perf_counter() >= deadline:
                break
            for h in ready:
                widx, items = inflight.pop(h)
                try:
                    outs = self.pool.result(h)
                except WorkerLost as err:
                    if self.pool.restarts - restarts0 >= int(e.max_worker_restarts):
                        raise RuntimeError(
                            f"round {rnd}: more than engine.max_worker_restarts={e.max_worker_restarts} worker "
                            f"restarts; last error: {err}") from err
                    self.pool.replace(widx)
                    again = []  # re-run as one task, so multi-client groups keep their members
                    for pos, cid in items:
                        ledger.append({"client": cid, "round": rnd, "samples": 0, "loss": math.nan, "seconds": 0.0,
                                       "worker": f"w{widx}", "failure": f"worker lost: {err}",
                                       "attempt": attempts[cid] + 1})
                        if retry_or_drop(pos, cid, "worker lost", push=False):
                            again.append((pos, cid))
                    if again:
                        heapq.heappush(queue, (again[0][0], again))
                    idle.append(widx)
                    continue
                idle.append(widx)
                for out in outs:
                    if out.error is not None:
                        record(out, failure=out.error.splitlines()[0])
                        retry_or_drop(out.pos, out.cid, out.error)
                    else:
                        record(out)
                        results[out.pos] = out
                        done_ok += 1
            if not collect_all:  # after results *and* drops (a drop can unblock buffered results)
                fold_ready()
        # stragglers: clients still running (cancelled) or never started when the round closed
        cancelled = sum(len(items) for _, items in inflight.values()) + sum(len(items) for _, items in queue)
        if inflight:
            self.pool.cancel(list(inflight))
        if collect_all:
            # straggler mode: keep the first `target` clients to finish (completion order, recorded in
            # the ledger), then fold those in sampled order; the rest count as stragglers
            pos_of = {c: p for p, c in enumerate(sampled)}
            finished = [pos_of[row["client"]] for row in ledger if row["failure"] is None]
            keep = set(finished[:target])
            cancelled += len(finished) - len(keep)
            kept = {p: results[p] for p in keep}
            results.clear()
            results.update({p: kept.get(p) for p in range(k)})
            total_w = float(sum(weights[p] for p in keep)) or 1.0
            fold_ready()
        if acc is not None and kept_w != total_w:
            acc *= np.float32(total_w / kept_w)  # some clients were dropped: renormalise
        return {
            "avg": acc, "fold_seconds": fold_seconds, "num_clients": n_clients, "num_samples": n_sum,
            "loss": loss_sum / n_sum if n_sum else math.nan, "extras": extras, "dropped": dropped,
            "retries": retries, "worker_restarts": self.pool.restarts - restarts0, "ledger": ledger,
            "cancelled": cancelled,
        }


def _ema(prev, value, decay):
    from fedray.metrics import ema_update

    return ema_update(prev, value, decay)
