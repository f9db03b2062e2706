"""Workload registry: name -> the function that runs one cell of it on the worker.

Entries are import paths, each from its workload's spec (`runner`, harness/protocol/workloads/),
resolved only inside the worker, so the controller can list and validate workloads without
importing torch. A workload is its spec module there and its runner module here.
"""

from __future__ import annotations

import importlib

from harness.protocol.workloads import SPECS

REGISTRY: dict[str, str] = {name: spec.runner for name, spec in SPECS.items()}


def resolve(name: str):
    """The runner of workload `name`: run(cell: dict, progress: Callable[..., None]) -> dict."""
    module, func = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), func)
