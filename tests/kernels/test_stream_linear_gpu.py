"""The stream-K verify GEMM (kernels/linear/stream_linear.py) on a Hopper GPU, in bf16, at
Qwen3-8B's weight shapes and the verify's rows: against cuBLAS and float64, across grid sizes
(a cut tile summed by its owner from the other CTAs' parts), with no host sync, and in CUDA
graph replays on new inputs (the counters reset themselves). Its timing is the op workload's
(`op: linear`, linear_impl wgmma, each GEMM alone with linear_gemm) and the decode cells'."""

from __future__ import annotations

import pytest
import torch
from cuda_checks import capture, no_host_sync

from harness.kernels.linear import stream_linear as sl

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available()
                                 or torch.cuda.get_device_capability() != (9, 0),
                                 reason="the stream-K kernel runs wgmma: Hopper (sm_90) only")]

# Qwen3-8B's q/k/v, o, gate/up, down and lm_head, a ragged N (a partial 128-row tile), and an N
# whose rows are not 16 bytes apart (no tensor store: the threads store y).
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (200, 4096), (130, 4096)]


def rel(y, x, w):
    want = x.double() @ w.double().T
    return float((y.double() - want).norm() / want.norm())


def _xw(M, N, K, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).bfloat16()
    return x, w


@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("M", [17, 65, 72])
def test_matches_float64_as_cublas_does(M, N, K):
    x, w = _xw(M, N, K, M + N)
    y = sl.linear(x, w)
    assert y.shape == (M, N)
    assert rel(y, x, w) <= 2 * rel(x @ w.T, x, w) + 1e-3


@pytest.mark.parametrize("ctas", [1, 7, 61, 132, 264])
@pytest.mark.parametrize("groups, stages", [(1, 8), (1, 4), (2, 5)])
def test_any_shape_gives_the_right_answer(ctas, groups, stages):
    """Grids of 1 to 2 CTAs a multiprocessor cut the q/k/v tiles anywhere along K."""
    x, w = _xw(65, 6144, 4096, ctas)
    y = sl.linear(x, w, sl.Shape(groups=groups, stages=stages, ctas=ctas))
    assert rel(y, x, w) <= 2 * rel(x @ w.T, x, w) + 1e-3


def test_the_same_call_gives_the_same_bits():
    """A cut tile is summed in CTA order by its owner: the bits never depend on which CTA
    finished first, so repeated calls agree exactly."""
    x, w = _xw(65, 4096, 12288, 3)
    first = sl.linear(x, w)
    for _ in range(5):
        assert torch.equal(sl.linear(x, w), first)


def test_a_strided_x_and_leading_dims():
    """x a view (rows 8 elements longer than K), and x with a leading dimension as the verify
    forward's [b, T, hidden] activations: the same bits."""
    base, w = _xw(65, 4096, 4104, 4)
    x, w = base[:, :4096], w[:, :4096].contiguous()
    assert x.stride(0) == 4104
    y = sl.linear(x, w)
    assert rel(y, x, w) <= 2 * rel(x @ w.T, x, w) + 1e-3
    y3 = sl.linear(x.contiguous().view(1, 65, 4096), w)
    assert y3.shape == (1, 65, 4096)
    assert torch.equal(y3.view(65, 4096), y)


def test_graph_replays_on_new_inputs():
    """Captured once, replayed on new x: every replay equals an eager call bit for bit (the
    counters reset, the sum's order is fixed), and no call syncs."""
    x, w = _xw(65, 6144, 4096, 5)
    out = {}
    sl.linear(x, w)
    with no_host_sync():
        sl.linear(x, w)
    g = capture(lambda: out.__setitem__("y", sl.linear(x, w)))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        assert torch.equal(out["y"], sl.linear(x, w))


def test_rows_it_does_not_take_go_to_cublas():
    x, w = _xw(73, 4096, 4096, 6)
    assert torch.equal(sl.linear(x, w), torch.nn.functional.linear(x, w))
    x16, _ = _xw(16, 4096, 4096, 7)
    assert torch.equal(sl.linear(x16, w), torch.nn.functional.linear(x16, w))
