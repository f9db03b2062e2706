"""cuBLASLt with each shape's algorithm timed (kernels/linear/lt_linear.py) on a CUDA GPU, at
Qwen3-8B's weight shapes and decode's rows: every algorithm the heuristic offers computes what
F.linear does (so the hand-written declarations of cuBLASLt's enums and structures are right), a
plan is timed and kept, a call after the plan never syncs with the host and replays in a CUDA
graph on new inputs, and a shape first met inside a capture runs the heuristic's pick. Its
timing is the op workload's (`op: linear`, blas_impl cublaslt_tuned) and the decode cells'."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cuda_checks import capture, no_host_sync

from harness.kernels.linear import lt_linear

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="cuBLASLt needs a CUDA GPU")]

# q/k/v, o, gate/up, down and the lm_head
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)]


def _xw(M, N, K, seed, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).to(dtype)
    return x, w


def close(y, x, w):
    want = F.linear(x, w).float()
    return float((y.float() - want).abs().max()) <= 1e-2 * float(want.abs().max())


@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("M", [1, 16, 65])
def test_every_algorithm_offered_computes_f_linear(M, N, K):
    x, w = _xw(M, N, K, M + N)
    handle, _ = lt_linear._device_state(x.device)
    descs = lt_linear._descs(M, N, K, x.dtype)
    algos = lt_linear._heuristics(handle, descs)
    assert algos, "the heuristic offered nothing"
    for algo in algos:
        y = torch.full((M, N), float("nan"), dtype=x.dtype, device="cuda")
        assert lt_linear._run(descs, algo, x, w, y) == 0
        assert close(y, x, w), lt_linear._config(algo)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N, K", SHAPES)
def test_a_plan_is_timed_once_and_kept(N, K, dtype):
    x, w = _xw(65, N, K, N, dtype)
    y = lt_linear.linear(x, w)
    assert close(y, x, w)
    mine = [p for p in lt_linear.plans() if (p["rows"], p["n"], p["k"]) == (65, N, K)
            and p["dtype"] == str(dtype).removeprefix("torch.")]
    assert len(mine) == 1
    plan = mine[0]
    assert plan["timed"] and plan["tried"] >= 1 and plan["torch_us"] > 0 and plan["us"] > 0
    assert plan["us"] <= plan["torch_us"]                # F.linear's own time when it won
    x2, _ = _xw(65, N, K, N + 1, dtype)
    with no_host_sync():
        y2 = lt_linear.linear(x2, w)
    assert close(y2, x2, w)
    assert len(lt_linear.plans()) == len({(p["rows"], p["n"], p["k"], p["dtype"]) for p in lt_linear.plans()})


def test_graph_replays_compute_new_inputs():
    N, K = 4096, 12288
    x, w = _xw(65, N, K, 7)
    lt_linear.linear(x, w)                                   # planned outside the capture
    out = {}
    graph = capture(lambda: out.__setitem__("y", lt_linear.linear(x, w)))
    for seed in (8, 9):
        x.copy_(_xw(65, N, K, seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert close(out["y"], x, w)


def test_a_shape_first_met_inside_a_capture_runs_the_heuristic_pick():
    lt_linear.linear(*_xw(65, 4096, 4096, 10))              # the workspace, outside the capture
    N, K = 1024, 4096
    rows = 40                                                # no other test plans this shape
    x, w = _xw(rows, N, K, 11)
    out = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out["y"] = lt_linear.linear(x, w)
    graph.replay()
    torch.cuda.synchronize()
    assert close(out["y"], x, w)
    plan = next(p for p in lt_linear.plans() if (p["rows"], p["n"], p["k"]) == (rows, N, K))
    assert not plan["timed"] and plan["us"] is None and plan["runs"].startswith("algo ")


def test_timing_between_neighbours_takes_their_time_off():
    """The ranking's time of a GEMM between the kernel that writes its input and the one that
    reads its output is the GEMM's: the neighbours' own time (a few µs, ~a quarter of the o
    GEMM's) is taken off, and they stay out of the candidates' order."""
    N, K = 4096, 4096
    x, w = _xw(65, N, K, 12)
    handle, _ = lt_linear._device_state(x.device)
    descs = lt_linear._descs(65, N, K, x.dtype)
    algos = lt_linear._heuristics(handle, descs)[:2]
    weights = [w] + [torch.randn_like(w) for _ in range(5)]
    alone = lt_linear.time_candidates([None] + algos, descs, x, weights, neighbours=False)
    between = lt_linear.time_candidates([None] + algos, descs, x, weights, neighbours=True)
    assert len(between) == len(alone) == 1 + len(algos)
    for a, b in zip(alone, between):
        assert 0.85 < b / a < 1.15, (alone, between)
