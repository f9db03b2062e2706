"""Kernel and op cells with `ncu: true` on a GPU host with Nsight Compute: the real profiler over
the real kernels (harness/worker/ncu.py). Skips where `ncu` is not installed."""

from __future__ import annotations

import pytest

from harness.protocol import params
from harness.worker import main as worker
from harness.worker import ncu

pytestmark = pytest.mark.gpu


def test_a_kernel_cell_carries_the_counters_of_every_mode_it_timed(cuda):
    if ncu.find_ncu() is None:
        pytest.skip("ncu is not installed on this host")
    cell = params.canonical({"workload": "kernel", "device": "cuda", "dtype": "bfloat16",
                             "verify_mode": "custom", "compare_modes": "triton", "context_length": 16384,
                             "tree_tokens": 65, "repeats": 3, "warmup_steps": 1, "ncu": True})
    out = worker.run_cell(cell)
    assert out["status"] == "ok", out["error"]
    m = out["metrics"]
    assert out["kernel"]["ncu_errors"] == {}
    own = {k: v for k, v in m.items() if k.startswith("ncu.")}
    triton = {k: v for k, v in m.items() if k.startswith("triton.ncu.")}
    assert own and triton
    # the custom call is its main kernel (and a combine where it splits), each with every
    # summary counter; their durations add up to about the timed call (clocks as they run,
    # caches flushed before each pass)
    durations = {k: v for k, v in own.items() if k.endswith(".duration_us")}
    assert durations and all(v > 0 for v in durations.values())
    assert 0.5 * m["kernel_us"] < sum(durations.values()) < 3 * m["kernel_us"]
    for key in durations:
        kernel = key.removesuffix(".duration_us")
        for counter in ("sm_pct", "dram_pct", "registers", "warps_per_scheduler", "cycles_per_issue"):
            assert f"{kernel}.{counter}" in own, (kernel, counter)
        assert 0 < own[f"{kernel}.registers"] <= 255
        assert 0 <= own[f"{kernel}.sm_pct"] <= 100
    assert any(k.split(".")[-2] == "stall" for k in own), "no stall reason from the raw page"
    # where the warps' samples were, by opcode (the source page): the softmax's exponentials
    # among them, shares of 100
    main = max(durations, key=durations.get).removesuffix(".duration_us")
    time = {k: v for k, v in own.items() if k.startswith(f"{main}.time.")}
    assert f"{main}.time.MUFU" in time and sum(time.values()) == pytest.approx(100.0, abs=0.5), time


def test_an_op_cell_carries_its_kernels_counters(cuda):
    """The tree build (one CTA a sequence: a latency-bound chain) under the profiler."""
    if ncu.find_ncu() is None:
        pytest.skip("ncu is not installed on this host")
    cell = params.canonical({"workload": "op", "op": "tree_build", "device": "cuda", "model": "qwen3-8b",
                             "tree_budget": 64, "block_size": 16, "repeats": 3, "warmup_steps": 1,
                             "ncu": True})
    out = worker.run_cell(cell)
    assert out["status"] == "ok", out["error"]
    assert out["kernel"]["ncu_errors"] == {}
    durations = {k: v for k, v in out["metrics"].items() if k.startswith("ncu.") and k.endswith(".duration_us")}
    assert durations and 0.3 * out["metrics"]["kernel_us"] < sum(durations.values()) < 3 * out["metrics"]["kernel_us"]
