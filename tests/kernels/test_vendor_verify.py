"""The vendor verify (kernels/verify/vendor_verify.py) on a CPU: torch's CPU flash kernel over the
prefix and, masked, over the tree block, merged by log-sum-exp, against the float64 reference.

The cache past each sequence's lengths[b] + T holds NaN, so a slice that reads one key too many
fails; the tree keys are scaled up so that a wrong tree mask or a wrong merge weight moves the
output well past the tolerance (a long prefix would otherwise carry almost all the mass)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.kernels.verify import vendor_verify as vv
from harness.kernels.verify import verify_reference as ref


def inputs(b, hq, hkv, T, d, lengths, seed, dtype=torch.float32, tree_scale=4.0):
    g = torch.Generator().manual_seed(seed)
    S = max(lengths) + T + 5
    q = torch.randn(b, hq, T, d, generator=g).to(dtype)
    k = torch.full((b, hkv, S, d), float("nan"), dtype=dtype)
    v = torch.full((b, hkv, S, d), float("nan"), dtype=dtype)
    for i, L in enumerate(lengths):
        k[i, :, :L + T] = torch.randn(hkv, L + T, d, generator=g).to(dtype)
        v[i, :, :L + T] = torch.randn(hkv, L + T, d, generator=g).to(dtype)
        k[i, :, L:L + T] *= tree_scale
    bits = ref.pack_visibility(ref.random_tree(b, T, g))
    return q, k, v, bits


def reference(q, k, v, lengths, bits):
    return ref.reference_attention(q.double(), k.double(), v.double(),
                                   torch.tensor(lengths), bits)


@pytest.mark.parametrize("b, hq, hkv, T, d, lengths", [
    (1, 4, 2, 9, 32, [70]),
    (2, 8, 2, 17, 64, [130, 41]),     # sequences of different prefix lengths
    (1, 4, 4, 65, 32, [200]),         # no grouping; 65 tree tokens cross a 64-row boundary
    (2, 4, 1, 5, 16, [0, 12]),        # an empty prefix: the tree block alone
])
def test_equals_the_float64_reference(b, hq, hkv, T, d, lengths):
    q, k, v, bits = inputs(b, hq, hkv, T, d, lengths, seed=hash((b, hq, T)) % 1000)
    out = vv.tree_verify_attention(q, k, v, lengths, bits)
    assert ref.relative_error(out, reference(q, k, v, lengths, bits)) < 1e-5


def test_bf16_within_the_kernel_workloads_tolerance():
    lengths = [300, 150]
    q, k, v, bits = inputs(2, 8, 2, 17, 64, lengths, seed=3, dtype=torch.bfloat16)
    out = vv.tree_verify_attention(q, k, v, lengths, bits)
    assert out.dtype == torch.bfloat16
    assert ref.relative_error(out, reference(q, k, v, lengths, bits)) < 1e-2


def test_writes_into_out_and_honours_the_scale():
    lengths = [50]
    q, k, v, bits = inputs(1, 4, 2, 9, 32, lengths, seed=5)
    out = torch.full((1, 4, 9, 32), float("nan"))
    got = vv.tree_verify_attention(q, k, v, lengths, bits, sm_scale=0.3, out=out)
    assert got is out
    want = ref.reference_attention(q.double(), k.double(), v.double(), torch.tensor(lengths), bits,
                                   sm_scale=0.3)
    assert ref.relative_error(out, want) < 1e-5


def test_a_wrong_merge_or_mask_fails_the_check():
    """The test's own power: the tree block dropped, or every tree key made visible, moves the
    output past the tolerance the first test holds."""
    lengths = [70]
    q, k, v, bits = inputs(1, 4, 2, 9, 32, lengths, seed=11)
    want = reference(q, k, v, lengths, bits)
    all_visible = ref.pack_visibility(torch.ones(1, 9, 9, dtype=torch.bool))
    assert ref.relative_error(vv.tree_verify_attention(q, k, v, lengths, all_visible), want) > 1e-2
    scale = 1 / math.sqrt(32)
    o_pre, _ = vv.fused_attention(q.reshape(1, 2, 18, 32), k[:, :, :70], v[:, :, :70], scale, "cpu")
    assert ref.relative_error(o_pre.reshape(1, 4, 9, 32), want) > 1e-2


def test_prefix_lse_is_the_natural_log_sum_exp():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (7, 40, 40))
    out, lse = vv.fused_attention(q, k, v, 0.25, "cpu")
    s = q @ k.transpose(-1, -2) * 0.25
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)
    assert torch.allclose(out, torch.softmax(s, -1) @ v, atol=1e-5)


def test_bad_arguments_are_refused():
    q, k, v, bits = inputs(1, 6, 4, 5, 16, [10], seed=2)
    with pytest.raises(ValueError, match="not a multiple"):
        vv.tree_verify_attention(q, k, v, [10], bits)
    q, k, v, bits = inputs(1, 4, 2, 5, 16, [10], seed=2)
    with pytest.raises(ValueError, match="2 lengths for 1"):
        vv.tree_verify_attention(q, k, v, [10, 3], bits)
    with pytest.raises(ValueError, match="backend must be one of"):
        vv.tree_verify_attention(q, k, v, [10], bits, backend="magic")


def test_backend_by_device():
    assert vv.pick_backend(torch.device("cpu")) == "cpu"


def test_a_mask_built_once_is_the_mask_used():
    """`mask` given (as the kernel workload builds it, once outside the timed call) is what the
    call masks with: the same as building it from tree_bits, and an all-visible one differs."""
    lengths = [40]
    q, k, v, bits = inputs(1, 4, 2, 9, 32, lengths, seed=13)
    own = vv.tree_verify_attention(q, k, v, lengths, bits)
    given = vv.tree_verify_attention(q, k, v, lengths, bits,
                                     mask=vv.tree_mask(bits, 9, 2, "cpu", 2, q.dtype))
    assert torch.equal(own, given)
    everything = torch.zeros(1, 2, 18, 9)                  # additive: every tree key seen
    wrong = vv.tree_verify_attention(q, k, v, lengths, bits, mask=everything)
    assert ref.relative_error(wrong, reference(q, k, v, lengths, bits)) > 1e-2


def test_the_tree_mask_by_backend():
    """The fused kernels take an additive mask (0 seen, -inf hidden) per KV head with rows padded
    to 16-byte strides; FlashAttention-2's float32 block a bool one."""
    g = torch.Generator().manual_seed(3)
    bits = ref.pack_visibility(ref.random_tree(1, 9, g))
    visible = vv.tree_visibility(bits, 9, 2)
    bias = vv.tree_mask(bits, 9, 2, "cudnn", 3, torch.bfloat16)
    assert bias.shape == (1, 3, 18, 9) and bias.dtype == torch.bfloat16 and bias.stride(2) == 16
    assert torch.equal(bias == 0, visible.expand(1, 3, 18, 9))
    assert torch.isneginf(bias[~visible.expand(1, 3, 18, 9)]).all()
    assert torch.equal(vv.tree_mask(bits, 9, 2, "flash", 3, torch.bfloat16), visible)


