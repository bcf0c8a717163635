"""Adversarial robustness of a model: FGSM and PGD attacks and accuracies (FedCCL Table 8).

Attacks are L∞-bounded and always run in **pixel space**: the stored images are converted with
``to_float(x, meta, normalize=False)`` (``x/255`` for uint8 storage, so pixels lie in [0, 1]), the
perturbation is added and projected there, and only then is the model input formed with the dataset's
``(x - mean)/std`` normalisation when ``normalize`` is true. So ``eps = 0.3`` means 0.3 of the pixel range
whatever normalisation the model sees, as in Goodfellow et al. (2015) and Madry et al. (2018).

* FGSM:  ``x̃ = clip(x + ε·sign(∇_x CE(f(x), y)))``.
* PGD-k: ``x⁰ = x`` (or ``x + U(-ε, ε)`` with ``random_start``),
  ``x^{t+1} = clip(Π_{‖x'-x‖∞≤ε}(x^t + α·sign(∇_{x^t} CE(f(x^t), y))))``, t = 0..k-1, evaluated at x^k;
  α defaults to 2.5·ε/k (Madry et al.'s rule).

``clip`` is the valid pixel range, ``(0, 1)`` for uint8 storage; for float32 storage no range is known, so
nothing is clipped unless a range is given. Gradients are taken w.r.t. the input only (parameter ``.grad``
fields are left untouched) and the model is put in eval mode for evaluation; the local adversarial
training of FedAvg+ / FedCCL+ uses :func:`pgd_attack` / :func:`fgsm_attack` directly on a training batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedray.core.errors import ConfigError
from fedray.core.params import ParamSpec, check_params, defaults

__all__ = [
    "PixelSpace",
    "fgsm_attack",
    "pgd_attack",
    "fgsm_accuracy",
    "pgd_accuracy",
    "robustness_report",
    "validate_adversarial_spec",
    "ADVERSARIAL_DEFAULTS",
    "ADVERSARIAL_PARAMS",
]


@dataclass(frozen=True)
class PixelSpace:
    """Maps between pixel space (where attacks live) and the model's input space.

    ``mean``/``std`` are the normalisation statistics (empty: the model reads pixels directly);
    ``clip`` is the valid pixel range or ``None``.
    """

    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    clip: tuple[float, float] | None = (0.0, 1.0)

    @classmethod
    def from_meta(cls, meta, normalize: bool, clip="auto") -> "PixelSpace":
        """The space of a :class:`~fedray.data.table.DatasetMeta` (``clip="auto"``: (0, 1) for uint8 data)."""
        if clip == "auto":
            clip = (0.0, 1.0) if meta is None or getattr(meta, "dtype", "uint8") == "uint8" else None
        if normalize and meta is not None and meta.mean:
            return cls(tuple(meta.mean), tuple(meta.std), clip)
        return cls((), (), clip)

    def _stats(self, x: torch.Tensor):
        shape = (1, len(self.mean)) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).reshape(shape)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).reshape(shape)
        return mean, std

    def to_model(self, x: torch.Tensor) -> torch.Tensor:
        """Pixel batch -> model input (``(x - mean)/std`` or unchanged)."""
        if not self.mean:
            return x
        mean, std = self._stats(x)
        return (x - mean) / std

    def to_pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Model input -> pixel batch (inverse of :meth:`to_model`)."""
        if not self.mean:
            return x
        mean, std = self._stats(x)
        return x * std + mean

    def project(self, x_adv: torch.Tensor, x: torch.Tensor, eps: float) -> torch.Tensor:
        """Project onto the ε-ball around ``x`` and the valid pixel range."""
        x_adv = torch.max(torch.min(x_adv, x + eps), x - eps)
        if self.clip is not None:
            x_adv = x_adv.clamp(self.clip[0], self.clip[1])
        return x_adv


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _input_grad(model, space: PixelSpace, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∇_x of the summed cross-entropy at pixel batch ``x`` (parameters get no gradient)."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(space.to_model(x)), y, reduction="sum")
        (g,) = torch.autograd.grad(loss, x)
    return g


def fgsm_attack(model, x: torch.Tensor, y: torch.Tensor, eps: float, space: PixelSpace = PixelSpace()) -> torch.Tensor:
    """FGSM adversarial pixel batch ``clip(x + ε·sign(∇_x CE))`` (``x`` in pixel space, result detached)."""
    eps = _check_eps(eps)
    if eps == 0:
        return x.detach().clone()
    g = _input_grad(model, space, x, y)
    return space.project(x.detach() + eps * g.sign(), x.detach(), eps).detach()


def pgd_attack(model, x: torch.Tensor, y: torch.Tensor, eps: float, *, steps: int = 20, alpha: float | None = None,
               random_start: bool = False, generator: torch.Generator | None = None,
               space: PixelSpace = PixelSpace()) -> torch.Tensor:
    """PGD-``steps`` adversarial pixel batch (module docstring); α defaults to 2.5·ε/steps."""
    eps = _check_eps(eps)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    alpha = 2.5 * eps / steps if alpha is None else _check_eps(alpha)
    x0 = x.detach()
    if eps == 0:
        return x0.clone()
    if random_start:
        noise = torch.rand(x0.shape, generator=generator, dtype=x0.dtype, device="cpu").to(x0.device)
        x_adv = space.project(x0 + (2.0 * noise - 1.0) * eps, x0, eps)
    else:
        x_adv = x0.clone()
    for _ in range(steps):
        g = _input_grad(model, space, x_adv, y)
        x_adv = space.project(x_adv + alpha * g.sign(), x0, eps).detach()
    return x_adv


def _batches(images, labels, meta, batch_size: int, device, max_samples: int | None):
    from fedray.data.loader import to_float

    n = int(np.asarray(labels).shape[0]) if not torch.is_tensor(labels) else int(labels.shape[0])
    if max_samples is not None:
        n = min(n, int(max_samples))
    for i in range(0, n, batch_size):
        j = min(i + batch_size, n)
        xb, yb = images[i:j], labels[i:j]
        if torch.is_tensor(xb):
            xb = xb.float() if xb.dtype != torch.uint8 else xb.float() / 255.0
        else:
            arr = np.array(xb)  # a writable copy of the batch (store arrays are read-only views)
            xb = to_float(torch.from_numpy(arr), meta, False) if meta is not None else (
                torch.from_numpy(arr).float() / 255.0 if arr.dtype == np.uint8 else torch.from_numpy(arr).float())
        yb = yb.long() if torch.is_tensor(yb) else torch.from_numpy(np.array(yb)).long()
        yield xb.to(device), yb.to(device)


def _accuracy(model, images, labels, attack, *, meta, normalize, batch_size, device, max_samples, clip) -> float:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    space = PixelSpace.from_meta(meta, normalize, clip)
    was_training = model.training
    model.eval()
    correct, total = 0, 0
    try:
        for xb, yb in _batches(images, labels, meta, batch_size, device, max_samples):
            x_adv = attack(model, xb, yb, space)
            with torch.no_grad():
                pred = model(space.to_model(x_adv)).argmax(1)
            correct += int((pred == yb).sum())
            total += int(yb.shape[0])
    finally:
        model.train(was_training)
    return correct / total if total else math.nan


def fgsm_accuracy(model, images, labels, eps: float, *, meta=None, normalize: bool = False, batch_size: int = 500,
                  device="cpu", max_samples: int | None = None, clip="auto") -> float:
    """Top-1 accuracy of ``model`` on FGSM examples of radius ``eps`` (pixel space; ``eps = 0``: clean accuracy).

    ``images``: stored arrays (uint8 / float32 numpy, as in the data store) or a float tensor already in
    pixel space; ``meta``/``normalize`` describe how the model's inputs are formed (see
    :class:`PixelSpace`); ``max_samples`` evaluates only the first n samples.
    """
    eps = _check_eps(eps)
    return _accuracy(model, images, labels, lambda m, x, y, s: fgsm_attack(m, x, y, eps, s), meta=meta,
                     normalize=normalize, batch_size=batch_size, device=device, max_samples=max_samples, clip=clip)


def pgd_accuracy(model, images, labels, eps: float, *, steps: int = 20, alpha: float | None = None,
                 random_start: bool = False, seed: int = 0, meta=None, normalize: bool = False, batch_size: int = 500,
                 device="cpu", max_samples: int | None = None, clip="auto") -> float:
    """Top-1 accuracy on PGD-``steps`` examples (α = 2.5·ε/steps by default; ``random_start`` draws the start
    uniformly in the ε-ball from a generator seeded with ``seed``). Arguments as :func:`fgsm_accuracy`."""
    eps = _check_eps(eps)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))

    def attack(m, x, y, s):
        return pgd_attack(m, x, y, eps, steps=steps, alpha=alpha, random_start=random_start, generator=gen, space=s)

    return _accuracy(model, images, labels, attack, meta=meta, normalize=normalize, batch_size=batch_size,
                     device=device, max_samples=max_samples, clip=clip)


