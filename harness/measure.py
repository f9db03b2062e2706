"""Measurement math: robust summaries and the GPU idle fraction from a CUDA-activity trace.

Standard library only, so it runs in the worker and in tests without torch. The idle fraction
follows DESIGN.md: busy = the *union* of kernel / memcpy / memset intervals (never their sum:
kernels on several streams overlap), window = host step boundaries on the profiler's clock,
idle = 1 - busy / window. Kernels are attributed to phases through the launch that issued them
(the CUDA runtime call carries the same correlation id as the device activity).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
STEP_RANGE = "harness.step"
PHASE_PREFIX = "phase."


# -- summaries ---------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("percentile of nothing")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(values: list[float]) -> float:
    """Median absolute deviation: meaningful from three repeats on, and one outlier repeat
    does not dominate it (a standard deviation of three samples would)."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


# -- interval arithmetic -----------------------------------------------------------------------
def union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the union of [start, end) intervals, clipped to [lo, hi)."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


# -- traces ------------------------------------------------------------------------------------
def load_trace(path: str | Path) -> list[dict]:
    """Events of a Chrome trace written by torch.profiler's export_chrome_trace."""
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def _span(e: dict) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def analyze_trace(events: list[dict]) -> dict:
    """Idle fraction and per-phase attribution over the profiled steps.

    Returns {} when the trace has no step ranges. Times are in microseconds as in the trace;
    per-phase numbers are per step, in milliseconds.
    """
    steps = sorted((_span(e) for e in events
                    if e.get("ph") == "X" and e.get("name") == STEP_RANGE
                    and e.get("cat") == "user_annotation"))
    if not steps:
        return {}
    lo, hi = steps[0][0], steps[-1][1]
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
    busy = union_length([_span(e) for e in device], lo, hi)
    window = hi - lo

    # Kernels per step: a constant count says no activity records were dropped (Kineto can
    # drop them in long processes).
    per_step = [sum(1 for e in device if e.get("cat") == "kernel" and s <= float(e["ts"]) < t)
                for s, t in steps]

    phases = _phase_attribution(events, device, lo, hi, len(steps))
    return {
        "idle_fraction": max(0.0, 1.0 - busy / window) if window > 0 else None,
        "window_ms": window / 1e3,
        "busy_ms": busy / 1e3,
        "steps": len(steps),
        "kernels_per_step": per_step,
        "records_consistent": len(set(per_step)) <= 1,
        "phases": phases,
    }


def _phase_attribution(events, device, lo, hi, n_steps) -> dict:
    ranges = defaultdict(list)
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and name.startswith(PHASE_PREFIX):
            ranges[name[len(PHASE_PREFIX):]].append(_span(e))
    if not ranges:
        return {}
    # A runtime call (cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch...) inside a phase's
    # host range owns the device activity with its correlation id.
    owner = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            ts = float(e["ts"])
            for phase, spans in ranges.items():
                if any(s <= ts < t for s, t in spans):
                    owner[e["args"]["correlation"]] = phase
                    break
    by_phase = defaultdict(list)
    for e in device:
        phase = owner.get(e.get("args", {}).get("correlation"))
        if phase is not None:
            by_phase[phase].append(_span(e))
    out = {}
    for phase, spans in ranges.items():
        host = sum(t - s for s, t in spans if s >= lo and t <= hi)
        out[phase] = {"host_ms": host / 1e3 / n_steps,
                      "gpu_ms": union_length(by_phase[phase], lo, hi) / 1e3 / n_steps}
    return out
