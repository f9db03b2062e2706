"""The fused decode-forward kernels (kernels/fused/triton_fused.py), under the Triton interpreter on CPU.

Each kernel against the torch ops it replaces, on fresh random fp32 inputs with poisoned outputs;
then the whole forward: a tiny target and drafter on the fused path equal the unfused path
(logits, captured hidden states, every KV-cache entry), so the wiring in model.py (split
residual stream, cache writes at the slots, the attention writing o_proj's layout) is checked,
not only the kernels. bf16 runs on the GPU (test_fused_ops_gpu.py, `pytest -m gpu`).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")

from harness.decode.kernel_choice import Kernels  # noqa: E402
from harness.decode.model import apply_rope, rope_tables  # noqa: E402

TOL = dict(atol=2e-5, rtol=2e-5)


def _kernels():
    from harness.kernels.fused import triton_fused

    return triton_fused


def run_add_rmsnorm(x, w, eps, residual):
    return _kernels().add_rmsnorm(x, w, eps, residual)


def run_silu_mul(gu):
    return _kernels().silu_mul(gu)


def run_qk(qkv, heads, qw, kw, eps, cos, sin, kc, vc, slots):
    q = _kernels().qk_norm_rope_store(qkv, heads, qw, kw, eps, cos, sin, kc, vc, slots)
    return q, kc, vc


def run_move_kv(kc, vc, src, dst):
    _kernels().move_kv(kc, vc, src, dst)
    return kc, vc


@pytest.mark.parametrize("d", [128, 48])
def test_move_kv_compacts_like_indexing(interp, d):
    """Every layer's and head's rows src[b] moved to dst[b] as torch indexing moves them, where
    destinations overlap sources (the accepted path compacted to the window's front: row j
    from slot L + idx[j], idx increasing, to L + j); other slots untouched."""
    L, b, h, S, n = 3, 2, 2, 64, 6
    kc, vc = torch.randn(L, b, h, S, d), torch.randn(L, b, h, S, d)
    lengths = torch.tensor([[20], [41]])
    idx = torch.tensor([[0, 2, 3, 7, 8, 8], [0, 1, 4, 5, 9, 12]])         # padded with the last
    src, dst = lengths + idx, lengths + torch.arange(n)
    want_k, want_v = kc.clone(), vc.clone()
    b_idx = torch.arange(b)[:, None]
    for c in (want_k, want_v):
        c[:, b_idx, :, dst] = c[:, b_idx, :, src]
    got_k, got_v = interp.apply(run_move_kv, (kc, vc, src, dst))
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("cols", [128, 100])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rmsnorm(interp, cols, with_residual):
    g = torch.Generator().manual_seed(cols + with_residual)
    x = torch.randn(2, 3, cols, generator=g)
    r = torch.randn(2, 3, cols, generator=g) if with_residual else None
    w = torch.randn(cols, generator=g)
    out, res = interp.apply(run_add_rmsnorm, (x, w, 1e-6, r))
    h = x + r if with_residual else x
    torch.testing.assert_close(res, h, **TOL)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(h, (cols,), w, 1e-6), **TOL)


def test_silu_mul(interp):
    g = torch.Generator().manual_seed(1)
    gu = torch.randn(5, 2 * 1300, generator=g)           # F = 1300: two blocks, a ragged one
    out = interp.apply(run_silu_mul, (gu,))
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up, **TOL)


def run_standardise(x, scale):
    from harness.kernels.fused import triton_fused
    return triton_fused.standardise(x, scale)


@pytest.mark.parametrize("cols", [5000, 300])          # two blocks and a ragged one; one block
def test_standardise(interp, cols):
    g = torch.Generator().manual_seed(cols)
    x = torch.randn(3, 2, cols, generator=g) * 3 - 7
    out = interp.apply(run_standardise, (x, 32.0))
    std, mean = torch.std_mean(x.double(), dim=-1, keepdim=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), (x.double() - mean) / std * 32.0, atol=2e-4, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 32), (2, 1, 24), (0, 2, 16)])
def test_qk_norm_rope_store(interp, heads, kv_heads, d):
    """Queries returned normed and rotated; keys normed, rotated and values copied into the
    cache at each token's slot; every other cache entry untouched. d = 24: half 12, masked."""
    g = torch.Generator().manual_seed(heads * 100 + d)
    b, T, S = 2, 5, 16
    qkv = torch.randn(b, T, heads + 2 * kv_heads, d, generator=g)
    qw, kw = torch.randn(d, generator=g), torch.randn(d, generator=g)
    positions = torch.tensor([[3, 4, 4, 5, 6], [9, 10, 11, 11, 12]])
    slots = torch.tensor([[7, 8, 9, 10, 11], [0, 1, 2, 3, 4]])
    cos, sin = rope_tables(positions, d, 10000.0, torch.float32)
    kc = torch.full((b, kv_heads, S, d), float("nan"))
    vc = torch.full((b, kv_heads, S, d), float("nan"))
    q, kc, vc = interp.apply(run_qk, (qkv, heads, qw if heads else None, kw, 1e-6, cos, sin,
                                      kc, vc, slots))
    rms = lambda x, w: torch.nn.functional.rms_norm(x, (d,), w, 1e-6)  # noqa: E731
    q_ref, k_ref, v_ref = qkv.split([heads, kv_heads, kv_heads], dim=2)
    if heads:
        torch.testing.assert_close(q, apply_rope(rms(q_ref, qw), (cos, sin)), **TOL)
    else:
        assert q is None
    k_ref = apply_rope(rms(k_ref, kw), (cos, sin))
    for i in range(b):
        written = torch.zeros(S, dtype=torch.bool)
        written[slots[i]] = True
        torch.testing.assert_close(kc[i][:, slots[i]], k_ref[i].transpose(0, 1), **TOL)
        torch.testing.assert_close(vc[i][:, slots[i]], v_ref[i].transpose(0, 1), **TOL)
        assert kc[i][:, ~written].isnan().all() and vc[i][:, ~written].isnan().all()


