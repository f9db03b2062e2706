"""Workload registry: name -> the function that runs one cell of it on the worker.

Entries are import paths, resolved only inside the worker, so the controller can list and
validate workloads without importing torch. A later workload (kernel timing, a serving
endpoint, calibration) is one module and one line here.
"""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {
    "decode": "harness.worker.workloads.decode:run",
    "calibrate": "harness.worker.workloads.calibrate:run",   # checks the idle meter (issue 5)
    "noop": "harness.worker.workloads.noop:run",             # harness self-test: sleeps sleep_s
    "kernel": "harness.worker.workloads.kernel:run",         # one verify-attention kernel vs roofline
}


def resolve(name: str):
    """The runner of workload `name`: run(cell: dict, progress: Callable[..., None]) -> dict."""
    module, func = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), func)
