"""A Qwen3-style target model with a preallocated KV cache.

RMSNorm, rotary position embeddings, grouped-query attention with per-head q/k norms, SwiGLU.
Weights are seeded random (presets in `presets.py`) or loaded from a local HF-format safetensors
checkpoint. The forward pass takes explicit positions, cache slots and an attention mask, so the
same code serves prefill (causal), plain decoding (one token) and tree verification (1+N tree
tokens at positions len+depth, each seeing the prefix and its ancestors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from harness.decode import attention
from harness.decode.kernel_choice import Kernels


def linear(layer: nn.Linear, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
    """layer(x) (no bias), on the kernel `kernels.linear` picks (linear_weight)."""
    return linear_weight(layer.weight, x, kernels)


def linear_weight(weight: torch.Tensor, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
    """F.linear(x, weight) on cuBLAS, or on the skinny Triton kernel, which takes forwards of
    up to skinny_linear.MAX_ROWS rows (plain decoding's 1, the draft block's 16) and hands
    larger ones (the verify's 65, prefill) to cuBLAS itself; `wgmma` also gives the verify's
    17-72 rows to the stream-K CUDA kernel (stream_linear.py).
    What goes to cuBLAS goes to cuBLASLt on each shape's timed algorithm instead where
    `kernels.blas` is cublaslt_tuned (lt_linear.py)."""
    if kernels.linear == "wgmma" and _stream_linear_takes(x, weight):
        from harness.kernels.linear import stream_linear
        return stream_linear.linear(x, weight)
    tuned = kernels.blas == "cublaslt_tuned"
    if kernels.linear in ("triton", "wgmma"):
        from harness.kernels.linear import skinny_linear
        # it hands what it does not take to F.linear: with `tuned`, lt_linear takes that instead
        if not tuned or skinny_linear.takes(x.numel() // x.shape[-1], x.shape[-1]):
            return skinny_linear.linear(x, weight)
    if tuned:
        from harness.kernels.linear import lt_linear
        return lt_linear.linear(x, weight)
    return F.linear(x, weight)


def _stream_linear_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    from harness.kernels.linear import stream_linear
    return (x.device.type == "cuda" and weight.dtype == x.dtype
            and stream_linear.takes(x.numel() // x.shape[-1], x.shape[-1], x.dtype))


def overlaps_gemm(x: torch.Tensor, kernels: Kernels) -> bool:
    """Whether a kernel right after the weight GEMM of input x (or of as many rows) launches
    with PDL: the skinny Triton kernel lets the kernel after it launch early; cuBLAS's GEMMs do
    not, and after them a plain launch is faster (pdl.launch_options)."""
    return gemm_overlaps(x.numel() // x.shape[-1], x.shape[-1], kernels)


def gemm_overlaps(rows: int, K: int, kernels: Kernels) -> bool:
    """`overlaps_gemm` for a GEMM of `rows` rows of depth K (bf16 where the stream-K kernel
    takes it: the only dtype it runs)."""
    if kernels.linear not in ("triton", "wgmma"):
        return False
    from harness.kernels.linear import skinny_linear, stream_linear
    return skinny_linear.takes(rows, K) or (
        kernels.linear == "wgmma" and stream_linear.takes(rows, K, torch.bfloat16))


@dataclass(frozen=True)
class TargetConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [b, T, 1, d] for rotate-half RoPE at `positions` [b, T]. A KVCache keeps them
    for every position it can hold (`KVCache.rope`); a forward gathers its rows once and
    shares them with every layer (positions are the same in all of them)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                              dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq          # [b, T, d/2]
    angles = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, rope) -> torch.Tensor:
    """x [b, T, h, d]; rope = rope_tables(...). In the activation dtype, as HF Qwen3 does."""
    cos, sin = rope
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class KVCache:
    """Preallocated keys and values for every layer: [layers, batch, kv_heads, max_len, head_dim].

    The head-major layout makes `k[l, :, :, :S]` a view whose last dimension is contiguous, which
    is what attention kernels want; new tokens are scattered to explicit slots per sequence.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, rope_theta: float):
        shape = (layers, batch, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        # The rotary tables of every position the cache can hold, computed once: a forward
        # gathers its rows (a kernel each for cos and sin) where recomputing them took about
        # ten small kernels, three forwards a decode step. The ops are elementwise, so a row
        # equals what rope_tables computes for that position alone, bit for bit.
        self.rope_table = rope_tables(torch.arange(max_len, device=device)[None], head_dim,
                                      rope_theta, dtype)

    def rope(self, positions: torch.Tensor):
        """rope_tables(positions, ...) of the cache's model: cos, sin [b, T, 1, d] for
        positions [b, T] (each below max_len, as every slot written is)."""
        cos, sin = self.rope_table
        return cos[0][positions], sin[0][positions]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [b, T, kv_heads, d] go to positions `slots` [b, T] of each sequence."""
        b_idx = torch.arange(slots.shape[0], device=slots.device)[:, None]
        self.k[layer][b_idx, :, slots] = k
        self.v[layer][b_idx, :, slots] = v

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, fused: bool = False) -> None:
        """For every sequence b and layer, copy slots src[b, j] to slots dst[b, j] (all read
        before any is written): the accepted KV to the front of the window. `fused`: one
        Triton launch (Kernels.fused_ops) where torch indexing takes four."""
        if fused:
            from harness.kernels.fused import triton_fused
            triton_fused.move_kv(self.k, self.v, src, dst)
            return
        b_idx = torch.arange(src.shape[0], device=src.device)[:, None]
        for c in (self.k, self.v):
            c[:, b_idx, :, dst] = c[:, b_idx, :, src]

    def move(self, b: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy slots `src` to slots `dst` of sequence b in every layer (accepted-KV compaction)."""
        self.k[:, b, :, dst] = self.k[:, b, :, src]
        self.v[:, b, :, dst] = self.v[:, b, :, src]


class Attention(nn.Module):
    """Grouped-query attention. The q, k and v projections are one matrix (`qkv_proj`, rows in
    that order) and the SwiGLU's gate and up projections another: one GEMM launch instead of
    three (two), which matters once a step is a graph of thousands of small kernels.
    Checkpoints keep HF's separate matrices; checkpoint.py stacks and splits them."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, kvh, d = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden, (h + 2 * kvh) * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_eps)
        self.k_norm = RMSNorm(d, cfg.rms_eps)

    def _store(self, k, v, rope, cache: KVCache, layer: int, slots) -> None:
        cache.write(layer, slots, apply_rope(self.k_norm(k), rope), v)

    def write_kv(self, x, rope, cache: KVCache, layer: int, slots,
                 kernels: Kernels = Kernels()) -> None:
        """Project x [b, T, hidden] to keys and values only (the k and v rows of qkv_proj) and
        store them at `slots` [b, T]: the drafter's context features need no queries. With
        `kernels.fused_ops`, norm, RoPE and the cache write are one Triton launch."""
        b, T, _ = x.shape
        cfg = self.cfg
        kv = linear_weight(self.qkv_proj.weight[cfg.heads * cfg.head_dim:], x, kernels)
        kv = kv.view(b, T, 2 * cfg.kv_heads, cfg.head_dim)
        if kernels.fused_ops:
            from harness.kernels.fused import triton_fused
            triton_fused.qk_norm_rope_store(kv, 0, None, self.k_norm.weight, cfg.rms_eps, *rope,
                                            cache.k[layer], cache.v[layer], slots,
                                            overlap=overlaps_gemm(x, kernels))
            return
        k, v = kv.split(cfg.kv_heads, dim=2)
        self._store(k, v, rope, cache, layer, slots)

    def forward(self, x, rope, cache: KVCache, layer: int, slots, mask: attention.Mask):
        b, T, _ = x.shape
        cfg = self.cfg
        qkv = linear(self.qkv_proj, x, mask.kernels).view(b, T, cfg.heads + 2 * cfg.kv_heads,
                                                          cfg.head_dim)
        q, k, v = qkv.split([cfg.heads, cfg.kv_heads, cfg.kv_heads], dim=2)
        q = apply_rope(self.q_norm(q), rope)
        self._store(k, v, rope, cache, layer, slots)
        S = mask.kv_len
        out = attention.attend(q.transpose(1, 2), cache.k[layer, :, :, :S], cache.v[layer, :, :, :S], mask)
        return linear(self.o_proj, out.transpose(1, 2).reshape(b, T, cfg.heads * cfg.head_dim),
                      mask.kernels)

    def forward_fused(self, x, rope, cache: KVCache, layer: int, slots, mask: attention.Mask):
        """`forward` on the fused kernels: q/k norms, RoPE and the cache write in one launch,
        and the attention output written in the [b, T, h, d] layout o_proj reads."""
        from harness.kernels.fused import triton_fused
        b, T, _ = x.shape
        cfg = self.cfg
        qkv = linear(self.qkv_proj, x, mask.kernels).view(b, T, cfg.heads + 2 * cfg.kv_heads,
                                                          cfg.head_dim)
        q = triton_fused.qk_norm_rope_store(qkv, cfg.heads, self.q_norm.weight, self.k_norm.weight,
                                            cfg.rms_eps, *rope, cache.k[layer], cache.v[layer], slots,
                                            overlap=overlaps_gemm(x, mask.kernels))
        S = mask.kv_len
        out = torch.empty_like(q)
        attention.attend(q.transpose(1, 2), cache.k[layer, :, :, :S], cache.v[layer, :, :, :S], mask,
                         out=out.transpose(1, 2))
        return linear(self.o_proj, out.view(b, T, cfg.heads * cfg.head_dim), mask.kernels)


class MLP(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x, kernels: Kernels = Kernels()):
        gate, up = linear(self.gate_up_proj, x, kernels).chunk(2, dim=-1)
        return linear(self.down_proj, F.silu(gate) * up, kernels)

    def forward_fused(self, x, kernels: Kernels = Kernels()):
        from harness.kernels.fused import triton_fused
        gate_up = linear(self.gate_up_proj, x, kernels)
        return linear(self.down_proj, triton_fused.silu_mul(gate_up, overlaps_gemm(x, kernels)),
                      kernels)


class Layer(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, cache, layer, slots, mask):
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, slots, mask)
        return x + self.mlp(self.post_attention_layernorm(x), mask.kernels)

    def forward_fused(self, h, residual, rope, cache, layer, slots, mask):
        """`forward` on the fused kernels. The stream travels split, x = h + residual
        (residual None: x = h), so each sublayer's residual add happens inside the next norm."""
        from harness.kernels.fused import triton_fused
        n1, n2 = self.input_layernorm, self.post_attention_layernorm
        overlap = overlaps_gemm(h, mask.kernels)   # each norm follows a GEMM of these rows
        x, residual = triton_fused.add_rmsnorm(h, n1.weight, n1.eps, residual, overlap)
        h = self.self_attn.forward_fused(x, rope, cache, layer, slots, mask)
        x, residual = triton_fused.add_rmsnorm(h, n2.weight, n2.eps, residual, overlap)
        return self.mlp.forward_fused(x, mask.kernels), residual


def run_layers(layers, x, rope, cache: KVCache, slots, mask: attention.Mask,
               capture: tuple[int, ...] = ()):
    """x through `layers`, on the fused Triton kernels when `mask.kernels.fused_ops` (the mask
    travels with every forward, so it carries the forward's kernel choices). Returns (h,
    residual, captured): the output is h + residual (residual None: h; `final_norm` takes the
    pair) and `captured` holds the outputs of the layers in `capture`."""
    captured = []
    if not mask.kernels.fused_ops:
        for i, layer in enumerate(layers):
            x = layer(x, rope, cache, i, slots, mask)
            if i in capture:
                captured.append(x)
        return x, None, captured
    h, residual = x, None
    for i, layer in enumerate(layers):
        h, residual = layer.forward_fused(h, residual, rope, cache, i, slots, mask)
        if i in capture:
            h, residual = h + residual, None
            captured.append(h)
    return h, residual, captured


def final_norm(norm: RMSNorm, h: torch.Tensor, residual: torch.Tensor | None,
               overlap: bool = True) -> torch.Tensor:
    """norm(h + residual), the add fused into the norm (see `run_layers`); `overlap` as
    triton_fused's (false after a kernel that does not trigger its dependents)."""
    if residual is None:
        return norm(h)
    from harness.kernels.fused import triton_fused
    return triton_fused.add_rmsnorm(h, norm.weight, norm.eps, residual, overlap)[0]


class Target(nn.Module):
    """The target model. `forward` returns logits and the hidden states of `capture_layers`
    (outputs of those layers), which the DFlash drafter is conditioned on."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.lm_head.weight
        return KVCache(self.cfg.layers, batch, self.cfg.kv_heads, max_len, self.cfg.head_dim,
                       p.dtype, p.device, self.cfg.rope_theta)

    def forward(self, ids, positions, cache: KVCache, slots, mask: attention.Mask,
                capture_layers: tuple[int, ...] = (), logits_for: torch.Tensor | None = None):
        """ids, positions, slots: [b, T]. Returns (logits [b, T', V], captured hidden [b, T, n*hidden]).

        `logits_for` (optional [b, T'] indices) restricts the vocabulary projection to some rows,
        which keeps prefill from materialising T x V logits.
        """
        x = self.embed_tokens(ids)
        rope = cache.rope(positions)
        h, residual, captured = run_layers(self.layers, x, rope, cache, slots, mask, capture_layers)
        if logits_for is not None:
            rows = logits_for[..., None].expand(-1, -1, h.shape[-1])
            h = torch.gather(h, 1, rows)
            residual = None if residual is None else torch.gather(residual, 1, rows)
        # After the last down_proj, or after the gathers of `logits_for` (torch kernels).
        overlap = logits_for is None and overlaps_gemm(h, mask.kernels)
        logits = linear(self.lm_head, final_norm(self.norm, h, residual, overlap), mask.kernels)
        hidden = torch.cat(captured, dim=-1) if captured else None
        return logits, hidden


@torch.no_grad()
def init_random_(module: nn.Module, seed: int) -> None:
    """Seeded random weights, drawn on the module's device (fast even for 8B parameters).

    Linear weights ~ N(0, 1/fan_in) keep activations O(1) through depth; norms stay at one.
    """
    gen = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    for name, p in sorted(module.named_parameters()):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.dim() == 2:
            fan_in = p.shape[1] if "embed" not in name else 1
            p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        else:
            p.normal_(0.0, 0.02, generator=gen)
