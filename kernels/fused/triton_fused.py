"""Fused elementwise kernels of the decode forward: one launch where torch takes several.

A decode step captured as one CUDA graph is ~1600 kernels for qwen3-8b, and on an H200 the GPU
idles ~0.5 µs at each kernel boundary even inside a graph; most of those kernels were tiny
elementwise ops around the GEMMs (RoPE alone was ten per layer: mul, neg, cat, mul, add for q and
for k). Per layer, three kernels replace them:

  add_rmsnorm            residual add + RMSNorm              (was: add, rms_norm)
  qk_norm_rope_store     q/k RMSNorm + RoPE, q out in [b, T, h, d], k and v written straight
                         into the KV cache at their slots   (was: ~15 kernels and a scatter)
  silu_mul               SwiGLU's silu(gate) * up            (was: silu, mul)

and per step, for the accepted path's keys and values:

  move_kv                rows of every layer's K and V cache to their compacted slots
                         (was: a gather, an index_put and two copies)

Each reads its inputs once and computes in fp32; it rounds where the unfused torch code rounds
(the residual sum and silu(gate) to the activation dtype) and otherwise only once at the end, so
fused and unfused forwards agree to within bf16 rounding, not bit for bit. Both the baseline
and the fast loop run the same forward, so losslessness checks compare like with like.
Kernels are dtype-generic; tests run them under TRITON_INTERPRET=1 on CPU in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.kernels import pdl


@triton.jit
def _add_rmsnorm_kernel(X, R, W, OUT, RES_OUT, stride_x, stride_r, stride_o, stride_ro, n_cols, eps,
                        HAS_RES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        # The residual stream stays in the activation dtype, as `x + f(x)` does unfused.
        h = (x + tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32))
        h = h.to(RES_OUT.dtype.element_ty)
        tl.store(RES_OUT + row * stride_ro + cols, h, mask=ok)
        x = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (x * rstd * w).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _qk_norm_rope_store_kernel(
    QKV, QW, KW, COS, SIN, Q_OUT, KC, VC, SLOTS,
    stride_xb, stride_xt, stride_xh,
    stride_cb, stride_ct,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_sb, stride_st,
    T, eps, HQ, HKV,
    HALF: tl.constexpr, HALF_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    """One (token, head) per program. Heads [0, HQ) are queries, [HQ, HQ+HKV) keys, then values."""
    pdl.wait_then_release(PDL)
    bt = tl.program_id(0)
    head = tl.program_id(1)
    b = (bt // T).to(tl.int64)
    t = (bt % T).to(tl.int64)
    i = tl.arange(0, HALF_BLOCK)
    ok = i < HALF
    src = QKV + b * stride_xb + t * stride_xt + head * stride_xh
    x1 = tl.load(src + i, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + i, mask=ok, other=0.0).to(tl.float32)
    slot = tl.load(SLOTS + b * stride_sb + t * stride_st).to(tl.int64)
    if head >= HQ + HKV:                       # a value head: copy into the cache
        kvh = head - HQ - HKV
        dst = VC + b * stride_vb + kvh * stride_vh + slot * stride_vs
        tl.store(dst + i, x1.to(VC.dtype.element_ty), mask=ok)
        tl.store(dst + HALF + i, x2.to(VC.dtype.element_ty), mask=ok)
    else:
        is_q = head < HQ
        wp = tl.where(is_q, QW, KW)
        rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
        y1 = x1 * rstd * tl.load(wp + i, mask=ok, other=0.0).to(tl.float32)
        y2 = x2 * rstd * tl.load(wp + HALF + i, mask=ok, other=0.0).to(tl.float32)
        rope = b * stride_cb + t * stride_ct
        c1 = tl.load(COS + rope + i, mask=ok, other=0.0).to(tl.float32)
        c2 = tl.load(COS + rope + HALF + i, mask=ok, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + rope + i, mask=ok, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + rope + HALF + i, mask=ok, other=0.0).to(tl.float32)
        o1 = y1 * c1 - y2 * s1                 # rotate-half: x * cos + [-x2, x1] * sin
        o2 = y2 * c2 + y1 * s2
        if is_q:
            dst = Q_OUT + b * stride_qb + t * stride_qt + head * stride_qh
            tl.store(dst + i, o1.to(Q_OUT.dtype.element_ty), mask=ok)
            tl.store(dst + HALF + i, o2.to(Q_OUT.dtype.element_ty), mask=ok)
        else:
            kvh = head - HQ
            dst = KC + b * stride_kb + kvh * stride_kh + slot * stride_ks
            tl.store(dst + i, o1.to(KC.dtype.element_ty), mask=ok)
            tl.store(dst + HALF + i, o2.to(KC.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(GU, OUT, stride_g, stride_o, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(GU + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * stride_g + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)   # silu rounds, as unfused
    tl.store(OUT + row * stride_o + cols, (s * u).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _span_moments_kernel(X, MOMENTS, stride_x, n_cols, P, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (p, row): the count, mean and sum of squared deviations of span p of the row
    (its own two passes, in registers), for `_standardise_kernel` to merge."""
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    cols = p * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    n = tl.sum(ok.to(tl.float32), 0)
    mean = tl.sum(x, 0) / n
    m2 = tl.sum(tl.where(ok, (x - mean) * (x - mean), 0.0), 0)
    at = MOMENTS + (row * P + p) * 3
    tl.store(at, n)
    tl.store(at + 1, mean)
    tl.store(at + 2, m2)


