"""The shared progress bar: shown only on a terminal without TQDM_DISABLE; lines go above it, or to the log."""

from __future__ import annotations

import io
import sys

from fedray.reporting.progress import ProgressBar, bars_on


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_without_a_terminal_or_with_tqdm_disable(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(sys, "stderr", _Terminal())
    monkeypatch.setenv("TQDM_DISABLE", "1")
    bar = ProgressBar(5, "trial", log=lines.append)
    assert not bar.active and not bars_on()
    bar.update(1, best="0.9")
    bar.write("[tune] trial 0 started")
    bar.close()
    assert lines == ["[tune] trial 0 started"] and sys.stderr.getvalue() == ""
    monkeypatch.delenv("TQDM_DISABLE")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, not a terminal
    assert not ProgressBar(5, "trial").active and not bars_on(True)


def test_bar_on_a_terminal_counts_and_writes_lines_above(monkeypatch, capsys):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    lines: list[str] = []
    assert not ProgressBar(5, "point", enabled=False).active
    with ProgressBar(5, "trial", desc="study s", initial=2, log=lines.append) as bar:
        assert bar.active
        bar.update(1, best="0.9123")
        bar.write("[tune] trial 3 value [0.9123]")
        bar.reset(1)
    shown = err.getvalue()
    assert "study s" in shown and "3/5" in shown and "best=0.9123" in shown and "1/5" in shown
    assert "[tune] trial 3 value [0.9123]" in capsys.readouterr().out and lines == []
