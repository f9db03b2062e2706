"""The `ncu` knob's plumbing (harness/worker/ncu.py) without a GPU: the profiler is a stand-in
script here (the real one is tested on a GPU host, test_ncu_gpu.py); the process it profiles is
the real harness/worker/ncu_target.py, and the kernel cell is a real CPU cell."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.protocol import params
from harness.worker import ncu
from harness.worker.workloads import kernel as kw
from harness.worker.workloads import op

DATA = Path(__file__).parent / "data"

# A stand-in for `ncu`: MODE (its first line) says what it does. `target` runs the profiled
# command as ncu would and writes a report only when it succeeds; `report` writes one without
# running it; `--import` prints the H200 fixture's details page after ncu-style noise.
FAKE = """\
#!{python}
import subprocess, sys, time
MODE = {mode!r}
args = sys.argv[1:]
if "--import" in args:
    print("==PROF== importing")
    page = args[args.index("--page") + 1]
    if page == "details":
        print(open({details!r}).read())
    if page == "source":
        if MODE == "no-source":
            print("==ERROR== unknown option --print-source")
            sys.exit(1)
        assert args[args.index("--print-source") + 1] == "sass"
        print(open({source!r}).read())
    sys.exit(0)
if MODE == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
          "Performance Counters on the target device 0.")
    sys.exit(1)
if MODE == "hang":
    time.sleep(60)
report = args[args.index("--export") + 1] + ".ncu-rep"
open({args_file!r}, "w").write(" ".join(args))
if MODE == "target":
    target = args[args.index("--force-overwrite") + 1:]
    done = subprocess.run(target)
    if done.returncode:
        print("==PROF== Disconnected")
        sys.exit(done.returncode)
