"""Cost of FedRCL's multi-level loss relative to plain cross-entropy, per local SGD step.

One step = forward, loss, backward, gradient-norm clip (10) and an SGD update (lr 0.1, weight decay 1e-3),
exactly what ``local_sgd`` does per batch. Losses compared on the same model and batch:

- ``ce``          cross-entropy only (FedAvg);
- ``fedscl``      CE + multi-level SCL over the five taps l1..l5 (β = 0: no penalty);
- ``fedrcl``      CE + multi-level SCL + β·penalty, ``variant: reference`` (the default);
- ``fedrcl-paper`` the same with ``variant: paper`` (Eq. 5 read literally);
- ``fedrcl-last`` FedRCL on the last level only (``levels: last``).

Batches are random images with labels from 10 classes drawn so that each class appears ~5 times in a
batch of 50 (as with FedRCL's CIFAR-10 clients; the penalty's selection depends on the labels, its cost
barely). Steps of the different losses are interleaved (one model replica each, same initial weights),
so load changes on a shared machine affect all of them alike. Prints the median milliseconds per step and
the ratio to ``ce``. No assertions.

    python bench/bench_fedrcl_loss.py [--models cnn_taps resnet18_gn] [--batch 50] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedray.algorithms.fedrcl import level_taps  # noqa: E402
from fedray.losses import multilevel_relaxed_contrastive_loss  # noqa: E402
from fedray.models import build_model  # noqa: E402

INPUTS = {"cnn_taps": (1, 28), "resnet18_gn": (3, 32), "resnet10_gn": (3, 32)}


def make_loss(kind: str, taps_all: list[str]):
    if kind == "ce":
        return lambda m, x, y: F.cross_entropy(m(x), y)
    taps = taps_all[-1:] if kind == "fedrcl-last" else taps_all
    beta = 0.0 if kind == "fedscl" else 1.0
    variant = "paper" if kind == "fedrcl-paper" else "reference"

    def loss(m, x, y):
        logits, feats = m.forward_features(x, taps)
        scl, pen = multilevel_relaxed_contrastive_loss([feats[t] for t in taps], y, tau=0.05, lam=0.7, beta=beta,
                                                       variant=variant)
        return F.cross_entropy(logits, y) + scl + beta * pen

    return loss


class Stepper:
    """One model replica + optimizer per loss, so that steps of different losses can be interleaved."""

    def __init__(self, model, loss_fn):
        self.model = model
        self.loss_fn = loss_fn
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(self.params, lr=0.1, weight_decay=1e-3)

    def step(self, x, y) -> float:
        t0 = time.perf_counter()
        self.opt.zero_grad()
        loss = self.loss_fn(self.model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 10.0)
        self.opt.step()
        return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["cnn_taps", "resnet18_gn"], choices=sorted(INPUTS))
    ap.add_argument("--losses", nargs="+", default=["ce", "fedscl", "fedrcl", "fedrcl-paper", "fedrcl-last"],
                    choices=["ce", "fedscl", "fedrcl", "fedrcl-paper", "fedrcl-last"])
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per (model, loss)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = one client worker's setting)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))

    print(f"FedRCL loss cost per local step: batch {args.batch}, {args.steps} timed steps (median), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':<12} {'loss':<13} {'ms/step':>9} {'x CE':>6}")
    for name in args.models:
        ch, size = INPUTS[name]
        torch.manual_seed(0)
        model = build_model(name, in_channels=ch, image_size=size, num_classes=10)
        model.train()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.batch, ch, size, size, generator=g)
        y = torch.arange(args.batch) % 10
        y = y[torch.randperm(args.batch, generator=g)]
        taps = level_taps(model, "all")
        steppers = {kind: Stepper(copy.deepcopy(model), make_loss(kind, taps)) for kind in args.losses}
        for _ in range(args.warmup):
            for st in steppers.values():
                st.step(x, y)
        times = {kind: [] for kind in args.losses}
        for _ in range(args.steps):  # interleaved, so load changes on a shared machine hit every loss alike
            for kind, st in steppers.items():
                times[kind].append(st.step(x, y))
        base = 1000 * statistics.median(times["ce"]) if "ce" in times else None
        for kind in args.losses:
            ms = 1000 * statistics.median(times[kind])
            ratio = f"{ms / base:6.2f}" if base else "     -"
            print(f"{name:<12} {kind:<13} {ms:>9.1f} {ratio}")


if __name__ == "__main__":
    main()
