"""The GPU's time series in a cell's result: a real worker cell (noop) under a fake pynvml, the
absent cases (no GPU visible, no NVML), and the series itself (columns, nulls, decimation)."""

from __future__ import annotations

import json
import time

import pytest
from test_hostfacts import MIB, device, fake_nvml, nvml_present, use

from harness.worker import gpuseries, hostfacts
from harness.worker.main import run_cell


def snap(t: float, **gpu) -> dict:
    return {"time": t, "cpu_count": 2, "gpu": {"index": 0, **gpu}}


def test_a_gpu_cell_carries_its_gpu_series(monkeypatch):
    use(monkeypatch, fake_nvml([device(util=97, used_bytes=1536 * MIB, power_mw=123456)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(gpuseries, "INTERVAL_S", 0.02)
    before = time.time()
    result = run_cell({"workload": "noop", "sleep_s": 0.3})
    assert result["status"] == "ok"
    series = result["gpu_series"]
    assert series["gpu_index"] == 0 and series["interval_s"] == 0.02
    # origin is kept to the millisecond (round(origin, 3)): it may read up to half a millisecond before `before`.
    assert before - 0.001 <= series["origin"] <= before + 1
    n = len(series["t_s"])
    assert n >= 6                       # enter, a tick every 20 ms of the 300 ms, exit
    assert n == result["host_facts"]["samples"]   # the same snapshots as the host facts
    assert series["t_s"] == sorted(series["t_s"]) and 0 <= series["t_s"][0] < 0.2
    assert series["t_s"][-1] <= result["wall_s"] + 0.01
    assert series["utilization_pct"] == [97] * n
    assert series["memory_used_mb"] == [1610.6] * n     # 1536 MiB in MLflow's decimal MB
    assert series["sm_clock_mhz"] == [1980] * n
    assert series["power_w"] == [123.5] * n
    assert series["temperature_c"] == [41] * n
    assert series["power_capped_pct"] == [100] * n      # the fake's reasons: idle and power cap
    assert len(json.dumps(series)) < 200 * n           # compact: columns, not a dict per point


@pytest.mark.skipif(not nvml_present(), reason="no NVML on this host")
def test_a_real_gpu_gives_a_real_series(monkeypatch):
    monkeypatch.setattr(hostfacts, "_NVML", hostfacts._NvmlState())    # this process's own
    result = run_cell({"workload": "noop", "sleep_s": 1.2})
    if not hostfacts.nvml_ready():
        pytest.skip(f"NVML does not come up here: {result['host_facts'].get('nvml')}")
    series = result["gpu_series"]
    assert len(series["t_s"]) >= 4                     # enter, two ticks at 0.5 s, exit
    assert all(0 <= u <= 100 for u in series.get("utilization_pct", []) if u is not None)
    assert all(m > 0 for m in series.get("memory_used_mb", []) if m is not None)
    assert all(c > 0 for c in series.get("sm_clock_mhz", []) if c is not None)


def test_no_gpu_visible_means_no_series_and_no_sampler_thread(monkeypatch):
    use(monkeypatch, fake_nvml([device()]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(gpuseries, "INTERVAL_S", 0.01)
    result = run_cell({"workload": "noop", "sleep_s": 0.1})
    assert "gpu_series" not in result
    assert result["host_facts"]["nvml"] == "no GPU visible to this process"
    assert result["host_facts"]["samples"] == 2        # start and end only: no thread


def test_without_nvml_nothing_is_invented(monkeypatch):
    state = hostfacts._NvmlState()
    state.tried, state.error = True, "pynvml not importable: No module named 'pynvml'"
    monkeypatch.setattr(hostfacts, "_NVML", state)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpuseries, "INTERVAL_S", 0.01)
    result = run_cell({"workload": "noop", "sleep_s": 0.1})
    assert "gpu_series" not in result
    assert result["host_facts"]["nvml"].startswith("pynvml not importable")
    assert result["host_facts"]["samples"] == 2        # start and end only: no thread


def test_a_quantity_nvml_could_not_read_is_null_or_has_no_column():
    samples = [snap(100.0, utilization_pct=10, power_w=50.0),
               snap(100.5, utilization_pct=None, power_w=60.0),
               {"time": 100.7, "nvml": "GPU 0: lost"},         # no GPU facts: not a point
               snap(101.0, utilization_pct=30, power_w=70.0)]
    series = gpuseries.gpu_series(samples, origin=100.0, interval_s=0.5)
    assert series["t_s"] == [0.0, 0.5, 1.0]
    assert series["utilization_pct"] == [10, None, 30]
    assert series["power_w"] == [50.0, 60.0, 70.0]
    assert "sm_clock_mhz" not in series and "memory_used_mb" not in series
    assert "interval_s" not in gpuseries.gpu_series(samples, 100.0, None)   # not sampled between
    assert gpuseries.gpu_series([{"time": 1.0, "nvml": "no GPU"}], 0.0, 0.5) is None
    assert gpuseries.gpu_series([], 0.0, None) is None


def test_the_power_cap_share_is_the_share_of_snapshots_that_name_it():
    reasons = [["sw_power_cap"], [], ["sw_power_cap", "sw_thermal_slowdown"], None, ["gpu_idle"]]
    samples = [snap(10.0 + 0.5 * i, temperature_c=60 + i, throttle_reasons=r)
               for i, r in enumerate(reasons)]
    series = gpuseries.gpu_series(samples, 10.0, 0.5, max_points=3)      # runs of 2, 2, 1
    assert series["power_capped_pct"] == [50, 100, 0]    # None: not read, not counted
    assert series["temperature_c"] == [60, 62, 64]
    unread = gpuseries.gpu_series([snap(1.0, temperature_c=50)], 1.0, None)
    assert "power_capped_pct" not in unread              # never read: no column


def test_a_long_cell_is_decimated_into_means():
    samples = [snap(1000.0 + 0.5 * i, utilization_pct=i % 4 * 10, sm_clock_mhz=1980)
               for i in range(1000)]
    series = gpuseries.gpu_series(samples, 1000.0, 0.5, max_points=240)
    per = 5                                          # ceil(1000 / 240)
    assert len(series["t_s"]) == 200 and series["interval_s"] == 0.5 * per
    assert series["t_s"][:2] == [1.0, 3.5]           # each point at the mean time of its run
    assert series["utilization_pct"][:4] == [12, 14, 16, 18]   # means of 0,10,20,30,0 ...
    assert series["sm_clock_mhz"] == [1980] * 200
    assert len(json.dumps(series)) < 10000
