"""kernels/linear/stream_linear.cu on the CPU emulator: the stream-K wgmma GEMM of the verify's
65 rows, unchanged, against float64.

The emulator runs the tensor copies, mbarriers and warpgroup MMAs as the GPU would (copies
landing as late as the rules allow, an MMA reading shared memory at its wait), so a stage
released before its MMAs retire, a missing barrier wait or a wrong descriptor computes wrong
numbers here. Blocks run one after another, so they run last to first (emu_reverse_blocks): a
cut tile's owner, the lowest of its CTAs, waits for the others' parts, which on the GPU run at
the same time and here must have run before it.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from emulator.emulate import emulated_library
from harness.kernels.linear import stream_linear as sl

INVALID_VALUE = 1        # cudaErrorInvalidValue


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = emulated_library("linear/stream_linear.cu", tmp_path_factory.mktemp("stream_linear"))
    lib.tsl_linear.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.tsl_linear.restype = ctypes.c_int
    lib.tsl_struct_size.restype = ctypes.c_int
    lib.emu_reverse_blocks.argtypes = [ctypes.c_int]
    lib.tsl_max_rows.restype = ctypes.c_int
    return lib


def _inputs(M, N, K, seed=0, x_stride=None):
    g = torch.Generator().manual_seed(seed)
    xs = x_stride or K
    x_full = torch.randn(M, xs, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(torch.bfloat16)
    return x_full[:, :K], w


def _run(lib, x, w, ctas, reverse=True, early=False, groups=2, stages=5, y=None):
    """(rc, y, counters after the call) of one launch on the emulator (y: a view to write into,
    else a new [M, N])."""
    M, K = x.shape
    N = w.shape[0]
    tiles = -(-N // (sl.GROUP_ROWS * groups))
    partials = torch.full((sl.partial_floats(ctas, groups),), float("nan"))   # poison: never read unwritten
    counters = torch.zeros(tiles, dtype=torch.int32)
    if y is None:
        y = torch.full((M, N), float("nan"), dtype=torch.bfloat16)
    a = sl.Args(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), partials=partials.data_ptr(),
                counters=counters.data_ptr(), M=M, N=N, K=K, x_stride=x.stride(0),
                w_stride=w.stride(0), y_stride=y.stride(0), ctas=ctas, groups=groups, stages=stages, pdl=1)
    lib.emu_configure(int(early), 0)
    lib.emu_reverse_blocks(int(reverse))
    try:
        rc = lib.tsl_linear(ctypes.byref(a), None)
    finally:
        lib.emu_reverse_blocks(0)
        lib.emu_configure(0, 0)
    return rc, y, counters


def _check(y, x, w):
    want = x.double() @ w.double().T
    got = y.double()
    assert torch.isfinite(got).all(), "some outputs were never written (NaN)"
    # fp32 accumulation, then one bf16 rounding (2^-8 relative) of the output
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-3)


def test_the_struct_matches(lib):
    assert lib.tsl_struct_size() == ctypes.sizeof(sl.Args)
    assert lib.tsl_max_rows() == sl.MAX_ROWS
    lib.tsl_partial_floats.restype = ctypes.c_int64
    lib.tsl_partial_floats.argtypes = [ctypes.c_int64, ctypes.c_int64]
    for ctas, groups in ((1, 1), (132, 1), (132, 2)):
        assert lib.tsl_partial_floats(ctas, groups) == sl.partial_floats(ctas, groups)


@pytest.mark.parametrize("ctas", [1, 4, 7])
@pytest.mark.parametrize("groups, stages", [(1, 8), (2, 5), (2, 3)])
def test_65_rows_against_float64(lib, ctas, groups, stages):
    """65 rows, a partial last tile (N 320: 2.5 tiles of 128, 1.25 of 256) and 5 K steps: one
    CTA takes every iteration (the ring wraps when they outnumber its stages), or 4 or 7 CTAs
    cut tiles between them."""
    x, w = _inputs(65, 320, 320)
    rc, y, counters = _run(lib, x, w, ctas, groups=groups, stages=stages)
    assert rc == 0
    _check(y, x, w)
    assert (counters == 0).all(), "every counter is reset by the CTA that summed its tile"


def test_a_tile_cut_among_many_ctas(lib):
    """One tile over 10 K steps and 5 CTAs: the first owns it and adds the other four's parts."""
    x, w = _inputs(40, 128, 640, seed=2)
    rc, y, counters = _run(lib, x, w, 5)
    assert rc == 0 and (counters == 0).all()
    _check(y, x, w)


@pytest.mark.parametrize("M", [17, 72])
def test_row_counts_at_the_edges(lib, M):
    x, w = _inputs(M, 192, 256, seed=M)
    rc, y, _ = _run(lib, x, w, 3)
    assert rc == 0
    _check(y, x, w)


