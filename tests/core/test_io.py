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