# ----------------------------------------------------------------------------------------- eval hook
ADVERSARIAL_PARAMS = {
    "eps": ParamSpec(0.1, "pixel-space L-inf radius", float, ge=0),
    "pgd_steps": ParamSpec(20, "PGD steps", int, ge=1),
    "pgd_alpha": ParamSpec(None, "PGD step size (null: 2.5*eps/steps)", float, gt=0, nullable=True),
    "random_start": ParamSpec(False, "PGD starts at a uniform point of the eps-ball", bool),
    "every": ParamSpec(0, "evaluate every k rounds (0: only the last round)", int, ge=0),
    "max_samples": ParamSpec(None, "evaluate the first n test samples (null: all)", int, ge=1, nullable=True),
}
ADVERSARIAL_DEFAULTS = defaults(ADVERSARIAL_PARAMS)


def validate_adversarial_spec(spec: dict, path: str = "eval.adversarial") -> dict:
    """Check an ``eval.adversarial`` mapping and return it with defaults filled in (:data:`ADVERSARIAL_PARAMS`).

    Keys: ``eps`` (pixel-space L∞ radius, default 0.1; FedCCL states none), ``pgd_steps`` (20),
    ``pgd_alpha`` (null: 2.5·eps/steps), ``random_start`` (false), ``every`` (evaluate every k rounds; 0 = only the last round),
    ``max_samples`` (null: the whole test set). Raises :class:`~fedray.core.errors.ConfigError` naming the key.
    """
    return check_params(spec, ADVERSARIAL_PARAMS, path, ConfigError)


