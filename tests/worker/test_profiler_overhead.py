"""The profiler's cost as decode cells report it (harness/worker/idle.py profiler_overhead) and
the scenario that sweeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.sweep.scenario import load_scenario
from harness.worker import idle

REPO = Path(__file__).resolve().parents[2]


def test_overhead_is_the_profiled_step_against_the_plain_windows_either_side():
    stats = {"window_ms": 66.0, "steps": 6}                  # 11 ms a step under the profiler
    # Steps drifting from 9.5 to 10.5 ms over the three windows: the mean of the two plain
    # ones is the drift at the profiled window, so only the profiler's 1 ms is charged.
    out = idle.profiler_overhead(stats, [9.5, 10.5])
    assert out == {"profiled_step_ms": 11.0, "profiler_overhead_pct": pytest.approx(10.0)}
    assert idle.profiler_overhead(stats, [12.0])["profiler_overhead_pct"] == pytest.approx(-100 / 12)


def test_a_plain_window_times_only_its_recorded_steps():
    now = [0.0]                       # seconds, advanced by the steps themselves
    calls = []

    def step():                       # the warm-up's steps take 50 ms, the recorded ones 4
        calls.append(now[0])
        now[0] += 0.050 if len(calls) <= 2 else 0.004

    ms = idle.plain_window(step, 5, warmup=2, clock=lambda: now[0])
    assert len(calls) == 7
    assert ms == pytest.approx(4.0)


@pytest.mark.parametrize("stats, windows", [({}, [10.0]), ({"window_ms": 5.0, "steps": 0}, [10.0]),
                                            ({"window_ms": 5.0, "steps": 2}, [])])
def test_no_profiled_window_means_no_overhead_rather_than_zero(stats, windows):
    assert idle.profiler_overhead(stats, windows) == {}


def test_the_profiler_overhead_scenario_profiles_as_many_steps_as_it_times():
    cells = load_scenario(REPO / "scenarios" / "profiler-overhead.yaml").cells()
    assert len(cells) == 8
    assert all(c["profile_steps"] == c["steps"] and c["profile"] for c in cells)
    assert {c["graph_capture"] for c in cells} == {"none", "verify", "full"}


def test_the_profiling_windows_fit_the_steps_the_bounds_count():
    # The worker warms each profiling window up with the fast loops' steps in flight + 1; the
    # KV cache, the synthetic draws and the context check count PROFILE_WARMUP steps for it.
    from harness.decode.fast import IN_FLIGHT
    from harness.protocol.workloads import decode

    from harness.worker.workloads import decode as worker

    assert IN_FLIGHT + 1 <= decode.PROFILE_WARMUP
    # One count: the worker sizes its cache and draws with the function the check uses.
    assert worker.repeat_steps is decode.repeat_steps and worker.AUDIT_STEPS == decode.AUDIT_STEPS
