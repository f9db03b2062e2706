"""The skinny linear kernels (kernels/linear/skinny_linear.py) under the Triton interpreter
(conftest.interp): every row count, split-K with its counters, ragged N, the one-row GEMV and
which weights it takes, and what the module hands to cuBLAS. On the GPU, in bf16 and in graph
replays: tests/kernels/test_skinny_linear_gpu.py."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.linear import skinny_linear as sl  # noqa: E402


def reference(x, w):
    return x.double() @ w.double().T


def _linear(x, w, cfg):
    return sl.linear(x, w, cfg)


def _calls_then_counters(w, xs, cfg):
    ys = [sl.linear(x, w, cfg) for x in xs]
    lock = sl.WORKSPACE.get(xs[0].device, w.shape[0], cfg.split,
                            triton.cdiv(w.shape[0], cfg.block_n))[1]
    return ys, lock.tolist()


def _out_argument(x, w):
    out = torch.empty(*x.shape[:-1], w.shape[0])
    y = sl.linear(x, w, out=out)
    return y.data_ptr() == out.data_ptr(), y


def _with_no_kernel(x, w):
    kernel, sl._skinny_kernel = sl._skinny_kernel, None     # a launch would raise
    try:
        return sl.linear(x, w)
    finally:
        sl._skinny_kernel = kernel


def _one_row_without_tile_kernel(x, w):
    """One row with no config: the GEMV, never the tile kernel (a launch of it would raise)."""
    kernel, sl._skinny_kernel = sl._skinny_kernel, None
    try:
        return sl.linear(x, w)
    finally:
        sl._skinny_kernel = kernel


def _one_row_past_gemv_max_n(x, w):
    """More weight rows than GEMV_MAX_N (the lm_head): the tile kernel, never the GEMV."""
    kernel, limit = sl._gemv_kernel, sl.GEMV_MAX_N
    sl._gemv_kernel, sl.GEMV_MAX_N = None, w.shape[0] - 1
    try:
        return sl.linear(x, w)
    finally:
        sl._gemv_kernel, sl.GEMV_MAX_N = kernel, limit


# (N, K): ragged weight rows past the last 8-row block, and K steps of 512, 32 and 16 columns.
@pytest.mark.parametrize("N, K", [(203, 512), (64, 96), (40, 2064)])
def test_one_row_takes_the_gemv_and_matches_float64(interp, N, K):
    gen = torch.Generator().manual_seed(N + K)
    x, w = torch.randn(1, K, generator=gen), torch.randn(N, K, generator=gen)
    y = interp.apply(_one_row_without_tile_kernel, (x, w))
    assert y.shape == (1, N)
    assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-4)


def test_one_row_of_a_wide_weight_keeps_the_tile_kernel(interp):
    gen = torch.Generator().manual_seed(9)
    x, w = torch.randn(1, 256, generator=gen), torch.randn(96, 256, generator=gen)
    y = interp.apply(_one_row_past_gemv_max_n, (x, w))
    assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-4)


def test_gemv_block_k():
    assert [sl.gemv_block_k(k) for k in (4096, 12288, 96, 2064, 1536)] == [1024, 1024, 32, 16, 512]


@pytest.mark.parametrize("M", [1, 7, 16])
@pytest.mark.parametrize("split", [1, 4])
def test_each_row_count_and_split_matches_float64(interp, M, split):
    gen = torch.Generator().manual_seed(M * 10 + split)
    x = torch.randn(M, 512, generator=gen)
    w = torch.randn(200, 512, generator=gen)       # 200: the last 64-row tile is ragged
    y = interp.apply(_linear, (x, w, sl.Config(block_n=64, block_k=64, split=split)))
    assert y.shape == (M, 200)
    assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-4)


def test_split_counters_reset_so_every_later_call_is_right(interp):
    """The last split of a tile sums the partials and zeroes the tile's counter: a counter left
    at 1 would make the next call's first split the 'last', which would write a partial sum."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(128, 256, generator=gen)
    xs = [torch.randn(5, 256, generator=gen) for _ in range(3)]
    ys, counters = interp.apply(_calls_then_counters, (w, xs, sl.Config(64, 64, split=2)))
    for x, y in zip(xs, ys):
        assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-4)
    assert counters == [0, 0]


def test_the_split_sum_has_a_fixed_order(interp):
    """Partials are summed in split order by whichever split arrives last: the same bits on
    every call, and the unsplit kernel's result to within rounding."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 1024, generator=gen), torch.randn(64, 1024, generator=gen)
    a, b = (interp.apply(_linear, (x, w, sl.Config(64, 64, split=4))) for _ in range(2))
    assert torch.equal(a, b)


def test_batched_input_and_out_argument(interp):
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 3, 256, generator=gen), torch.randn(96, 256, generator=gen)
    same, y = interp.apply(_out_argument, (x, w))
    assert same and y.shape == (2, 3, 96)
    assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-4)


def test_what_it_does_not_take_goes_to_torch(interp):
    """More rows than MAX_ROWS (the verify, prefill) and a K off the MMA depth are cuBLAS's:
    the same result, never a launch."""
    gen = torch.Generator().manual_seed(4)
    for x, w in ((torch.randn(sl.MAX_ROWS + 1, 256, generator=gen),
                  torch.randn(32, 256, generator=gen)),
                 (torch.randn(2, 24, generator=gen), torch.randn(32, 24, generator=gen))):
        assert torch.allclose(interp.apply(_with_no_kernel, (x, w)), x @ w.T)


def test_default_config_fills_the_gpu():
    """Tiles of 64 weight rows; K split while the programs cover less than 2/3 of the multiprocessors
    (the H200 sweep's winners: q/k/v's 96 programs unsplit, o_proj split in two)."""
    assert sl.default_config(1, 6144, 4096, 132) == sl.Config(64, 128, 1)
    assert sl.default_config(1, 4096, 4096, 132) == sl.Config(64, 128, 2)
    assert sl.default_config(1, 4096, 12288, 132) == sl.Config(64, 128, 2)
    assert sl.default_config(1, 151936, 4096, 132).split == 1
    assert sl.default_config(1, 64, 2048, 132).split == 2      # no split shallower than 1024
    assert sl.default_config(1, 64, 96, 132) == sl.Config(64, 32, 1)
