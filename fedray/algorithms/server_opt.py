"""Server optimizers, composable with every federated algorithm.

The engine computes the weighted average ``avg`` of the client models; a server optimizer turns the
current global weights ``w`` and ``avg`` into the next global weights. The pseudo-gradient is
``d = w - avg`` (the direction plain FedAvg would move).

- ``none``: ``w' = avg`` exactly (bit-identical to FedAvg's average).
- ``fedavgm`` (Hsu et al. 2019): ``m = beta*m + d``; ``w' = w - lr*m`` (momentum 0.4 in METHODS.md).
- ``fedadam`` (Reddi et al. 2021): ``m = b1 m + (1-b1) d``, ``v = b2 v + (1-b2) d^2``,
  ``w' = w - lr * m / (sqrt(v) + tau)`` with b1 0.9, b2 0.99, tau 1e-3, lr 0.01 (METHODS.md); ``v`` starts
  at ``tau^2`` as in the reference (and Reddi et al.'s ``v_{-1} >= tau^2``), ``m`` at zero.
- ``fedacg`` (Kim et al. 2024): the server broadcasts the look-ahead ``w_hat = w + lam*m`` (lam 0.85);
  clients add the proximal term ``beta/2 ||theta - w_hat||^2`` through :class:`ClientHints` (any
  algorithm); then ``Delta = avg - w_hat``, ``m = lam*m + Delta``, ``w' = w_hat + lr*Delta``.
"""

from __future__ import annotations

import numpy as np

from fedray.algorithms.base import ClientHints, reject_defaults_table
from fedray.config import ConfigError
from fedray.core.params import ParamSpec, check_params
from fedray.core.registry import Registry, RegistryError


