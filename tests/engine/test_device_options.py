"""engine.deterministic (the config field and what it switches on) and the errors that name the config field behind
them (a worker's GPU share out of memory, an op without a deterministic kernel): fedray/engine/outcomes.py,
fedray/engine/replica.py. Whole runs on the device: tests/gpu."""

from __future__ import annotations

import os

import pytest
import torch

from fedray.config import ConfigError, config_hash, dump_config, from_dict
from fedray.engine.outcomes import DETERMINISM_HINT, GPU_OOM_HINT, error_hint, error_text, is_fatal
from fedray.engine.replica import CUBLAS_WORKSPACE, limit_gpu_memory, use_deterministic_torch


def _raised(err: BaseException) -> str:
    try:
        raise err
    except BaseException as e:  # noqa: BLE001
        return error_text(e)


def test_cuda_out_of_memory_names_worker_num_gpus_and_stays_transient():
    err = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    text = _raised(err)
    first = text.splitlines()[0]  # the ledger's failure column
    assert first.startswith(f"OutOfMemoryError: {GPU_OOM_HINT}. CUDA out of memory")
    assert "engine.worker_num_gpus" in first
    assert not is_fatal(err)  # retried, then dropped, as before


@pytest.mark.parametrize("device, index", [("cuda", 3), ("cuda:1", 1)])
def test_gpu_share_limits_the_allocator_of_the_device_by_index(monkeypatch, device, index):
    # torch's set_per_process_memory_fraction takes an index and raises on a plain torch.device("cuda"): on the
    # first real GPU (issue 32) every worker with a GPU share failed its set-up that way
    calls = []

    def fake_set(fraction, dev):
        assert isinstance(dev, int), dev  # what torch accepts: not torch.device("cuda")
        calls.append((fraction, dev))

    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fake_set)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    limit_gpu_memory(torch.device(device), 0.25)
    limit_gpu_memory(torch.device(device), 2)  # a share above one GPU: the whole of it
    assert calls == [(0.25, index), (1.0, index)]


def test_op_without_deterministic_kernel_names_the_flag():
    err = RuntimeError("adaptive_max_pool2d_backward_cuda does not have a deterministic implementation, but you set "
                       "'torch.use_deterministic_algorithms(True)'")
    assert error_hint(err) == DETERMINISM_HINT
    assert _raised(err).startswith(f"RuntimeError: {DETERMINISM_HINT}. adaptive_max_pool2d")
    assert is_fatal(err)


@pytest.mark.parametrize("err", [ValueError("bad"), MemoryError("host"), RuntimeError("CUDA error: launch failure")])
def test_other_errors_read_as_before(err):
    assert error_hint(err) is None
    assert _raised(err).splitlines()[0] == f"{type(err).__name__}: {err}"


def test_config_field_checked_hashed_only_when_on_and_dumped_only_when_on():
    base = from_dict({})
    assert base.engine.deterministic is False
    on = from_dict({"engine": {"deterministic": True}})
    assert config_hash(on) != config_hash(base)  # other GPU kernels: other bits
    assert config_hash(from_dict({"engine": {"deterministic": False}})) == config_hash(base)  # earlier runs' names
    assert "deterministic" not in dump_config(base) and "deterministic: true" in dump_config(on)
    with pytest.raises(ConfigError, match=r"engine\.deterministic"):
        from_dict({"engine": {"deterministic": "yes"}})


def test_use_deterministic_torch_sets_the_process_modes(monkeypatch):
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        use_deterministic_torch()
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's choice is kept
        use_deterministic_torch()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
