"""FedAvg and FedProx: the first users of the plug-in interface."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedray.algorithms.base import Algorithm, ClientContext, ClientUpdate, local_sgd, register


@register
class FedAvg(Algorithm):
    """McMahan et al. 2017: local SGD on cross-entropy, sample-weighted average.

    ``weighting: samples`` (default) weights each client by its sample count; ``uniform`` gives every
    client the same weight (FedRCL's setting with equal-sized clients)."""

    name = "fedavg"
    supports_multi_client = True  # local loss: cross-entropy only (fedray.engine.multiclient)
    defaults = {"weighting": "samples"}
    description = "Federated averaging (cross-entropy, sample-weighted mean)"

    def validate(self):
        if self.params["weighting"] not in ("samples", "uniform"):
            raise_cfg("weighting", self.params["weighting"], "samples or uniform")

    def client_weight(self, num_samples: int) -> float:
        return 1.0 if self.params["weighting"] == "uniform" else float(num_samples)


@register
class FedProx(FedAvg):
    """Li et al. 2020: local loss CE + mu/2 * ||theta - theta_global||^2 (METHODS.md: mu = 1e-3)."""

    name = "fedprox"
    supports_multi_client = True  # cross-entropy + proximal term (fedray.engine.multiclient)
    defaults = {"mu": 1e-3, "weighting": "samples"}
    description = "FedAvg with a proximal term mu/2 ||w - w_global||^2"

    def validate(self):
        super().validate()
        self._require_nonneg("mu")

    def multi_client_prox_mu(self, payload: dict) -> float:
        return float(self.params["mu"])

    def local_update(self, ctx: ClientContext, payload: dict) -> ClientUpdate:
        mu = float(self.params["mu"])
        g = torch.from_numpy(np.asarray(ctx.global_weights)).to(ctx.device)
        flat = ctx.flat.view()
        # the proximal gradient mu * (w - w_g) is added after backward, on the flat buffer's params
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        offsets = _param_offsets(ctx)

        def loss_fn(model, x, y):
            ce = F.cross_entropy(model(x), y)
            prox = 0.0
            for p, (off, n) in zip(params, offsets):
                prox = prox + torch.sum((p - g[off : off + n].view_as(p)) ** 2)
            return ce + 0.5 * mu * prox

        del flat
        loss = local_sgd(ctx, loss_fn)
        return ClientUpdate(weights=ctx.flat.read(), num_samples=ctx.num_samples, loss=loss)


def _param_offsets(ctx: ClientContext):
    """(offset, numel) of every trainable parameter inside the flat vector."""
    layout = ctx.flat.layout
    by_name = {name: (off, n) for name, _, off, n in layout.slices()}
    return [by_name[name] for name, p in ctx.model.named_parameters() if p.requires_grad]


def raise_cfg(field, value, expected):
    from fedray.config import ConfigError

    raise ConfigError(f"algorithm.params.{field}: expected {expected}, got {value!r}")
