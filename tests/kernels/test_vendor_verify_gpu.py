"""The vendor verify (kernels/verify/vendor_verify.py) on a GPU: each fused prefix kernel torch offers
here (cuDNN, FlashAttention-2) at the loop's shapes (GQA 32/8, d 128, 16 and 65 tree tokens,
prefixes of 4096 and 65536 keys, a batch of two different lengths), bf16, against the float64
reference. The cache past each sequence's lengths[b] + T holds NaN (a read past the prefix or the
tree fails) and the tree keys are scaled up, so a wrong mask or merge weight does not hide below the
tolerance. The log-sum-exp each backend returns is checked against the logits' own."""

from __future__ import annotations

import pytest
import torch

from harness.kernels.verify import vendor_verify as vv
from harness.kernels.verify import verify_reference as ref

pytestmark = pytest.mark.gpu

HQ, HKV, D = 32, 8, 128
BOOST = 6.0


def backends():
    if not torch.cuda.is_available():
        return []
    return ["cudnn", "flash"] if torch.cuda.get_device_capability() >= (9, 0) else ["flash"]


def inputs(lengths, T, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, S = len(lengths), max(lengths) + T + 64
    q = torch.randn(b, HQ, T, D, device="cuda", generator=g).bfloat16()
    k = torch.full((b, HKV, S, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    v = torch.full_like(k, float("nan"))
    for i, L in enumerate(lengths):
        k[i, :, :L + T] = torch.randn(HKV, L + T, D, device="cuda", generator=g).bfloat16()
        v[i, :, :L + T] = torch.randn(HKV, L + T, D, device="cuda", generator=g).bfloat16()
        k[i, :, L:L + T] *= BOOST
    bits = ref.pack_visibility(ref.random_tree(b, T, torch.Generator().manual_seed(seed))).cuda()
    return q, k, v, bits


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("lengths, T", [([4096], 65), ([65536], 65), ([4096], 16), ([3000, 1111], 65)])
def test_equals_the_float64_reference(backend, lengths, T):
    q, k, v, bits = inputs(lengths, T, seed=sum(lengths) + T)
    out = torch.full((len(lengths), HQ, T, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    vv.tree_verify_attention(q, k, v, lengths, bits, backend=backend, out=out)
    want = ref.reference_attention(q.double(), k.double(), v.double(),
                                   torch.tensor(lengths, device="cuda"), bits)
    assert ref.relative_error(out, want) < 1e-2


@pytest.mark.parametrize("backend", backends())
def test_prefix_lse_is_the_natural_log_sum_exp(backend):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, HKV, 4 * 65, D, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(1, HKV, 2048, D, device="cuda", generator=g).bfloat16() for _ in range(2))
    out, lse = vv.fused_attention(q, k, v, D ** -0.5, backend)
    s = q.float() @ k.float().transpose(-1, -2) * D ** -0.5
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=2e-2)
    assert ref.relative_error(out, torch.softmax(s, -1).double() @ v.double()) < 1e-2


def test_the_default_backend_on_hopper_is_cudnn():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    want = "cudnn" if torch.cuda.get_device_capability() >= (9, 0) else "flash"
    assert vv.pick_backend(torch.device("cuda")) == want


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("T", [16, 65])
def test_the_tree_block_on_the_backend_equals_the_float32_one(backend, T):
    """The tree block alone (G x T folded rows over T keys under the tree's mask, as the loop's
    shapes give it): the backend's kernel with `tree_mask`'s mask against float32 torch ops."""
    q, k, v, bits = inputs([0], T, seed=T)
    qg = q.reshape(1, HKV, (HQ // HKV) * T, D)
    kt, vt = k[:, :, :T], v[:, :, :T]
    mask = vv.tree_mask(bits, T, HQ // HKV, backend, HKV, q.dtype)
    out, lse = vv.tree_attention(qg, kt, vt, mask, D ** -0.5, backend)
    want, want_lse = vv.tree_attention(qg, kt, vt, vv.tree_mask(bits, T, HQ // HKV, "flash", HKV, q.dtype),
                                       D ** -0.5, "flash")
    assert ref.relative_error(out, want.double()) < 1e-2
    assert torch.allclose(lse, want_lse, atol=5e-2)
