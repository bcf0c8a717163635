"""The progress bar of every long command (``fedray run`` rounds, ``fedray tune`` trials, ``fedray scale``
points; sweeps use it the same way): a tqdm bar on stderr when stderr is a terminal, nothing otherwise.

Without a terminal (a log file, CI, ``ray job submit``), or with ``TQDM_DISABLE`` set (the tests set it),
there is no bar and the commands' own one-line-per-step log lines are the progress report. While a bar is
shown, :meth:`ProgressBar.write` prints a line above it (``tqdm.write``) instead of through it.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ProgressBar", "bars_on"]


def bars_on(enabled: bool = True) -> bool:
    """Whether a bar would be shown: asked for, stderr is a terminal and ``TQDM_DISABLE`` is not set."""
    return bool(enabled) and sys.stderr.isatty() and not os.environ.get("TQDM_DISABLE")


class ProgressBar:
    """``ProgressBar(total, unit)``: ``update(n, **postfix)``, ``reset(done)``, ``write(line)``, ``close()``
    (or ``with``). ``active`` says whether a bar is shown; when not, every method but ``write`` does
    nothing and ``write`` hands the line to ``log``."""

    def __init__(self, total: int, unit: str, desc: str | None = None, initial: int = 0, enabled: bool = True,
                 log=print):
        self.log = log
        self.bar = None
        if bars_on(enabled):
            from tqdm import tqdm

            # disable=False: whether to show it was decided above (tqdm reads TQDM_DISABLE once, at import)
            self.bar = tqdm(total=int(total), initial=int(initial), unit=unit, desc=desc, dynamic_ncols=True,
                            disable=False)

    @property
    def active(self) -> bool:
        return self.bar is not None

    def update(self, n: int = 1, **postfix) -> None:
        if self.bar is None:
            return
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(n)

    def reset(self, done: int) -> None:
        """Back to ``done`` steps (e.g. a run that went back to its last checkpoint)."""
        if self.bar is not None:
            self.bar.reset(total=self.bar.total)
            self.bar.update(done)

    def write(self, line: str) -> None:
        if self.bar is None:
            self.log(line)
        else:
            from tqdm import tqdm

            tqdm.write(line, file=sys.stdout)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
