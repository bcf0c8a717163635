"""Chaos: random fault schedules over whole fedray runs, each checked against fedray's promise (bench/chaos.py)."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from chaos import main

    sys.exit(main())
