"""The fused decode-forward kernels (harness.kernels.fused.triton_fused) in bf16 on a GPU, at
qwen3-8b's shapes.

Each kernel against the torch ops it replaces: both are compared with a float32 computation of
the same function on the same bf16 inputs, and the fused kernel may be off by no more than the
unfused bf16 ops are (it rounds where they round, and otherwise only once at the end); what it
copies (the residual sum, the values into the cache) must be exact. Then a verify forward of a
qwen3-8b-shaped target (random weights, 4 of its 36 layers, 65 tree tokens over a 4096-token
prefix, Triton attention) fused and unfused against the same model in float32 (SDPA): the
fused logits no further from it than the unfused ones, and their argmax agreeing. The same
kernels run under the Triton interpreter in fp32 in test_fused_ops.py (the interpreter
mishandles bf16). The time and kernel count of the fused forward is the op workload's
(`op: fused_forward`, scenarios/ops.yaml).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")

from harness.kernels.fused import triton_fused
from harness.kernels.verify import verify_reference

from harness.decode import attention
from harness.decode.kernel_choice import Kernels
from harness.decode.model import (
    Target,
    TargetConfig,
    apply_rope,
    init_random_,
    rope_tables,
)
from harness.protocol.presets import PRESETS

pytestmark = pytest.mark.gpu

BF = torch.bfloat16
QWEN = PRESETS["qwen3-8b"]["target"]
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = (QWEN[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "ffn"))
T = 65                       # 1 + a tree budget of 64
SLACK = 1.25                 # fused error <= SLACK x the unfused ops' error
FORWARD_SLACK = 1.5          # the same for 4 layers' logits


def err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def randn(device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return lambda *s: torch.randn(*s, generator=g, device=device)


@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rmsnorm(cuda, with_residual):
    r = randn(cuda, 0)
    x, res, w = r(T, HIDDEN).to(BF), r(T, HIDDEN).to(BF), r(HIDDEN).to(BF)
    out, h = triton_fused.add_rmsnorm(x, w, 1e-6, res if with_residual else None)
    want_h = x + res if with_residual else x          # bf16 add: fp32 sum, rounded once
    assert torch.equal(h, want_h)
    ref = F.rms_norm(want_h.float(), (HIDDEN,), w.float(), 1e-6)
    plain = F.rms_norm(want_h, (HIDDEN,), w, 1e-6)
    assert err(out, ref) <= SLACK * err(plain, ref)


def test_silu_mul(cuda):
    gu = randn(cuda, 1)(T, 2 * FFN).to(BF)
    gate, up = gu.chunk(2, -1)
    ref = F.silu(gate.float()) * up.float()
    plain = F.silu(gate) * up
    got = triton_fused.silu_mul(gu)
    assert got.shape == (T, FFN) and got.dtype == BF
    assert err(got, ref) <= SLACK * err(plain, ref)


@pytest.mark.parametrize("b,heads", [(1, HEADS), (2, HEADS), (2, 0)])   # heads 0: the drafter's KV write
def test_qk_norm_rope_store(cuda, b, heads):
    """Queries normed and rotated; keys normed, rotated and values copied (exactly) into the
    cache at each token's slot, per sequence; every other cache slot untouched."""
    r = randn(cuda, 2 + b + heads)
    S = 4200
    qkv = r(b, T, heads + 2 * KV_HEADS, HEAD_DIM).to(BF)
    qw, kw = r(HEAD_DIM).to(BF), r(HEAD_DIM).to(BF)
    starts = torch.tensor([4096, 1000][:b], device=cuda)
    pos = starts[:, None] + torch.arange(T, device=cuda)                 # [b, T]
    slots = pos.clone()
    cos32, sin32 = rope_tables(pos, HEAD_DIM, QWEN["rope_theta"], torch.float32)
    cos, sin = rope_tables(pos, HEAD_DIM, QWEN["rope_theta"], BF)
    kc = torch.full((b, KV_HEADS, S, HEAD_DIM), float("nan"), dtype=BF, device=cuda)
    vc = torch.full_like(kc, float("nan"))
    q = triton_fused.qk_norm_rope_store(qkv, heads, qw if heads else None, kw, 1e-6, cos, sin,
                                        kc, vc, slots)
    q_in, k_in, v_in = qkv.split([heads, KV_HEADS, KV_HEADS], 2)

    def ref_and_plain(x, w):
        ref = apply_rope(F.rms_norm(x.float(), (HEAD_DIM,), w.float(), 1e-6), (cos32, sin32))
        plain = apply_rope(F.rms_norm(x, (HEAD_DIM,), w, 1e-6), (cos, sin))
        return ref, plain

    if heads:
        ref, plain = ref_and_plain(q_in, qw)
        assert q.shape == (b, T, heads, HEAD_DIM)
        assert err(q, ref) <= SLACK * err(plain, ref)
    else:
        assert q is None
    k_ref, k_plain = ref_and_plain(k_in, kw)
    got_k = torch.stack([kc[i][:, slots[i]].transpose(0, 1) for i in range(b)])   # [b, T, hkv, d]
    got_v = torch.stack([vc[i][:, slots[i]].transpose(0, 1) for i in range(b)])
    assert err(got_k, k_ref) <= SLACK * err(k_plain, k_ref)
    assert torch.equal(got_v, v_in)
    for i in range(b):
        written = torch.zeros(S, dtype=torch.bool, device=cuda)
        written[slots[i]] = True
        assert kc[i][:, ~written].isnan().all() and vc[i][:, ~written].isnan().all()


