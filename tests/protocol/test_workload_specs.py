"""Workloads are declared in harness/protocol/workloads/ (one WorkloadSpec per module), and
everything else reads them: the cell schema (params), the scenario validator, the gate's
default policies and the worker's runners. A spec module dropped into the package is a new
workload, with no other file touched."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.gate import policy
from harness.protocol import params, workloads
from harness.protocol.workloads import Param, WorkloadSpec, discover
from harness.sweep import scenario
from harness.worker import workloads as runners

REPO = Path(__file__).resolve().parents[2]
SPECS = workloads.SPECS


def test_the_registry_lists_the_modules_of_the_package():
    assert list(SPECS) == ["decode", "calibrate", "noop", "kernel", "op", "peer",
                           "pytest_benchmark", "service"]
    assert params.WORKLOADS == tuple(SPECS)
    modules = sorted(p.stem for p in (REPO / "harness/protocol/workloads").glob("*.py")
                     if not p.name.startswith("_"))
    assert modules == sorted(SPECS)


def test_every_parameter_is_declared_once_and_reaches_the_schema():
    general = (params.WORKLOAD_PARAM,) + params.GENERAL_PARAMS
    declared = [p for p in general] + [p for s in SPECS.values() for p in s.all_params()]
    assert sorted(p.name for p in declared) == sorted(params.ALL_PARAMS)
    assert len({p.name for p in declared}) == len(declared)
    for p in declared:
        assert params.PARAMS[p.name] is p
        assert params.ALL_PARAMS[p.name] == p.default
        assert p.name in scenario.CellParams.model_fields
        assert p.name in scenario.MatrixParams.model_fields
        assert tuple(scenario._describe(("defaults", p.name))) == (p.name, p.what, p.choices)
        assert (p.name in params.MEASUREMENT_KNOBS) == p.measurement
    for name, spec in SPECS.items():
        assert params.WORKLOAD_PARAMS.get(name, {}) == {p.name: p.default for p in spec.params}
        for p in spec.shared_params + spec.impl_params:       # in every cell
            assert params.DEFAULTS[p.name] == p.default
        assert {p.name: p.default for p in spec.impl_params}.items() <= params.IMPL_DEFAULTS.items()


def test_a_parameters_declaration_is_what_the_validator_enforces(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\nmatrix:\n  workload: [noop]\n  sleep_s: [-1]\n")
    with pytest.raises(Exception, match=f"sleep_s must be {params.PARAMS['sleep_s'].what}, got -1"):
        scenario.load_scenario(path)
    path.write_text("name: t\nmatrix:\n  workload: [calibrate]\n  replay: [lazy]\n")
    with pytest.raises(Exception, match=r"unknown replay 'lazy' \(allowed: eager, graph\)"):
        scenario.load_scenario(path)


def _recording(calls: list, name: str, check):
    def wrapped(cell):
        calls.append((name, cell["workload"]))
        return check(cell)
    return wrapped


def test_every_check_runs_on_the_cells_it_declares(monkeypatch):
    """A spec's `checks` run on its own cells; `shared_checks` on every cell."""
    calls: list = []
    own = {(f"{n}.{c.__name__}", n) for n, s in SPECS.items() for c in s.checks}
    shared = {(f"{n}.{c.__name__}", w) for n, s in SPECS.items() for c in s.shared_checks
              for w in SPECS}
    for name, spec in list(SPECS.items()):
        monkeypatch.setitem(SPECS, name, dataclasses.replace(
            spec,
            checks=tuple(_recording(calls, f"{name}.{c.__name__}", c) for c in spec.checks),
            shared_checks=tuple(_recording(calls, f"{name}.{c.__name__}", c)
                                for c in spec.shared_checks)))
    scenario.parse_scenario("name: t\nmatrix:\n  workload: [decode, calibrate, noop, kernel, op, "
                            "peer]\ninclude:\n  - {workload: pytest_benchmark, benchmark: t.py::test_a}\n"
                            "  - {workload: service, service_start: engine}\n")
    assert set(calls) == own | shared
    assert ("decode.check_context", "decode") in calls and ("kernel.check_shape", "kernel") in calls
    assert ("decode.check_tau", "kernel") in calls
    assert ("kernel.check_shape", "decode") not in calls


