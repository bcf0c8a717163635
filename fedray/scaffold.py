"""``fedray new NAME``: a plugin project to start a method of one's own from (docs/extending.md).

It writes ``./NAME/`` holding a package ``NAME`` (a method: FedAvg whose clients train with label smoothing,
and a model built from two plain modules with :meth:`fedray.FedModel.wrap`, so every algorithm can use it), a
config that runs it on the embedded MNIST subset, a test of the loss against its equation written as a loop
and of a two-round run, and a README. Nothing is overwritten: an existing directory is refused.
"""

from __future__ import annotations

import importlib.util
import keyword
from pathlib import Path

from fedray.core.errors import ConfigError
from fedray.core.io import atomic_write_text

__all__ = ["new_project"]

PACKAGE = '''"""{name}: FedAvg whose clients train with label smoothing, and a small CNN (a fedray plugin project).

Each client minimises the label-smoothed cross-entropy of its batch (Szegedy et al. 2016, Sec. 7):

    L = (1/B) sum_i [ (1 - eps) * (-log p_i[y_i]) + eps * (1/C) sum_c (-log p_i[c]) ]          (eq. 1)

with p_i = softmax(f(x_i)) over C classes; the server averages as FedAvg does (w = sum_k n_k/n w_k, eq. 2,
fedray's own weighted average). Edit ``smoothed_ce`` and ``make_loss`` to make the method yours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fedray
from fedray import ParamSpec


def smoothed_ce(logits: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 1."""
    logp = F.log_softmax(logits, dim=1)
    return ((1 - eps) * -logp.gather(1, y[:, None]).squeeze(1) + eps * -logp.mean(dim=1)).mean()


@fedray.register_algorithm
class {cls}(fedray.Algorithm):
    """FedAvg with label-smoothed local training (eq. 1)."""

    name = "{name}"
    description = "FedAvg with label smoothing on the clients ({name} plugin)"
    params_spec = {{"eps": ParamSpec(0.1, "label smoothing eps (eq. 1)", float, ge=0, le=1)}}

    def make_loss(self, ctx, payload):
        eps = float(self.params["eps"])
        return lambda model, x, y: smoothed_ce(model(x), y, eps)


@fedray.register_model("{name}_cnn", options={{"width": 16}}, inputs="image",
                       description="two conv layers + a linear classifier ({name} plugin)")
def cnn(inp, num_classes: int, width: int):
    """Plain modules wrapped as a FedModel: the features are tapped 'embedding' (the methods that need feature
    taps or a split point can use it)."""
    features = torch.nn.Sequential(
        torch.nn.Conv2d(inp.in_channels, width, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten())
    return fedray.FedModel.wrap(features, torch.nn.Linear(2 * width, num_classes))
'''

CONFIG = '''# {name} on the embedded MNIST subset: `fedray run exp.yaml` (from any directory; plugins are found next to
# this file). Add `engine.backend=local` to run in-process.
plugins: [{name}]
seed: 0
data:
  source: mnist5k
  partition: {{name: dirichlet, num_clients: 20, params: {{alpha: 0.5}}}}
model: {{name: {name}_cnn, params: {{width: 16}}}}
algorithm: {{name: {name}, params: {{eps: 0.1}}}}
train: {{rounds: 10, clients_per_round: 5, batch_size: 32, lr: 0.05}}
'''

TEST = '''"""{name}'s own tests: the loss against eq. 1 written as a loop, and a two-round run (python -m pytest -q)."""

import math
from pathlib import Path

import torch

from {name} import smoothed_ce

HERE = Path(__file__).resolve().parent


def test_the_loss_is_eq_1():
    g = torch.Generator().manual_seed(0)
    logits, y, eps = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.tensor([0, 3, 1, 1, 2, 0]), 0.2
    total = 0.0
    for i in range(6):
        logz = math.log(sum(math.exp(v) for v in logits[i].tolist()))
        nll = [logz - v for v in logits[i].tolist()]
        total += (1 - eps) * nll[int(y[i])] + eps * sum(nll) / 4
    assert abs(float(smoothed_ce(logits, y, eps)) - total / 6) < 1e-12


def test_two_rounds_train(tmp_path):
    from fedray.config import load_config
    from fedray.driver.runner import run_experiment

    cfg = load_config(HERE / "exp.yaml", ["train.rounds=2", "engine.backend=local", f"output.root={{tmp_path}}"])
    res = run_experiment(cfg, progress=False, log=lambda *a, **k: None)
    assert len(res.rounds) == 2 and math.isfinite(res.rounds[-1]["loss"])
'''

README = '''# {name}

A fedray plugin project (`fedray new {name}`): the package `{name}/` registers the algorithm `{name}` and the
model `{name}_cnn`; `exp.yaml` names it in `plugins:`.

```bash
fedray run exp.yaml                      # on a local Ray; engine.backend=local runs in-process
python -m pytest -q                      # the method's own tests
fedray datasets exp.yaml | grep plugin   # what the plugin registers
```

Editing the code gives the config a new run directory (the code's digest is part of the run's identity);
docs/extending.md of fedray explains the hooks, the models, data sources, partitioners and metrics.
'''


def new_project(name: str, parent: str | Path = ".") -> Path:
    """Write the project ``parent/name`` (module docstring); the directory it made."""
    if not name.isidentifier() or keyword.iskeyword(name) or not name.islower():
        raise ConfigError(f"{name!r} must be a lower-case Python identifier (the plugin's module name)")
    if importlib.util.find_spec(name) is not None:
        raise ConfigError(f"a module {name!r} is importable already; choose a name that shadows nothing")
    root = Path(parent) / name
    if root.exists():
        raise ConfigError(f"{root} exists; nothing was written")
    cls = "".join(p.capitalize() for p in name.split("_")) or name
    files = {root / name / "__init__.py": PACKAGE, root / "exp.yaml": CONFIG, root / f"test_{name}.py": TEST,
             root / "README.md": README}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text.format(name=name, cls=cls))
    return root
