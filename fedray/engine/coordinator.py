"""The coordinator: the server state of a run, one round program, evaluation.

With the Ray backend it runs as an actor (``num_cpus=engine.coordinator_num_cpus``, 0 by default) that
owns the worker pool; the driver calls ``run_round`` once per round and gets a small report back. With
the local backend the same class runs in the driver process over in-process workers. The coordinator
holds the global weights, the algorithm's and the server optimizer's state, the EMA of the accuracy and
the round number (everything a checkpoint holds); it picks the round program once, at construction, from
``algorithm.program`` (:mod:`fedray.engine.programs`), and after each round evaluates the global model on
the client workers, sharded (:mod:`fedray.engine.evaluation`; robustness runs here, on one thread).
Determinism and faults: ``docs/engine.md``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from fedray.algorithms import build_server_optimizer
from fedray.core.procinfo import proc_status
from fedray.core.ray_env import current_node_id
from fedray.core.weights import weights_hash
from fedray.engine.dispatch import RunAborted
from fedray.engine.evaluation import ShardedEvaluation
from fedray.engine.faults import FaultInjector
from fedray.engine.outcomes import InStore
from fedray.engine.pool import LocalPool, RayPool
from fedray.engine.programs import program_for
from fedray.engine.replica import Replica, coordinator_device, device_name
from fedray.engine.round_report import Memory, RoundReport
from fedray.engine.spec import CoordinatorSpec
from fedray.metrics import ema_update
from fedray.metrics.analysis import feature_analysis
from fedray.metrics.robustness import robustness_due, robustness_report

__all__ = ["Coordinator"]


class Coordinator:
    def __init__(self, spec: CoordinatorSpec):
        cfg_dict, run_dir = spec.config, spec.run_dir
        test_data: Any = spec.test  # the test split: a dict, or (Ray) an InStore of one
        rp = Replica(cfg_dict, spec.partition_path, coordinator_device(cfg_dict["engine"]["device"]), seed_model=True)
        self.replica = rp
        self.cfg = cfg = rp.cfg
        self.algorithm = rp.algorithm
        self.server_opt = build_server_optimizer(cfg.server.name, float(cfg.server.lr or 0.0), cfg.server.params)
        self.weights = rp.flat.read()
        self.algo_state = self.algorithm.init_state(self.weights)
        test_ref = None
        if isinstance(test_data, InStore):  # the driver's copy in the object store: evaluation tasks use it as is
            import ray

            test_ref, test_data = test_data.ref, ray.get(test_data.ref)  # type: ignore[call-overload]  # an ObjectRef
        self.test = test_data
        self.ema: float | None = None
        self.round = 0
        self.pool: RayPool | LocalPool
        if cfg.engine.backend == "ray":
            self.pool = RayPool(spec.worker_spec(), spec.num_workers, spec.worker_cpus, spec.worker_gpus,
                                actors=spec.workers, heartbeat_s=cfg.engine.heartbeat_s,
                                start_timeout_s=cfg.engine.start_timeout_s)
        else:
            self.pool = LocalPool(spec.worker_spec(), spec.num_workers)
        self.program = program_for(self.algorithm)(
            cfg=cfg, algorithm=self.algorithm, server_opt=self.server_opt, pool=self.pool, sizes=rp.sizes,
            num_params=int(rp.flat.layout.size), model=rp.model, meta=rp.meta,
            class_counts=rp.store.class_counts, device=rp.device,  # read by the split program only, when needed
            check_clients=rp.store.check_clients,
            faults=FaultInjector(cfg.engine.fault_injection, run_dir))
        self.evaluation = ShardedEvaluation(self.pool, cfg, test_data, rp.meta, test_ref=test_ref)

    # ------------------------------------------------------------------------------- API
    def ready(self) -> dict:
        """The pool's size, the model's size, and what the run trains on: this coordinator's device (the server
        model of a split program, the evaluation's shards in-process) and its workers' (the driver records it in
        ``run.json`` and refuses a resume on another kind: :func:`fedray.driver.setup.record_device`)."""
        workers = self.pool.call_all("device", timeout=float(self.cfg.engine.start_timeout_s), skip_lost=True)
        return {"workers": self.pool.size, "num_params": int(self.replica.flat.layout.size),
                "device": {"coordinator": device_name(self.replica.device), "workers": sorted(set(workers))}}

    def pid(self) -> int:
        """This process's id (the tests kill it)."""
        return os.getpid()

    def node_id(self) -> str | None:
        """The Ray node this actor runs on (None in-process, without Ray)."""
        return current_node_id() if self.cfg.engine.backend == "ray" else None

    def workers(self) -> list[dict]:
        """Every worker the pool has had: name, Ray node (None in-process) and state (live, starting, retired);
        replacements that are ready by now count as live."""
        self.pool.poll()
        return self.pool.workers_info()

    def get_weights(self) -> np.ndarray:
        return self.weights

    def weights_hash(self) -> str:
        return weights_hash(self.replica.flat.layout, self.weights)

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

    def memory(self) -> Memory:
        """Resident memory (MB) of this process now, at peak (VmHWM) and its private part (RssAnon; the rest
        is mostly object-store pages it read), and of the client workers (sum of current RSS, largest
        peak), each read from /proc by the process itself. In every round report as ``memory``."""
        st = proc_status(os.getpid())
        if self.pool.kind == "ray":
            try:
                w = self.pool.call_all("memory", timeout=30)
            except Exception:  # noqa: BLE001 - a worker died after the round: the next round replaces it
                w = [{"rss_mb": math.nan, "peak_mb": math.nan}]
        else:
            w = [{"rss_mb": st.get("VmRSS", math.nan), "peak_mb": st.get("VmHWM", math.nan)}] if self.pool.size else []
        return Memory(coordinator_rss_mb=st.get("VmRSS", math.nan), coordinator_peak_mb=st.get("VmHWM", math.nan),
                      coordinator_anon_mb=st.get("RssAnon", math.nan),
                      workers_rss_mb=float(sum(x["rss_mb"] for x in w)) if w else math.nan,
                      workers_peak_mb=float(max(x["peak_mb"] for x in w)) if w else math.nan)

    # ------------------------------------------------------------------------------- round
    def run_round(self, rnd: int) -> RoundReport:
        """Run round ``rnd`` with the program, take its new state, evaluate; the round's report.

        The state change is atomic: if the round fails (or is interrupted) anywhere, the coordinator keeps
        the previous round's weights, algorithm state and server-optimizer state, so a checkpoint written
        afterwards is the last good round's."""
        opt_state = self.server_opt.state_dict()  # the program's server step updates it in place
        before = (self.weights, self.algo_state, self.round, self.ema)
        try:
            res = self.program.run_round(rnd, self.weights, self.algo_state)
            _check_finite(rnd, res)
            self.weights, self.algo_state, self.round = res.weights, res.algo_state, rnd
            t0 = time.perf_counter()
            evaluation = self._evaluate_round(rnd)  # on the workers: it can fail like the round's tasks
            t_eval = time.perf_counter() - t0
            _check_names(rnd, res.report, evaluation)
        except BaseException:
            self.server_opt.load_state_dict(opt_state)
            self.weights, self.algo_state, self.round, self.ema = before
            raise
        report = res.report
        evaluation = dict(evaluation)
        report.worker_restarts += int(evaluation.pop("eval_worker_restarts", 0))
        report.evaluation = evaluation
        report.seconds = {**report.seconds, "eval": t_eval}
        report.memory = self.memory()
        report.workers = self.pool.size  # live at the round's end (fewer after a worker was lost for good)
        return report

    def _evaluate_round(self, rnd: int) -> dict:
        """Accuracy every ``eval.every`` rounds and at the last (EMA updated), robustness when due."""
        cfg = self.cfg
        out: dict = {}
        last = rnd == int(cfg.train.rounds)
        if rnd % int(cfg.eval.every) == 0 or last:
            ana = int(cfg.eval.analysis_every)
            out.update(self.evaluate(analysis=bool(ana) and (rnd % ana == 0 or last), rnd=rnd))
            self.ema = ema_update(self.ema, out["accuracy"], cfg.eval.ema)
            out["ema_accuracy"] = self.ema
        if cfg.eval.adversarial:
            if robustness_due(cfg.eval.adversarial, rnd, last):
                out["robustness"] = self.robustness()
        return out

    def evaluate(self, analysis: bool = False, rnd: int | None = None) -> dict:
        """Accuracy (+ per domain) of the global model, evaluated on the client workers; with ``analysis`` also
        the FedRCL feature metrics (covariance traces, effective rank, VCI) of its test-set embeddings.
        ``eval_retries`` / ``eval_worker_restarts``: shards run again after a failure / workers replaced."""
        out, counters = self.evaluation.run(self.round if rnd is None else rnd, self.weights, analysis)
        out["eval_retries"] = counters["retries"]
        out["eval_worker_restarts"] = counters["worker_restarts"]
        if analysis:
            out["analysis"] = feature_analysis(out.pop("features"), self.test["labels"])
        return out

    def robustness(self) -> dict:
        """Clean / FGSM / PGD accuracy of the global model under ``eval.adversarial`` (FedCCL Table 8)."""
        rp, cfg = self.replica, self.cfg
        rp.flat.load(self.weights)
        return robustness_report(rp.model, self.test["images"], self.test["labels"], cfg.eval.adversarial,
                                 meta=rp.meta, normalize=bool(cfg.data.normalize),
                                 batch_size=int(cfg.eval.batch_size), device=rp.device, seed=int(cfg.seed))


def _check_names(rnd: int, report: RoundReport, evaluation: dict) -> None:
    """The evaluation's numbers (accuracy, the metrics of ``eval.metrics``, ...) cannot take a key the round's
    report holds already (an algorithm's ``round_metrics``): one would silently replace the other."""
    clash = sorted(set(evaluation) & report.names())
    if clash:
        raise RunAborted(f"round {rnd}: the evaluation's {clash[0]!r} has the name of a key of the round's report (the "
                         f"algorithm's round_metrics); register the metric (eval.metrics) under another name")


def _check_finite(rnd: int, res) -> None:
    """A round whose model or training loss is NaN/inf cannot give a trustworthy number: stop the run."""
    bad = int(res.weights.size - np.count_nonzero(np.isfinite(res.weights)))
    if bad:
        raise RunAborted(f"round {rnd}: the global model has {bad} non-finite values (NaN/inf) after aggregation; "
                         f"the run stops at the last finite round (check train.lr, server.params, the loss)")
    loss = res.report.loss  # NaN is a client without a full batch (drop_last); inf is divergence
    if math.isinf(float(loss)):
        raise RunAborted(f"round {rnd}: the training loss is {loss}; the run stops at the last finite round "
                         f"(check train.lr and the algorithm's parameters)")
