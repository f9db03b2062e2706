"""cuBLASLt with each shape's algorithm timed (kernels/linear/lt_linear.py), what runs without a
GPU: the choice between F.linear and the algorithms timed, which calls it takes, and which of the
forward's GEMMs reach it (model.linear_weight with blas_impl cublaslt_tuned). The calls into
cuBLASLt are tests/kernels/test_lt_linear_gpu.py's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.decode.kernel_choice import Kernels
from harness.decode.model import linear_weight
from harness.kernels.linear import lt_linear


def test_an_algorithm_replaces_f_linear_only_when_faster_by_the_margin():
    assert lt_linear.choose(100.0, []) is None
    assert lt_linear.choose(100.0, [99.5, 101.0]) is None           # within 1 %: F.linear stays
    assert lt_linear.choose(100.0, [105.0, 98.0, 97.0]) == 2        # the fastest, 3 % faster
    assert lt_linear.choose(100.0, [98.9]) == 0
    assert lt_linear.choose(100.0, [98.9], min_gain=0.02) is None
    assert lt_linear.choose(100.0, [120.0, 130.0]) is None


def test_calls_it_cannot_take_as_they_are_go_to_f_linear():
    x, w = torch.randn(65, 64, dtype=torch.bfloat16), torch.randn(128, 64, dtype=torch.bfloat16)
    assert not lt_linear.takes(x, w)                                 # a CPU tensor
    assert torch.equal(lt_linear.linear(x, w), F.linear(x, w))


def test_shapes_and_layouts_it_refuses(monkeypatch):
    """Checked as on a CUDA device: only the device test is moved out of the way."""
    class Cuda:
        type = "cuda"

    def t(*shape, dtype=torch.bfloat16):
        """A contiguous tensor at a 256-byte aligned address (the CPU allocator's are 64)."""
        n = torch.Size(shape).numel()
        size = torch.empty((), dtype=dtype).element_size()
        buf = torch.empty(n + lt_linear.ALIGNMENT // size, dtype=dtype)
        off = (-buf.data_ptr() % lt_linear.ALIGNMENT) // size
        return buf[off:off + n].view(*shape)

    def takes(x, w):
        monkeypatch.setattr(torch.Tensor, "device", property(lambda self: Cuda()))
        try:
            return lt_linear.takes(x, w)
        finally:
            monkeypatch.undo()
    x, w = t(65, 4096), t(6144, 4096)
    assert takes(x, w)
    assert not takes(t(65, 4096, dtype=torch.float32), t(6144, 4096, dtype=torch.float32))
    assert not takes(x, t(6144, 4096, dtype=torch.float16))          # dtypes differ
    assert not takes(t(lt_linear.MAX_ROWS + 1, 4096), w)             # prefill's rows
    assert not takes(t(4096, 65).t(), w)                             # not contiguous
    assert not takes(t(65, 4100), t(6144, 4100))                     # K not a multiple of 8
    assert not takes(t(65, 4096), t(6150, 4096))                     # N not a multiple of 8
    assert not takes(t(65 * 4096 + 8)[8:].view(65, 4096), w)        # 16 bytes off alignment
    assert not takes(x, t(6144 * 4096 + 8)[8:].view(6144, 4096))


@pytest.fixture
def routed(monkeypatch):
    """Which kernel each GEMM of linear_weight ran: (name, rows)."""
    ran = []

    def spy(name, fn):
        def call(x, weight, *args):
            ran.append((name, x.numel() // x.shape[-1]))
            return fn(x, weight, *args)
        return call
    from harness.kernels.linear import skinny_linear
    monkeypatch.setattr(lt_linear, "linear", spy("lt", lt_linear.linear))
    monkeypatch.setattr(skinny_linear, "linear", spy("skinny", skinny_linear.linear))
    return ran


def test_the_gemms_cublas_would_run_reach_it(routed):
    w = torch.randn(32, 64)
    tuned = dict(blas="cublaslt_tuned")
    for rows in (1, 16, 65):
        for kernels in (Kernels(linear="triton", **tuned), Kernels(linear="torch", **tuned),
                        Kernels(linear="triton"), Kernels(linear="torch", blas="cublaslt")):
            y = linear_weight(w, torch.randn(rows, 64), kernels)
            assert y.shape == (rows, 32)
    assert routed == [
        ("skinny", 1), ("lt", 1), ("skinny", 1),                      # 1 row: the skinny kernel's
        ("skinny", 16), ("lt", 16), ("skinny", 16),
        ("lt", 65), ("lt", 65), ("skinny", 65)]                       # 65: cuBLAS's, so ours


def test_a_plan_says_what_it_runs():
    plan = lt_linear.Plan(65, 151936, 4096, "bfloat16", us=420.51234, torch_us=453.8, tried=8)
    assert plan.as_dict() == {"rows": 65, "n": 151936, "k": 4096, "dtype": "bfloat16", "runs": "torch",
                              "us": 420.512, "torch_us": 453.8, "tried": 8, "timed": True}
    plan.algo, plan.config = lt_linear._Algo(), (66, 20, 1)
    assert plan.as_dict()["runs"] == "algo 66 tile 20 splitk 1"


def test_the_structures_are_cublaslt_s_sizes():
    """cublasLtMatmulAlgo_t is 8 uint64; the heuristic result adds a size_t, a status, a float
    and four ints (96 bytes on x86-64)."""
    import ctypes
    assert ctypes.sizeof(lt_linear._Algo) == 64
    assert ctypes.sizeof(lt_linear._Heuristic) == 96
