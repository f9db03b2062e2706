"""A DFlash-style block drafter.

As in DFlash (arXiv 2602.06036): a few Qwen3-style layers with no embedding or head of their own
(the target's are used). The target's hidden states at `target_layer_ids` are concatenated,
projected (`fc`, `hidden_norm`) and turned into extra keys and values in every draft layer: the
drafter's "context cache", appended to as tokens are committed. One forward drafts a whole block:
input [bonus, MASK x (B-1)] at positions len .. len+B-1, non-causal inside the block, each block
position seeing the whole context cache; the B-1 drafted positions give per-position logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.decode import attention
from harness.decode.kernel_choice import Kernels
from harness.decode.model import (KVCache, Layer, RMSNorm, Target, TargetConfig, final_norm,
                                  linear, overlaps_gemm, run_layers)


@dataclass(frozen=True)
class DrafterConfig:
    layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    # Random-weight drafters produce distributions whose sharpness depends on incidental things
    # (the cache contents, the init order), which would make DDTree shapes, and with synthetic
    # acceptance the accepted lengths, drift between runs. So a random drafter's logits are
    # standardised per position and scaled by `logit_scale`: top-k log-probs shaped like a
    # trained drafter's (a confident first choice: mean top-1 probability ~0.8 at a
    # 151936 vocabulary), trees of realistic depth. 0 = raw
    # logits (what a trained drafter checkpoint would use).
    logit_scale: float = 32.0


class Drafter(nn.Module):
    def __init__(self, cfg: DrafterConfig, target_cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.target_cfg = target_cfg
        n = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n * target_cfg.hidden, target_cfg.hidden, bias=False)
        self.hidden_norm = RMSNorm(target_cfg.hidden, target_cfg.rms_eps)
        self.layers = nn.ModuleList(Layer(target_cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(target_cfg.hidden, target_cfg.rms_eps)
        # The last vocabulary id stands in for DFlash's mask token.
        self.mask_token_id = target_cfg.vocab_size - 1
        self._block_vis: dict = {}     # (batch, device) -> the block's visibility and bitmasks

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.fc.weight
        t = self.target_cfg
        return KVCache(self.cfg.layers, batch, t.kv_heads, max_len, t.head_dim, p.dtype, p.device,
                       t.rope_theta)

    def ingest(self, cache: KVCache, target_hidden: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, kernels: Kernels = Kernels()) -> None:
        """Add committed tokens to the context cache. target_hidden [b, T, n*hidden] are the
        target's captured hidden states of those tokens, at `positions` / `slots` [b, T];
        `kernels` the decoder's (its fused ops and GEMMs: there is no attention)."""
        feats = self.hidden_norm(linear(self.fc, target_hidden, kernels))
        rope = cache.rope(positions)
        for i, layer in enumerate(self.layers):
            layer.self_attn.write_kv(feats, rope, cache, i, slots, kernels)

    def draft(self, target: Target, cache: KVCache, bonus: torch.Tensor,
              lengths: torch.Tensor, kv_len: int, kernels: Kernels = Kernels()) -> torch.Tensor:
        """bonus [b] (the next token, not yet in any cache), lengths [b] committed tokens,
        kv_len >= max(lengths) + B (keys read); `kernels` the decoder's (the block is a fully
        visible "tree", so the verify kernel serves the drafter too).
        Returns logits [b, B-1, V] for positions 1 .. B-1 (float32 when standardised)."""
        b, B = bonus.shape[0], self.cfg.block_size
        ids = torch.full((b, B), self.mask_token_id, dtype=torch.long, device=bonus.device)
        ids[:, 0] = bonus
        offsets = torch.arange(B, device=bonus.device)
        positions = lengths[:, None] + offsets
        # The block's own keys/values go to the slots just past the context; the next ingest
        # overwrites them with committed tokens, so nothing stale is ever visible.
        vis, bits = self._block_visibility(b, bonus.device)
        mask = attention.Mask(lengths, vis, kv_len=kv_len, kernels=kernels, bits=bits)
        x = target.embed_tokens(ids)
        rope = cache.rope(positions)
        h, residual, _ = run_layers(self.layers, x, rope, cache, positions, mask)
        logits = linear(target.lm_head, final_norm(self.norm, h[:, 1:],
                                                   None if residual is None else residual[:, 1:],
                                                   overlaps_gemm(h, kernels)),
                        kernels)
        if not self.cfg.logit_scale:
            return logits
        # float32 out: scaled logits near the top are ~40, where bf16's step (0.25) would tie
        # the candidates the tree ranks.
        if kernels.fused_ops:
            from harness.kernels.fused import triton_fused
            return triton_fused.standardise(logits, self.cfg.logit_scale,
                                            overlaps_gemm(h, kernels))
        logits = logits.float()
        std, mean = torch.std_mean(logits, dim=-1, keepdim=True)
        return (logits - mean) / std * self.cfg.logit_scale

    def _block_visibility(self, batch: int, device: torch.device):
        """The block's visibility (all ones: non-causal inside the block) [b, B, B] and its
        bitmasks, the same at every step: made at the first draft of a batch size on a device
        (outside any graph capture: the warm-up's) instead of by a few kernels every step."""
        key = (batch, str(device))
        if key not in self._block_vis:
            B = self.cfg.block_size
            vis = torch.ones(batch, B, B, dtype=torch.bool, device=device)
            self._block_vis[key] = (vis, attention.visibility_bits(vis))
        return self._block_vis[key]
