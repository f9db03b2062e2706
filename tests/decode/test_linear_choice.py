"""Which kernel a forward's weight GEMM runs on (harness.decode.model.linear_weight) and whether
the kernel after it may launch early (gemm_overlaps), by linear_impl and row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.decode.kernel_choice import Kernels
from harness.decode.model import gemm_overlaps, linear_weight


@pytest.mark.parametrize("impl", ["torch", "triton", "wgmma"])
@pytest.mark.parametrize("rows", [1, 16, 65, 80])
def test_every_choice_computes_f_linear_on_a_cpu(impl, rows):
    """Off a GPU every choice falls back to torch's F.linear (the kernels need CUDA)."""
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    assert torch.equal(linear_weight(w, x, Kernels(linear=impl)), F.linear(x, w))


@pytest.mark.parametrize("impl, rows, overlaps", [
    ("torch", 1, False), ("torch", 65, False),
    ("triton", 1, True), ("triton", 16, True), ("triton", 65, False),
    ("wgmma", 1, True), ("wgmma", 16, True), ("wgmma", 17, True), ("wgmma", 65, True),
    ("wgmma", 72, True), ("wgmma", 73, False),
])
def test_the_kernel_after_a_gemm_launches_early_only_after_ours(impl, rows, overlaps):
    """cuBLAS's GEMMs do not trigger their dependents (a PDL launch after them gains nothing);
    the skinny kernel (up to 16 rows) and the stream-K kernel (17-72, wgmma) do."""
    assert gemm_overlaps(rows, 4096, Kernels(linear=impl)) is overlaps


def test_wgmma_is_a_knob_value_cells_accept():
    from harness.protocol.workloads.decode import LINEAR_IMPLS
    assert "wgmma" in LINEAR_IMPLS
    with pytest.raises(ValueError, match=r"Kernels.linear must be one of torch, triton, wgmma \(got 'cutlass'\)"):
        Kernels(linear="cutlass")


def test_wgmma_launches_the_stream_k_kernel_at_its_default_shape(monkeypatch):
    """linear_impl wgmma hands the verify's rows to the stream-K module, at its default shape."""
    from harness.decode import model
    from harness.kernels.linear import stream_linear
    seen = []
    monkeypatch.setattr(model, "_stream_linear_takes", lambda x, w: True)
    monkeypatch.setattr(stream_linear, "linear", lambda x, w, *shape: seen.append(shape) or x)
    x, w = torch.zeros(65, 64), torch.zeros(96, 64)
    linear_weight(w, x, Kernels(linear="wgmma"))
    assert seen == [()]
