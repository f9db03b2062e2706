"""Tree-verify attention from torch's own fused attention kernels: the peer a user has without
writing a kernel (the kernel workload's `vendor` compare mode).

    tree_verify_attention(q, k, v, lengths, tree_bits) -> [b, Hq, T, d]

The verify's keys fall in two parts. The committed prefix (lengths[b] keys) is seen by every
query, so it needs no mask, and a fused attention kernel that returns its log-sum-exp computes
it at that kernel's speed: cuDNN's on Hopper and later, FlashAttention-2's (torch's build) on
other CUDA GPUs, torch's CPU flash kernel on a CPU. The G query heads of a KV head are folded
into the query axis (one head of G x T rows a KV head, as the SDPA verify mode does), so the
cache is read once a group and never expanded. The T tree keys, which a query sees when they
are its ancestors, go to the same kernel with an additive mask (`tree_mask`; FlashAttention-2
takes none, so there they are a masked softmax over T columns in float32 torch ops). The prefix
goes to the fused kernel as a batch of key ranges (`key_ranges`), and every part (each range,
the keys left over, the tree block) is merged by its log-sum-exp, each part's output weighted by
its share of the row's softmax mass (`merge`):

    out = sum_p softmax_p(lse_p) o_p

With the tree block in float32 torch ops and the parts merged by logsumexp / logaddexp, a call
at 65 tree tokens over 64k keys on an H100 was 46 kernels: cuDNN's 165.6 µs, the tree block 51,
the rest of the glue ~87 (kernels/NOTES.md, "Session 40"): a peer slowed by its glue, not by its
attention kernel.

What it is not: the decode loop's verify. Each sequence's prefix is sliced at its length on the
host (`lengths` is a list of ints), so a captured step, whose shapes are fixed while the prefix
grows, cannot use it; the kernel workload, whose lengths are fixed per input set, can. Why a
second SDPA peer: the SDPA verify mode masks every key (an additive bias over the whole cache),
which sends torch to its memory-efficient kernel; this one leaves the prefix unmasked, which is
the form the vendors' fastest kernels take.

Reference: kernels/verify/verify_reference.py (float64). Tests: tests/kernels/test_vendor_verify.py
(CPU), test_vendor_verify_gpu.py (cuDNN and FlashAttention-2 on a GPU). Benchmark: the kernel
workload's `compare_modes: vendor` (scenarios/verify-ab.yaml).
"""

from __future__ import annotations

import math

import torch

from harness.kernels.verify.verify_reference import unpack_visibility

BACKENDS = ("cudnn", "flash", "cpu")
FUSED_TREE = ("cudnn", "cpu")   # the backends whose kernel takes the tree block's mask (FA2's none)
# The prefix goes to the fused kernel as a batch of key ranges (split-KV without a kernel of our
# own): one call over a 64k prefix gives cuDNN a grid of a few row tiles a KV head (754 µs at 65
# tree tokens on an H200), where 16 ranges of 4k keys took 160.5 µs (kernels/NOTES.md, "Session
# 38"). Ranges of at least RANGE_MIN_KEYS keys, at most MAX_RANGES of them.
MAX_RANGES = 16
RANGE_MIN_KEYS = 1024


def pick_backend(device: torch.device) -> str:
    """The fused kernel the prefix goes to on `device`: cuDNN on compute capability 9.0 and
    later (its Hopper kernels are the fastest torch ships there), FlashAttention-2 on other CUDA
    GPUs, the CPU flash kernel on a CPU."""
    if device.type != "cuda":
        return "cpu"
    return "cudnn" if torch.cuda.get_device_capability(device) >= (9, 0) else "flash"


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, backend: str,
                    mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [b, h, M, d] over k, v [b, h, n, d] (n >= 1) by `backend`'s fused kernel,
    under an additive `mask` [b, h, M, n] where given (cuDNN and the CPU kernel; FlashAttention-2
    takes none): (out [b, h, M, d] in q's dtype, natural-log log-sum-exp [b, h, M] float32)."""
    if backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, True, 0.0, False, False, scale=scale)[:2]
    elif backend == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    elif backend == "flash" and mask is None:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, False, False, scale=scale)[:2]
    elif backend == "flash":
        raise ValueError("FlashAttention-2 takes no mask")
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return out, lse.reshape(q.shape[:3]).float()      # cuDNN's is [b, h, M, 1]


