"""The custom CUDA tree-verify attention kernels (kernels/verify/verify_attention.cu), called from Python.

    tree_verify_attention(q, k, v, lengths, tree_bits, sm_scale=None, num_splits=None)
    tree_verify_attention_paged(q, k_pages, v_pages, page_table, lengths, tree_bits, ...)
    mla_tree_verify_attention(q, kv, lengths, tree_bits, sm_scale=None, num_splits=None,
                              page_table=None)

Same contract as the Triton baseline (kernels/verify/triton_verify.py): queries are the T = 1 + N tree
tokens of each sequence; sequence b sees its committed prefix [0, lengths[b]) fully and the tree
keys lengths[b] + j (j < T) by the ancestor bitmask tree_bits[b, i] (bit j % 32 of word j // 32,
see harness.decode.attention.visibility_bits). bf16 in and out, fp32 accumulation.

Calls never synchronise with the host and allocate only the output and the split-KV workspace
(pass `out=` and `workspace=` from `alloc_workspace` to allocate nothing), so they can be
captured in a CUDA graph; make the first call outside the capture (it compiles and loads the
library). The library is compiled on first use (kernels/build.py); importing this module works
on a host without a GPU.

Five implementations (`impl=`, default "mma"): "mma" (mma.sync, any GPU from sm_80), "wgmma"
(S = QK^T on Hopper's warpgroup MMA, P V on mma.sync), "wgmma_pv" (both products on wgmma:
GQA at head_dim 128, software-pipelined, gqa_pipelined_kernel; MLA, mla_pv_kernel),
"wgmma_tail" (wgmma_pv, with the rows past the last full 64-row block carried one a CTA as tail
rows on the full blocks' tiles where the shape allows: 65 tree tokens x G heads run G row blocks,
not G + 1; gqa_tail_kernel, a contiguous cache; elsewhere it is wgmma_pv) and "wgmma_sumcheck"
(wgmma_pv whose softmax takes a tile's max only where the tile's exponentials, computed against
the running max as it stands, sum past 2^7 in some row: bit-equal to wgmma_pv, ~40 fewer
instructions a warp a tile; the GQA shapes wgmma_pv runs). The caller picks one; nothing in the
environment does. On the H200 (kernels/NOTES.md, sessions 27-31) wgmma_tail is level with
wgmma_pv at 16k-128k keys (1.04x slower at 64k) and wgmma_sumcheck 1.02-1.07x faster at 65 tree
tokens (the harness's `auto` on Hopper).
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

TILE_KEYS = 64               # keys per tile of the kernels (BN in verify_attention.cu)
MAX_SPLITS = 1024            # chosen here at most
MAX_REQUESTED_SPLITS = 4096  # asked for at most (each split adds a partial output to the workspace)
MLA_DK, MLA_DV = 576, 512
# The pipelined paged GQA kernel (wgmma_pv) addresses a row as a 32-bit count of 16-byte chunks
# from its head's first row (verify_attention.cu, gqa_pipelined_kernel's copy): a K or V pool may
# span 32 GiB from it.
MAX_PAGED_CHUNKS = 2**31


class _Params(ctypes.Structure):
    """Mirror of tva::AttnParams (every field 8 bytes wide, so no padding questions)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("q", "k", "v", "out", "lengths", "tree_bits", "page_table", "ws_o", "ws_lse")] + \
               [(name, ctypes.c_int64) for name in
                ("lengths_int64", "batch", "heads_q", "heads_kv", "tokens", "num_splits", "page_size",
                 "q_sb", "q_sh", "q_st", "k_sb", "k_sh", "k_st", "v_sb", "v_sh", "v_st",
                 "o_sb", "o_sh", "o_st", "bits_sb", "bits_st", "pt_sb")] + \
               [("sm_scale", ctypes.c_double), ("kv_rows", ctypes.c_int64)]


def _lib():
    from harness.kernels.build import load_library

    lib = load_library()
    if lib.tva_struct_size() != ctypes.sizeof(_Params):
        raise RuntimeError("verify_attention.cu and custom_verify.py disagree on the parameter struct")
    return lib


