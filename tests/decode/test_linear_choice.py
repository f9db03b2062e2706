"""Which kernel a forward's weight GEMM runs on (harness.decode.model.linear_weight) and whether
the kernel after it may launch early (gemm_overlaps), by linear_impl and row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.decode.kernel_choice import Kernels
from harness.decode.model import gemm_overlaps, linear_weight


@pytest.mark.parametrize("impl", ["torch", "triton", "wgmma", "wgmma_large"])
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
    assert gemm_overlaps(rows, 4096, 4096, Kernels(linear=impl)) is overlaps


# Qwen3-8B's verify GEMMs, [n, k] of a bf16 weight, and whether wgmma_large gives them to the
# stream-K kernel: the 64 MiB line falls between q/k/v (48 MiB) and down (96 MiB).
QWEN3_8B = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (24576, 4096, True),
            "down": (4096, 12288, True), "lm_head": (151936, 4096, True)}


@pytest.mark.parametrize("gemm", QWEN3_8B)
def test_wgmma_large_streams_only_the_large_weights(gemm):
    """At the verify's 65 rows wgmma_large runs the stream-K kernel (and lets the kernel after
    it launch early) for the GEMMs over 64 MiB or more of weight, and leaves the others to
    cuBLAS; wgmma takes them all. At up to 16 rows both run the skinny kernel."""
    from harness.decode.model import stream_linear_runs
    n, k, large = QWEN3_8B[gemm]
    mix, every = Kernels(linear="wgmma_large"), Kernels(linear="wgmma")
    assert stream_linear_runs(65, n, k, mix) is large
    assert gemm_overlaps(65, n, k, mix) is large
    assert stream_linear_runs(65, n, k, every) and gemm_overlaps(65, n, k, every)
    assert gemm_overlaps(16, n, k, mix) and not stream_linear_runs(16, n, k, mix)
    assert not stream_linear_runs(73, n, k, mix)          # past the kernel's rows: cuBLAS
    # the line is in bytes: the same shape in float32 is twice the weight
    assert stream_linear_runs(65, 6144, 4096, mix, torch.float32) is False   # not a dtype it runs


def test_the_norms_after_a_layers_gemms_launch_by_the_gemm_before_each(monkeypatch):
    """A layer's two norms follow different GEMMs (the layer before's down, this layer's o):
    under wgmma_large the first may launch early (down streams) and the second not (o is
    cuBLAS's), where one flag for both would have got one of them wrong."""
    from harness.decode import model
    from harness.decode.attention import Mask
    from harness.kernels.fused import triton_fused
    cfg = model.TargetConfig(**{**_qwen3_8b_target(), "layers": 1})
    layer = torch.nn.Module.__new__(model.Layer)
    torch.nn.Module.__init__(layer)
    layer.input_layernorm = model.RMSNorm(cfg.hidden, cfg.rms_eps)
    layer.post_attention_layernorm = model.RMSNorm(cfg.hidden, cfg.rms_eps)
    meta = torch.device("meta")
    layer.self_attn = model.Attention(cfg).to(meta)
    layer.mlp = model.MLP(cfg).to(meta)
    seen = []

    def norm(h, w, eps, residual, overlap):
        seen.append(overlap)
        return h, h
    monkeypatch.setattr(triton_fused, "add_rmsnorm", norm)
    monkeypatch.setattr(layer.self_attn, "forward_fused", lambda x, *a: x)
    monkeypatch.setattr(layer.mlp, "forward_fused", lambda x, kernels: x)
    mask = Mask.__new__(Mask)
    object.__setattr__(mask, "kernels", Kernels(linear="wgmma_large", fused_ops=True))
    h = torch.zeros(1, 65, cfg.hidden)
    layer.forward_fused(h, None, None, None, 0, None, mask)
    assert seen == [True, False]


def _qwen3_8b_target() -> dict:
    from harness.protocol import presets
    return dict(presets.PRESETS["qwen3-8b"]["target"])


def test_wgmma_is_a_knob_value_cells_accept():
    from harness.protocol.workloads.decode import LINEAR_IMPLS
    assert "wgmma" in LINEAR_IMPLS
    with pytest.raises(ValueError, match=r"Kernels.linear must be one of torch, triton, wgmma, wgmma_large \(got 'cutlass'\)"):
        Kernels(linear="cutlass")


def test_wgmma_launches_the_stream_k_kernel_at_its_default_shape(monkeypatch):
    """linear_impl wgmma hands the verify's rows to the stream-K module, at its default shape."""
    from harness.decode import model
    from harness.kernels.linear import stream_linear
    seen = []
    monkeypatch.setattr(model, "stream_linear_runs", lambda *a, **k: True)
    monkeypatch.setattr(stream_linear, "linear", lambda x, w, *shape: seen.append(shape) or x)
    x, w = torch.zeros(65, 64, device="meta"), torch.zeros(96, 64, device="meta")
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda")))
    linear_weight(w, x, Kernels(linear="wgmma"))
    assert seen == [()]