def key_ranges(n: int) -> int:
    """How many key ranges a prefix of n keys is cut into (1 below 2 x RANGE_MIN_KEYS)."""
    return max(1, min(MAX_RANGES, n // RANGE_MIN_KEYS))


def prefix_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, backend: str,
                 ranges: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`fused_attention` of q [1, h, M, d] over the prefix k, v [1, h, n, d], the n keys cut into
    `ranges` ranges of n // ranges keys, attended as one batch (views of the cache, no copy),
    plus the n % ranges keys left as one more call: the parts `merge` takes, each (out
    [p, h, M, d] in q's dtype, lse [p, h, M] float32) for p ranges."""
    n = k.shape[2]
    ranges = max(1, min(ranges, n))
    if ranges == 1:           # one call, no copy of q (short prefixes, timed as such)
        return [fused_attention(q, k, v, scale, backend)]
    c = n // ranges
    main = ranges * c
    # [h, ranges * c, d] -> [ranges, h, c, d]: range r is batch entry r, a strided view.
    kr = k[0, :, :main].unflatten(1, (ranges, c)).transpose(0, 1)
    vr = v[0, :, :main].unflatten(1, (ranges, c)).transpose(0, 1)
    qr = q.expand(ranges, -1, -1, -1).contiguous()
    parts = [fused_attention(qr, kr, vr, scale, backend)]
    if main < n:
        parts.append(fused_attention(q, k[:, :, main:n], v[:, :, main:n], scale, backend))
    return parts


def merge(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """The attention over the union of the parts' keys, float32 [1, h, M, d]: each part's output
    weighted by its share of the row's softmax mass, softmax over the parts' log-sum-exps (one
    kernel for the weights; every part has a key a row, so every lse is finite)."""
    weights = torch.softmax(torch.cat([lse for _, lse in parts]), 0)[..., None]    # [P, h, M, 1]
    out, i = None, 0
    for o, lse in parts:
        p = lse.shape[0]
        term = weights[i] * o[0] if p == 1 else (weights[i:i + p] * o).sum(0)     # [h, M, d]
        out = term if out is None else out + term
        i += p
    return out[None]


def tree_mask(tree_bits: torch.Tensor, T: int, group: int, backend: str, heads_kv: int,
              dtype: torch.dtype) -> torch.Tensor:
    """Which tree keys each folded query row sees, in the form `tree_attention` takes on
    `backend`: for the fused kernels an additive mask [b, heads_kv, G*T, T] in `dtype` (0 seen,
    -inf hidden; rows padded to 8 elements, the 16-byte strides the kernels ask), for the
    float32 block a bool [b, 1, G*T, T]. The same for every layer of a forward: a caller that
    calls more than once builds it once and passes it."""
    visible = tree_visibility(tree_bits, T, group)
    if backend not in FUSED_TREE:
        return visible
    b, _, M, _ = visible.shape
    bias = torch.full((b, heads_kv, M, -(-T // 8) * 8), float("-inf"), dtype=dtype,
                      device=visible.device)
    bias[..., :T].masked_fill_(visible, 0.0)
    return bias[..., :T]


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, h, M, d] over the T tree keys k, v [b, h, T, d] under `tree_mask`'s mask (every row
    sees at least its own node): (out [b, h, M, d], lse float32 [b, h, M]). On cuDNN and the
    CPU one masked call of the backend's kernel; on FlashAttention-2, which takes no mask, a
    masked softmax over T columns in float32 torch ops."""
    if backend in FUSED_TREE:
        return fused_attention(q, k, v, scale, backend, mask)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.matmul(torch.exp(s - lse[..., None]), v.float()), lse


def tree_visibility(tree_bits: torch.Tensor, T: int, group: int) -> torch.Tensor:
    """[b, 1, G*T, T] bool: which tree keys each folded query row sees. Rows g * T + t of a KV
    head's folded queries are query head kv * G + g at tree node t."""
    return unpack_visibility(tree_bits, T).repeat(1, group, 1)[:, None]


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                          tree_bits: torch.Tensor, sm_scale: float | None = None, *,
                          backend: str | None = None, mask: torch.Tensor | None = None,
                          ranges: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """q [b, Hq, T, d]; k, v [b, Hkv, S, d] (contiguous cache, S >= lengths[i] + T); lengths: each
    sequence's committed keys, as ints; tree_bits [b, T, ceil(T/32)] int32 (ancestor bitmasks).
    Returns [b, Hq, T, d] in q's dtype, written into `out` when given. `backend` (default
    `pick_backend`) names the fused kernel; `mask` is `tree_mask` of tree_bits for it, built
    here when not given; `ranges` the key ranges of each prefix (default `key_ranges`)."""
    b, hq, T, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of KV heads {hkv}")
    if len(lengths) != b:
        raise ValueError(f"{len(lengths)} lengths for {b} sequences")
    G = hq // hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    backend = backend or pick_backend(q.device)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if mask is None:
        mask = tree_mask(tree_bits, T, G, backend, hkv, q.dtype)
    if out is None:
        out = torch.empty(b, hq, T, v.shape[-1], dtype=q.dtype, device=q.device)
    for i, L in enumerate(lengths):
        qg = q[i:i + 1].reshape(1, hkv, G * T, d)
        tree = tree_attention(qg, k[i:i + 1, :, L:L + T], v[i:i + 1, :, L:L + T], mask[i:i + 1],
                              scale, backend)
        parts = [tree] if L == 0 else prefix_parts(qg, k[i:i + 1, :, :L], v[i:i + 1, :, :L], scale,
                                                   backend, ranges or key_ranges(L)) + [tree]
        out[i:i + 1].copy_(merge(parts).reshape(1, hq, T, -1))
    return out
