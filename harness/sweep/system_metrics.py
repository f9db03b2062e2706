"""A cell's GPU samples (its result's `gpu_series`, harness.worker.gpuseries) as MLflow system
metrics: the child run's "System metrics" tab then charts what the GPU did during the cell.

MLflow's own monitor (mlflow.system_metrics, which needs its process to be the one on the GPU:
ours is the controller, often on another machine) logs a metric `system/gpu_<i>_<quantity>` per
GPU, a value per logging step, each with its wall-clock timestamp; the UI puts every `system/`
metric in that tab and draws it over time. The names here are the monitor's
(mlflow/system_metrics/metrics/gpu_monitor.py): utilisation in %, memory in use in decimal
megabytes, power in watts. The monitor has no clock, temperature or power-cap metric; they
get names in its pattern (`gpu_<i>_sm_clock_megahertz`, ...). `<i>` is NVML's index of the
cell's GPU, as the monitor numbers GPUs.

Only what was sampled is logged: a null point is skipped, a result without a series (no GPU,
no NVML) logs no system metric at all. No mlflow import: the caller wraps the tuples.
"""

from __future__ import annotations

from harness.protocol.numbers import is_finite_number

PREFIX = "system/"
# gpu_series column -> MLflow's name for it after "gpu_<i>_"
NAMES = {
    "utilization_pct": "utilization_percentage",
    "memory_used_mb": "memory_usage_megabytes",
    "power_w": "power_usage_watts",
    "sm_clock_mhz": "sm_clock_megahertz",
    "temperature_c": "temperature_celsius",
    "power_capped_pct": "power_capped_percentage",
}


def system_metrics(result: dict, fallback_start_ms: int) -> list[tuple[str, float, int, int]]:
    """(key, value, timestamp ms, step) for every sampled point of the result's GPU series;
    [] when it has none. Times are the series' own (its `origin` plus each `t_s`), else
    counted from `fallback_start_ms` (the run's start) for a series without an origin."""
    series = result.get("gpu_series")
    if not isinstance(series, dict) or not isinstance(series.get("t_s"), list):
        return []
    index = series.get("gpu_index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return []
    origin = series.get("origin")
    start_ms = int(origin * 1000) if is_finite_number(origin) else fallback_start_ms
    times = series["t_s"]
    out = []
    for column, name in NAMES.items():
        values = series.get(column)
        if not isinstance(values, list):
            continue
        key = f"{PREFIX}gpu_{index}_{name}"
        for step, (t, v) in enumerate(zip(times, values)):
            if is_finite_number(t) and is_finite_number(v):
                out.append((key, float(v), start_ms + int(round(t * 1000)), step))
    return out
