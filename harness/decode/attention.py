"""Attention over the KV cache with a prefix + new-token visibility mask.

Every forward of the decode loop has the same shape of mask: each sequence b has `lengths[b]`
committed tokens, fully visible, followed by T new tokens at slots lengths[b] .. lengths[b]+T-1
whose mutual visibility is `new_vis[b]` (causal for prefill, ancestors-and-self for a tree,
[[True]] for one plain decoding token). `Mask` carries that description; each verify mode turns
it into what its kernel wants (a dense boolean mask for SDPA).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.nn import functional as F


@dataclass
class Mask:
    lengths: torch.Tensor        # [b] int64, committed tokens per sequence (on the model's device)
    new_vis: torch.Tensor        # [b, T, T] bool, visibility among the new tokens
    kv_len: int                  # keys [0, kv_len) are read; >= max(lengths) + T
    mode: str = "sdpa"           # verify_mode: which kernel runs this attention
    _dense: torch.Tensor | None = field(default=None, repr=False)

    def dense(self) -> torch.Tensor:
        """[b, 1, T, kv_len] bool: True where query i may attend key j. Built once per forward
        and shared by every layer."""
        if self._dense is None:
            b, T, _ = self.new_vis.shape
            j = torch.arange(self.kv_len, device=self.lengths.device)
            rel = j[None, :] - self.lengths[:, None]                      # [b, S]: slot - length
            in_new = (rel >= 0) & (rel < T)
            tree = torch.gather(self.new_vis, 2, rel.clamp(0, T - 1)[:, None, :].expand(b, T, -1))
            self._dense = ((rel < 0)[:, None, :] | (in_new[:, None, :] & tree))[:, None]
        return self._dense


def causal_mask(lengths: torch.Tensor, T: int, kv_len: int) -> Mask:
    vis = torch.ones(T, T, dtype=torch.bool, device=lengths.device).tril()
    return Mask(lengths, vis.expand(lengths.shape[0], T, T), kv_len)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask) -> torch.Tensor:
    """q [b, h, T, d]; k, v [b, kv_heads, S, d] (grouped-query). Returns [b, h, T, d]."""
    if mask.mode == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense(),
                                              enable_gqa=q.shape[1] != k.shape[1])
    raise NotImplementedError(
        f"verify_mode '{mask.mode}' is not implemented yet in this build (available: sdpa)")