def test_a_failing_check_points_at_the_first_blamed_parameter_the_scenario_sets(monkeypatch):
    def no_long_naps(cell):
        return (("seed", "sleep_s"), "too long") if cell["sleep_s"] > 1 else None
    monkeypatch.setitem(SPECS, "noop", dataclasses.replace(SPECS["noop"], checks=(no_long_naps,)))
    text = "name: t\nmatrix:\n  workload: [noop]\n  sleep_s: [0.5, 2]\n"
    with pytest.raises(Exception) as info:
        scenario.parse_scenario(text, "s.yaml")
    assert str(info.value) == "s.yaml:4:18: too long"     # sleep_s: [0.5, 2] at its 2


def test_labels_come_from_the_specs():
    expected = {"decode": "tiny ctx=256 N=16 verify=sdpa graph=none tree=cpu greedy",
                "calibrate": "calibrate work_us=500 idle_target=0.5 replay=eager",
                "noop": "noop sleep_s=0",
                "kernel": "kernel sdpa ctx=256 T=16 gqa 32/8 d128 contiguous",
                "op": "op topk auto tiny D=7 k=16",
                "peer": "peer transformers static tiny ctx=256",
                "pytest_benchmark": "bench ?",
                "service": "service engine ctx=256 out=64 c=1"}
    for name, spec in SPECS.items():
        cell = params.canonical({"workload": name})
        assert params.cell_label(cell) == spec.cell_label(cell) == expected[name]


def test_a_speculative_decode_label_says_which_acceptance_it_uses():
    label = params.cell_label
    assert label({"acceptance": "greedy"}).endswith(" tree=cpu greedy")
    assert label({"acceptance": "synthetic"}).endswith(" tree=cpu synthetic tau=6.5")
    assert label({"acceptance": "synthetic", "tau": 4, "accept": "gpu"}).endswith(
        " accept=gpu synthetic tau=4")
    # plain decoding has no acceptance model, so no word
    plain = label({"speculation": "none", "acceptance": "synthetic"})
    assert "greedy" not in plain and "synthetic" not in plain and "tau" not in plain


def test_renaming_labels_changes_no_cell_id():
    # ids of these cells as computed before labels said greedy/synthetic: a label is a name,
    # never part of the id, so journals and baselines keep lining up.
    before = {"7a3adb3bd300": {"acceptance": "synthetic", "tau": 4.0},
              "8b4e20c2f3d4": {"acceptance": "greedy"},
              "25d4a628bee3": {"speculation": "none"},
              "30179517e19b": {"acceptance": "synthetic", "tau": 6.5, "context_length": 4096,
                               "model": "qwen3-8b"}}
    assert {params.cell_id(c): c for c in before.values()} == before


def test_default_policies_are_the_union_of_the_workloads_policies():
    union = {}
    for spec in SPECS.values():
        for metric, fields in spec.policies.items():
            union.setdefault(metric, policy.Policy(metric, **fields))
    assert list(policy.DEFAULT_POLICIES.items()) == list(union.items())
    # the policies the gate had before workloads declared them, plus the profiler's overhead
    # and a serving engine's NVML idle estimate (both reported, never gated)
    P = policy.Policy
    assert list(policy.DEFAULT_POLICIES.values()) == [
        P("tokens_per_s", "higher", threshold_rel=0.03),
        P("accept_len_mean", "higher", threshold_rel=0.03),
        P("idle_fraction", "lower", threshold_abs=0.02, gate=False, per="run"),
        P("profiler_overhead_pct", "lower", threshold_abs=1.0, gate=False, per="run"),
        P("step_ms_p50", "lower", threshold_rel=0.03),
        P("kernel_us", "lower", threshold_rel=0.03),
        P("idle_fraction_nvml", "lower", threshold_abs=0.05, gate=False, per="run"),
    ]