class _TraceRow(ctypes.Structure):
    """Mirror of trace::Row (kernels/trace.cuh): one CTA's stamps in a trace build."""

    _fields_ = [("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64), ("clock", ctypes.c_int64 * 6),
                ("kernel", ctypes.c_uint32), ("sm", ctypes.c_uint32), ("block", ctypes.c_uint32 * 3),
                ("pad", ctypes.c_uint32)]


TRACE_ROWS = 1 << 15        # trace::ROWS


def read_trace() -> tuple[list[dict], int] | None:
    """The CTAs a trace build (HARNESS_KERNEL_TRACE=1) stamped since the last read, in the order
    they started, and how many were stamped (more than returned: the rest were dropped); None where
    the library is not a trace build. Each row: kernel (verify_attention.cu's TraceKernel), sm,
    block (x, y, z), start_ns / end_ns (%globaltimer) and clock (%clock64 at each stamp, 0 where
    the kernel has no such stamp). Synchronises the device first."""
    torch.cuda.synchronize()
    lib = _lib()
    if lib.tva_trace_row_size() != ctypes.sizeof(_TraceRow):
        raise RuntimeError("kernels/trace.cuh and custom_verify.py disagree on a trace row")
    rows = (_TraceRow * TRACE_ROWS)()
    n = lib.tva_trace_read(ctypes.byref(rows), TRACE_ROWS)
    if n == -1:
        return None
    if n < 0:
        raise RuntimeError("reading the kernels' trace failed")
    out = [{"kernel": r.kernel, "sm": r.sm, "block": tuple(r.block), "start_ns": r.start_ns,
            "end_ns": r.end_ns, "clock": list(r.clock)} for r in rows[:min(n, TRACE_ROWS)]]
    out.sort(key=lambda r: r["start_ns"])
    return out, n


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _gqa_occupancy(index: int, head_dim: int, num_warps: int, paged: bool, wgmma: int) -> int:
    with torch.cuda.device(index):
        return max(1, _lib().tva_gqa_occupancy(head_dim, num_warps, int(paged), int(wgmma)))


# wgmma_pv: S and P V on wgmma; wgmma_tma: wgmma_pv with its tiles by tensor copies (TMA) where
# the cache is contiguous (GQA: 4 warps), else wgmma_pv
IMPLS = ("mma", "wgmma", "wgmma_pv", "wgmma_tail", "wgmma_sumcheck", "wgmma_tma")
# tva_gqa_forward's and tva_mla_forward's `wgmma` (the gaps: codes of variants since removed,
# which they refuse)
_IMPL_CODE = {"mma": 0, "wgmma": 1, "wgmma_pv": 2, "wgmma_tail": 3, "wgmma_sumcheck": 6, "wgmma_tma": 12}
# the pipelined kernel (head_dim 128): plain, with tail rows, with the sum-checked softmax, by
# tensor copies
PIPELINED = ("wgmma_pv", "wgmma_tail", "wgmma_sumcheck", "wgmma_tma")
TAILED = ("wgmma_tail",)                   # run the tail kernel where the shape has tail rows
# variants of the pipelined GQA kernel alone: the MLA latent runs its own P V kernel for them
GQA_VARIANTS = TAILED + ("wgmma_sumcheck",)
# A library caller gets mma.sync (any GPU from sm_80). The harness's cells pick with their
# custom_impl knob, whose `auto` is wgmma on Hopper: measured faster there (kernels/NOTES.md).
DEFAULT_IMPL = "mma"


def _resolve_impl(impl: str, index: int, warps: int) -> int:
    """The variant to launch (tva_gqa_forward's `wgmma`: _IMPL_CODE): impl "mma" (any GPU),
    "wgmma", "wgmma_pv", "wgmma_tail", "wgmma_sumcheck" or "wgmma_tma" (compute capability 9.0,
    4 or 8 warps; an error where it cannot run)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "mma":
        return 0
    if torch.cuda.get_device_capability(index) != (9, 0):
        raise ValueError(f"impl '{impl}' needs a Hopper GPU (compute capability 9.0)")
    if warps not in (4, 8):
        raise ValueError(f"impl '{impl}' needs 4 or 8 warps per CTA (whole warpgroups), got {warps}")
    return _IMPL_CODE[impl]


# --------------------------------------------------------------------------------------------
# Planning (host only: shapes, never values)
# --------------------------------------------------------------------------------------------

def gqa_warps(rows: int, wgmma: bool = False) -> int:
    """Warps per CTA (16 query rows each) for M = G * T rows. Padded rows cost tensor-core work;
    each extra row block re-reads every KV tile from L2: minimise padded rows x (1 + c per
    block), ties to the larger CTA. c = 0.15 for mma.sync; 0.10 for wgmma (whole warpgroups),
    whose K operand comes from shared memory once per warpgroup: at 260 rows (65 tree tokens x
    4 heads) five 4-warp blocks beat three 8-warp ones by 5 % at 16k-64k, at 256 rows two
    8-warp blocks beat four 4-warp ones by 6-9 % at 16k-64k (H200, wgmma QK^T, kernels/NOTES.md,
    session 7)."""
    c = 0.10 if wgmma else 0.15

    def cost(w: int) -> float:
        blocks = math.ceil(rows / (16 * w))
        return blocks * 16 * w * (1 + c * blocks)
    return min((8, 4) if wgmma else (8, 4, 2), key=lambda w: (cost(w), -w))


def plan_warps(rows: int, impl: str) -> int:
    """Warps per CTA for `impl` at M = rows: the pipelined kernel takes 4 at every shape measured
    (on the H200 at 65536 keys: 65 tree tokens 199 vs 264 us with 8, 64 tokens 156 vs 184, 16
    tokens 84 vs 100; kernels/NOTES.md); the others as gqa_warps says."""
    return 4 if impl in PIPELINED else gqa_warps(rows, wgmma=impl != "mma")


def tail_row_blocks(rows: int, block: int = 64) -> int:
    """Full row blocks the tail kernel runs for M = rows (the rest, one a CTA, as tail rows), or
    0 where M has no such shape: 0 < rows % block <= rows // block (verify_attention.cu's
    tail_row_blocks). 65 tree tokens x G heads: G blocks and G tail rows."""
    nb, rem = divmod(rows, block)
    return nb if 0 < rem <= nb else 0


def runs_tail(rows: int, warps: int, impl: str, paged: bool) -> bool:
    """Whether impl wgmma_tail runs the tail kernel for M = rows (a contiguous cache, 4 warps,
    the shape above); elsewhere it runs the plain pipelined kernel (tva_gqa_forward's dispatch)."""
    return impl in TAILED and not paged and warps == 4 and tail_row_blocks(rows) > 0


def row_blocks(rows: int, warps: int, impl: str, paged: bool) -> int:
    """CTAs a (split, sequence, KV head) for M = rows: the tail kernel's full blocks where it
    runs, else ceil(M / 16 warps)."""
    return tail_row_blocks(rows) if runs_tail(rows, warps, impl, paged) else math.ceil(rows / (16 * warps))


def gqa_slots(m_blocks: int, occupancy: int, sms: int, per_row_pages: bool = False) -> int:
    """CTAs the split plan counts as running at once. One row block (G T <= 128 rows: at most
    128 FLOPs a KV byte, under the H200's ~184 ridge) is a bandwidth problem: two CTAs on a
    multiprocessor share its memory pipes, and more splits only add partials for the combine.
    One CTA a multiprocessor measured faster there (16 tree tokens, b 1, H200: 16 splits 25.8
    us over 16384 keys against 28.8 for the 33 that fill two a multiprocessor; 72.4 against 75.3
    over 65536; kernels/NOTES.md), over a paged cache too with the pipelined kernel's copy (page
    16: 26.5 against 29.3 us at 16384 keys, 74.1 against 77.3 at 65536; page 1: 75.6 against
    77.4). The mma and wgmma kernels look each row's page up in every thread's copy, and the
    second resident CTA hides those round trips (`per_row_pages`: page 16 took 95.4 us at 16
    splits and 78.0 at 33 with that copy). Several row blocks (65 tree tokens: five) are a
    tensor-core problem whose co-resident CTAs hide each other's latencies: every slot counts
    (13 splits at 65536 keys, the best of 4-32 measured)."""
    return sms if m_blocks == 1 and not per_row_pages else occupancy * sms


def _splits(requested, ctas_per_split: int, slots: int, max_keys: int, overhead_keys: int,
            shared_keys: int = 0) -> int:
    if requested is not None:
        if not 1 <= int(requested) <= MAX_REQUESTED_SPLITS:
            raise ValueError(f"num_splits must be in [1, {MAX_REQUESTED_SPLITS}], got {requested}")
        return int(requested)
    return best_splits(ctas_per_split, slots, max_keys, overhead_keys, shared_keys=shared_keys)


def split_tiles(max_keys: int, splits: int) -> int:
    """Key tiles one CTA of a split streams: its share of `max_keys`, in whole tiles."""
    return math.ceil(math.ceil(max_keys / splits) / TILE_KEYS)


@functools.lru_cache(maxsize=4096)
def best_splits(ctas_per_split: int, slots: int, max_keys: int, overhead_keys: int,
                cap: int = MAX_SPLITS, shared_keys: int = 0) -> int:
    """Split count (at most `cap`) with the shortest modelled time: waves of CTAs (`slots` run at
    once) times the keys one CTA streams (its chunk, whole tiles) plus a fixed cost per CTA in
    keys (start-up latency, and writing and re-reading its partial output), plus `shared_keys`
    for every CTA of the call: a cost the CTAs do not pay side by side but one after another
    (their partials, where they all land in L2 at once and the combine reads every one back).
    Wave quantisation matters: 144 CTAs on 132 SMs take two waves, 128 take one."""
    def cost(s: int) -> int:
        chunk = split_tiles(max_keys, s) * TILE_KEYS
        return (math.ceil(s * ctas_per_split / slots) * (chunk + overhead_keys)
                + s * ctas_per_split * shared_keys)
    top = max(1, min(cap, math.ceil(max_keys / TILE_KEYS)))
    return min(range(1, top + 1), key=lambda s: (cost(s), s))


# MLA's partial rows (64 x 512 fp32, 128 KB a CTA) land in L2 together as the splits end, and the
# combine reads every one back. scenarios/mla-splits.yaml on an H100 (26 cells, 4k-128k keys,
# 12-65 splits; kernels/NOTES.md "Session 57") fits 3.4 µs + 1.97 µs a tile a CTA streams + 0.31
# µs a split whatever the length: ~5 keys of a CTA's streaming for each CTA. One tile stands for
# a CTA's start-up, as for GQA.
MLA_SHARED_KEYS = 5


def _overhead_keys(rows: int, dv: int, key_bytes: int) -> int:
    """A CTA's fixed cost in keys' worth of bytes: ~ one tile of start-up latency, plus its fp32
    partial output (rows x dv), written once and read once by the combine."""
    return TILE_KEYS + rows * dv * 8 // key_bytes


def plan(q: torch.Tensor, heads_kv: int, max_keys: int, paged: bool, mla: bool = False,
         num_splits: int | None = None, num_warps: int | None = None, impl: str = DEFAULT_IMPL) -> dict:
    """Launch shape for these inputs: warps per CTA, row blocks, splits, value dim, wgmma."""
    b, hq, T, _ = q.shape
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if mla:
        m_blocks = math.ceil(hq * T / 64)
        splits = _splits(num_splits, b * m_blocks, _sm_count(index), max_keys, TILE_KEYS,
                         shared_keys=MLA_SHARED_KEYS)
        mla_impl = "wgmma_pv" if impl in GQA_VARIANTS else impl   # MLA: mla_pv_kernel for those
        return dict(num_warps=8, m_blocks=m_blocks, num_splits=splits, dv=MLA_DV,
                    wgmma=_resolve_impl(mla_impl, index, 8))
    d = q.shape[-1]
    if impl in PIPELINED and d != 128:
        # The pipelined kernel is built for 128 alone: the earlier single-stage kernel's d64
        # instance failed the float64 check on the H200 (relative error 0.56, while the CPU
        # emulator agreed with the reference), so none is offered rather than one run wrong.
        raise ValueError(f"impl '{impl}' supports head_dim 128 only, not {d} (use 'wgmma')")
    rows = hq // heads_kv * T
    warps = num_warps or plan_warps(rows, impl)
    if warps not in (2, 4, 8):
        raise ValueError(f"num_warps must be 2, 4 or 8, got {warps}")
    wgmma = _resolve_impl(impl, index, warps)
    m_blocks = row_blocks(rows, warps, impl, paged)
    occupancy = _gqa_occupancy(index, d, warps, paged, wgmma)
    per_row_pages = paged and impl not in PIPELINED   # only the pipelined copy shares them
    slots = gqa_slots(m_blocks, occupancy, _sm_count(index), per_row_pages=per_row_pages)
    splits = _splits(num_splits, b * heads_kv * m_blocks, slots, max_keys,
                     _overhead_keys(16 * warps, d, 4 * d))
    return dict(num_warps=warps, m_blocks=m_blocks, num_splits=splits, dv=d, wgmma=wgmma)


def alloc_workspace(q: torch.Tensor, num_splits: int, dv: int):
    """Split-KV workspace for `num_splits` splits: partial outputs and their log2-sum-exp."""
    b, hq, T, _ = q.shape
    n = num_splits if num_splits > 1 else 0
    return (torch.empty(n * b * hq * T * dv, dtype=torch.float32, device=q.device),
            torch.empty(n * b * hq * T, dtype=torch.float32, device=q.device))


# --------------------------------------------------------------------------------------------
# Checks (host only)
# --------------------------------------------------------------------------------------------

def _check_rows(name: str, t: torch.Tensor) -> None:
    """cp.async moves 16-byte chunks: rows must start 16-byte aligned with a unit last stride."""
    if t.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be bfloat16, got {t.dtype}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device")
    if t.stride(-1) != 1:
        raise ValueError(f"{name} needs a contiguous last dimension (stride {t.stride(-1)})")
    if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
        raise ValueError(f"{name} rows must be 16-byte aligned (strides {t.stride()})")


def _check_common(q, lengths, tree_bits):
    b, _, T, _ = q.shape
    W = (T + 31) // 32
    if tree_bits.shape != (b, T, W) or tree_bits.dtype != torch.int32:
        raise ValueError(f"tree_bits must be int32 [{b}, {T}, {W}], got {tree_bits.dtype} "
                         f"{tuple(tree_bits.shape)}")
    if lengths.shape != (b,) or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be int32/int64 [{b}], got {lengths.dtype} {tuple(lengths.shape)}")
    if lengths.device != q.device or tree_bits.device != q.device:
        raise ValueError("lengths and tree_bits must be on q's device")
    return lengths.contiguous(), tree_bits if tree_bits.stride(-1) == 1 else tree_bits.contiguous()


def _params(q, k, v, out, lengths, tree_bits, page_table, ws, heads_kv, splits, page_size, sm_scale):
    p = _Params()
    p.q, p.k, p.v, p.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    p.lengths, p.tree_bits = lengths.data_ptr(), tree_bits.data_ptr()
    p.page_table = page_table.data_ptr() if page_table is not None else None
    p.ws_o, p.ws_lse = ws[0].data_ptr(), ws[1].data_ptr()
    p.lengths_int64 = int(lengths.dtype == torch.int64)
    p.batch, p.heads_q, _, _ = q.shape
    p.tokens = q.shape[2]
    p.heads_kv, p.num_splits, p.page_size = heads_kv, splits, page_size
    p.q_sb, p.q_sh, p.q_st = q.stride()[:3]
    p.k_sb, p.k_sh, p.k_st = k.stride()[:3]
    p.v_sb, p.v_sh, p.v_st = v.stride()[:3]
    p.o_sb, p.o_sh, p.o_st = out.stride()[:3]
    p.bits_sb, p.bits_st = tree_bits.stride()[:2]
    p.pt_sb = page_table.stride(0) if page_table is not None else 0
    p.sm_scale = float(sm_scale)
    p.kv_rows = k.shape[2]           # contiguous: rows per (b, head); paged: the page size
    return p


def _prepare_out_ws(q, dv, pl, out, workspace):
    b, hq, T, _ = q.shape
    if out is None:
        out = torch.empty(b, hq, T, dv, dtype=torch.bfloat16, device=q.device)
    elif (out.shape != (b, hq, T, dv) or out.dtype != torch.bfloat16 or out.stride(-1) != 1
          or out.data_ptr() % 4 or any(s % 2 for s in out.stride()[:-1])):
        raise ValueError(f"out must be bfloat16 [{b}, {hq}, {T}, {dv}] with a contiguous last dim")
    if workspace is None:
        workspace = alloc_workspace(q, pl["num_splits"], dv)
    elif pl["num_splits"] > 1:
        need = pl["num_splits"] * b * hq * T
        if workspace[0].numel() < need * dv or workspace[1].numel() < need:
            raise ValueError("workspace too small (alloc_workspace with the same num_splits)")
        # Partial outputs are written and read as float2 (8 bytes), lse as float.
        if (workspace[0].dtype != torch.float32 or workspace[1].dtype != torch.float32
                or workspace[0].data_ptr() % 8 or not workspace[0].is_contiguous()
                or not workspace[1].is_contiguous()):
            raise ValueError("workspace must be two contiguous float32 tensors, the first 8-byte aligned "
                             "(alloc_workspace)")
    return out, workspace


def _run(fn, *args) -> None:
    rc = fn(*args)
    if rc != 0:
        raise RuntimeError(f"custom verify kernel launch failed: {_lib().tva_error_string(rc).decode()}")


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

def _gqa(q, k, v, lengths, tree_bits, page_table, page_size, max_keys, sm_scale, num_splits,
         num_warps, impl, out, workspace):
    _check_rows("q", q)
    _check_rows("k", k)
    _check_rows("v", v)
    b, hq, T, d = q.shape
    hkv = k.shape[1]
    if d not in (64, 128):
        raise ValueError(f"head dim {d} is not supported (64 or 128)")
    if k.shape[-1] != d or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if hq % hkv or (hq // hkv) & (hq // hkv - 1):
        raise ValueError(f"{hq} query heads over {hkv} KV heads is not a power-of-two group")
    lengths, tree_bits = _check_common(q, lengths, tree_bits)
    paged = page_table is not None
    pl = plan(q, hkv, max_keys, paged, num_splits=num_splits, num_warps=num_warps, impl=impl)
    if paged and impl in PIPELINED:   # the other kernels' offsets are 64-bit
        _check_pool_span("k_pages", k)
        _check_pool_span("v_pages", v)
    out, ws = _prepare_out_ws(q, d, pl, out, workspace)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    p = _params(q, k, v, out, lengths, tree_bits, page_table, ws, hkv, pl["num_splits"], page_size, scale)
    with torch.cuda.device(q.device):
        lib = _lib()
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _run(lib.tva_gqa_forward, ctypes.byref(p), d, pl["num_warps"], int(paged), int(pl["wgmma"]),
             ctypes.c_void_p(stream))
    return out


def tree_verify_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                          tree_bits: torch.Tensor, sm_scale: float | None = None,
                          num_splits: int | None = None, *, num_warps: int | None = None,
                          impl: str = DEFAULT_IMPL, out: torch.Tensor | None = None,
                          workspace=None) -> torch.Tensor:
    """GQA tree-verify attention over a contiguous cache.

    q [b, Hq, T, d] (d 64 or 128); k, v [b, Hkv, S, d] with a contiguous last dim (any other
    strides: a view of a larger cache is fine), Hq / Hkv a power of two; lengths [b] int32/int64
    on the device with lengths[b] + T <= S (not checked: that would sync); tree_bits
    [b, T, ceil(T/32)] int32. Returns [b, Hq, T, d] bfloat16. `num_splits` and `num_warps`
    override the plan; `impl` "mma" (the default), "wgmma", "wgmma_pv", "wgmma_tail" or
    "wgmma_sumcheck" (Hopper only, see _resolve_impl).
    """
    if k.dim() != 4 or k.shape[0] != q.shape[0]:
        raise ValueError(f"k must be [b, Hkv, S, d] with b = {q.shape[0]}, got {tuple(k.shape)}")
    return _gqa(q, k, v, lengths, tree_bits, None, 1, k.shape[2], sm_scale, num_splits, num_warps,
                impl, out, workspace)


def tree_verify_attention_paged(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                                page_table: torch.Tensor, lengths: torch.Tensor,
                                tree_bits: torch.Tensor, sm_scale: float | None = None,
                                num_splits: int | None = None, *, num_warps: int | None = None,
                                impl: str = DEFAULT_IMPL, out: torch.Tensor | None = None,
                                workspace=None) -> torch.Tensor:
    """GQA tree-verify attention over a paged cache.

    k_pages, v_pages [num_pages, Hkv, page_size, d]; page_table [b, max_pages] int32: key j of
    sequence b lives in page page_table[b, j // page_size], slot j % page_size.
    """
    if k_pages.dim() != 4:
        raise ValueError(f"k_pages must be [num_pages, Hkv, page_size, d], got {tuple(k_pages.shape)}")
    page_table = _check_page_table(page_table, q)
    page_size = k_pages.shape[2]
    return _gqa(q, k_pages, v_pages, lengths, tree_bits, page_table, page_size,
                page_table.shape[1] * page_size, sm_scale, num_splits, num_warps, impl, out, workspace)


def _check_pool_span(name: str, pages: torch.Tensor) -> None:
    """A pool [num_pages, Hkv, page_size, d] whose last row lies 2^31 16-byte chunks or more past
    a head's first row cannot be addressed by the pipelined paged kernel (MAX_PAGED_CHUNKS)."""
    last = (pages.shape[0] - 1) * pages.stride(0) + (pages.shape[2] - 1) * pages.stride(2)
    if last * pages.element_size() >= MAX_PAGED_CHUNKS * 16:
        raise ValueError(f"{name} spans {last * pages.element_size()} bytes from a head's first row; the "
                         f"pipelined paged kernel (impl 'wgmma_pv') addresses at most {MAX_PAGED_CHUNKS * 16 >> 30} GiB a pool")


def _check_page_table(page_table: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if page_table.dim() != 2 or page_table.shape[0] != q.shape[0] or page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32 [b, max_pages], got {page_table.dtype} "
                         f"{tuple(page_table.shape)}")
    if page_table.device != q.device:
        raise ValueError("page_table must be on q's device")
    return page_table if page_table.stride(1) == 1 else page_table.contiguous()


@functools.lru_cache(maxsize=None)
def _mla_smem_ok(index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(index)
    have = getattr(props, "shared_memory_per_block_optin", None)
    with torch.cuda.device(index):
        need = _lib().tva_mla_smem_bytes()
    return need, have


def _check_mla_smem(device: torch.device) -> None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    need, have = _mla_smem_ok(index)
    if have is not None and have < need:
        raise RuntimeError(f"the MLA kernel needs {need} bytes of shared memory per block; this GPU "
                           f"allows {have} (Hopper-class GPUs allow 232448)")


def mla_tree_verify_attention(q: torch.Tensor, kv: torch.Tensor, lengths: torch.Tensor,
                              tree_bits: torch.Tensor, sm_scale: float | None = None,
                              num_splits: int | None = None, *, page_table: torch.Tensor | None = None,
                              impl: str = DEFAULT_IMPL, out: torch.Tensor | None = None,
                              workspace=None) -> torch.Tensor:
    """MLA latent tree-verify attention: one KV head of 576 values (512 latent + 64 rope) for the
    keys, its first 512 values for the values.

    q [b, H, T, 576]; kv [b, 1, S, 576] (or pages [num_pages, 1, page_size, 576] with
    `page_table` [b, max_pages] int32). Returns [b, H, T, 512] bfloat16. The default scale is
    1/sqrt(576); MLA models usually pass their own. `impl` as for tree_verify_attention.
    """
    _check_rows("q", q)
    _check_rows("kv", kv)
    if q.shape[-1] != MLA_DK or kv.dim() != 4 or kv.shape[1] != 1 or kv.shape[-1] != MLA_DK:
        raise ValueError(f"MLA wants q [b, H, T, {MLA_DK}] and kv [b, 1, S, {MLA_DK}], got "
                         f"{tuple(q.shape)} and {tuple(kv.shape)}")
    lengths, tree_bits = _check_common(q, lengths, tree_bits)
    if page_table is not None:
        page_table = _check_page_table(page_table, q)
        page_size, max_keys = kv.shape[2], page_table.shape[1] * kv.shape[2]
    else:
        if kv.shape[0] != q.shape[0]:
            raise ValueError(f"kv batch {kv.shape[0]} != q batch {q.shape[0]}")
        page_size, max_keys = 1, kv.shape[2]
    _check_mla_smem(q.device)
    pl = plan(q, 1, max_keys, page_table is not None, mla=True, num_splits=num_splits, impl=impl)
    out, ws = _prepare_out_ws(q, MLA_DV, pl, out, workspace)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(MLA_DK)
    p = _params(q, kv, kv, out, lengths, tree_bits, page_table, ws, 1, pl["num_splits"], page_size, scale)
    with torch.cuda.device(q.device):
        lib = _lib()
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _run(lib.tva_mla_forward, ctypes.byref(p), int(page_table is not None), int(pl["wgmma"]),
             ctypes.c_void_p(stream))
    return out
