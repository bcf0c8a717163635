"""fedray.core.io: the one driver lock (``exclusive_lock``) used by fedray sweep and fedray tune."""

from __future__ import annotations

import pytest

from fedray.core.io import exclusive_lock


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_frees_after(tmp_path):
    path = tmp_path / "d" / "driver.lock"
    with exclusive_lock(path, "pid 1 on host-a", "sweep X"):
        assert path.read_text().strip() == "pid 1 on host-a"
        with pytest.raises(RuntimeError, match=r"sweep X: another driver is running it \(pid 1 on host-a; lock "):
            with exclusive_lock(path, "pid 2 on host-b", "sweep X"):
                pass
    with exclusive_lock(path, "pid 3 on host-c", "sweep X"):  # released at the end of the block
        assert path.read_text().strip() == "pid 3 on host-c"


# ------------------------------------------------------------------------------------------ a full disk
def test_a_failed_append_is_cut_back_and_named_as_a_full_disk(tmp_path, monkeypatch):
    import fedray.core.io as io
    from fedray.core.errors import DiskFull

    path = tmp_path / "metrics.jsonl"
    io.append_bytes(path, b'{"round": 1}\n')
    monkeypatch.setenv(io.FAULT_ENV, "metrics.jsonl@2=enospc")
    monkeypatch.setattr(io, "_counts", {})
    io.append_bytes(path, b'{"round": 2}\n')  # the first write under the spec: not its second
    with pytest.raises(DiskFull, match=r"^no space left on device writing .*metrics\.jsonl") as err:
        io.append_bytes(path, b'{"round": 3, "padding": "xxxxxxxxxxxxxxxxxxxxxxxx"}\n')
    assert err.value.errno == 28 and isinstance(err.value, OSError)
    assert path.read_bytes() == b'{"round": 1}\n{"round": 2}\n'  # the half line written is gone


def test_a_full_disk_in_an_atomic_write_keeps_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    import fedray.core.io as io
    from fedray.core.errors import DiskFull

    path = tmp_path / "run.json"
    io.atomic_write_text(path, "old\n")
    monkeypatch.setenv(io.FAULT_ENV, "run.*@1=enospc")
    monkeypatch.setattr(io, "_counts", {})
    with pytest.raises(DiskFull, match="run.json"):
        io.atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize("spec", ["ckpt-*.npz@0=enospc", "ckpt-*.npz=enospc", "x@1=explode", "@1=enospc"])
def test_a_malformed_fault_spec_is_refused_naming_it(tmp_path, monkeypatch, spec):
    import fedray.core.io as io

    monkeypatch.setenv(io.FAULT_ENV, spec)
    with pytest.raises(ValueError, match=f"{io.FAULT_ENV}: .* is not GLOB@N=ACTION"):
        io.atomic_write_text(tmp_path / "ckpt-000001.npz", "x")


def test_temporary_names_are_those_of_the_atomic_writer():
    from fedray.core.io import is_temp_name

    assert is_temp_name(".ckpt-000002.npz.j8igl2ma.tmp.npz") and is_temp_name(".run.json.abc123.tmp")
    assert not is_temp_name("run.json") and not is_temp_name(".space-reserve") and not is_temp_name("x.tmp")


def test_two_faults_on_one_glob_count_each_write_once(tmp_path, monkeypatch):
    import fedray.core.io as io
    from fedray.core.errors import DiskFull

    monkeypatch.setenv(io.FAULT_ENV, "ckpt-*@2=enospc,ckpt-*@3=enospc")
    monkeypatch.setattr(io, "_counts", {})
    outcomes = []
    for i in range(1, 5):
        try:
            io.atomic_write_text(tmp_path / f"ckpt-{i}", "x")
            outcomes.append("ok")
        except DiskFull:
            outcomes.append("full")
    assert outcomes == ["ok", "full", "full", "ok"]