def test_the_worker_runs_what_each_spec_names():
    import importlib.util
    assert runners.REGISTRY == {name: spec.runner for name, spec in SPECS.items()}
    for spec in SPECS.values():
        module, _, _ = spec.runner.partition(":")
        assert importlib.util.find_spec(module) is not None, spec.runner
    result = runners.resolve("noop")(params.canonical({"workload": "noop"}), lambda **_: None)
    assert result["metrics"]["slept_s"] >= 0


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="either choices or a type"):
        Param("x", 1)
    with pytest.raises(ValueError, match="is not a choice"):
        Param("x", "c", choices=("a", "b"))
    with pytest.raises(ValueError, match="say what a value must be"):
        Param("x", 1, int)
    with pytest.raises(ValueError, match="not 'module:function'"):
        WorkloadSpec(name="x", runner="harness.worker.workloads.x")
    with pytest.raises(ValueError, match="declared twice"):
        WorkloadSpec(name="x", runner="m:run", params=(Param("a", 1, int, "an int"),) * 2)


# -- discovery ---------------------------------------------------------------------------------

def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(textwrap.dedent(text))


def _spec_module(name: str, order: int | None = None) -> str:
    extra = "" if order is None else f", order={order}"
    return (f"from harness.protocol.workloads import WorkloadSpec\n"
            f"SPEC = WorkloadSpec(name={name!r}, runner='x:run'{extra})\n")


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("wlpkg")]:
        del sys.modules[name]


def test_discover_lists_every_spec_module_in_order(on_path):
    _package(on_path, "wlpkg_a", {"zeta": _spec_module("zeta"), "alpha": _spec_module("alpha"),
                                  "first": _spec_module("first", order=0),
                                  "_helpers": "X = 1\n"})
    assert list(discover("wlpkg_a")) == ["first", "alpha", "zeta"]


def test_discover_refuses_a_module_without_a_spec_or_with_anothers_name(on_path):
    _package(on_path, "wlpkg_b", {"empty": "X = 1\n"})
    with pytest.raises(TypeError, match="wlpkg_b.empty defines no SPEC"):
        discover("wlpkg_b")
    _package(on_path, "wlpkg_c", {"one": _spec_module("two")})
    with pytest.raises(RuntimeError, match="named after the workload"):
        discover("wlpkg_c")


# A process whose harness/protocol/workloads/ (and harness/worker/workloads/) also lists a
# folder outside the repository, holding one new spec module (and its runner): what a new
# workload's two files do, without writing into the shared source tree.
_EXTENDED = """
import importlib.util, json, sys
extra = sys.argv[1]
spec = importlib.util.find_spec("harness.protocol.workloads")
spec.submodule_search_locations.append(extra + "/protocol")
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
import harness.worker.workloads as runners
runners.__path__.append(extra + "/worker")
"""

_GEMM_SPEC = """
from harness.protocol.workloads import Param, WorkloadSpec, positive_int

def check_rows(cell):
    if cell["rows"] % cell["block"]:
        return ("rows", "block"), f"rows {cell['rows']} is not a multiple of block {cell['block']}"
    return None

SPEC = WorkloadSpec(
    name="gemm",
    runner="harness.worker.workloads.gemm:run",
    params=(positive_int("rows", 4096), positive_int("block", 128),
            Param("alpha", 1.0, float, "a number > 0", gt=0)),
    checks=(check_rows,),
    policies={"gemm_us": {"direction": "lower", "threshold_rel": 0.05}},
)
"""

_GEMM_RUNNER = """
def run(cell, progress):
    progress(stage="measure")
    return {"metrics": {"gemm_us": cell["rows"] / cell["block"]}, "samples": {}}
"""

