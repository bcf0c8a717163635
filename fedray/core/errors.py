"""Error types shared across fedray's layers (here so that no two layers import each other for them)."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Invalid configuration; the message starts with the dotted name of the field."""
