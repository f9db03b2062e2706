"""Attention over the KV cache with a prefix + new-token visibility mask.

Every forward of the decode loop has the same shape of mask: each sequence b has `lengths[b]`
committed tokens, fully visible, followed by T new tokens at slots lengths[b] .. lengths[b]+T-1
whose mutual visibility is `new_vis[b]` (causal for prefill, ancestors-and-self for a tree,
all-ones for a draft block, [[True]] for one plain decoding token). `Mask` carries that
description and the kernels of the forward it serves (`mask.kernels`, kernel_choice.py); each
verify kernel (`mask.kernels.verify`) turns it into what it wants:

  sdpa    torch's scaled_dot_product_attention with an additive bias over [0, kv_len)
  flex    torch's flex_attention with a block mask
  triton  the bundled Triton tree-verify kernel (split-KV over the prefix, ancestor bitmasks)
  custom  the bundled CUDA C++ kernel, same interface as triton

The kernels read only lengths[b] + T keys per sequence; `kv_len` is the bound for SDPA's dense
mask (fixed at the cache size under CUDA graphs, where shapes must not change).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from harness.decode.kernel_choice import Kernels


def visibility_bits(vis: torch.Tensor) -> torch.Tensor:
    """Pack a [b, T, T] bool visibility into ancestor bitmasks [b, T, W] int32, W = ceil(T/32):
    bit (j % 32) of word j // 32 of row i is set iff tree query i may see tree key j. This is
    the tree-mask format the Triton and CUDA verify kernels read."""
    b, T, _ = vis.shape
    W = (T + 31) // 32
    v = F.pad(vis, (0, W * 32 - T)).view(b, T, W, 32).to(torch.int64)
    words = (v << torch.arange(32, device=vis.device, dtype=torch.int64)).sum(-1)
    # Two's complement: bit 31 set means a negative int32.
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@dataclass
class Mask:
    lengths: torch.Tensor        # [b] int64, committed tokens per sequence (on the model's device)
    new_vis: torch.Tensor        # [b, T, T] bool, visibility among the new tokens
    kv_len: int                  # keys [0, kv_len) bound SDPA's dense mask; >= max(lengths) + T
    kernels: Kernels = Kernels()  # which kernels run this forward (the attention: .verify)
    bits: torch.Tensor | None = None   # [b, T, W] int32 ancestor bitmasks (made on demand)
    _bias: dict = field(default_factory=dict, repr=False)

    def dense(self) -> torch.Tensor:
        """[b, 1, T, kv_len] bool: True where query i may attend key j."""
        b, T, _ = self.new_vis.shape
        j = torch.arange(self.kv_len, device=self.lengths.device)
        rel = j[None, :] - self.lengths[:, None]                      # [b, S]: slot - length
        in_new = (rel >= 0) & (rel < T)
        tree = torch.gather(self.new_vis, 2, rel.clamp(0, T - 1)[:, None, :].expand(b, T, -1))
        return ((rel < 0)[:, None, :] | (in_new[:, None, :] & tree))[:, None]

    def sdpa_bias(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [b, 1, group*T, kv_len] for grouped queries (see `attend`), built once
        per forward and shared by every layer."""
        key = (group, dtype)
        if key not in self._bias:
            allowed = self.dense()                                     # [b, 1, T, S]
            b, _, T, S = allowed.shape
            allowed = allowed.expand(b, group, T, S).reshape(b, 1, group * T, S)
            bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            self._bias[key] = bias.masked_fill_(~allowed, float("-inf"))
        return self._bias[key]

    def tree_bits(self) -> torch.Tensor:
        if self.bits is None:
            self.bits = visibility_bits(self.new_vis)
        return self.bits


def causal_mask(lengths: torch.Tensor, T: int, kv_len: int, kernels: Kernels = Kernels()) -> Mask:
    vis = torch.ones(T, T, dtype=torch.bool, device=lengths.device).tril()
    return Mask(lengths, vis.expand(lengths.shape[0], T, T), kv_len, kernels=kernels)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """q [b, h, T, d]; k, v [b, kv_heads, S, d] (grouped-query; S >= mask.kv_len for sdpa).
    Returns [b, h, T, d], written into `out` (any strides, e.g. a transposed [b, T, h, d]
    buffer that o_proj reads without a copy) when given."""
    verify = mask.kernels.verify
    if out is not None:
        if verify == "triton":
            from harness.kernels.verify.triton_verify import tree_verify_attention
            return tree_verify_attention(q, k, v, mask.lengths, mask.tree_bits(), out=out)
        if verify == "custom":
            from harness.kernels.verify.custom_verify import tree_verify_attention
            return tree_verify_attention(q, k, v, mask.lengths, mask.tree_bits(), out=out,
                                         impl=mask.kernels.custom_impl)
        return out.copy_(attend(q, k, v, mask))
    if verify == "sdpa":
        # Fold the G query heads that share a KV head into the query axis: one SDPA head per
        # KV head, so the cache is read once per group and never expanded to h heads.
        b, h, T, d = q.shape
        G = h // k.shape[1]
        S = mask.kv_len
        qg = q.reshape(b, k.shape[1], G * T, d)
        out = F.scaled_dot_product_attention(qg, k[:, :, :S], v[:, :, :S],
                                             attn_mask=mask.sdpa_bias(G, q.dtype))
        return out.reshape(b, h, T, d)
    if verify == "triton":
        from harness.kernels.verify.triton_verify import tree_verify_attention
        return tree_verify_attention(q, k, v, mask.lengths, mask.tree_bits())
    if verify == "custom":
        from harness.kernels.verify.custom_verify import tree_verify_attention
        return tree_verify_attention(q, k, v, mask.lengths, mask.tree_bits(),
                                     impl=mask.kernels.custom_impl)
    if verify == "flex":
        from harness.decode.flex_verify import flex_tree_verify
        return flex_tree_verify(q, k, v, mask.lengths, mask.tree_bits())
    raise ValueError(f"unknown verify kernel '{verify}'")
