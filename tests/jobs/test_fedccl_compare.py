"""jobs/fedccl_compare.py: the FedCCL comparison job's settings (nothing trains)."""

from __future__ import annotations

from pathlib import Path

import pytest



def test_fedccl_compare_settings():
    from jobs.fedccl_compare import ON_DISK, build_config, main

    for name, (setting_file, overrides) in ON_DISK.items():
        cfg = build_config(setting_file, [*overrides, "data.root=/data/domains"], "fedccl", 0, Path("/tmp/x"),
                           quick=False, backend="local", workers=None)
        assert cfg.data.source == name and cfg.data.partition.name == "domain"
        assert cfg.train.clients_per_round == cfg.data.partition.num_clients and cfg.data.root == "/data/domains"
    local = build_config("fedccl_digits.yaml", [], "fedccl-local", 0, Path("/tmp/x"),
                         quick=False, backend="local", workers=None)
    assert local.algorithm.name == "fedccl" and local.algorithm.params["signals"] == "local"
    with pytest.raises(SystemExit):  # an on-disk setting without --data-root is refused before any work
        main(["--settings", "office10", "--out", "/tmp/unused-fedccl"])
