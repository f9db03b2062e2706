"""The pytest_benchmark workload: one benchmark of a pytest-benchmark run, ingested from the
JSON file pytest-benchmark writes (`harness ingest FILE.json`, harness/commands/ingest.py);
pytest measures it, no worker does.

`benchmark` is the test's node id as pytest-benchmark records it (its `fullname`,
`tests/test_ops.py::test_scale[64]`), `bench_group` its benchmark group and `bench_params` its
parametrisation (`n=64, dtype=float32`): a later run of the same test is the same cell, so it is
gated against this one. The metric is kernel_us, microseconds per call (pytest-benchmark times
rounds of N calls and counts each call 1/N of its round), gated as the kernel workloads' is.

Runner: harness/worker/workloads/pytest_benchmark.py, which refuses the cell with that advice.
"""

from __future__ import annotations

from harness.protocol.workloads import Param, WorkloadSpec

# Shown in tables, labels and MLflow params: no control characters, and no longer than a test
# id that a person reads (MLflow keeps param values up to 6000 characters).
_TEXT = r"^[^\x00-\x1f\x7f]{1,1000}$"

PARAMS = (
    Param("benchmark", "", str, "the node id of a pytest-benchmark test (its fullname, "
                                "tests/test_x.py::test_y[param])", pattern=_TEXT),
    Param("bench_group", None, str, "a pytest-benchmark group name, or null", pattern=_TEXT,
          nullable=True),
    Param("bench_params", "", str, "the benchmark's parameters as name=value, comma-separated, "
                                   "or ''", pattern=r"^[^\x00-\x1f\x7f]{0,1000}$"),
)


def check_named(cell: dict):
    """A cell names the benchmark it is (the default, '', names none)."""
    if not cell["benchmark"]:
        return ("benchmark",), ("a pytest_benchmark cell names its test: benchmark: "
                                "tests/test_x.py::test_y (cells of this workload come from "
                                "harness ingest FILE.json)")
    return None


def label(c: dict) -> str:
    """e.g. `bench tests/test_ops.py::test_scale[64] group=scale`."""
    parts = ["bench", c["benchmark"] or "?"]
    if c["bench_group"]:
        parts.append(f"group={c['bench_group']}")
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="pytest_benchmark",
    runner="harness.worker.workloads.pytest_benchmark:run",
    order=6,
    params=PARAMS,
    checks=(check_named,),
    label=label,
    policies={"kernel_us": {"direction": "lower", "threshold_rel": 0.03}},
)
