"""Waiting on another process's effect in a test: poll a condition until a deadline."""

from __future__ import annotations

import time


def wait_until(condition, seconds: float = 10.0, step: float = 0.05) -> bool:
    """Whether `condition()` became true within `seconds` (checked once more at the deadline,
    so a slow last poll never reads as a timeout)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())
