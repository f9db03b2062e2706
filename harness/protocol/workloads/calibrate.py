"""The calibrate workload: known GPU work and known host gaps, to check the idle meter.

Runner: harness/worker/workloads/calibrate.py. One spin kernel of `work_us` per step, paced so
that the GPU is idle `idle_target` of the time; the label is the default one
(`calibrate work_us=500 idle_target=0.5 replay=eager`). It measures the meter rather than a
configuration, so it declares no gate policies.
"""

from __future__ import annotations

from harness.protocol.workloads import Param, WorkloadSpec, choice

REPLAYS = ("eager", "graph")   # eager launches or one CUDA graph replay per step

PARAMS = (
    # GPU work per step in µs (one self-timed spin kernel)
    Param("work_us", 500.0, float, "a positive number (µs)", gt=0),
    # the GPU's true idle fraction by construction, in [0, 1)
    Param("idle_target", 0.5, float, "a number in [0, 1)", ge=0, lt=1),
    choice("replay", "eager", REPLAYS),
)

SPEC = WorkloadSpec(
    name="calibrate",
    runner="harness.worker.workloads.calibrate:run",
    order=1,
    params=PARAMS,
)