# ---------------------------------------------------------------------------------------------
# The whole forward, fused vs unfused


@torch.no_grad()
def run_decode_forward(fused: bool):
    """A tiny target + drafter: prefill-like causal forward, a tree-verify forward with the
    Triton kernel, a draft and an ingest, every one on the fused kernels when `fused`.
    Returns every output and both caches."""
    from harness.decode import attention
    from harness.decode.drafter import Drafter, DrafterConfig
    from harness.decode.model import Target, TargetConfig, init_random_

    torch.manual_seed(0)
    cfg = TargetConfig(vocab_size=64, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=8, ffn=48)
    target = Target(cfg)
    init_random_(target, 0)
    drafter = Drafter(DrafterConfig(layers=2, target_layer_ids=(0, 2), block_size=4), cfg)
    init_random_(drafter, 1)
    b, S = 2, 32
    prefill_kernels = Kernels(verify="sdpa", fused_ops=fused)
    tree_kernels = Kernels(verify="triton", fused_ops=fused)
    cache, dcache = target.new_cache(b, S), drafter.new_cache(b, S)
    g = torch.Generator().manual_seed(5)
    # prefill 6 tokens (causal), logits of the last one only
    ids = torch.randint(0, 63, (b, 6), generator=g)
    pos = torch.arange(6).expand(b, 6)
    lengths = torch.zeros(b, dtype=torch.long)
    mask = attention.causal_mask(lengths, 6, S, kernels=prefill_kernels)
    logits1, hid1 = target(ids, pos, cache, pos, mask, capture_layers=(0, 2),
                           logits_for=torch.full((b, 1), 5))
    drafter.ingest(dcache, hid1, pos, pos, kernels=prefill_kernels)
    # a tree verify of 5 tokens with the Triton kernel
    lengths = torch.tensor([6, 6])
    vis = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0],
                        [1, 0, 1, 0, 1]], dtype=torch.bool).expand(b, 5, 5).contiguous()
    depth = torch.tensor([0, 1, 1, 2, 2])
    tree_mask = attention.Mask(lengths, vis, S, kernels=tree_kernels)
    ids2 = torch.randint(0, 63, (b, 5), generator=g)
    logits2, hid2 = target(ids2, lengths[:, None] + depth, cache, lengths[:, None] + torch.arange(5),
                           tree_mask, capture_layers=(0, 2))
    draft = drafter.draft(target, dcache, ids2[:, 0], lengths, S, kernels=tree_kernels)
    return logits1, hid1, logits2, hid2, draft, cache.k, cache.v, dcache.k, dcache.v