class ServerOptimizer:
    """Base class and ``none``. A subclass declares its parameters in ``params_spec`` (name ->
    :class:`~fedray.core.params.ParamSpec`); ``__init__`` resolves the given ones into ``self.params``,
    raising ``server.params.<name>: ...`` for unknown keys, wrong types and out-of-range values."""

    name = "none"
    description = "plain average of the client models (FedAvg)"
    params_spec: dict[str, ParamSpec] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        reject_defaults_table(cls)

    def __init__(self, lr: float = 1.0, params: dict | None = None):
        self.lr = float(lr)
        self.params = check_params(dict(params or {}), self.params_spec, "server.params", ConfigError)
        self.state: dict[str, np.ndarray] = {}

    def broadcast_weights(self, w: np.ndarray) -> np.ndarray:
        """Weights sent to clients (FedACG sends a look-ahead)."""
        return w

    def client_hints(self) -> ClientHints:
        """Hints for every client's local training (FedACG: its proximal weight beta)."""
        return ClientHints()

    def step(self, w: np.ndarray, avg: np.ndarray) -> np.ndarray:
        return avg

    def state_dict(self) -> dict:
        return {k: v.copy() for k, v in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        self.state = {k: np.asarray(v, dtype=np.float32).copy() for k, v in state.items()}


class FedAvgM(ServerOptimizer):
    name = "fedavgm"
    description = "FedAvgM: server momentum on the pseudo-gradient (momentum 0.4)"
    params_spec = {"momentum": ParamSpec(0.4, "beta: decay of the server momentum buffer m = beta*m + d", float,
                                         ge=0, lt=1)}

    def step(self, w, avg):
        d = w - avg
        m = self.state.get("m")
        m = d if m is None else np.float32(self.params["momentum"]) * m + d
        self.state["m"] = m.astype(np.float32, copy=False)
        return (w - np.float32(self.lr) * m).astype(np.float32, copy=False)


class FedAdam(ServerOptimizer):
    name = "fedadam"
    description = "FedAdam: Adam on the pseudo-gradient (server lr 0.01, beta1 0.9, beta2 0.99, tau 1e-3)"
    params_spec = {
        "beta1": ParamSpec(0.9, "b1: decay of the first moment m", float, ge=0, lt=1),
        "beta2": ParamSpec(0.99, "b2: decay of the second moment v", float, ge=0, lt=1),
        "tau": ParamSpec(1e-3, "tau: adaptivity (added to sqrt(v); v starts at tau^2)", float, gt=0),
    }

    def step(self, w, avg):
        b1, b2, tau = (np.float32(self.params[k]) for k in ("beta1", "beta2", "tau"))
        d = avg - w  # ascent direction, as in Reddi et al.
        m = self.state.get("m", np.zeros_like(w))
        v = self.state.get("v")
        if v is None:
            v = np.full_like(w, tau * tau)
        m = b1 * m + (np.float32(1) - b1) * d
        v = b2 * v + (np.float32(1) - b2) * d * d
        self.state["m"], self.state["v"] = m.astype(np.float32), v.astype(np.float32)
        return (w + np.float32(self.lr) * m / (np.sqrt(v) + tau)).astype(np.float32, copy=False)


class FedACG(ServerOptimizer):
    """Accelerated client gradient (Kim et al., CVPR 2024).

    Broadcast ``w_hat = w + lam * m``; clients train from ``w_hat`` with a proximal term
    ``beta/2 ||theta - w_hat||^2``; then ``m = lam*m + (avg - w_hat)`` ... in the paper's form
    ``Delta = avg - w_hat``, ``m' = lam * m + Delta`` and ``w' = w_hat + Delta`` (server lr 1).
    beta = 2e-3: the FedACG code adds 1e-3 * ||theta - w_hat||^2 with no 1/2 (METHODS.md §1); ``beta: 0.001``
    gives the older, half-strength pull."""

    name = "fedacg"
    description = "FedACG: look-ahead broadcast w + lam*m and a client proximal term (lam 0.85, beta 2e-3)"
    params_spec = {
        "lam": ParamSpec(0.85, "lambda: momentum decay and look-ahead step w_hat = w + lambda*m", float, ge=0, lt=1),
        "beta": ParamSpec(2e-3, "beta: weight of the clients' proximal term beta/2 ||theta - w_hat||^2 (2e-3 = "
                          "the reference's 1e-3 ||theta - w_hat||^2)", float, ge=0),
    }

    def broadcast_weights(self, w):
        m = self.state.get("m")
        if m is None:
            return w
        return (w + np.float32(self.params["lam"]) * m).astype(np.float32, copy=False)

    def client_hints(self) -> ClientHints:
        return ClientHints(prox_mu=float(self.params["beta"]))

    def step(self, w, avg):
        w_hat = self.broadcast_weights(w)
        delta = avg - w_hat
        m = self.state.get("m")
        m = delta if m is None else np.float32(self.params["lam"]) * m + delta
        self.state["m"] = m.astype(np.float32, copy=False)
        return (w_hat + np.float32(self.lr) * delta).astype(np.float32, copy=False)


SERVER_OPTIMIZERS: Registry[type[ServerOptimizer]] = Registry("server optimizer", "fedray.register_server_optimizer")


def register_server_optimizer(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    """Class decorator: register a :class:`ServerOptimizer` subclass under its ``name`` (``server.name``); a name
    another module registered is refused, naming both modules."""
    if not (isinstance(cls, type) and issubclass(cls, ServerOptimizer)):
        raise RegistryError(f"register_server_optimizer: expected a subclass of fedray.algorithms.server_opt."
                            f"ServerOptimizer, got {cls!r}")
    if not cls.name or (cls.name == ServerOptimizer.name and cls is not ServerOptimizer):
        raise RegistryError(f"register_server_optimizer: {cls.__module__}.{cls.__qualname__} needs a name of its own "
                            f"(class attribute name = '...')")
    SERVER_OPTIMIZERS.add(cls.name, cls, cls.__module__)
    return cls


for _cls in (ServerOptimizer, FedAvgM, FedAdam, FedACG):
    register_server_optimizer(_cls)


def build_server_optimizer(name: str, lr: float = 1.0, params: dict | None = None) -> ServerOptimizer:
    if name not in SERVER_OPTIMIZERS:
        raise ConfigError(f"server.name: unknown server optimizer {name!r} (known: {', '.join(SERVER_OPTIMIZERS)})")
    if lr <= 0:
        raise ConfigError(f"server.lr: must be > 0, got {lr!r}")
    return SERVER_OPTIMIZERS[name](lr, params)
