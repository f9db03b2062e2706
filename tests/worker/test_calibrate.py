"""The calibration workload on a CPU (its schedule and host-gap logic; idle is n/a there), and
the per-workload parameters: calibrate's knobs never change a decode cell's id."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.scenario import load_scenario, parse_scenario
from harness.worker import main as worker
from harness.worker.workloads import calibrate, resolve

REPO = Path(__file__).resolve().parents[2]


# -- schedule ----------------------------------------------------------------------------------
def test_step_period_gives_the_target_idle():
    assert calibrate.step_period_s(1e-3, 0.5) == pytest.approx(2e-3)
    assert calibrate.step_period_s(1e-3, 0.9) == pytest.approx(1e-2)
    assert calibrate.step_period_s(1e-3, 0.1) == pytest.approx(1e-3 / 0.9)
    assert calibrate.step_period_s(1e-3, 0.0) == pytest.approx(5e-4)   # host runs ahead
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError):
            calibrate.step_period_s(1e-3, bad)


def test_window_steps_fill_the_minimum_window():
    assert calibrate.window_steps(1e-3, 16) == 50
    assert calibrate.window_steps(1e-3, 16, min_window_s=0.005) == 16
    assert calibrate.window_steps(0.1, 16) == 16


# -- the truth from the kernels' own clock ---------------------------------------------------------
US = 1000                 # ns
GPU_CLOCK = 7_000_000_000  # the GPU clock's offset from the host's: unknown to gpu_truth


def paced(n, period_us, work_us, latency_us=5, first_host_us=1000, late=None):
    """Launches every period_us; each kernel runs work_us, starting latency_us after its
    launch or when the previous one ends. late={k: extra µs} delays a kernel's start."""
    launch, stamps, free = [], [], 0
    for k in range(n):
        h = (first_host_us + k * period_us) * US
        start = max(h + (latency_us + (late or {}).get(k, 0)) * US, free) + GPU_CLOCK
        stamps.append((start, start + work_us * US))
        launch.append(h)
        free = start + work_us * US - GPU_CLOCK
    return stamps, launch


def test_truth_when_the_gpu_waits():
    stamps, launch = paced(40, period_us=100, work_us=50)
    lo, hi = launch[0], launch[-1] + 100 * US
    t = calibrate.gpu_truth(stamps, launch, 0, 40, lo, hi)
    assert t["idle"] == pytest.approx(0.5)
    assert t["kernel_us"] == pytest.approx(50)
    assert t["latency_us"] == pytest.approx(0)
    # A window of the last 20 steps only: the same.
    t = calibrate.gpu_truth(stamps, launch, 20, 20, launch[20], hi)
    assert t["idle"] == pytest.approx(0.5)


def test_truth_ignores_a_late_kernel_for_the_clock_and_sees_its_idle():
    # Kernel 3 starts 30 µs late (the GPU was held up): the clock placement uses the smallest
    # latency, and the late start is idle time the meter must see too.
    stamps, launch = paced(10, period_us=100, work_us=50, late={3: 30})
    t = calibrate.gpu_truth(stamps, launch, 0, 10, launch[0], launch[-1] + 100 * US)
    assert t["idle"] == pytest.approx(0.5)          # 50 of every 100 µs, the late one included
    assert t["latency_us"] == pytest.approx(0)      # median: the late one is one of ten


def test_truth_when_the_host_runs_ahead():
    # Host every 25 µs, kernels of 50 µs: the GPU is busy from its first kernel on; work
    # launched in the window runs long after it, and is clipped away.
    stamps, launch = paced(100, period_us=25, work_us=50, latency_us=5)
    lo, hi = launch[0], launch[-1] + 25 * US
    t = calibrate.gpu_truth(stamps, launch, 0, 100, lo, hi)
    assert t["idle"] == pytest.approx(0.0, abs=1e-9)
    assert t["latency_us"] > 1000                  # the GPU fell far behind the host
    # A later window of a queue that never drained: the whole window is busy.
    t = calibrate.gpu_truth(stamps, launch, 50, 50, launch[50], hi)
    assert t["idle"] == pytest.approx(0.0, abs=1e-9)


def test_truth_counts_a_backlog_from_before_the_window():
    # 10 kernels of 200 µs launched at once before the window, then a window of 10 steps of
    # 100 µs launching 20 µs kernels: the backlog covers the first 2000 µs of the window.
    stamps, launch = paced(10, period_us=0, work_us=200, first_host_us=0)
    more_stamps, more_launch = paced(10, period_us=100, work_us=20, first_host_us=10)
    start = stamps[-1][1]                   # the window's kernels wait for the backlog
    more_stamps = [(max(s, start + 20 * US * k), max(s, start + 20 * US * k) + 20 * US)
                   for k, (s, _) in enumerate(more_stamps)]
    t = calibrate.gpu_truth(stamps + more_stamps, launch + more_launch, 10, 10,
                            more_launch[0], more_launch[-1] + 100 * US)
    # Every window kernel queued behind the backlog, the host slower than the GPU: the clock
    # is placed by the first backlog launch (it found the GPU idle), not by the window's.
    assert t["idle"] == pytest.approx(0.0, abs=1e-9)
    assert t["latency_us"] > 500
    # Placed by the window's own launches instead (the GPU never idle at any of them), the
    # window would sit ~1.3 ms late on the GPU clock and show idle that never was.
    t = calibrate.gpu_truth(more_stamps, more_launch, 0, 10, more_launch[0],
                            more_launch[-1] + 100 * US)
    assert t["idle"] > 0.05