def test_fused_forward_equals_unfused(interp):
    fused = interp.apply(run_decode_forward, (True,))
    plain = interp.apply(run_decode_forward, (False,))
    names = ("prefill logits", "prefill hidden", "verify logits", "verify hidden", "draft logits",
             "k cache", "v cache", "draft k cache", "draft v cache")
    for name, a, b in zip(names, fused, plain):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------------------------------------
# The whole fast loop with every switch on: still lossless


@torch.no_grad()
def run_fast_loop_switched_on():
    """In the interpreter: fused forward, Triton top-k, Triton verify, GPU-style tree build and
    accept, sibling branches and a batch of two (as tests/decode/test_fast_loop.py, in float32).
    Returns the speculative output and plain greedy decoding with the unfused forward: equal,
    the fused loop is lossless against the plain one (a fused greedy reference would cost 40
    interpreted forwards and say no more)."""
    from harness.decode.fast import FastSpecDecoder
    from test_decode import OracleDrafter, ar_reference, make_models, prompts_for

    every = Kernels(verify="triton", topk="triton", fused_ops=True, accept="triton")
    target, drafter = make_models(11, block=6, dtype=torch.float32)
    prompts = prompts_for(11, [9, 20])
    ref = ar_reference(target, prompts, 40)
    # Three steps (each costs seconds interpreted), each telling: the path leaves the best
    # chain for a sibling at steps 1 and 3 (after 0 and 8 tokens) and is cut short at step 2
    # (after 5): 5 + 3 + 4 tokens.
    oracle = OracleDrafter(drafter, ref, [9, 20], wrong_at={(5, 2)}, second_at={(0, 1), (8, 0)})
    dec = FastSpecDecoder(target, oracle, batch=2, max_len=128, tree_budget=8, kernels=every,
                          tree_build="gpu", accept="gpu")
    dec.prefill(prompts)
    for _ in range(3):
        dec.step()
    dec.finish()
    return dec.output, ref


def test_fast_loop_with_every_switch_on_is_lossless(interp):
    out, plain = interp.apply(run_fast_loop_switched_on)
    for b in range(2):
        assert len(out[b]) == 12                  # the path the oracle laid out, all of it
        assert out[b] == plain[b][: len(out[b])]


# ---------------------------------------------------------------------------------------------
# The cell knobs that pick these kernels (harness/protocol/params.py IMPL_DEFAULTS)


def test_a_cpu_cell_that_picks_a_cuda_kernel_fails_and_the_next_cell_runs():
    from harness.worker import main as worker

    cell = {"model": "tiny", "context_length": 32, "steps": 2, "repeats": 1, "warmup_steps": 0,
            "profile_steps": 0, "device": "cpu"}
    bad = worker.run_cell(dict(cell, topk_impl="triton"))
    assert bad["status"] == "failed" and "pick CUDA kernels" in bad["error"]
    ok = worker.run_cell(cell)
    assert ok["status"] == "ok", ok["error"]
    # What ran, auto resolved for a CPU (no tree-build kernel: the tree is built on the host).
    assert ok["kernels"] == {"fused_ops": False, "topk_impl": "torch", "linear_impl": "torch",
                             "blas_impl": "torch"}