def test_k_past_the_last_full_step_and_a_strided_x(lib):
    """K 200 (three steps of 64 and one of 8: the tensor copy zero-fills the rest of both
    operands) and x a view with rows 264 elements apart."""
    x, w = _inputs(65, 136, 200, seed=3, x_stride=264)
    assert x.stride(0) == 264
    rc, y, _ = _run(lib, x, w, 2)
    assert rc == 0
    _check(y, x, w)


@pytest.mark.parametrize("ctas", [1, 3, 6])
def test_y_rows_not_16_bytes_apart_are_stored_by_the_threads(lib, ctas):
    """N 130 (rows 260 bytes apart): no tensor store can write y, so the range's last tile goes
    out through each thread's stores, as the whole tiles before it do."""
    x, w = _inputs(65, 130, 256, seed=6)
    rc, y, counters = _run(lib, x, w, ctas)
    assert rc == 0 and (counters == 0).all()
    _check(y, x, w)


@pytest.mark.parametrize("groups, stages", [(1, 8), (2, 5)])
def test_the_tensor_store_writes_only_y(lib, groups, stages):
    """y a view into a larger buffer (rows 40 elements past N apart, 3 rows past M): the tensor
    store's box (a tile's rows by 72 tokens) is clipped to y, so every element around it keeps
    its sentinel, while every element of y is written."""
    M, N = 33, 192
    x, w = _inputs(M, N, 256, seed=7)
    buf = torch.full((M + 3, N + 40), 7.0, dtype=torch.bfloat16)
    view = buf[:M, :N]
    rc, _, counters = _run(lib, x, w, 3, groups=groups, stages=stages, y=view)
    assert rc == 0 and (counters == 0).all()
    _check(view, x, w)
    assert (buf[:, N:] == 7.0).all() and (buf[M:] == 7.0).all(), "the store wrote outside y"


def test_more_ctas_than_iterations(lib):
    """A grid larger than the work is cut to one CTA an iteration (an idle CTA would be counted
    at a tile it never reaches)."""
    x, w = _inputs(65, 128, 128, seed=4)
    rc, y, counters = _run(lib, x, w, 9)
    assert rc == 0 and (counters == 0).all()
    _check(y, x, w)


@pytest.mark.parametrize("ctas", [1, 4])
@pytest.mark.parametrize("groups, stages", [(1, 8), (2, 3)])
def test_copies_landing_at_issue_give_the_same_bits(lib, ctas, groups, stages):
    """Copies landing at issue (TVA_EMU_EARLY) overwrite a stage the moment the producer refills
    it: with one CTA the ring wraps (15 or 10 iterations), so a stage released before the MMAs
    reading it retire turns their outputs into NaN."""
    x, w = _inputs(65, 640, 320, seed=5)
    _, late, _ = _run(lib, x, w, ctas, groups=groups, stages=stages)
    rc, early, _ = _run(lib, x, w, ctas, early=True, groups=groups, stages=stages)
    assert rc == 0
    assert torch.equal(late.view(torch.int16), early.view(torch.int16))


@pytest.mark.parametrize("M, K", [(73, 128), (0, 128), (65, 0)])
def test_shapes_it_does_not_take_are_refused(lib, M, K):
    """Rows outside 1..72 or no depth: cudaErrorInvalidValue, nothing launched."""
    x = torch.zeros(max(M, 1), max(K, 8), dtype=torch.bfloat16)
    w = torch.zeros(128, max(K, 8), dtype=torch.bfloat16)
    y = torch.zeros(max(M, 1), 128, dtype=torch.bfloat16)
    partials = torch.zeros(sl.partial_floats(1))
    counters = torch.zeros(1, dtype=torch.int32)
    a = sl.Args(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), partials=partials.data_ptr(),
                counters=counters.data_ptr(), M=M, N=128, K=K, x_stride=max(K, 8), w_stride=max(K, 8),
                y_stride=128, ctas=1, groups=2, stages=5)
    assert lib.tsl_linear(ctypes.byref(a), None) == INVALID_VALUE


@pytest.mark.parametrize("groups, stages", [(3, 3), (2, 2), (2, 6), (1, 17)])
def test_shapes_past_the_limits_are_refused(lib, groups, stages):
    """At most two consumer groups, 3..16 stages (two MMA groups in flight hold two), and the
    ring within a CTA's shared memory (six stages of two groups are 253 KB)."""
    x, w = _inputs(65, 128, 128)
    y = torch.zeros(65, 128, dtype=torch.bfloat16)
    partials = torch.zeros(sl.partial_floats(1, 3))
    counters = torch.zeros(1, dtype=torch.int32)
    a = sl.Args(x=x.data_ptr(), w=w.data_ptr(), y=y.data_ptr(), partials=partials.data_ptr(),
                counters=counters.data_ptr(), M=65, N=128, K=128, x_stride=128, w_stride=128,
                y_stride=128, ctas=1, groups=groups, stages=stages)
    assert lib.tsl_linear(ctypes.byref(a), None) == INVALID_VALUE
