"""The pytest_benchmark workload's runner: there is nothing to run here. Its cells are
measured by pytest-benchmark in the project that owns the test and ingested from its JSON
(`harness ingest FILE.json`); a scenario or a gate that asks a worker to measure one gets a
refusal that says so, instead of numbers from a different harness."""

from __future__ import annotations

from harness.protocol.errors import CellRefused


def run(cell: dict, progress) -> dict:
    raise CellRefused(
        f"benchmark {cell['benchmark']!r} is measured by pytest-benchmark, not by a worker: run "
        f"pytest --benchmark-json=FILE, then `harness ingest FILE`; gate that run with "
        f"`harness gate SCENARIO --baseline ... --run RUN_ID`")
