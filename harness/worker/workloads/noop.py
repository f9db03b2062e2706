"""The noop workload: a harness self-test that sleeps `sleep_s` seconds and measures nothing.

It exercises everything around a cell -- shipping, locking, launching, progress, results,
timeouts, retries -- without a model, and needs only the standard library (so it runs under any
host Python, with or without torch). Used by the SSH tests and the SSH benchmark
(results/ssh-benchmark.md); not a performance measurement.

`worker_pid` says which worker process ran the cell: a serving worker runs many cells of a slot
in one process, and the tests check that it does (and that a broken one is replaced).
"""

from __future__ import annotations

import os
import time


def run(cell: dict, progress) -> dict:
    progress(stage="sleep", sleep_s=cell["sleep_s"])
    t0 = time.perf_counter()
    time.sleep(cell["sleep_s"])
    return {"metrics": {"slept_s": round(time.perf_counter() - t0, 6), "worker_pid": os.getpid()},
            "samples": {}}