@torch.no_grad()
def test_qwen3_shaped_verify_forward_fused_vs_unfused(cuda):
    cfg = TargetConfig(**dict(QWEN, layers=4))
    torch.manual_seed(0)
    with torch.device(cuda):
        target32 = Target(cfg)
    init_random_(target32, 0)
    target = copy.deepcopy(target32).to(BF)
    ctx = 4096
    cache = target.new_cache(1, ctx + 128)
    g = torch.Generator(device=cuda).manual_seed(1)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache32 = target32.new_cache(1, ctx + 128)
    cache32.k.copy_(cache.k)
    cache32.v.copy_(cache.v)
    lengths = torch.tensor([ctx], device=cuda)
    ids = torch.randint(0, cfg.vocab_size, (1, T), generator=g, device=cuda)
    vis = verify_reference.random_tree(1, T, torch.Generator().manual_seed(2)).to(cuda)
    bits = attention.visibility_bits(vis)
    slots = lengths[:, None] + torch.arange(T, device=cuda)

    def forward(model, cache, kernels):
        mask = attention.Mask(lengths, vis, ctx + 128, kernels=kernels, bits=bits)
        return model(ids, slots, cache, slots, mask)[0][0].float()     # [T, V]

    ref = forward(target32, cache32, Kernels(verify="sdpa"))
    plain = forward(target, cache, Kernels(verify="triton", fused_ops=False))
    fused = forward(target, cache, Kernels(verify="triton", fused_ops=True))

    def rel(x):
        return float((x - ref).norm() / ref.norm())

    assert rel(fused) <= FORWARD_SLACK * rel(plain), (rel(fused), rel(plain))
    agree = lambda a, b: float((a.argmax(-1) == b.argmax(-1)).float().mean())
    assert agree(fused, plain) >= 0.8
    assert agree(fused, ref) >= agree(plain, ref) - 0.1


def test_move_kv_compacts_like_indexing(cuda):
    """The accepted path's keys and values moved to the window's front in every layer and head
    (destinations overlapping sources), exactly as torch indexing moves them."""
    r = randn(cuda, 9)
    L, b, S, n = 4, 2, 512, 16
    kc, vc = r(L, b, KV_HEADS, S, HEAD_DIM).to(BF), r(L, b, KV_HEADS, S, HEAD_DIM).to(BF)
    lengths = torch.tensor([[100], [333]], device=cuda)
    idx = torch.tensor([[0, 1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 64, 64, 64, 64, 64],
                        [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]], device=cuda)
    src, dst = lengths + idx, lengths + torch.arange(n, device=cuda)
    want_k, want_v = kc.clone(), vc.clone()
    b_idx = torch.arange(b, device=cuda)[:, None]
    for c in (want_k, want_v):
        c[:, b_idx, :, dst] = c[:, b_idx, :, src]
    triton_fused.move_kv(kc, vc, src, dst)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
