"""The idle meter on an engine's profiler trace, on real Kineto traces: the H200 trace of
tests/worker/data (torch.profiler with CUDA activity, named ranges), and a CPU-only one made
here by torch.profiler (no device activity: nothing to say about a GPU)."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from harness.worker import engine_trace, measure

H200 = Path(__file__).resolve().parents[1] / "worker" / "data" / "idle_trace.json.gz"


@pytest.fixture(scope="module")
def events():
    return json.loads(gzip.decompress(H200.read_bytes()))["traceEvents"]


def test_the_window_is_the_whole_profile_and_busy_its_device_union(events):
    got = engine_trace.analyze(engine_trace.load(H200))         # gzip read in place
    steps = measure.analyze_trace(events)                       # over its harness.step ranges
    x = [e for e in events if e.get("ph") == "X" and "ts" in e]
    lo = min(float(e["ts"]) for e in x)
    hi = max(float(e["ts"]) + float(e.get("dur", 0)) for e in x)
    assert got["window_ms"] == pytest.approx((hi - lo) / 1e3)
    assert got["window_ms"] > steps["window_ms"]                 # the profile outlasts the steps
    assert got["busy_ms"] >= steps["busy_ms"] > 0
    assert got["idle_fraction"] == pytest.approx(1 - got["busy_ms"] / got["window_ms"])
    # Summing durations instead of taking their union would count overlaps twice.
    device = [e for e in x if e.get("cat") in measure.DEVICE_CATEGORIES]
    assert got["busy_ms"] <= sum(float(e.get("dur", 0)) for e in device) / 1e3 + 1e-9


def test_device_time_goes_to_the_innermost_range_that_launched_it(events):
    got = engine_trace.analyze(events)
    steps = measure.analyze_trace(events)
    # Four draft/tree/verify rounds launched everything (a warm-up round before the three
    # profiled steps): the innermost range wins over the enclosing harness.step, and the
    # phases do not overlap, so their GPU time adds up to the busy time.
    assert set(got["ranges"]) == {f"phase.{p}" for p in steps["phases"]}
    assert sum(r["gpu_ms"] for r in got["ranges"].values()) == pytest.approx(got["busy_ms"])
    # The warm-up round's launches count too, beside the three profiled steps' kernels.
    assert sum(r["records"] for r in got["ranges"].values()) > sum(steps["kernels_per_step"])
    for phase, stats in steps["phases"].items():
        assert got["ranges"][f"phase.{phase}"]["gpu_ms"] >= stats["gpu_ms"] * steps["steps"]


def test_a_cpu_only_profile_says_nothing_about_idle(tmp_path):
    import torch
    with (torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
          torch.profiler.record_function("forward")):
        torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "rank0.pt.trace.json"
    prof.export_chrome_trace(str(path))
    assert engine_trace.analyze(engine_trace.load(path)) == {}


def test_only_traces_written_since_the_profile_began_are_read(tmp_path):
    old = tmp_path / "old.pt.trace.json.gz"
    old.write_bytes(b"")
    os.utime(old, (time.time() - 3600,) * 2)
    since = time.time() - 1
    (tmp_path / "rank1").mkdir()
    new = tmp_path / "rank1" / "x.pt.trace.json.gz"
    new.write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert engine_trace.traces_since(tmp_path, since) == [new]


def test_numbered_profiler_steps_are_one_range_and_the_list_stays_short(events, monkeypatch):
    # The H200 trace with its phase ranges renamed the way torch numbers ProfilerStep#N: one
    # name per range kind, and at most MAX_RANGES names whatever the trace holds.
    renamed, n = [], 0
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("phase."):
            n += 1
            e = dict(e, name=f"ProfilerStep#{n}")
        renamed.append(e)
    got = engine_trace.analyze(renamed)
    assert n > 1 and set(got["ranges"]) == {"ProfilerStep"}
    assert got["ranges"]["ProfilerStep"]["gpu_ms"] == pytest.approx(got["busy_ms"])
    many = [dict(e, name=f"range-{i}") if e.get("cat") == "user_annotation" else e
            for i, e in enumerate(events)]
    every = engine_trace.analyze(many)["ranges"]
    assert len(every) == 12                      # the ranges that launched device work
    monkeypatch.setattr(engine_trace, "MAX_RANGES", 5)
    kept = engine_trace.analyze(many)["ranges"]
    assert len(kept) == 5
    assert min(r["gpu_ms"] for r in kept.values()) >= max(
        r["gpu_ms"] for name, r in every.items() if name not in kept)