_PROBE = """
from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.scenario import load_scenario, parse_scenario
from harness.gate.policy import DEFAULT_POLICIES
from harness.worker.main import run_cell

def error(text):
    try:
        parse_scenario(text, "s.yaml")
    except InputError as exc:
        return str(exc)

ok = parse_scenario("name: g\\nmatrix:\\n  workload: [gemm]\\n  rows: [4096, 8192]\\n")
result = run_cell({"workload": "gemm", "rows": 512, "block": 64})
print(json.dumps({
    "workloads": params.WORKLOADS,
    "gemm_params": params.WORKLOAD_PARAMS.get("gemm"),
    "labels": [params.cell_label(c) for c in ok.cells()],
    "ids": {name: load_scenario(f"scenarios/{name}.yaml").cell_ids() for name in sys.argv[2:]},
    "check": error("name: g\\nmatrix:\\n  workload: [gemm]\\n  block: [100]\\n"),
    "type": error("name: g\\nmatrix:\\n  workload: [gemm]\\n  alpha: [0]\\n"),
    "foreign": error("name: g\\nmatrix:\\n  workload: [noop]\\n  rows: [8]\\n"),
    "unknown": error("name: g\\nmatrix:\\n  workload: [gem]\\n"),
    "policy": DEFAULT_POLICIES["gemm_us"].to_dict(),
    "policies": list(DEFAULT_POLICIES),
    "result": [result["status"], result["error"], result["metrics"], result["label"]],
}))
"""

SHIPPED = ("quickstart", "nightly", "pr", "calibrate", "kernels", "ops", "decode-modes")


def _extended_run(tmp_path: Path, spec_text: str, runner_text: str = _GEMM_RUNNER):
    (tmp_path / "protocol").mkdir()
    (tmp_path / "worker").mkdir()
    (tmp_path / "protocol" / "gemm.py").write_text(spec_text)
    (tmp_path / "worker" / "gemm.py").write_text(runner_text)
    return subprocess.run([sys.executable, "-c", _EXTENDED + _PROBE, str(tmp_path), *SHIPPED],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_a_dropped_in_spec_module_is_a_workload_everywhere(tmp_path):
    out = _extended_run(tmp_path, _GEMM_SPEC)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["workloads"] == ["decode", "calibrate", "noop", "kernel", "op", "peer",
                                 "pytest_benchmark", "service", "gemm"]
    assert seen["gemm_params"] == {"rows": 4096, "block": 128, "alpha": 1.0}
    assert seen["labels"] == ["gemm rows=4096 block=128 alpha=1", "gemm rows=8192 block=128 alpha=1"]
    assert seen["check"] == "s.yaml:4:11: rows 4096 is not a multiple of block 100"
    assert seen["type"] == "s.yaml:4:11: alpha must be a number > 0, got 0"
    assert seen["foreign"] == ("s.yaml:4:10: rows is a parameter of workload 'gemm' only; "
                               "this cell runs workload 'noop'")
    assert seen["unknown"] == ("s.yaml:3:14: unknown workload 'gem' (allowed: decode, calibrate, "
                               "noop, kernel, op, peer, pytest_benchmark, service, gemm; did you "
                               "mean 'gemm'?)")
    assert seen["policy"]["direction"] == "lower" and seen["policy"]["threshold_rel"] == 0.05
    assert seen["policies"] == [*policy.DEFAULT_POLICIES, "gemm_us"]
    assert seen["result"] == ["ok", None, {"gemm_us": 8.0}, "gemm rows=512 block=64 alpha=1"]
    # a new workload changes no existing cell's id
    assert seen["ids"] == {name: scenario.load_scenario(REPO / "scenarios" / f"{name}.yaml").cell_ids()
                           for name in SHIPPED}


def test_a_parameter_name_belongs_to_one_workload(tmp_path):
    out = _extended_run(tmp_path, _GEMM_SPEC.replace('positive_int("block", 128)',
                                                     'positive_int("heads", 128)'))
    assert out.returncode != 0
    assert "cell parameter heads is declared twice" in out.stderr
