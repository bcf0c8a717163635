"""jobs/sweeps/*.yaml, the papers' comparisons as sweep files: each loads (every point's config valid), its tables
name every experiment apart, and its seed-0 points are the runs of the former jobs/*_compare.py (their config
hashes, pinned here, so the numbers of docs/reproductions.md stay those of these runs). Nothing trains."""

from __future__ import annotations

import pytest

from fedray.apps.sweep_spec import load_sweep
from fedray.config import from_dict
from tests.helpers import ROOT

# config hashes of the runs the former comparison jobs made (fedrcl_compare; scala_compare --small-model --lr 0.05;
# fedccl_compare's digits-balanced, digits-imbalanced and mnist-dir0.05 settings and --robustness)
SEED0_HASHES = {
    "fedrcl_mnist": ["278d54e4d66a", "5b7671391d8c", "7bd4780e0e41", "b944d45d3891", "cf21f1a42945", "fed5fd37ba03"],
    "scala_mnist": ["0bbcfd0205d9", "16d3968971c8", "1a45991de8e1", "1bd679f63540", "32b2477b60e2", "8caf16086d04",
                    "a5fbb858c5ad", "b6b63ce0f35e", "c33f5e5bd77c", "cda8425d9848"],
    "fedccl_digits": ["0b6a5672efbc", "0e31acc64ac6", "1aec01131796", "3c25da8b0b0e", "3c96b5bbaeda", "8f1e39ca5818",
                      "97a6c2d5b239", "abdb80bcccb8", "ae5b4a74552b", "b83745c35059", "c0d70625f919", "c5c84c8c61e1"],
    "fedccl_mnist": ["400d180b9bd4", "4255ec48e25f", "536682770a35", "63f290882245", "8e594dfa470c", "e21938185a21"],
    "fedccl_robustness": ["0a0a13ed60bf", "109c975f7314", "4178aedf7f3b"],
}


@pytest.mark.parametrize("name", sorted(SEED0_HASHES))
def test_paper_sweeps_keep_the_comparison_runs(name, tmp_path):
    spec = load_sweep(ROOT / "jobs" / "sweeps" / f"{name}.yaml", output_dir=tmp_path / name)
    assert sorted(p.hash for p in spec.points if p.values["seed"] == 0) == SEED0_HASHES[name]
    assert {p.values["seed"] for p in spec.points} == {0, 1, 2} and spec.tables
    assert not (tmp_path / name).exists()


def test_paper_sweeps_take_the_real_datasets_by_overrides(tmp_path):
    """FedRCL on CIFAR-10 with the GroupNorm ResNet-18 and FedCCL on Digit-5, as the sweep files' headers say."""
    cifar = load_sweep(ROOT / "jobs" / "sweeps" / "fedrcl_mnist.yaml", output_dir=tmp_path / "c",
                       overrides=["data.source=cifar10", "data.root=/data", "model.name=resnet18_gn",
                                  "train.batch_size=50", "train.augment=[rotate,crop,flip]"])
    cfg = from_dict(cifar.points[-1].config)
    assert (cfg.data.source, cfg.model.name, cfg.train.batch_size, cfg.train.augment) == \
        ("cifar10", "resnet18_gn", 50, ["rotate", "crop", "flip"])
    digit5 = load_sweep(ROOT / "jobs" / "sweeps" / "fedccl_digits.yaml", output_dir=tmp_path / "d",
                        overrides=["data.source=digit5", "data.root=/data", "data.partition.num_clients=5",
                                   "train.clients_per_round=5"])
    assert {from_dict(p.config).data.source for p in digit5.points} == {"digit5"}


def test_scala_fashion_mnist_sweep_is_the_papers_protocol_seed_0_first(tmp_path):
    """SCALA Tables 4/6 on Fashion-MNIST (jobs/sweeps/scala_fmnist.yaml): 11 methods x 4 skews x 3 seeds at §5.1's
    protocol, every cell's seed 0 before any seed 1 (the runs take CPU-hours and accumulate over sessions)."""
    spec = load_sweep(ROOT / "jobs" / "sweeps" / "scala_fmnist.yaml", output_dir=tmp_path / "s",
                      overrides=[f"data.root={tmp_path}"])
    assert len(spec.points) == 132 and [p.values["seed"] for p in spec.points] == [0] * 44 + [1] * 44 + [2] * 44
    cfgs = [from_dict(p.config) for p in spec.points[:44]]
    assert {c.algorithm.name for c in cfgs} == {"scala", "fedavg", "splitfed_v1", "splitfed_v2", "splitfed_v3",
                                                  "sfl_local_loss", "fedprox", "feddyn", "feddecorr", "fedlogit", "fedla"}
    assert {(c.data.partition.name, tuple(sorted(c.data.partition.params.items()))) for c in cfgs} == {
        ("classes_per_client", (("classes", 2),)), ("classes_per_client", (("classes", 4),)),
        ("dirichlet", (("alpha", 0.05),)), ("dirichlet", (("alpha", 0.1),))}
    c = next(c for c in cfgs if c.algorithm.name == "scala")
    assert (c.data.source, c.model.name, c.train.lr, c.train.clients_per_round, c.data.partition.num_clients,
            c.algorithm.params["batch_size"], c.algorithm.params["local_iters"]) == \
        ("fashion-mnist", "alexnet_split", 0.01, 10, 100, 320, 5)
    assert not (tmp_path / "s").exists()


def test_fedccl_table4_sweep_is_the_papers_protocol_seed_0_first(tmp_path):
    """FedCCL Table 4 on the full MNIST and Fashion-MNIST (jobs/sweeps/fedccl_table4.yaml): six methods x two data
    sets x 3 seeds at §5.1's protocol, every cell's seed 0 first; MNIST from the dataset cache (data.download)."""
    spec = load_sweep(ROOT / "jobs" / "sweeps" / "fedccl_table4.yaml", output_dir=tmp_path / "f")
    assert len(spec.points) == 36 and [p.values["seed"] for p in spec.points] == [0] * 12 + [1] * 12 + [2] * 12
    cfgs = [from_dict(p.config) for p in spec.points[:12]]
    assert {(c.data.source, c.algorithm.name) for c in cfgs} == {
        (s, a) for s in ("mnist", "fashion-mnist") for a in ("fedavg", "fedproc", "fedpcl", "fedproto", "fpl", "fedccl")}
    for c in cfgs:
        assert (c.model.name, c.data.partition.name, c.data.partition.params, c.data.partition.num_clients,
                c.train.clients_per_round, c.train.rounds, c.train.local_epochs, c.train.batch_size, c.train.lr) == \
            ("cnn4", "dirichlet", {"alpha": 0.05}, 10, 10, 100, 1, 64, 0.01)
        assert (c.data.root, c.data.download) == ((None, True) if c.data.source == "mnist"
                                                  else ("/usr/share/datasets/fashion-mnist", False))
    assert next(c for c in cfgs if c.algorithm.name == "fedccl").algorithm.params["tau"] == 0.07
    assert not (tmp_path / "f").exists()
