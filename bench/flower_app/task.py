"""Data, partition, model and local training of the benchmark workloads (shared/bench/WORKLOAD.md §1-4 for W1 /
W2, bench/workload_def.py for pfl-shape) for the Flower ClientApp and ServerApp, exactly as the plain-PyTorch
floor (bench/workload_floor.py) uses them: all come from bench/workload_def.py. Data and partition are read
once per process and cached (each Ray actor of Flower's simulation engine is one process)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from bench import workload_def as wd

WORKLOADS = wd.WORKLOADS
weights_hash = wd.weights_hash


def initial_model(workload: str):
    return wd.make_model(workload)


@functools.lru_cache(maxsize=2)
def load_data(workload: str, data_path: str | None = None):
    """(X_train, X_test, y_train, y_test, client_indices) of ``workload`` (``data_path``: pfl-shape's arrays)."""
    return wd.load(workload, data_path or None)


def sampled_clients(workload: str, data_path: str | None, rnd: int) -> list[int]:
    """Round ``rnd``'s clients in sampled order, empty clients dropped (WORKLOAD.md §5)."""
    return wd.sampled_clients(workload, rnd, load_data(workload, data_path)[4])


def train_client(model, workload: str, data_path: str | None, cid: int, rnd: int) -> int:
    """One epoch of SGD(lr 0.05), batch 10, in the order permutation([seed, rnd, cid]); returns n."""
    X_train, _, y_train, _, parts = load_data(workload, data_path)
    idx = parts[cid]
    xs, ys = X_train[idx], y_train[idx]
    n = len(ys)
    perm = wd.batch_order(rnd, cid, n)
    opt = torch.optim.SGD(model.parameters(), lr=wd.LR)
    model.train()
    for i in range(0, n, wd.BATCH_SIZE):
        b = perm[i : i + wd.BATCH_SIZE]
        xb, yb = torch.from_numpy(xs[b]), torch.from_numpy(ys[b])
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    return n


def accuracy(model, workload: str, data_path: str | None) -> float:
    _, X_test, _, y_test, _ = load_data(workload, data_path)
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(X_test)).argmax(1).numpy() == y_test).mean())
