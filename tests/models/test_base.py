"""fedray.models.base: the pooled tap."""

from __future__ import annotations

import pytest
import torch

from fedray.models import pool_tap

torch.set_num_threads(1)


def test_pool_tap():
    m = torch.randn(2, 3, 4, 5)
    assert torch.allclose(pool_tap(m), m.mean(dim=(2, 3)))
    v = torch.randn(2, 7)
    assert pool_tap(v) is v
    with pytest.raises(ValueError, match="shape"):
        pool_tap(torch.randn(2, 3, 4))
