"""tests/conftest.py collects the slowest files first (SLOW_FILES) so that none runs alone at
the end of `make test`'s workers: a renamed or deleted file there would silently stop counting."""

from __future__ import annotations

from pathlib import Path

from conftest import SLOW_FILES

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_file_exists():
    missing = [path for path in SLOW_FILES if not (ROOT / path).is_file()]
    assert not missing, f"SLOW_FILES names files that are not there: {missing}"