def robustness_due(spec: dict, rnd: int, last: bool) -> bool:
    """Whether round ``rnd`` evaluates robustness under ``spec`` (validated, non-empty)."""
    every = int(spec.get("every", 0))
    return last or (every > 0 and rnd % every == 0)


def robustness_report(model, images, labels, spec: dict, *, meta, normalize: bool, batch_size: int = 500,
                      device="cpu", seed: int = 0) -> dict:
    """Clean, FGSM and PGD accuracy of ``model`` under an ``eval.adversarial`` spec (module docstring)."""
    s = validate_adversarial_spec(dict(spec))
    kw = dict(meta=meta, normalize=normalize, batch_size=batch_size, device=device, max_samples=s["max_samples"])
    clean = fgsm_accuracy(model, images, labels, 0.0, **kw)
    fgsm = fgsm_accuracy(model, images, labels, s["eps"], **kw)
    pgd = pgd_accuracy(model, images, labels, s["eps"], steps=s["pgd_steps"], alpha=s["pgd_alpha"],
                       random_start=s["random_start"], seed=seed, **kw)
    n = int(len(labels)) if s["max_samples"] is None else min(int(len(labels)), int(s["max_samples"]))
    return {"eps": float(s["eps"]), "pgd_steps": int(s["pgd_steps"]), "samples": n,
            "clean_accuracy": clean, "fgsm_accuracy": fgsm, "pgd_accuracy": pgd}
