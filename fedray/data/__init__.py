"""fedray's data layer: sources, partitioners, the partition store. ``fedray.data.from_arrays`` and
``fedray.data.from_hf`` (:mod:`fedray.data.memory`) register in-memory data for a run; they are imported on first
use, so importing this package stays light."""

from __future__ import annotations

import importlib

__all__ = ["InMemoryData", "from_arrays", "from_hf"]


def __getattr__(name: str):
    if name in __all__:
        value = getattr(importlib.import_module("fedray.data.memory"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedray.data' has no attribute {name!r}")