open(report, "w").write("report")
"""


def fake_ncu(tmp_path: Path, mode: str) -> str:
    exe = tmp_path / "ncu"
    exe.write_text(FAKE.format(python=sys.executable, mode=mode, args_file=str(tmp_path / "args.txt"),
                               details=str(DATA / "ncu_details_h200.csv"),
                               source=str(DATA / "ncu_source_h100.csv")))
    exe.chmod(0o755)
    return str(exe)


def cpu_cell(**over) -> dict:
    cell = {"workload": "kernel", "device": "cpu", "verify_mode": "sdpa", "context_length": 70,
            "tree_tokens": 9, "heads": 4, "kv_heads": 2, "head_dim": 32, "repeats": 3,
            "warmup_steps": 1}
    cell.update(over)
    return params.canonical(cell)


def test_a_report_becomes_the_kernels_counters(tmp_path):
    got = ncu.profile(cpu_cell(), "custom", exe=fake_ncu(tmp_path, "report"))
    args = (tmp_path / "args.txt").read_text().split(" ")
    # the sections the details page is read from, the instruction count, the GPU's own clocks,
    # only the call between cudaProfilerStart and Stop
    assert args[args.index("--metrics") + 1] == "smsp__inst_executed.sum"
    assert {"SpeedOfLight", "WarpStateStats"} <= {args[i + 1] for i, a in enumerate(args) if a == "--section"}
    assert args[args.index("--clock-control") + 1] == "none"
    assert args[args.index("--profile-from-start") + 1] == "off"
    assert got["ncu.gqa_pipelined_kernel.duration_us"] == pytest.approx(235.42)
    assert got["ncu.gqa_tail_kernel.registers"] == 244
    assert "SourceCounters" in {args[i + 1] for i, a in enumerate(args) if a == "--section"}
    assert got["ncu.gqa_pipelined_kernel.time.MUFU"] == pytest.approx(21.5, abs=0.01)
    assert all(k.startswith("ncu.") for k in got)


def test_an_ncu_without_the_source_page_keeps_the_other_counters(tmp_path):
    got = ncu.profile(cpu_cell(), "custom", exe=fake_ncu(tmp_path, "no-source"))
    assert got["ncu.gqa_pipelined_kernel.duration_us"] == pytest.approx(235.42)
    assert not any(".time." in k for k in got)


def test_the_profiled_process_says_why_it_cannot_run(tmp_path):
    """The real target process on a CPU cell: one line, which becomes the reason."""
    with pytest.raises(ncu.Unavailable, match=r"ncu wrote no report \(exit 2\): ncu profiles CUDA "
                                              r"kernels; this cell runs on cpu"):
        ncu.profile(cpu_cell(), "sdpa", exe=fake_ncu(tmp_path, "target"))


def test_counters_the_driver_withholds_are_named(tmp_path):
    with pytest.raises(ncu.Unavailable, match="^ERR_NVGPUCTRPERM - The user does not have permission"):
        ncu.profile(cpu_cell(), "sdpa", exe=fake_ncu(tmp_path, "perm"))


def test_a_profile_that_does_not_finish_is_stopped(tmp_path):
    with pytest.raises(ncu.Unavailable, match="ncu did not finish within 2 s"):
        ncu.profile(cpu_cell(), "sdpa", timeout=2,
                    exe=fake_ncu(tmp_path, "hang"))


def test_a_host_without_ncu_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ncu, "_CANDIDATES", ())
    assert ncu.find_ncu() is None
    with pytest.raises(ncu.Unavailable, match="ncu .* is not on PATH"):
        ncu.profile(cpu_cell(), "sdpa")


def test_a_cpu_kernel_cell_with_ncu_keeps_its_timing_and_says_why_it_has_no_counters():
    result = kw.run(cpu_cell(ncu=True, compare_modes="flex"), lambda **_: None)
    assert result["metrics"]["kernel_us"] > 0 and "flex.kernel_us" in result["metrics"]
    assert not any(".ncu." in k or k.startswith("ncu.") for k in result["metrics"])
    assert result["kernel"]["ncu_errors"] == {
        "sdpa": "ncu profiles CUDA kernels; this cell ran on cpu",
        "flex": "ncu profiles CUDA kernels; this cell ran on cpu"}


def test_an_op_cell_on_cpu_likewise():
    cell = params.canonical({"workload": "op", "op": "topk", "device": "cpu", "model": "tiny",
                             "tree_budget": 8, "block_size": 4, "repeats": 3, "warmup_steps": 1,
                             "ncu": True})
    result = op.run(cell, lambda **_: None)
    assert result["metrics"]["kernel_us"] > 0
    assert result["kernel"]["ncu_errors"] == {"topk": "ncu profiles CUDA kernels; this cell ran on cpu"}


def test_ncu_is_a_measurement_knob_of_kernel_and_op_cells():
    """It adds metrics, never changes what a cell is: the id stays; other workloads refuse it."""
    assert params.cell_id(cpu_cell(ncu=True)) == params.cell_id(cpu_cell())
    from harness.protocol.errors import InputError
    from harness.sweep.scenario import parse_scenario
    parse_scenario("name: n\ndefaults: {workload: op}\nmatrix:\n  ncu: [true]\n", "n.yaml")
    with pytest.raises(InputError, match=r"^n.yaml:3:\d+: ncu profiles the call a kernel or op cell "
                                         r"times; this cell runs workload 'decode'"):
        parse_scenario("name: n\nmatrix:\n  ncu: [true]\n", "n.yaml")


def test_the_profiled_calls_are_the_cells_own():
    """What the profiled process calls (each runner's profile_call), run here on a CPU: a
    kernel cell's mode on its first timed input set gives that set's output; an op cell's call
    runs its kernel."""
    import torch
    cell = cpu_cell(batch_size=1)
    pt = kw.Point.from_cell(cell)
    out = kw.profile_call(cell, "sdpa", torch.device("cpu"), torch.float32)()
    first = kw.input_sets(pt, torch.device("cpu"), torch.float32, cell["seed"] * 1000)[0]
    assert torch.equal(out, kw.prepare("sdpa", pt, first)())
    cell = params.canonical({"workload": "op", "op": "tree_build", "device": "cpu", "model": "tiny",
                             "tree_budget": 8, "block_size": 4})
    op.profile_call(cell, "tree_build", torch.device("cpu"), torch.float32)()
