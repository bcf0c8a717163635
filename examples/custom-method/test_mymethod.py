"""The example method's own tests: its loss against a naive loop written from eq. 1, and a two-round run.

    cd examples/custom-method && python -m pytest -q test_mymethod.py
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mymethod import logit_l2_loss

HERE = Path(__file__).resolve().parent


def test_loss_is_eq_1_written_as_a_loop():
    g = torch.Generator().manual_seed(0)
    logits, y, lam = torch.randn(7, 5, generator=g), torch.randint(0, 5, (7,), generator=g), 0.3
    naive = sum(-F.log_softmax(logits[i], 0)[y[i]] for i in range(7)) / 7
    naive = naive + lam * sum(float(sum(v * v for v in logits[i])) for i in range(7)) / 7
    assert torch.allclose(logit_l2_loss(logits, y, lam), torch.as_tensor(naive, dtype=logits.dtype), atol=1e-6)


def test_two_rounds_train(tmp_path):
    from fedray.config import load_config
    from fedray.driver.runner import run_experiment

    cfg = load_config(HERE / "exp.yaml", ["train.rounds=2", "engine.backend=local", f"output.root={tmp_path}"])
    res = run_experiment(cfg, log=lambda *a, **k: None, progress=False)
    assert len(res.rounds) == 2 and np.isfinite(res.rounds[-1]["loss"]) and res.accuracy > 0.1
