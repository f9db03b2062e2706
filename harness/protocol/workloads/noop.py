"""The noop workload: a harness self-test that sleeps `sleep_s` seconds and measures nothing.

Runner: harness/worker/workloads/noop.py (standard library only: it runs under any host Python).
The label is the default one (`noop sleep_s=0`); no gate policies.
"""

from __future__ import annotations

from harness.protocol.workloads import Param, WorkloadSpec

SPEC = WorkloadSpec(
    name="noop",
    runner="harness.worker.workloads.noop:run",
    order=2,
    params=(Param("sleep_s", 0.0, float, "a number of seconds >= 0", ge=0),),
)