def test_the_fused_tree_block_equals_the_float32_one():
    """The tree block through the CPU kernel with its additive mask equals FlashAttention-2's
    float32 torch block with the bool mask (out and log-sum-exp)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g) for n in (18, 9, 9))
    bits = ref.pack_visibility(ref.random_tree(1, 9, g))
    args = (q, k, v)
    fused = vv.tree_attention(*args, vv.tree_mask(bits, 9, 2, "cpu", 2, q.dtype), 0.2, "cpu")
    block = vv.tree_attention(*args, vv.tree_mask(bits, 9, 2, "flash", 2, q.dtype), 0.2, "flash")
    assert torch.allclose(fused[0], block[0], atol=1e-5) and torch.allclose(fused[1], block[1], atol=1e-5)


def test_merge_weights_each_part_by_its_mass():
    """Two parts of one row's keys merged equal the softmax over all of them; a part whose lse
    is swapped for another's does not."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 6, 16, generator=g)
    k, v = (torch.randn(1, 2, 30, 16, generator=g) for _ in range(2))
    parts = [vv.fused_attention(q, k[:, :, :12], v[:, :, :12], 0.3, "cpu"),
             vv.fused_attention(q, k[:, :, 12:], v[:, :, 12:], 0.3, "cpu")]
    whole, _ = vv.fused_attention(q, k, v, 0.3, "cpu")
    assert vv.merge(parts).shape == whole.shape and torch.allclose(vv.merge(parts), whole, atol=1e-5)
    swapped = [(parts[0][0], parts[1][1]), (parts[1][0], parts[0][1])]
    assert not torch.allclose(vv.merge(swapped), whole, atol=1e-3)


@pytest.mark.parametrize("n, ranges", [(70, 1), (70, 3), (64, 4), (5, 16), (4096, None)])
def test_key_ranges_merge_to_the_whole_prefix(n, ranges):
    """The prefix cut into key ranges (a batch of strided views of the cache, the keys left over
    as one more call) and merged by log-sum-exp equals one call over the whole prefix, out and
    log-sum-exp."""
    g = torch.Generator().manual_seed(n)
    q = torch.randn(1, 2, 9, 32, generator=g)
    k = torch.randn(1, 2, n + 7, 32, generator=g)
    v = torch.randn(1, 2, n + 7, 32, generator=g)
    k[:, :, n:] = float("nan")           # keys past the prefix must not be read
    scale = 1 / math.sqrt(32)
    whole, lse_whole = vv.fused_attention(q, k[:, :, :n], v[:, :, :n], scale, "cpu")
    ranges = ranges or vv.key_ranges(n)
    parts = vv.prefix_parts(q, k[:, :, :n], v[:, :, :n], scale, "cpu", ranges)
    got, lse = vv.merge(parts), torch.logsumexp(torch.cat([lse for _, lse in parts]), 0, keepdim=True)
    assert got.shape == whole.shape and lse.shape == lse_whole.shape
    assert torch.allclose(got, whole, atol=1e-5) and torch.allclose(lse, lse_whole, atol=1e-5)


def test_key_ranges_rule():
    assert [vv.key_ranges(n) for n in (1, 1500, 2048, 4096, 16384, 65536, 131072)] == [1, 1, 2, 4, 16, 16, 16]
