"""The GPU's own samples during a cell, as a small time series (result key `gpu_series`).

The host facts (hostfacts.summarize) keep each number's min and max: enough to tell a busy or
throttled GPU from a quiet one, not to see *when* the utilisation dropped or the clock fell. So
while a cell runs the worker also snapshots its GPU every `INTERVAL_S` (hostfacts.Sampler's
thread), and the result carries those snapshots as columns, one list per quantity:

    "gpu_series": {"gpu_index": 0, "origin": 1764650000.125, "interval_s": 0.5,
                   "t_s": [0.0, 0.5, ...], "utilization_pct": [97, ...],
                   "memory_used_mb": [1610.6, ...], "sm_clock_mhz": [1980, ...],
                   "power_w": [123.5, ...], "temperature_c": [41, ...],
                   "power_capped_pct": [0, ...]}

`power_capped_pct` is the share of a point's snapshots in which NVML named the software power
cap among the clock's event reasons: with `sm_clock_mhz` and `temperature_c` it says whether a
step time that rose during the cell followed the clock, and why the clock fell.

`origin` is the cell's start (epoch seconds) and `t_s` the seconds since it, so the controller
can place each point in time (MLflow's system metrics, harness.sweep.tracking) without the
result growing a timestamp per point. `gpu_index` is NVML's index of the GPU sampled.

Small by construction: at most `MAX_POINTS` points. A longer cell is decimated into that many
runs of consecutive snapshots, each point the mean of its run (what MLflow's own monitor does
over its logging interval), and `interval_s` says the spacing the points then have (absent
when nothing sampled between the cell's start and end).

Absent, never invented, as for the host facts: only snapshots that read the GPU count; a
quantity NVML could not read in a snapshot is null there, and one it never read has no column.
Without NVML or a GPU there is no series at all (the key is absent; host_facts' `nvml` says
why). Standard library only, like the rest of the worker's measuring code.
"""

from __future__ import annotations

import math

from harness.protocol.numbers import is_finite_number

INTERVAL_S = 0.5
# 240 points of five columns are 8-9 KB of JSON (measured on random H200-like readings): a
# two-hour cell stays as small as a two-minute one.
MAX_POINTS = 240
_MB = 1e6           # MLflow's GPU memory unit is the decimal megabyte (used bytes / 1e6)
_MIB = 2**20


def _power_capped(gpu: dict) -> float | None:
    reasons = gpu.get("throttle_reasons")
    return None if reasons is None else 100.0 * ("sw_power_cap" in reasons)


# column -> (snapshot field, or how it is read from a snapshot's GPU facts; scale; digits kept)
COLUMNS = {
    "utilization_pct": ("utilization_pct", 1.0, 1),
    "memory_used_mb": ("memory_used_mib", _MIB / _MB, 1),
    "sm_clock_mhz": ("sm_clock_mhz", 1.0, 0),
    "power_w": ("power_w", 1.0, 1),
    "temperature_c": ("temperature_c", 1.0, 0),
    "power_capped_pct": (_power_capped, 1.0, 0),
}


def gpu_series(samples: list[dict], origin: float, interval_s: float | None,
               max_points: int = MAX_POINTS) -> dict | None:
    """The series of the snapshots (hostfacts.sample's dicts) that read a GPU, times relative
    to `origin` (epoch seconds), taken every `interval_s` (None: only around the cell, and the
    series says no spacing); None when no snapshot read a GPU."""
    points = [s for s in samples if isinstance(s.get("gpu"), dict) and is_finite_number(s.get("time"))]
    if not points:
        return None
    points.sort(key=lambda s: s["time"])
    per = math.ceil(len(points) / max_points)
    runs = [points[i:i + per] for i in range(0, len(points), per)]
    out: dict = {"gpu_index": points[0]["gpu"].get("index"), "origin": round(origin, 3)}
    if interval_s is not None:
        out["interval_s"] = interval_s * per
    out["t_s"] = [round(_mean([s["time"] for s in run]) - origin, 3) for run in runs]
    for column, (field, scale, digits) in COLUMNS.items():
        read = field if callable(field) else (lambda gpu, field=field: gpu.get(field))
        values = [_mean([read(s["gpu"]) for s in run]) for run in runs]
        if all(v is None for v in values):
            continue
        out[column] = [None if v is None else _round(v * scale, digits) for v in values]
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if is_finite_number(v)]
    return sum(values) / len(values) if values else None


def _round(v: float, digits: int):
    return int(round(v)) if digits == 0 else round(v, digits)
