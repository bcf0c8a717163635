"""The server-side model(s) of a split round, held by the coordinator (SCALA, SplitFed V1/V2/V3, SFL).

Algorithms reach them through :meth:`SplitServer.forward` and :meth:`SplitServer.step` in their
``server_iteration``. Server-side dropout is keyed by (seed, round, server step, forward call), the
SplitFedV2 client order by (seed, round); the per-client copies (V1/V3) are averaged with the ordered fold.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call

from fedray.algorithms.training import make_torch_optimizer
from fedray.core.seeds import SERVER_STREAM, seed_of, seeded
from fedray.engine.fold import OrderedFold
from fedray.engine.split_layout import SplitLayout, has_dropout, views

__all__ = ["SplitServer"]


class _ServerModel:
    """One server-side model: a trainable flat leaf, its fixed tensors and its optimizer."""

    def __init__(self, train: torch.Tensor, fixed: torch.Tensor, opt: torch.optim.Optimizer, slot: int):
        self.train = train
        self.fixed = fixed
        self.opt = opt
        self.slot = slot


class SplitServer:
    """The server-side model(s) of a split round, on the coordinator (standalone-constructible for tests).

    ``main`` is the server-side model; ``copies`` (SplitFedV1/V3) one copy per participating client in
    sampled order, created from ``main`` at :meth:`begin_round` with fresh optimizers and averaged at
    :meth:`end_round`. Algorithms use :meth:`forward` and :meth:`step`."""

    def __init__(self, model, layout: SplitLayout, algorithm, train_cfg, seed: int, device=None):
        self.layout = layout
        self.algorithm = algorithm
        self.train_cfg = train_cfg
        self.seed = int(seed)
        _, self.part = model.split(layout.point)
        self.device = torch.device(device) if device is not None else next(iter(model.parameters())).device
        self.has_dropout = has_dropout(self.part)
        self.main: _ServerModel | None = None
        self.copies: list[_ServerModel] = []
        self._copy_weights: list[float] = []
        self.rnd = 0
        self.it = 0
        self._calls = 0
        self._order: np.ndarray | None = None

    # ------------------------------------------------------------------------------ round
    def _model(self, train: np.ndarray, fixed: np.ndarray, lr: float, slot: int) -> _ServerModel:
        tr = torch.tensor(np.asarray(train, np.float32), device=self.device).requires_grad_(True)
        fx = torch.tensor(np.asarray(fixed, np.float32), device=self.device)
        return _ServerModel(tr, fx, make_torch_optimizer(self.train_cfg, [tr], lr), slot)

    def begin_round(self, rnd: int, train: np.ndarray, fixed: np.ndarray, lr: float,
                    opt_state: dict | None = None, copy_weights: list[float] | None = None) -> None:
        """Load the round's server weights. ``opt_state`` restores ``main``'s optimizer state (persistent
        across rounds); ``copy_weights`` (one per client) creates the per-client copies."""
        self.rnd = int(rnd)
        self._order = None
        self.main = self._model(train, fixed, lr, 0)
        if opt_state:
            st = {}
            for k, v in opt_state.items():
                t = torch.as_tensor(np.asarray(v)).clone()
                st[k] = t if k == "step" else t.to(self.device)
            self.main.opt.state[self.main.train] = st
        self._copy_weights = [float(w) for w in (copy_weights or [])]
        self.copies = [self._model(train, fixed, lr, k + 1) for k in range(len(self._copy_weights))]
        self.part.train()

    def begin_iteration(self, it: int) -> None:
        self.it = int(it)
        self._calls = 0

    def end_round(self) -> tuple[np.ndarray, np.ndarray, dict | None]:
        """(server train vector, server fixed vector, main optimizer state or None for copies)."""
        if self.copies:
            fold_t, fold_f = OrderedFold(self._copy_weights), OrderedFold(self._copy_weights)
            for k, copy in enumerate(self.copies):  # the ordered fold, float32
                fold_t.add(k, copy.train.detach().to("cpu").numpy())
                fold_f.add(k, copy.fixed.to("cpu").numpy())
            avg_t, avg_f = fold_t.result(), fold_f.result()
            assert avg_t is not None and avg_f is not None  # one copy per client of the round, every one folded
            return avg_t.astype(np.float32), avg_f.astype(np.float32), None
        m = self.main
        assert m is not None  # begin_round built it
        state = {}
        for k, v in m.opt.state.get(m.train, {}).items():
            if v is None:
                continue
            state[k] = v.detach().to("cpu").numpy().copy() if torch.is_tensor(v) else np.asarray(v)
        return (m.train.detach().to("cpu").numpy().copy(), m.fixed.to("cpu").numpy().copy(), state)

    # ------------------------------------------------------------------------------ algorithm API
    def forward(self, model: _ServerModel, x: torch.Tensor) -> torch.Tensor:
        """Server-side logits of ``model`` on activations ``x``; dropout seeded per (seed, round,
        iteration, call number)."""
        key = [self.seed, self.rnd, SERVER_STREAM, 1002, self.it, self._calls]
        self._calls += 1
        tensors = {**views(model.train, self.layout.st_entries), **views(model.fixed, self.layout.sf_entries)}
        with seeded(self.has_dropout, seed_of(key), self.device):
            return functional_call(self.part, tensors, (x,))

    def step(self, model: _ServerModel, loss: torch.Tensor, wrt=()) -> tuple[torch.Tensor, ...]:
        """Gradients of ``loss`` w.r.t. ``wrt`` (e.g. the activations), then one optimizer step of
        ``model`` on ``loss`` (with ``train.grad_clip``). Both come from the same backward pass, so the
        returned gradients are at the pre-step weights."""
        grads = torch.autograd.grad(loss, (model.train, *wrt))
        model.train.grad = grads[0]
        clip = self.train_cfg.grad_clip
        if clip is not None:
            torch.nn.utils.clip_grad_norm_([model.train], float(clip))
        model.opt.step()
        model.train.grad = None
        return tuple(g.detach() for g in grads[1:])

    def client_order(self, n: int) -> list[int]:
        """A random order of the round's ``n`` clients, drawn once per (seed, round) (SplitFedV2)."""
        if self._order is None or self._order.size != n:
            self._order = np.random.default_rng([self.seed, self.rnd, SERVER_STREAM, 1000]).permutation(n)
        return [int(i) for i in self._order]
