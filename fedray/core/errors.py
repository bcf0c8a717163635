"""Error types shared across fedray's layers (here so that no two layers import each other for them)."""

from __future__ import annotations

__all__ = ["ConfigError", "DiskFull", "TransientError"]


class ConfigError(ValueError):
    """Invalid configuration; the message starts with the dotted name of the field."""


class TransientError(RuntimeError):
    """A client failure that a retry may not meet again (an injected fault, a flaky resource): retried by the
    failure policy, where an error of the client's code (a deterministic TypeError, AttributeError, ...) is not."""


class DiskFull(OSError):
    """A write failed because the disk (or a quota) is full: ``ENOSPC`` / ``EDQUOT``, with a message naming the file
    (:mod:`fedray.core.io`). The file written is as it was before; a run stops loudly with this reason."""

    def __str__(self) -> str:
        return str(self.strerror)
