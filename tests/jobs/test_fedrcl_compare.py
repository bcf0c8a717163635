"""jobs/fedrcl_compare.py: its configs for the embedded data and for the real datasets (CIFAR with the
GroupNorm ResNet-18). The runs themselves are measured in docs/reproductions.md; here nothing trains."""

from __future__ import annotations

import argparse


from fedray.config import from_dict


def _fedrcl_args(**over):
    base = dict(quick=False, rounds=None, source="mnist5k", model=None, data_root=None, analysis_every=None,
                backend="local", workers=None, threads=1, device="auto", seed=0, out="/tmp/unused")
    return argparse.Namespace(**{**base, **over})


def test_fedrcl_compare_configs_embedded_and_cifar():
    from jobs.fedrcl_compare import experiment_config

    mnist = from_dict(experiment_config("fedrcl", 0.05, _fedrcl_args()))
    assert mnist.model.name == "cnn_taps" and mnist.train.batch_size == 10 and mnist.train.augment is None
    assert mnist.data.partition.name == "balanced_dirichlet" and mnist.data.partition.params == {"alpha": 0.05}
    assert mnist.algorithm.params == {"weighting": "uniform", "lam": 0.7, "beta": 1.0, "tau": 0.05}
    cifar = from_dict(experiment_config("fedscl", 0.3, _fedrcl_args(source="cifar10", data_root="/data")))
    # unchanged on CIFAR: the paper's GroupNorm ResNet-18, batch 50, its augmentation
    assert cifar.model.name == "resnet18_gn" and cifar.train.batch_size == 50
    assert cifar.train.augment == ["rotate", "crop", "flip"] and cifar.data.root == "/data"
    extra = from_dict(experiment_config("moon", 0.3, _fedrcl_args()))
    assert extra.algorithm.name == "moon" and extra.algorithm.params == {}
