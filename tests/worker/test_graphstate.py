"""harness/worker/graphstate.py: every workload that times graph replays settles the process's
CUDA graph state before it times anything, and a GPU result says it did.

On a CPU there is no graph state: `settle` does nothing and the result says nothing. The wiring
is checked on the CPU by recording the calls; the settling itself on a GPU (skipped without
one). What the state does to a decode step was measured on the H200 (kernels/NOTES.md, "The
process's graph count"), a number for a benchmark to record, not for a test to assert.
"""

from __future__ import annotations

import pytest
import torch

from harness.protocol import params
from harness.worker import graphstate
from harness.worker import main as worker


@pytest.fixture
def fresh(monkeypatch):
    """This process as if nothing had settled it yet (on a GPU host other tests may have)."""
    monkeypatch.setattr(graphstate, "_settled", {})


@pytest.fixture
def calls(monkeypatch, fresh):
    seen = []
    real = graphstate.settle

    def record(device):
        seen.append(str(device))
        return real(device)
    monkeypatch.setattr(graphstate, "settle", record)
    return seen


def test_a_cpu_has_no_graph_state_to_settle(fresh):
    assert graphstate.settle(torch.device("cpu")) == 0
    assert graphstate.settled() is None


DECODE = {"workload": "decode", "model": "tiny", "device": "cpu", "context_length": 32, "steps": 2,
          "repeats": 1, "warmup_steps": 0, "profile_steps": 0}
OP = {"workload": "op", "op": "tree_build", "tree_build_impl": "torch", "device": "cpu",
      "model": "tiny", "block_size": 6, "tree_budget": 12, "context_length": 40, "repeats": 2,
      "warmup_steps": 1}
KERNEL = {"workload": "kernel", "device": "cpu", "verify_mode": "sdpa", "context_length": 70,
          "tree_tokens": 9, "heads": 4, "kv_heads": 2, "head_dim": 32, "repeats": 2,
          "warmup_steps": 1}
CALIBRATE = {"workload": "calibrate", "device": "cpu", "work_us": 200, "idle_target": 0.2,
             "steps": 20, "repeats": 1}
PEER = {"workload": "peer", "model": "tiny", "context_length": 24, "steps": 4, "repeats": 1,
        "warmup_steps": 1, "device": "cpu", "peer_cache": "static"}


@pytest.mark.parametrize("cell", [DECODE, OP, KERNEL, CALIBRATE, PEER],
                         ids=["decode", "op", "kernel", "calibrate", "peer"])
def test_every_timing_workload_settles_its_device_first(calls, cell):
    if cell is PEER:
        pytest.importorskip("transformers", reason="the peer workload runs transformers")
    result = worker.run_cell(params.canonical(cell))
    assert result["status"] == "ok", result["error"]
    assert calls == ["cpu"]
    assert "cuda_graphs_settled" not in result["env"]        # nothing was settled on a CPU


def test_a_noop_cell_imports_no_torch_to_settle_anything(calls):
    result = worker.run_cell(params.canonical({"workload": "noop"}))
    assert result["status"] == "ok" and calls == []


@pytest.mark.gpu
def test_settling_instantiates_the_graphs_once_and_the_result_says_so(cuda, monkeypatch, fresh):
    made = []
    real = torch.cuda.CUDAGraph

    class Counted(real):           # a subclass: torch may check what it captures into
        def __init__(self, *a, **k):
            made.append(1)
            super().__init__(*a, **k)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Counted)
    device = torch.device("cuda")
    assert graphstate.settle(device) == graphstate.SETTLE_GRAPHS == len(made)
    assert graphstate.settle(device) == graphstate.SETTLE_GRAPHS == len(made)   # once a process
    monkeypatch.setattr(torch.cuda, "CUDAGraph", real)
    result = worker.run_cell(params.canonical({**DECODE, "device": "cuda", "graph_capture": "full",
                                               "speculation": "none"}))
    assert result["status"] == "ok", result["error"]
    assert result["env"]["cuda_graphs_settled"] == graphstate.SETTLE_GRAPHS


def test_the_gate_warns_when_the_sides_were_timed_in_different_graph_states():
    from harness.gate.noise import graph_state_notes

    gpu = {"gpu": "NVIDIA H200"}
    settled = {"env": {**gpu, "cuda_graphs_settled": 8}}
    (line,) = graph_state_notes({"base": [{"env": gpu}, {"env": gpu}], "head": [settled]})
    assert "base unsettled, head settled (8 graphs)" in line
    assert graph_state_notes({"base": [settled], "head": [settled, settled]}) == []
    assert graph_state_notes({"base": [{"env": gpu}], "head": [{"env": gpu}]}) == []
    # CPU results have no graph state: a CPU pair never warns, settled or not.
    assert graph_state_notes({"base": [{"env": {}}], "head": [{"env": {"cuda_graphs_settled": 8}}]}) == []


def test_the_gate_notes_sides_that_ran_different_kernel_builds():
    from harness.gate.noise import kernel_build_notes
    gpu = {"gpu": "NVIDIA H200"}
    tma = {**gpu, "kernel_build_flags": ["-DTVA_TMA"]}
    (line,) = kernel_build_notes({"base": [{"env": gpu}], "head": [{"env": tma}]})
    assert "base default" in line and "head -DTVA_TMA" in line
    assert kernel_build_notes({"base": [{"env": tma}], "head": [{"env": tma}]}) == []
    assert kernel_build_notes({"base": [{"env": gpu}], "head": [{"env": gpu}]}) == []
    assert kernel_build_notes({"base": [{"env": {}}], "head": [{"env": {"kernel_build_flags": ["-DTVA_TMA"]}}]}) == []


def test_the_worker_records_a_non_default_kernel_build(monkeypatch):
    import torch  # noqa: F401  (the facts of a cell that ran torch, as a kernel cell does)
    from harness.kernels import build  # noqa: F401  (loaded, as in a worker that built a kernel)
    from harness.worker import main
    monkeypatch.delenv("HARNESS_KERNEL_DEBUG", raising=False)
    monkeypatch.delenv("HARNESS_KERNEL_TMA", raising=False)
    assert "kernel_build_flags" not in main.environment()
    monkeypatch.setenv("HARNESS_KERNEL_TMA", "1")
    assert main.environment()["kernel_build_flags"] == ["-DTVA_TMA"]


def test_the_removed_warp_specialised_build_is_refused_not_replaced(monkeypatch):
    """HARNESS_KERNEL_WS named a build this tree no longer has: asking for it fails the kernel's
    load with the reason, where the default build in its place would be timed as if it were it."""
    from harness.kernels import build
    monkeypatch.setenv("HARNESS_KERNEL_WS", "1")
    with pytest.raises(RuntimeError, match="HARNESS_KERNEL_WS: the warp-specialised verify build was removed"):
        build.load_library()
