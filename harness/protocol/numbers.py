"""What counts as a measured number in a result: a finite int or float, never a bool.

Results are JSON from workers of any age: a metric may be null, NaN or a flag, and `True` is an
int to Python. Every reader that draws, logs, gates or summarises numbers asks this one
question; standard library only, so the worker can ask it too.
"""

from __future__ import annotations

import math


def is_finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