def test_truth_without_stamps():
    stamps, launch = paced(4, period_us=100, work_us=50)
    assert calibrate.gpu_truth([None] * 4, launch, 0, 4, launch[0], launch[-1]) is None
    assert calibrate.gpu_truth(stamps, launch, 0, 4, launch[1], launch[0]) is None
    # A lost slot inside the window is left out; the rest still places the clock.
    t = calibrate.gpu_truth([stamps[0], None, *stamps[2:]], launch, 0, 4, launch[0],
                            launch[-1] + 100 * US)
    assert t["idle"] == pytest.approx(0.625)


class FakeClock:
    def __init__(self, tick):
        self.now, self.tick, self.reads = 0.0, tick, 0

    def __call__(self):
        self.reads += 1
        t = self.now
        self.now += self.tick
        return t


def test_host_pacer_waits_one_period_and_never_bursts():
    clock = FakeClock(0.25)
    pacer = calibrate.HostPacer(1.0, clock)
    pacer.start()                                  # read 0.0: first deadline 1.0
    pacer.wait()                                   # spins through 0.25, 0.5, 0.75, 1.0
    assert clock.reads == 5 and pacer.deadline == 2.0
    clock.now = 3.5                                # a step ran late, past its deadline
    pacer.wait()                                   # returns at once ...
    assert clock.reads == 6 and pacer.deadline == 4.5   # ... and no catch-up: a full period
    pacer.wait()
    assert clock.reads == 10 and pacer.deadline == 5.5


# -- the workload on a CPU ---------------------------------------------------------------------
def cpu_cell(**kw):
    cell = {"workload": "calibrate", "device": "cpu", "work_us": 100, "idle_target": 0.5,
            "warmup_steps": 1, "steps": 4, "repeats": 2, "profile_steps": 4}
    cell.update(kw)
    return params.canonical(cell)


def test_calibrate_on_cpu_reports_no_idle():
    out = resolve("calibrate")(cpu_cell(), lambda **k: None)
    m = out["metrics"]
    for key in ("idle_fraction", "idle_fraction_est", "idle_true", "idle_error_pp",
                "idle_est_error_pp"):
        assert m[key] is None, key
    assert m["step_us_target"] == pytest.approx(2 * m["work_us"])      # idle 0.5: T = 2 D
    steps = out["calibration"]["steps"]
    assert steps == calibrate.window_steps(m["step_us_target"] / 1e6, 4)
    assert len(out["samples"]["step_us"]) == 2 and "timeline" not in out


def test_graph_replay_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        calibrate.run(cpu_cell(replay="graph"), lambda **k: None)


def test_worker_runs_a_calibrate_cell():
    result = worker.run_cell({"workload": "calibrate", "device": "cpu", "work_us": 50,
                              "idle_target": 0.9, "steps": 2, "repeats": 1})
    assert result["status"] == "ok", result["error"]
    assert result["label"] == "calibrate work_us=50 idle_target=0.9 replay=eager"
    assert result["metrics"]["idle_fraction"] is None


# -- parameters: per-workload, decode ids unchanged --------------------------------------------
# Ids of the shipped decode scenarios before the calibrate workload existed.
QUICKSTART_IDS = ["a62af40b3bd1", "4fc517e8460d", "d49dd8e13b0d", "ab140eb07705"]
DIGESTS = {"nightly": "aeaf4618ae3dd6f7", "pr": "d17326d8bf06c49a"}


def test_decode_cell_ids_are_unchanged():
    assert load_scenario(REPO / "scenarios" / "quickstart.yaml").cell_ids() == QUICKSTART_IDS
    for name, digest in DIGESTS.items():
        # The speculative cells pinned when the registry came in; the AR reference cells added
        # to nightly/pr later are new cells, not changed ones.
        cells = load_scenario(REPO / "scenarios" / f"{name}.yaml").cells()
        ids = [params.cell_id(c) for c in cells if c["speculation"] != "none"]
        assert hashlib.sha256(",".join(ids).encode()).hexdigest()[:16] == digest, name


def test_workload_params_join_only_their_cells():
    decode = params.canonical({})
    assert "work_us" not in decode and "replay" not in decode
    cal = params.canonical({"workload": "calibrate"})
    assert {k: cal[k] for k in params.WORKLOAD_PARAMS["calibrate"]} == \
        params.WORKLOAD_PARAMS["calibrate"]
    assert params.cell_id({"workload": "calibrate", "work_us": 50}) != \
        params.cell_id({"workload": "calibrate", "work_us": 500})


