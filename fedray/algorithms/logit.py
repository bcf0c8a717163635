"""Federated logit-adjustment baselines of the SCALA paper (METHODS.md §3): FedLogit and FedLA.

Both are FedAvg with a different local loss. Models with dropout (``alexnet_split``) train with the torch RNG
seeded per (seed, round, client) (purpose ``dropout``), as every algorithm's local training does
(:class:`fedray.engine.client.sequential.SequentialRuntime`), so the result is reproducible bit for bit for any
number of workers.
"""

from __future__ import annotations

import numpy as np
import torch

from fedray.algorithms.base import ClientContext
from fedray.algorithms.registry import register
from fedray.algorithms.baselines import FedLC
from fedray.algorithms.fedavg import WEIGHTING, FedAvg
from fedray.algorithms.split import EPS_SPEC, ZERO_MODE_SPEC
from fedray.core.params import ParamSpec
from fedray.losses import label_prior, logit_adjusted_ce

__all__ = ["FedLogit", "FedLA"]


@register
class FedLogit(FedAvg):
    """FedLogit: FedAvg whose local loss is SCALA's client loss (Eq. 15),
    ``mean_i CE(z_i + log P_k, y_i)``, P_k the client's label distribution.

    ``prior: local`` (default) uses the client's whole local label distribution, ``batch`` the label
    frequencies of the current minibatch. Zero frequencies: ``zero_mode: clamp`` (``log max(P, eps)``,
    eps 1e-9) or ``exclude`` (class removed from the softmax), as in :func:`fedray.losses.logit_adjusted_ce`.
    """

    name = "fedlogit"
    params_spec = {
        "prior": ParamSpec("local", "P_k: the client's whole label distribution ('local') or the minibatch's ('batch')",
                           str, choices=("local", "batch")),
        "zero_mode": ZERO_MODE_SPEC,
        "eps": EPS_SPEC,
        "weighting": WEIGHTING,
    }
    description = "FedLogit: FedAvg with the logit-adjusted local loss CE(z + log P_k) (SCALA Eq. 15)"

    def make_loss(self, ctx: ClientContext, payload: dict):
        eps, zm = float(self.params["eps"]), self.params["zero_mode"]
        if self.params["prior"] == "local":
            prior = label_prior(torch.from_numpy(np.array(ctx.labels, dtype=np.int64)), int(ctx.num_classes)).to(ctx.device)

            def loss_fn(model, x, y):
                return logit_adjusted_ce(model(x), y, prior, eps=eps, zero_mode=zm)
        else:
            def loss_fn(model, x, y):
                return logit_adjusted_ce(model(x), y, label_prior(y, int(ctx.num_classes)), eps=eps, zero_mode=zm)

        return loss_fn


@register
class FedLA(FedLC):
    """FedLA, the SCALA paper's name for FedLC's logit calibration: an alias of ``fedlc``
    (:class:`fedray.algorithms.baselines.FedLC`, same parameters and loss ``CE(z - tau * n_c^{-1/4})``)."""

    name = "fedla"
    description = "FedLA (= FedLC logit calibration by local class counts), the SCALA paper's baseline"
