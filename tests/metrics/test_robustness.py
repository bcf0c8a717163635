"""fedray.metrics.robustness: FGSM / PGD attacks and the adversarial eval hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.config import ConfigError, from_dict
from tests.helpers import cnn4_config as _cfg, run_quiet as _run, small_config

pytestmark = pytest.mark.usefixtures("_cached_sources")  # tests/conftest.py


def test_adversarial_eval_hook_reports_clean_fgsm_pgd(tmp_path, partition_cache):
    cfg = _cfg(tmp_path, partition_cache, "fedavg", {}, train={"rounds": 1, "clients_per_round": 2, "batch_size": 64,
                                                                "lr": 0.05},
               eval={"adversarial": {"eps": 0.1, "pgd_steps": 3, "max_samples": 200}})
    rob = _run(cfg).rounds[-1]["robustness"]
    assert rob["samples"] == 200 and rob["eps"] == 0.1
    assert rob["pgd_accuracy"] <= rob["clean_accuracy"] and rob["fgsm_accuracy"] <= rob["clean_accuracy"]


# ------------------------------------------------------------------------------------------- robustness
@pytest.fixture(scope="module")
def trained_mlp():
    import fedray.data.sources as sources
    from fedray.data.loader import to_float
    from fedray.models import build_model

    bundle = sources.load_source("mnist5k")
    meta = bundle.meta
    xtr, ytr = np.asarray(bundle.train.images()), np.asarray(bundle.train.labels)
    torch.manual_seed(0)
    model = build_model("mlp", in_channels=1, image_size=28, num_classes=10, hidden=[64])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = to_float(torch.from_numpy(xtr), meta, True)
    y = torch.from_numpy(ytr).long()
    for _ in range(3):
        for i in range(0, len(y), 64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64]).backward()
            opt.step()
    return model, np.asarray(bundle.test.images()), np.asarray(bundle.test.labels), meta


def test_fgsm_eps0_is_clean_and_pgd_le_fgsm_le_clean(trained_mlp):
    from fedray.metrics import evaluate
    from fedray.metrics.robustness import fgsm_accuracy, pgd_accuracy

    model, xte, yte, meta = trained_mlp
    clean = evaluate(model, xte, yte, meta=meta, normalize=True)["accuracy"]
    assert clean > 0.8
    assert fgsm_accuracy(model, xte, yte, 0.0, meta=meta, normalize=True) == clean
    fgsm = fgsm_accuracy(model, xte, yte, 0.1, meta=meta, normalize=True)
    pgd = pgd_accuracy(model, xte, yte, 0.1, steps=10, meta=meta, normalize=True)
    assert pgd <= fgsm < clean
    assert pgd_accuracy(model, xte, yte, 0.0, meta=meta, normalize=True) == clean


def test_attacks_stay_in_the_pixel_eps_ball(trained_mlp):
    from fedray.metrics.robustness import PixelSpace, fgsm_attack, pgd_attack

    model, xte, yte, meta = trained_mlp
    space = PixelSpace.from_meta(meta, normalize=True)
    x = torch.from_numpy(xte[:64]).float() / 255.0
    y = torch.from_numpy(yte[:64]).long()
    assert torch.allclose(space.to_pixels(space.to_model(x)), x, atol=1e-6)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = None
    for xa in (fgsm_attack(model, x, y, 0.2, space),
               pgd_attack(model, x, y, 0.2, steps=5, random_start=True, generator=gen, space=space)):
        assert float((xa - x).abs().max()) <= 0.2 + 1e-6
        assert float(xa.min()) >= 0.0 and float(xa.max()) <= 1.0
    assert all(p.grad is None for p in model.parameters())  # attacks leave parameter gradients alone


@pytest.mark.parametrize(
    "spec,field",
    [({"eps": -1}, "eps"), ({"pgd_steps": 0}, "pgd_steps"), ({"radius": 0.1}, "radius"), ({"every": 1.5}, "every")],
)
def test_adversarial_eval_config_errors(tmp_path, partition_cache, spec, field):
    cfg = small_config(tmp_path, partition_cache, eval={"adversarial": spec})
    with pytest.raises(ConfigError, match=rf"eval\.adversarial\.{field}\b"):
        from_dict(cfg)
