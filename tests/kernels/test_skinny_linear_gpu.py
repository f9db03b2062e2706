"""The skinny linear kernels (kernels/linear/skinny_linear.py) on a GPU, in bf16, at Qwen3-8B's
weight shapes and decode's row counts (one row: the GEMV): against cuBLAS and float64, split and
unsplit, with no host sync, and in CUDA graph replays on new inputs (the split counters reset
themselves). Their timing is the op workload's (`op: linear`, scenarios/ops.yaml)."""

from __future__ import annotations

import pytest
import torch
from cuda_checks import capture, no_host_sync

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.linear import skinny_linear as sl

pytestmark = pytest.mark.gpu

# Qwen3-8B's layers and lm_head, and two small N: 200 (a ragged 64-row tile), 203 (a ragged
# 8-row block of the one-row GEMV, whose loads are masked then).
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (200, 4096), (203, 4096)]


def rel(y, x, w):
    want = x.double() @ w.double().T
    return float((y.double() - want).norm() / want.norm())


@pytest.mark.parametrize("N, K", SHAPES)
@pytest.mark.parametrize("M", [1, 15, 16])
def test_default_configs_match_float64_as_cublas_does(M, N, K):
    gen = torch.Generator(device="cuda").manual_seed(M + N)
    x = torch.randn(M, K, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=gen) * 0.02).bfloat16()
    y = sl.linear(x, w)
    assert rel(y, x, w) <= 2 * rel(x @ w.T, x, w) + 1e-3


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("split", [1, 2, 4])
def test_explicit_configs(M, split):
    gen = torch.Generator(device="cuda").manual_seed(M * 10 + split)
    x = torch.randn(M, 4096, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(4096, 4096, device="cuda", generator=gen) * 0.02).bfloat16()
    y = sl.linear(x, w, sl.Config(block_n=64, block_k=128, split=split))
    assert rel(y, x, w) <= 2 * rel(x @ w.T, x, w) + 1e-3


def test_graph_replays_on_new_inputs_with_split():
    """Captured once with K split in four, replayed on new x: every replay equals an eager
    call bit for bit (the counters reset, the sum's order is fixed), and no call syncs."""
    cfg = sl.Config(block_n=64, block_k=128, split=4)
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    w = (torch.randn(4096, 4096, device="cuda") * 0.02).bfloat16()
    out = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
    sl.linear(x, w, cfg, out=out)
    with no_host_sync():
        sl.linear(x, w, cfg, out=out)
    g = capture(lambda: sl.linear(x, w, cfg, out=out))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        assert torch.equal(out, sl.linear(x, w, cfg))


def test_one_row_graph_replays_on_new_inputs():
    """The one-row GEMV (no config), captured once and replayed on new x: every replay equals an
    eager call bit for bit (its sum has a fixed order), and no call syncs."""
    x = torch.randn(1, 4096, device="cuda").bfloat16()
    w = (torch.randn(6144, 4096, device="cuda") * 0.02).bfloat16()
    out = torch.empty(1, 6144, device="cuda", dtype=torch.bfloat16)
    sl.linear(x, w, out=out)
    with no_host_sync():
        sl.linear(x, w, out=out)
    g = capture(lambda: sl.linear(x, w, out=out))
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        assert torch.equal(out, sl.linear(x, w))
