"""The plain-PyTorch sequential reference ("the floor") of shared/bench/WORKLOAD.md.

A single process, no framework: exactly the data, partition, model, local training, sampling and
FedAvg of the workload definition. It prints one JSON line with start-up seconds, per-round seconds,
final accuracy and the weights hash (which must be 99cf087e17aa4b48 for W1 and 1b473336c9777f8c for W2
with 1 thread).

    python bench/workload_floor.py --workload W1 --threads 1
    python bench/workload_floor.py --workload pfl-shape --data bench/out/pfl-shape.npz   # see bench/workload_def.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload_def as wd  # noqa: E402  (the workloads' data, partition, model and orders, shared by the peers)

WORKLOADS = wd.WORKLOADS


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, help="stop after this many rounds (tests use a short prefix)")
    ap.add_argument("--save", help="write the final state_dict as .npz here")
    ap.add_argument("--data", help="the pfl-shape arrays (.npz) written by bench/bench_workload.py")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    w = WORKLOADS[args.workload]
    rounds = args.rounds or w.rounds
    X_train, X_test, y_train, y_test, parts = wd.load(args.workload, args.data)
    model = wd.make_model(args.workload)
    names = list(model.state_dict().keys())
    glob = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    startup = time.perf_counter() - T0
    per_round = []
    t_rounds = time.perf_counter()
    for rnd in range(1, rounds + 1):
        tr = time.perf_counter()
        sampled = wd.sampled_clients(args.workload, rnd, parts)
        updates, sizes = [], []
        for cid in sampled:
            model.load_state_dict({n: torch.from_numpy(glob[n]) for n in names})
            opt = torch.optim.SGD(model.parameters(), lr=wd.LR)
            xs, ys = X_train[parts[cid]], y_train[parts[cid]]
            n = len(ys)
            perm = wd.batch_order(rnd, cid, n)
            model.train()
            for i in range(0, n, wd.BATCH_SIZE):
                b = perm[i : i + wd.BATCH_SIZE]
                xb, yb = torch.from_numpy(xs[b]), torch.from_numpy(ys[b])
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
            updates.append({nm: t.detach().numpy().copy() for nm, t in model.state_dict().items()})
            sizes.append(n)
        total = sum(sizes)
        new = {}
        for j, (upd, n) in enumerate(zip(updates, sizes)):
            a = n / total
            for nm in names:
                if j == 0:
                    new[nm] = upd[nm] * a
                else:
                    new[nm] += upd[nm] * a
        glob = new
        per_round.append(time.perf_counter() - tr)
    rounds_s = time.perf_counter() - t_rounds
    model.load_state_dict({n: torch.from_numpy(glob[n]) for n in names})
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean())
    if args.save:
        np.savez(args.save, **{n: t.numpy() for n, t in model.state_dict().items()})
    print(json.dumps({
        "impl": f"floor-{args.threads}t", "workload": args.workload, "startup_s": startup, "rounds_s": rounds_s,
        "round_s": per_round, "accuracy": acc, "weights_hash": wd.weights_hash(model.state_dict()),
        "total_s": time.perf_counter() - T0,
    }))


if __name__ == "__main__":
    main()