def test_calibrate_scenario_validates():
    scenario = load_scenario(REPO / "scenarios" / "calibrate.yaml")
    cells = scenario.cells()
    assert len(cells) == 24 == len(set(scenario.cell_ids()))
    assert {c["workload"] for c in cells} == {"calibrate"}
    assert {c["idle_target"] for c in cells} == {0.0, 0.1, 0.5, 0.9}
    assert {c["replay"] for c in cells} == {"eager", "graph"}


def test_workload_param_on_another_workload_is_an_input_error():
    text = "name: s\nmatrix:\n  context_length: [256]\n  work_us: [50]\n"
    with pytest.raises(InputError) as err:
        parse_scenario(text, "s.yaml")
    assert str(err.value) == ("s.yaml:4:13: work_us is a parameter of workload 'calibrate' "
                              "only; this cell runs workload 'decode'")


def test_bad_calibrate_values():
    base = "name: s\ndefaults:\n  workload: calibrate\nmatrix:\n"
    with pytest.raises(InputError, match=r"s.yaml:5:17: idle_target must be a number in \[0, 1\)"):
        parse_scenario(base + "  idle_target: [1.0]\n", "s.yaml")
    with pytest.raises(InputError, match="unknown replay 'graphs'.*did you mean 'graph'"):
        parse_scenario(base + "  replay: [graphs]\n", "s.yaml")


def test_exclude_naming_another_workloads_param_does_not_match_decode_cells():
    text = ("name: s\nmatrix:\n  context_length: [256, 512]\n"
            "exclude:\n  - {work_us: 50}\n"
            "include:\n  - {workload: calibrate, work_us: 50}\n")
    cells = parse_scenario(text, "s.yaml").cells()
    assert [c["workload"] for c in cells] == ["decode", "decode", "calibrate"]


# -- the GPU path's bookkeeping, with a simulated GPU ----------------------------------------------
class SimulatedSpin:
    """Stands in for harness.kernels.calibrate.spin.SpinWork: a 'GPU' that runs each launched kernel for
    exactly duration_us, in launch order, starting 5 µs after its launch at the earliest, on a
    clock 3 s ahead of the host's."""

    def __init__(self, duration_us, device="cuda"):
        self.duration_ns = round(duration_us * 1e3)
        self.launch_ns, self._stamps, self.free = [], [], 0

    def launch(self):
        t = time.perf_counter_ns()
        self.launch_ns.append(t)
        start = max(t + 5 * US, self.free)
        self.free = start + self.duration_ns
        self._stamps.append((start + 3_000_000_000, self.free + 3_000_000_000))

    def graphed(self):
        self.launch()                                   # the warm-up before the capture
        return self.launch

    def launches(self):
        return len(self.launch_ns)

    def stamps(self):
        return list(self._stamps)


def test_gpu_path_bookkeeping_with_a_simulated_gpu(monkeypatch):
    import sys
    import types

    import torch

    from harness.worker import idle

    fake_module = types.SimpleNamespace(SpinWork=SimulatedSpin)
    monkeypatch.setitem(sys.modules, "harness.kernels.calibrate.spin", fake_module)
    monkeypatch.setattr(calibrate, "resolve_device", lambda cell: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(calibrate.graphstate, "settle", lambda device: 0)   # no graphs to settle
    profiled = {}

    def fake_profile_window(step_fn, steps, *, warmup=1):
        for _ in range(warmup + steps):
            step_fn()
        profiled["steps"] = steps
        return {"idle_fraction": 0.5, "step_busy_ms": 0.2005, "steps": steps,
                "kernels_per_step": [1] * steps, "records_dropped": False, "phases": {},
                "gaps": {}, "timeline": [], "window_ms": 1.0}
    monkeypatch.setattr(idle, "profile_window", fake_profile_window)

    cell = params.canonical({"workload": "calibrate", "device": "cuda", "work_us": 200,
                             "idle_target": 0.5, "replay": "graph", "warmup_steps": 3,
                             "steps": 4, "repeats": 2, "profile_steps": 4})
    out = calibrate.run(cell, lambda **k: None)
    m, steps = out["metrics"], out["calibration"]["steps"]
    assert steps == calibrate.window_steps(calibrate.step_period_s(200 / 1e6, 0.5), 4)
    # graph warm-up, the first launch, then per repeat warm-up + window, then the profile
    assert out["calibration"]["launches"] == 2 + 2 * (3 + steps) + 3 + profiled["steps"]
    assert m["kernel_us"] == pytest.approx(200)
    assert m["kernel_edge_us"] == pytest.approx(0.5)          # 200.5 µs seen by the "profiler"
    for key in ("idle_true", "idle_true_est"):
        assert 0 <= m[key] <= 1, key
    assert len(out["samples"]["idle_true_est"]) == 2
    assert m["idle_error_pp"] == pytest.approx((0.5 - m["idle_true"]) * 100)
    assert m["idle_fraction_est"] is None and m["idle_est_error_pp"] is None   # no events
    assert m["latency_us"] >= 0 and isinstance(m["idle_target_missed"], bool)
