"""pfl-research (PyPI ``pfl``) on the benchmark workloads (W1 / W2 of shared/bench/WORKLOAD.md, pfl-shape of
bench/workload_def.py), one JSON line of figures.

    bench/.pfl-venv/bin/python bench/workload_pfl.py --workload W1 [--threads 1]
    bench/.pfl-venv/bin/python bench/workload_pfl.py --workload pfl-shape --data bench/out/pfl-shape.npz

pfl's own simulation, one process (pfl simulates on one machine without a cluster; it spreads users over
several processes only when started under its distributed launcher, which this does not do): its
``FederatedAveraging`` algorithm run by ``SimulatedBackend`` (its default ``SumAggregator``) on a
``FederatedDataset``, a ``PyTorchModel`` with a local ``torch.optim.SGD(lr=0.05)`` and a central
``torch.optim.SGD(lr=1.0)`` (FedAvg: the new model is the old one plus the averaged model difference),
``WeightByDatapoints`` (the average is weighted by the users' sample counts, as FedAvg's), batch 10, 1 local
epoch. The same data, partition, model and initial weights as the other peers (bench/workload_def.py), and the
same users in the same order: the ``FederatedDataset``'s user sampler hands out each round's sampled clients
(``default_rng([0, round])``, empty clients dropped) and each user's dataset holds its samples in the
workload's order (``default_rng([0, round, client])``), which pfl's batching keeps. The cohort size is an
adaptive ``HyperParam`` (pfl's mechanism for it) because W2 has a round with 49 non-empty clients of 50.

What differs from the other peers by pfl's design: the update is applied as old + sum(n_k (w_k - old)) / sum(n_k)
(float sums differ from the floor's by rounding, so the weights hash differs while the accuracy agrees); and
in its first central iteration (iteration 0, where ``iteration % evaluation_frequency == 0`` always holds) pfl
evaluates every sampled user's data before and after local training (a forward pass each), which lands in
round 1's time. Needs the virtualenv made by ``bench/bench_workload.py --pfl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    import workload_def as wd

    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", type=wd.workload_name, default="W1",
                    help=f"{', '.join(sorted(wd.WORKLOADS))} or a scale point scale-P-K-R (bench/bench_scale_peers.py)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the one process")
    ap.add_argument("--data", help="the pfl-shape arrays (.npz) written by bench/bench_workload.py, or a scale "
                                     "point's, written by bench/bench_scale_peers.py")
    ap.add_argument("--rounds", type=int, help="stop after this many rounds (a short prefix, for checks)")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.hyperparam.base import HyperParam
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    logging.getLogger("pfl").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    w = wd.WORKLOADS[args.workload]
    n_rounds = args.rounds or w.rounds
    X_train, X_test, y_train, y_test, parts = wd.load(args.workload, args.data)
    schedule = [[(rnd, cid) for cid in wd.sampled_clients(args.workload, rnd, parts)] for rnd in range(1, n_rounds + 1)]

    base, _ = wd.model_spec(args.workload)

    class Module(base):  # pfl's PyTorchModel needs `loss` and `metrics` on the module; same parameters
        def loss(self, x, y):
            self.train()
            return F.cross_entropy(self(x), y.long())  # pfl hands every array over as float32

        @torch.no_grad()
        def metrics(self, x, y, eval=False):  # noqa: A002  (pfl's keyword)
            self.eval()
            logits = self(x)
            y = y.long()
            n = len(y)
            return {"loss": Weighted(float(F.cross_entropy(logits, y, reduction="sum")), n),
                    "accuracy": Weighted(float((logits.argmax(1) == y).sum()), n)}

    module = wd.make_model(args.workload, Module)
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))

    users = iter([u for rnd in schedule for u in rnd])

    def make_dataset(user):
        rnd, cid = user
        idx = parts[cid]
        order = idx[wd.batch_order(rnd, cid, len(idx))]
        return Dataset(raw_data=[X_train[order], y_train[order]], user_id=str(cid))

    train_data = FederatedDataset(make_dataset, user_sampler=lambda: next(users))

    class Rounds(HyperParam, TrainingProcessCallback):
        """The cohort size of the coming round (an adaptive hyperparameter), and the time each round ends."""

        def __init__(self):
            self.i, self.ends, self.cpu_ends = 0, [], []

        def value(self):
            return len(schedule[self.i])

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            self.ends.append(time.perf_counter())
            self.cpu_ends.append(time.process_time())  # this process's CPU, all its threads: pfl simulates in it
            self.i = min(self.i + 1, len(schedule) - 1)
            return False, Metrics()

    rounds = Rounds()
    backend = SimulatedBackend(training_data=train_data, val_data=None, postprocessors=[WeightByDatapoints()])
    algorithm_params = NNAlgorithmParams(central_num_iterations=n_rounds, evaluation_frequency=n_rounds + 1,
                                         train_cohort_size=rounds, val_cohort_size=None)
    train_params = NNTrainHyperParams(local_learning_rate=wd.LR, local_num_epochs=wd.LOCAL_EPOCHS,
                                      local_batch_size=wd.BATCH_SIZE)
    algorithm = FederatedAveraging()
    t_rounds, cpu_rounds = time.perf_counter(), time.process_time()
    startup = t_rounds - T0
    algorithm.run(algorithm_params=algorithm_params, backend=backend, model=model, model_train_params=train_params,
                  callbacks=[rounds], send_metrics_to_platform=False)  # no per-round metrics printout
    if len(rounds.ends) != n_rounds:
        raise RuntimeError(f"pfl ran {len(rounds.ends)} central iterations, expected {n_rounds}")
    starts = [t_rounds] + rounds.ends[:-1]
    round_s = [b - a for a, b in zip(starts, rounds.ends)]
    cpu_starts = [cpu_rounds] + rounds.cpu_ends[:-1]
    round_cpu_s = [b - a for a, b in zip(cpu_starts, rounds.cpu_ends)]
    module.eval()
    with torch.no_grad():
        acc = float((module(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean())
    print(json.dumps({
        "impl": f"pfl-{args.threads}t", "workload": args.workload, "startup_s": startup,
        "rounds_s": rounds.ends[-1] - t_rounds, "round_s": round_s, "round_cpu_s": round_cpu_s, "accuracy": acc,
        "weights_hash": wd.weights_hash(module.state_dict()), "total_s": time.perf_counter() - T0,
    }))


if __name__ == "__main__":
    main()
