"""The GPU-relevant part of the suite (marker ``gpu``; docs/gpu.md): whole runs with ``engine.device: auto``, so on a
machine with a GPU the workers, the coordinator and the split server train there, and here on the CPU. They need
neither mlxtend nor the network (the seeded images of bench/gpu/gpu_plugin.py), so bench/gpu/run_all.sh runs them
on the GPU machine as they are: ``pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedray.config import from_dict
from fedray.driver.runner import run_experiment
from tests.helpers import ROOT, set_nested

pytestmark = pytest.mark.gpu

PLUGIN = str(ROOT / "bench" / "gpu" / "gpu_plugin.py")


def images_config(tmp_path, **over) -> dict:
    """A W1-shaped FedAvg run on 1x28x28 seeded images (100 Dirichlet clients), in-process, ``engine.device: auto``."""
    cfg = {
        "seed": 0, "plugins": [PLUGIN],
        "data": {"source": "gpu-images", "normalize": False, "cache_dir": str(tmp_path / "partitions"),
                 "params": {"n_train": 1000, "n_test": 200, "channels": 1, "size": 28},
                 "partition": {"name": "dirichlet", "num_clients": 50, "params": {"alpha": 0.3}}},
        "model": {"name": "fedavg_cnn"},
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": 2, "clients_per_round": 4, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 2},
        "engine": {"backend": "local", "num_workers": 1, "device": "auto"},
        "output": {"root": str(tmp_path / "runs"), "checkpoint_every": 0, "tensorboard": False, "progress": False},
    }
    return set_nested(cfg, over)


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


def _here() -> str:
    """What run.json's ``device`` names for this machine's GPU, or ``cpu`` without one."""
    import torch

    return f"cuda ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "cpu"


def _recorded_device(result) -> dict:
    import json

    return json.loads((result.run_dir / "run.json").read_text())["device"]


@pytest.fixture
def deterministic_torch():
    """Put back torch's process-wide modes and CUBLAS_WORKSPACE_CONFIG after a test that sets engine.deterministic
    in this process (engine.backend: local)."""
    import os

    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
    if before[3] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[3]


def test_replica_takes_the_gpu_and_the_deterministic_modes(tmp_path, deterministic_torch):
    """engine.device: auto puts the model on the GPU when torch sees one; engine.deterministic: true switches on
    torch's deterministic algorithms, cuDNN's deterministic kernels and cuBLAS's fixed workspace in that process."""
    import os

    import torch

    from fedray.config import ExperimentConfig
    from fedray.driver.setup import prepare_data
    from fedray.engine.replica import CUBLAS_WORKSPACE, Replica
    from fedray.plugins import load_plugins

    cfg = from_dict(images_config(tmp_path, engine__deterministic=True))
    load_plugins(cfg)
    _, store = prepare_data(cfg, log=lambda *a: None)
    assert isinstance(cfg, ExperimentConfig)
    rp = Replica(cfg.to_dict(), str(store.path), "auto")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert rp.device.type == want and next(rp.model.parameters()).device.type == want
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (CUBLAS_WORKSPACE, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def test_deterministic_run_is_repeatable_in_process(tmp_path, deterministic_torch):
    """Two runs of the same config with engine.deterministic: true give the same bits on this machine's device."""
    a = _run(images_config(tmp_path / "a", engine__deterministic=True))
    b = _run(images_config(tmp_path / "b", engine__deterministic=True))
    assert a.weights_hash == b.weights_hash
    assert np.isfinite(a.rounds[-1]["loss"])
    assert _recorded_device(a) == {"coordinator": _here(), "workers": [_here()]}


@pytest.mark.ray
def test_fractional_gpu_workers_match_in_process_run(tmp_path, ray_session, deterministic_torch):
    """Two Ray workers with half a GPU each (the session's Ray has 1 GPU: the real one on a GPU machine, a fake one
    elsewhere) train on the device and give the in-process run's weights, with engine.deterministic: true."""
    local = _run(images_config(tmp_path / "l", engine__deterministic=True))
    ray2 = _run(images_config(tmp_path / "r", engine__deterministic=True, engine__backend="ray",
                              engine__num_workers=2, engine__worker_num_gpus=0.5, engine__worker_num_cpus=0.5))
    assert ray2.weights_hash == local.weights_hash
    assert ray2.rounds[-1]["workers"] == 2
    # the workers' share of the GPU is where they train (a fake logical GPU: the CPU)
    recorded = _recorded_device(ray2)
    assert recorded["workers"] == [_here()] and recorded["coordinator"] in ("cpu", _here())


def test_multi_client_on_device_close_to_sequential(tmp_path):
    """engine.multi_client: 2 (stacked parameters, vmapped forward) on this machine's device stays within float
    tolerance of one client at a time (batched kernels sum in another order)."""
    seq = _run(images_config(tmp_path / "s"))
    grp = _run(images_config(tmp_path / "g", engine__multi_client=2))
    a = np.load(seq.run_dir / "final_weights.npy")
    b = np.load(grp.run_dir / "final_weights.npy")
    assert np.allclose(a, b, rtol=1e-3, atol=1e-4), float(np.abs(a - b).max())


def test_split_server_on_device(tmp_path):
    """SCALA with the coordinator's server-side model on the device (the GPU when there is one) trains."""
    res = _run(images_config(tmp_path, data__partition={"name": "classes_per_client", "num_clients": 20,
                                                        "params": {"classes": 2}},
                             data__normalize=True, model={"name": "alexnet_split",
                                                          "params": {"channels": [8, 8, 8, 16, 16], "fc": [32, 16]}},
                             algorithm={"name": "scala", "params": {"batch_size": 40, "local_iters": 2}},
                             train__lr=0.01))
    rows = res.rounds
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[-1]["split"]["iterations"] == 2 and np.isfinite(rows[-1]["loss"])


def test_out_of_gpu_memory_fails_naming_worker_num_gpus(tmp_path):
    """A client whose training runs out of GPU memory (the probe model raises torch's CUDA out-of-memory error, as
    a worker's too small engine.worker_num_gpus share does) is retried, dropped, and the run fails with an error
    that names engine.worker_num_gpus."""
    cfg = images_config(tmp_path, model={"name": "gpu_oom_probe"}, engine__max_client_retries=1)
    with pytest.raises(Exception, match=r"OutOfMemoryError: engine\.worker_num_gpus: this worker ran out of GPU memory"):
        _run(cfg)
