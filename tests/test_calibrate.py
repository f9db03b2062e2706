"""The calibration workload on a CPU (its schedule and host-gap logic; idle is n/a there), and
the per-workload parameters: calibrate's knobs never change a decode cell's id."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from harness import params, worker
from harness.errors import InputError
from harness.scenario import load_scenario, parse_scenario
from harness.workloads import calibrate, resolve

REPO = Path(__file__).resolve().parent.parent


# -- schedule ----------------------------------------------------------------------------------
def test_step_period_gives_the_target_idle():
    assert calibrate.step_period_s(1e-3, 0.5) == pytest.approx(2e-3)
    assert calibrate.step_period_s(1e-3, 0.9) == pytest.approx(1e-2)
    assert calibrate.step_period_s(1e-3, 0.0) == pytest.approx(5e-4)   # host runs ahead
    for target in (0.0, 0.1, 0.5, 0.9):
        period = calibrate.step_period_s(1e-3, target)
        assert calibrate.true_idle(1e-3, period) == pytest.approx(target)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError):
            calibrate.step_period_s(1e-3, bad)


def test_window_steps_fill_the_minimum_window():
    assert calibrate.window_steps(1e-3, 16) == 50
    assert calibrate.window_steps(1e-3, 16, min_window_s=0.005) == 16
    assert calibrate.window_steps(0.1, 16) == 16


def test_choose_size():
    timings = {1024: 5e-6, 2048: 30e-6, 4096: 220e-6}
    assert calibrate.choose_size(50e-6, timings) == (2048, 2)
    assert calibrate.choose_size(10e-3, timings) == (4096, 45)
    assert calibrate.choose_size(1e-6, timings) == (1024, 1)     # nothing fits: the smallest


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
        ids = load_scenario(REPO / "scenarios" / f"{name}.yaml").cell_ids()
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
