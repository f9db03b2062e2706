"""The idle meter on synthetic CUDA-activity traces: window, attribution, gaps, dropped records,
the timeline and its figure, and the always-on estimate's arithmetic."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from harness.worker import idle, measure
from harness.dashboards import idle as idle_fig


def x(name, cat, ts, dur, **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": args}


def annotation(name, ts, dur):
    return x(name, "user_annotation", ts, dur)


def launch(name, ts, corr):
    return x(name, "cuda_runtime", ts, 5, correlation=corr)


def decode_trace(steps=4, drop=None):
    """A decode-like trace, as torch.profiler exports it. Step k starts at b = 1000 + 1000 k
    and lasts 980 µs; per step (µs from b):
        host   draft 0-100 | tree 120-420 | verify 420-480 | accept 480-700 | commit 700-960
        GPU    draft: two kernels on two streams, 20-60 and 40-80 (union 60)
               verify: one graph replay launched at 430 -> 3 kernels 440-540-600-640, running
                       on into accept
               accept: a DtoH copy launched at 490 that waits for verify: 640-645
               commit: one kernel 720-760
    Busy 305 per step; 6 kernels per step. `drop=(step, kernel index)` removes one record."""
    ev = []
    for k in range(steps):
        b, c = 1000 + 1000 * k, 10 * k
        ev += [annotation(measure.STEP_RANGE, b, 980),
               annotation("phase.draft", b, 100), annotation("phase.tree", b + 120, 300),
               annotation("phase.verify", b + 420, 60), annotation("phase.accept", b + 480, 220),
               annotation("phase.commit", b + 700, 260)]
        ev += [launch("cudaLaunchKernel", b + 10, c + 1), launch("cudaLaunchKernel", b + 30, c + 2),
               launch("cudaGraphLaunch", b + 430, c + 3), launch("cudaMemcpyAsync", b + 490, c + 4),
               launch("cudaLaunchKernel", b + 710, c + 5)]
        kernels = [x("draft_a", "kernel", b + 20, 40, correlation=c + 1),
                   x("draft_b", "kernel", b + 40, 40, correlation=c + 2),
                   x("attn", "kernel", b + 440, 100, correlation=c + 3),
                   x("mlp", "kernel", b + 540, 60, correlation=c + 3),
                   x("head", "kernel", b + 600, 40, correlation=c + 3),
                   x("commit", "kernel", b + 720, 40, correlation=c + 5)]
        if drop and drop[0] == k:
            del kernels[drop[1]]
        ev += kernels + [x("Memcpy DtoH", "gpu_memcpy", b + 640, 5, correlation=c + 4)]
    return ev


# -- interval math -----------------------------------------------------------------------------
def test_merge_and_cover_with_nested_and_touching_intervals():
    merged = measure.merge_intervals([(20, 30), (0, 10), (2, 3), (10, 12), (5, 5), (40, 50)])
    assert merged == [(0, 12), (20, 30), (40, 50)]          # nested dropped, touching joined
    assert measure.covered_length(merged, 5, 45) == 7 + 10 + 5
    assert measure.covered_length(merged, 12, 20) == 0
    assert measure.covered_length([], 0, 10) == 0


# -- window and attribution ---------------------------------------------------------------------
def test_decode_trace_window_busy_and_steps():
    stats = measure.analyze_trace(decode_trace())
    window, busy = 3980, 4 * 305
    assert stats["window_ms"] == pytest.approx(window / 1e3)
    assert stats["busy_ms"] == pytest.approx(busy / 1e3)
    assert stats["idle_fraction"] == pytest.approx(1 - busy / window)
    assert stats["idle_ms"] == pytest.approx((window - busy) / 4 / 1e3)
    assert stats["step_busy_ms"] == pytest.approx(0.305)
    assert stats["kernels_per_step"] == [6, 6, 6, 6]
    assert stats["records_dropped"] is False


def test_phase_host_gpu_and_idle_per_step():
    phases = measure.analyze_trace(decode_trace())["phases"]
    expect = {  # (host, gpu busy it launched, GPU idle while the host was in it), µs per step
        "draft": (100, 60, 40),
        "tree": (300, 0, 300),       # host-only: the GPU waits the whole time
        "verify": (60, 200, 20),     # its graph's kernels run on into accept
        "accept": (220, 5, 55),      # busy with verify's kernels and its own copy
        "commit": (260, 40, 220),
    }
    for name, (host, gpu, idle_us) in expect.items():
        assert phases[name] == {"host_ms": pytest.approx(host / 1e3),
                                "gpu_ms": pytest.approx(gpu / 1e3),
                                "idle_ms": pytest.approx(idle_us / 1e3)}, name


def test_gaps_between_phases_and_idle_adds_up():
    stats = measure.analyze_trace(decode_trace())
    gaps = stats["gaps"]
    assert set(gaps) == {"draft_to_tree", "commit_to_draft", "commit_to_end"}
    assert gaps["draft_to_tree"] == {"host_ms": pytest.approx(0.020),
                                     "idle_ms": pytest.approx(0.020)}
    # 3 inter-step gaps of 40 µs over 4 steps; the last step's tail of 20 µs
    assert gaps["commit_to_draft"]["host_ms"] == pytest.approx(0.030)
    assert gaps["commit_to_end"]["idle_ms"] == pytest.approx(0.005)
    total = sum(p["idle_ms"] for p in stats["phases"].values()) + \
        sum(g["idle_ms"] for g in gaps.values())
    assert total == pytest.approx(stats["idle_ms"])


def test_dropped_record_is_flagged():
    stats = measure.analyze_trace(decode_trace(drop=(2, 3)))
    assert stats["kernels_per_step"] == [6, 6, 5, 6]
    assert stats["records_dropped"] is True and stats["records_consistent"] is False


def test_kernels_count_for_the_step_that_launched_them():
    # The GPU runs behind: step 0's kernel executes during step 1. By launch it is step 0's.
    events = [annotation(measure.STEP_RANGE, 0, 100), annotation(measure.STEP_RANGE, 100, 100),
              launch("cudaLaunchKernel", 10, 1), x("k0", "kernel", 120, 50, correlation=1),
              launch("cudaLaunchKernel", 110, 2), x("k1", "kernel", 170, 60, correlation=2)]
    stats = measure.analyze_trace(events)
    assert stats["kernels_per_step"] == [1, 1]
    assert stats["busy_ms"] == pytest.approx(0.080)           # clipped to the window (..200)
    assert stats["step_busy_ms"] == pytest.approx(0.110 / 2)  # all launched work, unclipped


def test_driver_api_launches_attribute_too():
    # Triton launches through the driver API (cuLaunchKernel, category cuda_driver).
    events = [annotation(measure.STEP_RANGE, 0, 100), annotation("phase.verify", 0, 50),
              x("cuLaunchKernel", "cuda_driver", 10, 5, correlation=3),
              x("triton_verify", "kernel", 60, 20, correlation=3)]
    stats = measure.analyze_trace(events)
    assert stats["phases"]["verify"]["gpu_ms"] == pytest.approx(0.02)


def test_edges_of_the_window():
    # A phase range and a kernel that start before the window are clipped to it; work launched
    # before the first step is busy time of the window but not of any step.
    events = [annotation(measure.STEP_RANGE, 100, 100),
              annotation("phase.draft", 50, 100), annotation("phase.tree", 150, 50),
              launch("cudaLaunchKernel", 60, 1), x("k", "kernel", 90, 40, correlation=1)]
    stats = measure.analyze_trace(events)
    assert stats["idle_fraction"] == pytest.approx(0.7)
    assert stats["step_busy_ms"] == 0 and stats["kernels_per_step"] == [0]
    assert stats["phases"]["draft"] == {"host_ms": pytest.approx(0.05),
                                        "gpu_ms": pytest.approx(0.03),
                                        "idle_ms": pytest.approx(0.02)}
    assert stats["phases"]["tree"]["idle_ms"] == pytest.approx(0.05)
    assert stats["gaps"] == {}


def test_no_phases_no_attribution():
    stats = measure.analyze_trace([annotation(measure.STEP_RANGE, 0, 10), x("k", "kernel", 2, 3)])
    assert stats["phases"] == {} and stats["gaps"] == {}
    assert stats["idle_fraction"] == pytest.approx(0.7)


# -- timeline -----------------------------------------------------------------------------------
def test_timeline_of_steady_steps():
    items, merge_us = measure.build_timeline(decode_trace(), max_steps=3)
    assert merge_us == 2.0
    steps = [e for e in items if e["phase"] == "step"]
    assert [(e["start_ms"], e["end_ms"]) for e in steps] == [(0.0, 0.98), (1.0, 1.98), (2.0, 2.98)]
    gpu = [e for e in items if e["kind"] == "gpu"]
    # Per step: draft's overlapping kernels merge, verify's three back-to-back kernels merge,
    # then the copy (accept) and commit's kernel: 4 intervals.
    assert len(gpu) == 12
    assert gpu[:4] == [
        {"phase": "draft", "kind": "gpu", "start_ms": 0.02, "end_ms": 0.08},
        {"phase": "verify", "kind": "gpu", "start_ms": 0.44, "end_ms": 0.64},
        {"phase": "accept", "kind": "gpu", "start_ms": 0.64, "end_ms": 0.645},
        {"phase": "commit", "kind": "gpu", "start_ms": 0.72, "end_ms": 0.76}]
    host = [e for e in items if e["kind"] == "host" and e["phase"] != "step"]
    assert len(host) == 15 and host[0] == {"phase": "draft", "kind": "host",
                                           "start_ms": 0.0, "end_ms": 0.1}
    json.dumps(items)  # plain JSON, for the result file


def test_timeline_caps_its_size():
    # 100 kernels of 1 µs with 3 µs gaps, no phase: 100 intervals at 2 µs, 1 once merged at 4.
    events = [annotation(measure.STEP_RANGE, 0, 500)]
    events += [x(f"k{i}", "kernel", 10 + 4 * i, 1) for i in range(100)]
    items, merge_us = measure.build_timeline(events, max_items=10)
    gpu = [e for e in items if e["kind"] == "gpu"]
    assert merge_us == 4.0 and len(gpu) == 1 and gpu[0]["phase"] == "other"
    items, _ = measure.build_timeline(events)
    assert len([e for e in items if e["kind"] == "gpu"]) == 100


def test_timeline_of_nothing():
    assert measure.build_timeline([x("k", "kernel", 0, 1)]) == ([], 2.0)


# -- figure -------------------------------------------------------------------------------------
def _png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cell(timeline) -> dict:
    """A GPU decode cell result carrying `timeline`, as the report draws it."""
    return {"status": "ok", "label": "tiny ctx=256", "cell": {"model": "tiny"},
            "env": {"gpu": "NVIDIA H200"}, "timeline": timeline}


def test_timeline_figure_renders_without_warnings(tmp_path):
    # The figure is dashboards/idle.timeline (the one the report draws); it reads exactly what
    # measure.build_timeline writes, and skips malformed entries.
    items, _ = measure.build_timeline(decode_trace())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = idle_fig.timeline(_cell(items), tmp_path / "t.png", title="decode tiny ctx=256")
        empty = idle_fig.timeline(_cell([]), tmp_path / "empty.png", title="nothing")
        wrapped = idle_fig.timeline(
            _cell({"intervals": items + [{"phase": "x", "kind": "gpu"}, {"start_ms": "?"}]}),
            tmp_path / "wrapped.png")
    assert _png(out) and _png(empty) and _png(wrapped)
    assert idle_fig.timeline_intervals(_cell(items)) == [
        {k: i[k] for k in ("phase", "start_ms", "end_ms", "kind")} for i in items]


# -- the always-on estimate -----------------------------------------------------------------------
def test_idle_fraction_est():
    assert idle.idle_fraction_est(10.0, 4, 1.5) == pytest.approx(0.4)
    assert idle.idle_fraction_est(10.0, 4, 3.0) == 0.0          # calibration above the window
    assert idle.idle_fraction_est(None, 4, 1.5) is None         # no GPU
    assert idle.idle_fraction_est(10.0, 4, None) is None        # profiling off
    assert idle.idle_fraction_est(10.0, 0, 1.0) is None


def test_event_clock_is_a_no_op_when_disabled():
    clock = idle.EventStepClock(3, enabled=False)
    for _ in range(10):
        clock.mark()
    assert clock.window_ms() is None and clock.step_ms() is None and clock.steps() == 0


def test_profile_metrics_names():
    stats = measure.analyze_trace(decode_trace())
    m = idle.profile_metrics(stats)
    assert m["idle_fraction"] == stats["idle_fraction"]
    assert m["phase.tree.idle_ms"] == pytest.approx(0.3)
    assert m["phase.verify.gpu_ms"] == pytest.approx(0.2)
    assert m["gap.commit_to_draft.idle_ms"] == pytest.approx(0.03)
    assert not any(k.endswith("host_ms") for k in m)
    assert idle.profile_metrics({}) == {}


def test_meter_outputs_of_a_cell():
    stats = measure.analyze_trace(decode_trace())
    stats["timeline"], _ = measure.build_timeline(decode_trace())
    audit = {"syncs_per_step": 3.0, "sync_sites": [{"site": "a.py:1", "kind": "d2h",
                                                     "count": 9, "per_step": 3.0}]}
    # Two repeats whose event windows say 4 steps of 1.22 ms and of 0.61 ms.
    metrics, samples, extra = idle.meter_outputs(stats, [4.88, 2.44], 4, audit)
    assert samples["idle_fraction_est"] == [pytest.approx(0.75), pytest.approx(0.5)]
    assert metrics["idle_fraction_est"] == pytest.approx(0.625)
    assert metrics["idle_fraction"] == stats["idle_fraction"]
    assert metrics["syncs_per_step"] == 3.0 and extra["sync_sites"] == audit["sync_sites"]
    assert extra["timeline"] == stats["timeline"]
    assert "phases" not in extra["profile"] and extra["profile"]["records_dropped"] is False


def test_meter_outputs_without_a_gpu():
    metrics, samples, extra = idle.meter_outputs({}, [None, None], 4, None)
    assert metrics == {"idle_fraction": None, "idle_fraction_est": None}
    assert samples == {} and extra == {}


# A real trace from an H200, kept by idle.profile_window(step, 3) with HARNESS_TRACE_DIR set: 3
# steps of phases draft / tree / verify (record_function("phase.<name>") ranges), 3 small
# kernels each (x.mul_(1.0001) on 65536 floats), and one x[0].item() in tree. Taken
# with the profiler's settings of its day: a trace of `idle.lean_profile` (user-scope ranges
# only, no cpu_op events) must pass the same checks.
RECORDED = Path(__file__).parent / "data" / "idle_trace.json.gz"


@pytest.mark.skipif(not RECORDED.exists(), reason="recorded GPU trace not committed yet")
def test_recorded_trace_analyses_and_draws(tmp_path):
    events = json.loads(gzip.decompress(RECORDED.read_bytes()))["traceEvents"]
    stats = measure.analyze_trace(events)
    assert stats["steps"] == 3 and stats["kernels_per_step"] == [9, 9, 9]
    assert set(stats["phases"]) == {"draft", "tree", "verify"}
    assert 0 < stats["idle_fraction"] < 1 and stats["records_dropped"] is False
    assert all(p["gpu_ms"] > 0 for p in stats["phases"].values())
    # Every kernel and copy in the window reached its phase through its launch record (the
    # phases do not overlap, so their GPU time adds up to the busy time).
    assert sum(p["gpu_ms"] for p in stats["phases"].values()) == \
        pytest.approx(stats["busy_ms"] / stats["steps"])
    items, _ = measure.build_timeline(events)
    assert {e["phase"] for e in items if e["kind"] == "gpu"} <= {"draft", "tree", "verify"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _png(idle_fig.timeline(_cell(items), tmp_path / "recorded.png"))


# -- the profiler's settings ----------------------------------------------------------------------
def test_lean_profile_records_user_ranges_but_not_ops(tmp_path):
    import torch
    from torch.profiler import ProfilerActivity, record_function

    enable = torch.autograd.profiler._enable_profiler
    x = torch.ones(8)
    with idle.lean_profile([ProfilerActivity.CPU]) as (prof, config):
        for _ in range(3):
            with record_function(measure.STEP_RANGE):
                with record_function("phase.draft"):
                    x.mul_(2).add_(1)
    assert torch.autograd.profiler._enable_profiler is enable       # the hook is undone
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = measure.load_trace(tmp_path / "t.json")
    cats = {e.get("cat") for e in events if e.get("ph") == "X"}
    names = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert config["scopes"] == "user"
    assert names == {measure.STEP_RANGE, "phase.draft"}
    assert "cpu_op" not in cats                 # aten::mul_ / aten::add_ were not recorded
    # A profile started the ordinary way afterwards records ops again.
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as plain:
        x.mul_(2)
    assert any(e.name == "aten::mul_" for e in plain.events())


def test_cupti_teardown_is_asked_for_on_cuda_12_6_and_later(monkeypatch):
    import torch
    for cuda, env, expect in (("13.0", None, "1"), ("12.6", None, "1"), ("12.4", None, None),
                              (None, None, None), ("13.0", "0", "0")):
        monkeypatch.setattr(torch.version, "cuda", cuda)
        if env is None:
            monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
        else:
            monkeypatch.setenv("TEARDOWN_CUPTI", env)
        assert idle._release_cupti_after_profiling() == expect, (cuda, env)


# -- idle by kernel boundary ----------------------------------------------------------------------
def test_idle_gaps_name_the_kernels_around_each_gap():
    """One step of a graph replay: g1 -> (3 µs) -> n -> (1 µs) -> g2 -> (3 µs) -> n2, twice: the
    idle goes to the pairs around it, ranked by idle per step; the window's edges to None."""
    events = [annotation(measure.STEP_RANGE, 0, 100), annotation(measure.STEP_RANGE, 100, 100)]
    for base in (0, 100):
        events += [x("gemm", "kernel", base + 10, 20), x("norm", "kernel", base + 33, 5),
                   x("gemm", "kernel", base + 39, 20), x("silu", "kernel", base + 62, 30)]
    gaps = measure.analyze_trace(events)["idle_gaps"]
    by_pair = {(g["before"], g["after"]): g for g in gaps}
    assert by_pair[("gemm", "norm")] == {"before": "gemm", "after": "norm", "us_per_step": pytest.approx(3),
                                         "gaps_per_step": 1, "median_us": pytest.approx(3)}
    assert by_pair[("gemm", "silu")]["us_per_step"] == pytest.approx(3)
    assert by_pair[("norm", "gemm")]["us_per_step"] == pytest.approx(1)
    # between the steps: silu ends at 92, gemm starts at 110; the window starts with 10 µs idle
    assert by_pair[("silu", "gemm")]["us_per_step"] == pytest.approx(18 / 2)
    assert by_pair[(None, "gemm")]["us_per_step"] == pytest.approx(10 / 2)
    assert by_pair[("silu", None)]["us_per_step"] == pytest.approx(8 / 2)
    assert [g["us_per_step"] for g in gaps] == sorted((g["us_per_step"] for g in gaps), reverse=True)
    total = sum(g["us_per_step"] for g in gaps)
    assert total / 1e3 == pytest.approx(measure.analyze_trace(events)["idle_ms"])


def test_overlapping_activities_leave_no_gap_between_them():
    """A kernel that starts before the one ahead ends (programmatic dependent launch) makes no
    idle at that boundary."""
    events = [annotation(measure.STEP_RANGE, 0, 50), x("a", "kernel", 0, 20), x("b", "kernel", 15, 20),
              x("c", "kernel", 40, 10)]
    gaps = measure.analyze_trace(events)["idle_gaps"]
    assert [(g["before"], g["after"], g["us_per_step"]) for g in gaps] == [("b", "c", pytest.approx(5))]
