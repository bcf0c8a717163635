"""FedAvg with a logit penalty, a plain two-layer MLP and a label-sorted partitioner: a method brought to fedray
from the user's own directory (docs/extending.md).

FedAvgLogitL2 trains every client on

    L(w) = CE(f_w(x), y) + lam * (1/B) sum_i ||f_w(x_i)||^2                                    (eq. 1)

(the mean squared norm of the logits over a batch of B samples, which keeps the logits small under label
skew), and the server averages the client models as FedAvg does:

    w^{t+1} = sum_k (n_k / n) w_k^{t+1}                                                         (eq. 2)

Eq. 2 is fedray's own weighted average (``Algorithm.client_weight`` = n_k); eq. 1 is ``make_loss`` below.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fedray
from fedray import ParamSpec

from . import data  # noqa: F401  (the partitioner: torch-free, so a Ray driver can run it)

__all__ = ["FedAvgLogitL2", "TinyMLP", "logit_l2_loss"]


def logit_l2_loss(logits: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """Eq. 1: cross-entropy plus ``lam`` times the batch mean of the squared logit norms."""
    return F.cross_entropy(logits, y) + lam * logits.pow(2).sum(dim=1).mean()


@fedray.register_algorithm
class FedAvgLogitL2(fedray.Algorithm):
    """FedAvg whose clients add ``lam * mean ||logits||^2`` to the cross-entropy (eq. 1)."""

    name = "fedavg_logitl2"
    description = "FedAvg + lam * mean squared logit norm on the clients (examples/custom-method)"
    params_spec = {"lam": ParamSpec(1e-3, "weight of the logit penalty (eq. 1)", float, ge=0)}

    def make_loss(self, ctx, payload):
        lam = float(self.params["lam"])
        return lambda model, x, y: logit_l2_loss(model(x), y, lam)


class TinyMLP(torch.nn.Module):
    """A plain ``nn.Module``: flatten, one hidden ReLU layer, logits."""

    def __init__(self, in_features: int, hidden: int, num_classes: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(in_features, hidden)
        self.fc2 = torch.nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@fedray.register_model("tiny_mlp", options={"hidden": 32}, description="two-layer MLP (examples/custom-method)")
def tiny_mlp(inp, num_classes: int, hidden: int) -> TinyMLP:
    features = inp.input_dim or inp.in_channels * inp.height * inp.width
    return TinyMLP(features, int(hidden), num_classes)
