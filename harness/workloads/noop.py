"""The noop workload: a harness self-test that sleeps `sleep_s` seconds and measures nothing.

It exercises everything around a cell -- shipping, locking, launching, progress, results,
timeouts, retries -- without a model, and needs only the standard library (so it runs under any
host Python, with or without torch). Used by the SSH tests and the SSH benchmark
(results/ssh-benchmark.md); not a performance measurement.
"""

from __future__ import annotations

import time


def run(cell: dict, progress) -> dict:
    progress(stage="sleep", sleep_s=cell["sleep_s"])
    t0 = time.perf_counter()
    time.sleep(cell["sleep_s"])
    return {"metrics": {"slept_s": round(time.perf_counter() - t0, 6)}, "samples": {}}