@triton.jit
def _standardise_kernel(X, OUT, MOMENTS, stride_x, stride_o, n_cols, P, scale,
                        BLOCK: tl.constexpr, PB: tl.constexpr, PDL: tl.constexpr):
    """Program (p, row): the row's mean and std from its spans' moments (Chan et al.'s
    pairwise merge: M2 = sum M2_i + n_i (mean_i - mean)^2; Bessel's correction, as
    torch.std_mean), then (x - mean) / std * scale for span p, in float32."""
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    q = tl.arange(0, PB)
    at = MOMENTS + (row * P + q) * 3
    n_i = tl.load(at, mask=q < P, other=0.0)
    mean_i = tl.load(at + 1, mask=q < P, other=0.0)
    m2_i = tl.load(at + 2, mask=q < P, other=0.0)
    mean = tl.sum(n_i * mean_i, 0) / n_cols
    m2 = tl.sum(m2_i + n_i * (mean_i - mean) * (mean_i - mean), 0)
    std = tl.sqrt(m2 / (n_cols - 1))
    cols = p * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(OUT + row * stride_o + cols, (x - mean) / std * scale, mask=cols < n_cols)


@triton.jit
def _move_kv_kernel(K, V, SRC, DST, stride_l, stride_b, stride_h, stride_s, stride_ib, n_b, n_h, n_rows,
                    D: tl.constexpr, ROWS: tl.constexpr, D_BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One (layer, sequence, KV head) per program: its rows SRC[b] of K and V to rows DST[b]."""
    pdl.wait_then_release(PDL)
    pid = tl.program_id(0)
    h = pid % n_h
    b = (pid // n_h) % n_b
    layer = pid // (n_h * n_b)
    base = layer.to(tl.int64) * stride_l + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    j = tl.arange(0, ROWS)
    cols = tl.arange(0, D_BLOCK)
    ok = (j < n_rows)[:, None] & (cols < D)[None, :]
    src = tl.load(SRC + b * stride_ib + j, mask=j < n_rows, other=0).to(tl.int64)
    dst = tl.load(DST + b * stride_ib + j, mask=j < n_rows, other=0).to(tl.int64)
    at_src = base + src[:, None] * stride_s + cols[None, :]
    at_dst = base + dst[:, None] * stride_s + cols[None, :]
    k = tl.load(K + at_src, mask=ok)
    v = tl.load(V + at_src, mask=ok)
    # A destination row may be another row's source (the accepted path moves towards the front
    # of the window): every row is read before any is written.
    tl.debug_barrier()
    tl.store(K + at_dst, k, mask=ok)
    tl.store(V + at_dst, v, mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, cols] without a copy (the last dim must be contiguous)."""
    if x.stride(-1) != 1:
        raise ValueError("the last dimension must be contiguous")
    return x.reshape(-1, x.shape[-1])


def add_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor | None = None,
                overlap: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h) * weight, h) with h = x + residual (h = x when residual is None).
    `overlap`, here and in every launcher below: whether the launch may overlap the kernel
    before (pdl.launch_options: false after a kernel that does not trigger its dependents)."""
    x2 = _rows(x)
    n_rows, n_cols = x2.shape
    out = torch.empty_like(x)
    o2 = out.view(-1, n_cols)
    if residual is None:
        r2, res, ro2 = x2, x, x2
    else:
        r2 = _rows(residual)
        res = torch.empty_like(x)
        ro2 = res.view(-1, n_cols)
    block = triton.next_power_of_2(n_cols)
    _add_rmsnorm_kernel[(n_rows,)](
        x2, r2, weight, o2, ro2, x2.stride(0), r2.stride(0), o2.stride(0), ro2.stride(0),
        n_cols, eps, HAS_RES=residual is not None, BLOCK=block,
        num_warps=max(1, min(16, block // 512)), **pdl.launch_options(x.device, overlap))
    return out, res


def qk_norm_rope_store(qkv: torch.Tensor, heads: int, q_weight: torch.Tensor | None,
                       k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slots: torch.Tensor, overlap: bool = True) -> torch.Tensor | None:
    """qkv [b, T, heads + 2 kv_heads, d] (heads may be 0: keys and values only); cos, sin
    [b, T, 1, d] (model.rope_tables); k_cache, v_cache [b, kv_heads, S, d]; slots [b, T].
    Writes normed, rotated keys and the values to the cache at `slots`; returns the normed,
    rotated queries [b, T, heads, d] (None when heads is 0)."""
    b, T, n_heads, d = qkv.shape
    kv_heads = (n_heads - heads) // 2
    if qkv.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or d % 2:
        raise ValueError("qkv and the caches need a contiguous last dimension of even size")
    q = torch.empty(b, T, heads, d, dtype=qkv.dtype, device=qkv.device) if heads else None
    q_arg = q if q is not None else qkv          # never written when there are no query heads
    cos, sin = cos.reshape(b, T, d), sin.reshape(b, T, d)
    _qk_norm_rope_store_kernel[(b * T, n_heads)](
        qkv, q_weight if q_weight is not None else k_weight, k_weight, cos, sin, q_arg,
        k_cache, v_cache, slots,
        qkv.stride(0), qkv.stride(1), qkv.stride(2),
        cos.stride(0), cos.stride(1),
        q_arg.stride(0), q_arg.stride(1), q_arg.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        slots.stride(0), slots.stride(1),
        T, eps, heads, kv_heads, HALF=d // 2, HALF_BLOCK=triton.next_power_of_2(d // 2),
        num_warps=1 if d <= 128 else 2, **pdl.launch_options(qkv.device, overlap))
    return q


def silu_mul(gate_up: torch.Tensor, overlap: bool = True) -> torch.Tensor:
    """[..., 2F] (gate then up, as MLP.gate_up_proj stacks them) -> silu(gate) * up [..., F]."""
    g2 = _rows(gate_up)
    n_rows, two_f = g2.shape
    f = two_f // 2
    out = torch.empty(*gate_up.shape[:-1], f, dtype=gate_up.dtype, device=gate_up.device)
    o2 = out.view(-1, f)
    block = min(1024, triton.next_power_of_2(f))
    _silu_mul_kernel[(n_rows, triton.cdiv(f, block))](g2, o2, g2.stride(0), o2.stride(0), f,
                                                      BLOCK=block, num_warps=4,
                                                      **pdl.launch_options(gate_up.device, overlap))
    return out


# Columns a program of the standardisation reads: 38 spans a row at V = 151936, so the 15 rows
# of a draft block spread over every multiprocessor (one program a row took 44 µs on the H200).
STANDARDISE_BLOCK = 4096


def standardise(logits: torch.Tensor, scale: float, overlap: bool = True,
                moments: torch.Tensor | None = None) -> torch.Tensor:
    """float32 (x - mean) / std * scale along the last dim of logits [..., V] (any float dtype,
    V >= 2), std with Bessel's correction: what the random drafter does to its logits
    (drafter.DrafterConfig.logit_scale), torch.std_mean's five kernels in two. `moments`:
    scratch of rows * spans * 3 float32 (made here when not given)."""
    x2 = _rows(logits)
    n_rows, n_cols = x2.shape
    P = triton.cdiv(n_cols, STANDARDISE_BLOCK)
    if moments is None:
        moments = torch.empty(n_rows * P * 3, dtype=torch.float32, device=logits.device)
    out = torch.empty(*logits.shape, dtype=torch.float32, device=logits.device)
    o2 = out.view(-1, n_cols)
    _span_moments_kernel[(P, n_rows)](x2, moments, x2.stride(0), n_cols, P, BLOCK=STANDARDISE_BLOCK,
                                      num_warps=8, **pdl.launch_options(logits.device, overlap))
    _standardise_kernel[(P, n_rows)](x2, o2, moments, x2.stride(0), o2.stride(0), n_cols, P,
                                     float(scale), BLOCK=STANDARDISE_BLOCK,
                                     PB=triton.next_power_of_2(P), num_warps=8,
                                     **pdl.launch_options(logits.device))
    return out


def move_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """k_cache, v_cache [layers, b, kv_heads, S, d] (KVCache.k / .v, the same strides); src,
    dst [b, n] int64 slots: in every layer and head, row src[b, j] of sequence b is copied to
    row dst[b, j], all rows read before any is written (as `c[..., dst] = c[..., src]`)."""
    L, b, h, S, d = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache need the same shape and strides, last dim contiguous")
    if src.shape != dst.shape or src.shape[0] != b or src.stride() != dst.stride() or src.stride(-1) != 1:
        raise ValueError(f"src and dst must be [{b}, n] with the same strides, last dim contiguous")
    n = src.shape[1]
    _move_kv_kernel[(L * b * h,)](
        k_cache, v_cache, src, dst, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.stride(3), src.stride(0), b, h, n, D=d, ROWS=triton.next_power_of_2(n),
        D_BLOCK=triton.next_power_of_2(d), num_warps=4, **pdl.launch_options(k_cache.device))
