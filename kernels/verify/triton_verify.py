"""Tree-verify attention in Triton: flash-decoding over the KV prefix plus one masked tree chunk.

One verify forward of speculative decoding attends 1+N tree tokens of each sequence b to
  - the committed prefix, keys [0, lengths[b]), visible to every tree token, and
  - the tree itself, keys lengths[b] + j (j < T), visible to query i iff bit j of row i of the
    ancestor bitmask is set (`harness.decode.attention.visibility_bits`).

Shapes are small in the query dimension (T = 1 + N, N <= 256) and long in the key dimension
(up to 64k+), so this is flash-decoding rather than flash-attention:
  - The G query heads sharing one KV head and all T tree tokens form the M dimension of one tile
    (row r = t * G + g), so each KV tile is loaded once for the whole group and tl.dot gets a
    real M even for T = 16.
  - The prefix is split into `num_splits` chunks, one program each (grid: M tiles x splits+1 x
    b * kv_heads). Chunks are cut from lengths[b] on the device, so nothing is synced to the
    host and programs whose chunk lies beyond lengths[b] store nothing. Split 0 is the tree chunk.
  - Each program keeps an fp32 online softmax (m, l, acc) and writes it, unnormalised, to a
    workspace; `_combine_kernel` merges the partials with a log-sum-exp rescale and writes the output.

No host syncs and no allocations other than the output and the workspace (both can be passed
in), so a call can be captured in a CUDA graph. Kernels are dtype-generic (fp16 / bf16 / fp32 via
tl.dot with fp32 accumulation), which lets the tests run them under TRITON_INTERPRET=1 on CPU in
fp32 and fp16 (the interpreter mishandles bf16; bf16 is checked on the GPU,
tests/kernels/test_triton_verify_gpu.py).
Style follows the Triton fused-attention tutorial.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from harness.kernels import pdl

LOG2E = 1.4426950408889634
MIN_CHUNK = 256      # keys per split at least, when num_splits is chosen here: fewer is all overhead


@triton.jit
def _attend_tile(q, kT_ptrs, v_ptrs, visible, m_i, l_i, acc, load_mask_kT, load_mask_v, qk_scale,
                 DOT_PRECISION: tl.constexpr):
    """One online-softmax step over one key tile. `visible` [BLOCK_M, BLOCK_N] is the mask."""
    kT = tl.load(kT_ptrs, mask=load_mask_kT, other=0.0)
    qk = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale       # log2 domain
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead (no NaN).
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(qk - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    v = tl.load(v_ptrs, mask=load_mask_v, other=0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _split_kernel(
    Q, K, V, Lengths, Bits, Acc, ML,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_bb, stride_bt, stride_bw,
    T, HKV, D, M_PAD, num_splits, min_chunk_tiles, qk_scale,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    pid_m = tl.program_id(0)
    split = tl.program_id(1)            # 0: the tree chunk; s >= 1: prefix chunk s - 1
    bh = tl.program_id(2)
    bi = (bh // HKV).to(tl.int64)       # int64: cache strides times batch can pass 2**31
    kvh = (bh % HKV).to(tl.int64)
    L = tl.load(Lengths + bi).to(tl.int32)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    t = rows // G
    g = rows % G
    row_ok = t < T
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    q_ptrs = (Q + bi * stride_qb + (kvh * G + g)[:, None] * stride_qh + t[:, None] * stride_qt
              + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + bi * stride_kb + kvh * stride_kh
    v_base = V + bi * stride_vb + kvh * stride_vh

    # This program's slice of the prefix, cut from lengths[b] (same formula in _combine_kernel).
    n_tiles = tl.cdiv(L, BLOCK_N)
    chunk_tiles = tl.maximum(tl.cdiv(n_tiles, num_splits), min_chunk_tiles)
    is_tree = split == 0
    p_start = tl.maximum(split - 1, 0) * chunk_tiles * BLOCK_N
    p_end = tl.where(is_tree, 0, tl.minimum(p_start + chunk_tiles * BLOCK_N, L))
    tree_len = tl.where(is_tree, T, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Prefix: every key below lengths[b] is visible to every tree query.
    for start_n in range(p_start, p_end, BLOCK_N):
        keys = start_n + offs_n
        key_ok = keys < p_end
        kT_ptrs = k_base + keys[None, :] * stride_ks + offs_d[:, None] * stride_kd
        v_ptrs = v_base + keys[:, None] * stride_vs + offs_d[None, :] * stride_vd
        m_i, l_i, acc = _attend_tile(q, kT_ptrs, v_ptrs, key_ok[None, :], m_i, l_i, acc,
                                     d_ok[:, None] & key_ok[None, :], key_ok[:, None] & d_ok[None, :],
                                     qk_scale, DOT_PRECISION)

    # Tree: key j (slot L + j) is visible to query t iff bit j % 32 of word j // 32 of row t is set.
    # One [BLOCK_M] word load per 32 keys, not a [BLOCK_M, BLOCK_N] gather: fewer registers.
    # Not pipelined (num_stages=1): it runs for 1 + N/BLOCK_N tiles and would cost registers
    # that the prefix loop needs.
    bits_rows = Bits + bi * stride_bb + t * stride_bt
    for start_j in tl.range(0, tree_len, BLOCK_N, num_stages=1):
        j = start_j + offs_n
        j_ok = j < T
        visible = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int1)
        for w in tl.static_range((BLOCK_N + 31) // 32):
            word_idx = start_j // 32 + w
            word = tl.load(bits_rows + word_idx * stride_bw, mask=t < tl.where(word_idx * 32 < T, T, 0), other=0)
            in_word = (j // 32) == word_idx
            visible = visible | (in_word[None, :] & (((word[:, None] >> (j % 32)[None, :]) & 1) != 0))
        keys = L + j
        kT_ptrs = k_base + keys[None, :] * stride_ks + offs_d[:, None] * stride_kd
        v_ptrs = v_base + keys[:, None] * stride_vs + offs_d[None, :] * stride_vd
        m_i, l_i, acc = _attend_tile(q, kT_ptrs, v_ptrs, visible, m_i, l_i, acc,
                                     d_ok[:, None] & j_ok[None, :], j_ok[:, None] & d_ok[None, :],
                                     qk_scale, DOT_PRECISION)

    # Partials, unnormalised. Splits with no keys store nothing (_combine never reads them).
    # (Rows to store as a number, not a bool scalar: the interpreter rejects scalar & vector masks.)
    rows_to_store = tl.where(is_tree, T, tl.where(p_start < p_end, T, 0))
    store_ok = t < rows_to_store
    part = bh.to(tl.int64) * (num_splits + 1) + split
    ml_ptrs = ML + (part * 2) * M_PAD + rows
    tl.store(ml_ptrs, m_i, mask=store_ok)
    tl.store(ml_ptrs + M_PAD, l_i, mask=store_ok)
    acc_ptrs = Acc + (part * M_PAD + rows[:, None]) * D + offs_d[None, :]
    tl.store(acc_ptrs, acc, mask=store_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(
    Acc, ML, Lengths, Out,
    stride_ob, stride_oh, stride_ot, stride_od,
    T, HKV, D, M_PAD, num_splits, min_chunk_tiles,
    G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_BLOCK: tl.constexpr,
    ROWS: tl.constexpr, PDL: tl.constexpr,
):
    # ROWS output rows per program, all of their partials loaded at once as a
    # [SPLIT_BLOCK, ROWS, BLOCK_D] tile: a few wide independent loads rather than a chain of
    # dependent ones, so the combine stays small next to the split kernel even at 4k context.
    pdl.wait_then_release(PDL)
    pid_r = tl.program_id(0)
    bh = tl.program_id(1)
    bi = (bh // HKV).to(tl.int64)
    kvh = (bh % HKV).to(tl.int64)
    L = tl.load(Lengths + bi).to(tl.int32)
    n_tiles = tl.cdiv(L, BLOCK_N)
    chunk_tiles = tl.maximum(tl.cdiv(n_tiles, num_splits), min_chunk_tiles)
    n_parts = tl.cdiv(n_tiles, chunk_tiles) + 1        # the tree chunk + prefix splits with keys

    rows = pid_r * ROWS + tl.arange(0, ROWS)           # row = t * G + g, as in _split_kernel
    t = rows // G
    g = rows % G
    row_ok = t < T
    offs_s = tl.arange(0, SPLIT_BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for s0 in range(0, n_parts, SPLIT_BLOCK):
        split = s0 + offs_s
        ok = (split < n_parts)[:, None] & row_ok[None, :]                     # [S, R]
        part = bh.to(tl.int64) * (num_splits + 1) + split
        ml_off = (part * 2)[:, None] * M_PAD + rows[None, :]
        m_s = tl.load(ML + ml_off, mask=ok, other=float("-inf"))
        l_s = tl.load(ML + ml_off + M_PAD, mask=ok, other=0.0)
        acc_off = ((part[:, None] * M_PAD + rows[None, :]) * D)[:, :, None] + offs_d[None, None, :]
        acc_s = tl.load(Acc + acc_off, mask=ok[:, :, None] & d_ok[None, None, :], other=0.0)
        m_new = tl.maximum(m, tl.max(m_s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w_old = tl.math.exp2(m - m_safe)
        w_s = tl.math.exp2(m_s - m_safe[None, :])       # 0 for the masked (and empty) splits
        l = l * w_old + tl.sum(l_s * w_s, 0)
        acc = acc * w_old[:, None] + tl.sum(acc_s * w_s[:, :, None], 0)
        m = m_new
    # A row with no visible key at all (empty prefix and no tree bit) gets zeros, not NaN.
    out = acc / tl.where(l == 0.0, 1.0, l)[:, None]
    o_ptrs = (Out + bi * stride_ob + (kvh * G + g)[:, None] * stride_oh + t[:, None] * stride_ot
              + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8   # the interpreter on CPU: a few splits, so tests exercise the split path


def _interpreting() -> bool:
    # triton.jit read TRITON_INTERPRET when the kernels were defined: ask them, not the env.
    return not isinstance(_split_kernel, triton.runtime.JITFunction)


# A program's start-up and its partial's write, in tiles of keys (the wave model below).
PROGRAM_OVERHEAD_TILES = 3
# One row block: below this many tiles a program, fewer and longer programs (plan()).
SHORT_CHUNK_TILES = 16


def splits_by_waves(n_tiles: int, tree_tiles: int, per_split: int, slots: int, cap: int,
                    min_chunk_tiles: int = 1) -> int:
    """Prefix splits for several row blocks of 64 (65 tree tokens: five a KV head), where every
    program is busy on the tensor cores: the count with the least (waves of prefix programs) x
    (tiles a program + PROGRAM_OVERHEAD_TILES), plus one short program more when the tree
    chunk's programs (T keys each) do not fit beside the last wave. Ties keep fewer splits (fewer
    partials to combine). On the H200 at 65 tree tokens, b 1, this model's cost ratios between
    split counts matched the measured times within ~3 % (6, 8, 12, 16, 24 splits at 65536 keys:
    6 took 230.7 us, 8 332.6, against 267.4 for the 5 of the old two-programs-a-multiprocessor
    rule), and it keeps 5 at 4096 keys, where 6 measured 11 % slower (kernels/NOTES.md, "The
    Triton verify's split count")."""
    best_cost, best = None, 1
    for s in range(1, max(1, cap) + 1):
        chunk = max(triton.cdiv(n_tiles, s), min_chunk_tiles)
        used = triton.cdiv(n_tiles, chunk)
        if used < s:                        # more splits than chunks: the same as `used`
            break
        waves = triton.cdiv(used * per_split, slots)
        overflow = used * per_split + per_split > waves * slots
        cost = waves * (chunk + PROGRAM_OVERHEAD_TILES) + (tree_tiles + PROGRAM_OVERHEAD_TILES if overflow else 0)
        if best_cost is None or cost < best_cost:
            best_cost, best = cost, s
    return best


def plan(q: torch.Tensor, k: torch.Tensor, num_splits: int | None = None,
         config: dict | None = None) -> dict:
    """Tile sizes, number of prefix splits and workspace shape for these inputs (host only).
    `config` overrides BLOCK_M, BLOCK_N, num_warps, num_stages or COMBINE_ROWS (for tuning)."""
    b, hq, T, d = q.shape
    hkv, S = k.shape[1], k.shape[2]
    G = hq // hkv
    M = T * G
    if M <= 64:
        block_m = max(16, triton.next_power_of_2(M))
    else:   # 64 or 128 rows, whichever pads M less (ties: 128, fewer re-reads of each KV tile)
        block_m = 128 if triton.cdiv(M, 128) * 128 <= triton.cdiv(M, 64) * 64 else 64
    fp32 = q.element_size() >= 4
    wide = fp32 or d > 128              # keep fp32 / wide heads inside shared memory
    if wide:
        block_m = min(block_m, 64)
    # One query row per head of the group (plain decoding, M = G <= 16): tiles of 128 keys and
    # fewer, longer splits (below) took 4.9 / 3.2 % less time than 64 keys and two programs a
    # multiprocessor at 4096 / 16384 keys on the H200, level at 65536 (kernels/NOTES.md, "Plain
    # decoding's attention: tiles and splits").
    decode = M <= 16 and not wide
    # fp32 (tests, lossless checks) takes IEEE dots on CUDA cores: register-hungry, so no
    # pipelining and 8 warps (the least spilling of the configs compiled for sm_90).
    p = dict(BLOCK_M=block_m, BLOCK_N=32 if wide else 128 if decode else 64,
             num_warps=8 if fp32 or block_m * max(d, 64) >= 128 * 128 else 4,
             num_stages=1 if fp32 else 2 if wide else 3,
             # The interpreter pays per program: give it a few big combine programs.
             COMBINE_ROWS=16 if _interpreting() else 1)
    p.update(config or {})
    m_tiles = triton.cdiv(M, p["BLOCK_M"])
    if num_splits is None:
        # No split shorter than MIN_CHUNK keys, and (measured on the H200: kernels/NOTES.md,
        # "The Triton verify's split count"):
        #   plain decoding: about three programs for every four multiprocessors;
        #   one row block (16 tree tokens): one wave of about two programs a multiprocessor, the
        #     tree chunk's included (a second, partial wave would double the time), or three for
        #     every two where that would leave a program under SHORT_CHUNK_TILES tiles (16384
        #     keys: 29.2 against 32.4 µs; at 65536, 43 tiles a program, 2 % slower);
        #   several row blocks of 64 (65 tree tokens): whole waves (splits_by_waves).
        per_split = b * hkv * m_tiles
        min_chunk_tiles = max(1, MIN_CHUNK // p["BLOCK_N"])
        sms = _sm_count(q.device)
        cap = min(triton.cdiv(S, MIN_CHUNK), 256)
        one_wave = 2 * sms // per_split - 1
        n_tiles = triton.cdiv(S, p["BLOCK_N"])
        if decode:
            splits = 3 * sms // 4 // per_split
        elif m_tiles == 1 and not wide and n_tiles < SHORT_CHUNK_TILES * one_wave:
            splits = 3 * sms // 2 // per_split
        elif m_tiles > 1 and p["BLOCK_M"] == 64 and not wide:
            splits = splits_by_waves(n_tiles, triton.cdiv(T, p["BLOCK_N"]), per_split, 2 * sms, cap,
                                     min_chunk_tiles)
        else:
            splits = one_wave
        num_splits = max(1, min(splits, cap))
    else:
        min_chunk_tiles = 1      # the caller asked for exactly this many
    p.update(G=G, BLOCK_D=max(16, triton.next_power_of_2(d)), m_tiles=m_tiles,
             M_PAD=m_tiles * p["BLOCK_M"], num_splits=num_splits, min_chunk_tiles=min_chunk_tiles)
    return p


def alloc_workspace(q: torch.Tensor, k: torch.Tensor, num_splits: int | None = None,
                    config: dict | None = None):
    """The split-KV workspace (partial acc and m/l, fp32) for inputs shaped like q, k: allocate it
    once (outside a CUDA graph) and pass it as `workspace=` with the same num_splits and config."""
    p = plan(q, k, num_splits, config)
    b, hkv, d = q.shape[0], k.shape[1], q.shape[3]
    parts = b * hkv * (p["num_splits"] + 1)
    acc = torch.empty(parts * p["M_PAD"] * d, dtype=torch.float32, device=q.device)
    ml = torch.empty(parts * 2 * p["M_PAD"], dtype=torch.float32, device=q.device)
    return acc, ml


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                          tree_bits: torch.Tensor, sm_scale: float | None = None,
                          num_splits: int | None = None, *, out: torch.Tensor | None = None,
                          workspace=None, config: dict | None = None) -> torch.Tensor:
    """Tree-verify attention (see the module docstring).

    q [b, Hq, T, d]; k, v [b, Hkv, S, d] (last dim contiguous; any other strides, e.g. a view of
    a larger cache); lengths [b] int32/int64 on the device, with lengths[b] + T <= S (not checked:
    that would sync); tree_bits [b, T, ceil(T/32)] int32. Returns [b, Hq, T, d] in q's dtype
    (written into `out` when given). `workspace` comes from `alloc_workspace` with the same
    num_splits and config. Keys read per sequence: lengths[b] + T.
    """
    b, hq, T, d = q.shape
    hkv, S = k.shape[1], k.shape[2]
    if k.shape != (b, hkv, S, d) or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    if tree_bits.shape != (b, T, triton.cdiv(T, 32)) or tree_bits.dtype != torch.int32:
        raise ValueError(f"tree_bits must be int32 [{b}, {T}, {triton.cdiv(T, 32)}], "
                         f"got {tree_bits.dtype} {tuple(tree_bits.shape)}")
    if lengths.shape != (b,):
        raise ValueError(f"lengths must be [{b}], got {tuple(lengths.shape)}")
    if q.device.type != "cuda" and not _interpreting():
        raise RuntimeError("tree_verify_attention on CPU tensors needs TRITON_INTERPRET=1")
    if k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("k and v need a contiguous last dimension")
    p = plan(q, k, num_splits, config)
    if out is None:
        out = torch.empty(b, hq, T, d, dtype=q.dtype, device=q.device)
    if workspace is None:
        workspace = alloc_workspace(q, k, num_splits, config)
    acc, ml = workspace
    parts = b * hkv * (p["num_splits"] + 1)
    if acc.numel() < parts * p["M_PAD"] * d or ml.numel() < parts * 2 * p["M_PAD"]:
        raise ValueError("workspace too small for these inputs (alloc_workspace with the same num_splits)")
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * LOG2E
    tiles = dict(G=p["G"], BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], BLOCK_D=p["BLOCK_D"])

    _split_kernel[(p["m_tiles"], p["num_splits"] + 1, b * hkv)](
        q, k, v, lengths, tree_bits, acc, ml,
        *q.stride(), *k.stride(), *v.stride(), *tree_bits.stride(),
        T, hkv, d, p["M_PAD"], p["num_splits"], p["min_chunk_tiles"], scale,
        **tiles, DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        num_warps=p["num_warps"], num_stages=p["num_stages"], **pdl.launch_options(q.device))
    _combine_kernel[(triton.cdiv(T * p["G"], p["COMBINE_ROWS"]), b * hkv)](
        acc, ml, lengths, out, *out.stride(),
        T, hkv, d, p["M_PAD"], p["num_splits"], p["min_chunk_tiles"],
        G=p["G"], BLOCK_N=p["BLOCK_N"], BLOCK_D=p["BLOCK_D"],
        SPLIT_BLOCK=min(32, triton.next_power_of_2(p["num_splits"] + 1)),
        ROWS=p["COMBINE_ROWS"], num_warps=4, **pdl.launch_options(q.device))
    return out
