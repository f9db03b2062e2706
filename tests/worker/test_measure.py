"""Idle-fraction math on synthetic CUDA-activity traces, and the summaries."""

from __future__ import annotations

import json

import pytest

from harness.worker import measure


def x(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def step(ts, dur):
    return x(measure.STEP_RANGE, "user_annotation", ts, dur)


def test_union_handles_overlap_nesting_and_clipping():
    spans = [(0, 10), (5, 15), (6, 7), (20, 30), (40, 50)]
    assert measure.union_length(spans, 0, 100) == 15 + 10 + 10
    assert measure.union_length(spans, 8, 45) == 7 + 10 + 5     # clipped at both edges
    assert measure.union_length([], 0, 10) == 0
    assert measure.union_length([(5, 5)], 0, 10) == 0


def test_idle_fraction_is_union_over_the_step_window():
    # Two 100 µs steps; kernels on two streams overlap; one kernel starts before the window.
    events = [step(1000, 100), step(1100, 100),
              x("k1", "kernel", 1000, 40), x("k2", "kernel", 1020, 40),   # union 1000-1060
              x("m", "gpu_memcpy", 1150, 10), x("s", "gpu_memset", 1190, 30),  # 1190-1200 inside
              x("early", "kernel", 900, 150)]                               # 1000-1050 inside
    stats = measure.analyze_trace(events)
    busy = 60 + 10 + 10
    assert stats["window_ms"] == pytest.approx(0.2)
    assert stats["busy_ms"] == pytest.approx(busy / 1e3)
    assert stats["idle_fraction"] == pytest.approx(1 - busy / 200)


def test_kernel_count_per_step_flags_dropped_records():
    events = [step(0, 100), step(100, 100),
              x("a", "kernel", 10, 5), x("b", "kernel", 20, 5), x("c", "kernel", 110, 5)]
    stats = measure.analyze_trace(events)
    assert stats["kernels_per_step"] == [2, 1] and stats["records_consistent"] is False


def test_phase_attribution_follows_the_launch_not_the_kernel_time():
    # The verify kernel launched at 30 runs late (at 80, during "accept" on the host):
    # it still belongs to verify, because its launch happened inside verify's range.
    events = [step(0, 100),
              x("phase.verify", "user_annotation", 20, 30),
              x("phase.accept", "user_annotation", 50, 50),
              x("cudaLaunchKernel", "cuda_runtime", 30, 2, correlation=7),
              x("gemm", "kernel", 80, 15, correlation=7),
              x("cudaMemcpyAsync", "cuda_runtime", 60, 2, correlation=8),
              x("Memcpy DtoH", "gpu_memcpy", 96, 2, correlation=8)]
    phases = measure.analyze_trace(events)["phases"]
    # idle_ms: the whole GPU's idle time while the host was inside the phase (verify: the GPU
    # did nothing from 20 to 50; accept: 50..100 minus the gemm and the copy).
    assert phases["verify"] == {"host_ms": pytest.approx(0.03), "gpu_ms": pytest.approx(0.015),
                                "idle_ms": pytest.approx(0.03)}
    assert phases["accept"] == {"host_ms": pytest.approx(0.05), "gpu_ms": pytest.approx(0.002),
                                "idle_ms": pytest.approx(0.033)}


def test_no_steps_no_numbers():
    assert measure.analyze_trace([x("k", "kernel", 0, 5)]) == {}


def test_load_trace_reads_chrome_format(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [step(0, 10)]}))
    assert measure.load_trace(p)[0]["name"] == measure.STEP_RANGE


def test_drift_is_the_second_half_against_the_first():
    assert measure.drift_pct([10, 10, 10, 10, 10, 10, 10, 10]) == 0
    assert measure.drift_pct([10, 10, 10, 10.2, 10.2, 10.2]) == pytest.approx(2.0)
    # the median of each half: one slow step (the first after a pause) moves nothing
    assert measure.drift_pct([10.4, 10, 10, 10, 10, 10, 10, 10]) == 0
    assert measure.drift_pct([10, 10, 12, 9.5, 9.5]) == pytest.approx(-5.0)   # odd: the middle out
    assert measure.drift_pct([10, 11, 12]) is None


def test_percentile_and_spread():
    assert measure.percentile([3, 1, 2], 50) == 2
    assert measure.percentile([1, 2, 3, 4], 90) == pytest.approx(3.7)
    assert measure.spread([10, 10, 13]) == 0
    assert measure.spread([9, 10, 12]) == 1
    assert measure.spread([5]) == 0
