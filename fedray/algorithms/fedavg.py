"""FedAvg and FedProx: the first users of the plug-in interface."""

from __future__ import annotations

from fedray.algorithms.base import Algorithm, ClientHints
from fedray.algorithms.registry import register
from fedray.core.params import ParamSpec

WEIGHTING = ParamSpec("samples", "aggregation weight of a client: 'samples' (its sample count) or 'uniform' (equal)",
                      str, choices=("samples", "uniform"))


@register
class FedAvg(Algorithm):
    """McMahan et al. 2017: local SGD on cross-entropy, sample-weighted average.

    ``weighting: samples`` (default) weights each client by its sample count; ``uniform`` gives every
    client the same weight (FedRCL's setting with equal-sized clients)."""

    name = "fedavg"
    supports_multi_client = True  # local loss: cross-entropy only (fedray.engine.client.grouped)
    params_spec = {"weighting": WEIGHTING}
    description = "Federated averaging (cross-entropy, sample-weighted mean)"

    def client_weight(self, num_samples: int) -> float:
        return 1.0 if self.params["weighting"] == "uniform" else float(num_samples)


@register
class FedProx(FedAvg):
    """Li et al. 2020 (Eq. 2): local loss CE + mu/2 * ||theta - theta_global||^2, mu = 2e-3 (METHODS.md §1).

    The FedRCL lab code (the code FedRCL's tables ran) adds 1e-3 * ||theta - theta_global||^2 with no 1/2, so
    fedray's mu/2 form needs mu = 2e-3 for the same pull; set ``mu: 0.001`` for the older, half-strength default.

    The proximal term is the engine's shared one (:func:`fedray.algorithms.base.broadcast_proximal_term`,
    set through :meth:`client_hints`), so it composes with FedACG's client term (the weights add up)."""

    name = "fedprox"
    supports_multi_client = True  # cross-entropy + proximal term (fedray.engine.client.grouped)
    params_spec = {"mu": ParamSpec(2e-3, "weight of the proximal term mu/2 ||w - w_global||^2 (2e-3 = the lab code's "
                                     "1e-3 ||w - w_global||^2)", float, ge=0),
                   **FedAvg.params_spec}
    description = "FedAvg with a proximal term mu/2 ||w - w_global||^2"

    def client_hints(self) -> ClientHints:
        # the proximal term of local_sgd (and of multi-client training), anchored at the broadcast weights
        return ClientHints(prox_mu=float(self.params["mu"]))

