"""Top-k log-probs of drafter logits in Triton: `topk(logits, k) - logsumexp(logits)` per row.

For logits [..., V] (V = 151936, rows = b x D drafted positions) this replaces torch.topk +
torch.logsumexp (~124 µs on an H200 at b=2, D=15, k=64) with two launches that read the logits
once, with no host sync and no allocation other than the outputs and the workspace, so a CUDA
graph can capture it.

Elements are compared by a packed int64 key: the value's order-preserving int32 above
0x7FFFFFFF - id. Keys are unique and their order is (value desc, id asc), the tie rule.

  1. `_select_kernel`, grid (P, rows): program p reads elements [p*BLOCK, (p+1)*BLOCK) of its
     row, as SUB chunks of CW = BLOCK/SUB, and stores the span's (max, sum exp(x - max)) for
     the logsumexp and each chunk's M largest keys, largest first.
  2. `_finish_kernel`, one program per row: the threshold T = the k'-th largest of the row's
     C = P*SUB chunk maxima (one sort). k' distinct elements reach it, so the top k' all lie at
     or above it, and every element >= T is among the recorded keys unless its chunk holds more
     than M of them: a chunk whose M-th key reaches T may, and is read again from the logits.
     C is chosen near 4k', where a chunk holds ~0.3 elements >= T on random rows, so a
     re-read is rare there; rows whose large values crowd a few chunks re-read those chunks.
     The candidates (~1.1 k' on random rows) are written to the row's CAP slots, sorted by one
     sort when they fit a block (else ranked by counting), and the first k' written with
     logsumexp from the partials.
     More than CAP candidates (all-equal rows, heavy ties), or fewer than k' (impossible with a
     correct threshold; checked anyway, so the result never depends on it): an exact selection
     over the whole row instead (bisection on order-preserving integer keys, 32 passes, then
     one compaction pass that keeps exactly the k' first in (value desc, id asc)); slow (~34
     row reads by one program) but exact.

The logits are read once (the three launches before this read them twice, from HBM and then
from L2, with a threshold pass between); kernels/NOTES.md has the timings of both.
Comparisons use float32 values (bf16 / fp16 are widened exactly), -0.0 == +0.0 as in torch.
Log-probs are (x - max) - log(sum exp(x - max)) in float32: a few ulp of |log-prob| from the
float64 value (<= 1.7e-6 measured at the drafter's x32 scale, interpreter), which is below
torch's own float32 path, whose logsumexp is rounded at |lse| (half an ulp: 7.6e-6 at
|lse| ~ 150), so the two differ by up to about that. NaN logits are not supported. Any k works;
the ranking past BJ candidates is quadratic in them, so k' in the thousands gets slow.
Dtype-generic kernels: the tests run them under TRITON_INTERPRET=1 on CPU (fp32, fp16); bf16
is checked on the GPU (tests/kernels/test_triton_topk_gpu.py, `pytest -m gpu`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from harness.kernels import pdl

# Order-preserving int32 keys of float32 values (see _key): the keys of -inf and +inf.
KEY_NEG_INF = tl.constexpr(-2139095041)
KEY_POS_INF = tl.constexpr(2139095040)
# Below every packed key of a real element (see _pack): empty slots and elements past the row.
EMPTY = tl.constexpr(-2**63)

MAX_CHUNKS = 4096     # chunk maxima per row: the finish sorts them in one block
CHUNKS_PER_K = 4      # C ~ 4k' chunks a row (see the module docstring)
MIN_CAP = 2048        # candidate slots per row (at least k'): past this, the exact fallback


@triton.jit
def _key(x):
    """float32 -> int32 with the same order (signed compare); -0.0 maps to +0.0's key."""
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _unkey(key):
    b = key ^ ((key >> 31) & 0x7FFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _row_ptr(X, row, n1, stride0, stride1):
    r = row.to(tl.int64)
    return X + (r // n1) * stride0 + (r % n1) * stride1


@triton.jit
def _pack(x, ids):
    """(float32 value, int32 id) -> int64 key, unique, ordered as (value desc, id asc)."""
    return (_key(x).to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def _unpack(key):
    """int64 key -> (float32 value, int32 id); -0.0 comes back as +0.0 (equal, as compared)."""
    return _unkey((key >> 32).to(tl.int32)), 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)


@triton.jit
def _select_kernel(
    X, TOP, PART_M, PART_S,
    V, n1, stride0, stride1,
    BLOCK: tl.constexpr, SUB: tl.constexpr, M: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1)
    C = tl.num_programs(0) * SUB
    r64 = row.to(tl.int64)
    x_row = _row_ptr(X, row, n1, stride0, stride1)
    CW: tl.constexpr = BLOCK // SUB
    offs = p * BLOCK + tl.arange(0, SUB)[:, None] * CW + tl.arange(0, CW)[None, :]
    in_row = offs < V
    x = tl.load(x_row + offs, mask=in_row, other=float("-inf")).to(tl.float32)

    m = tl.max(tl.max(x, 1), 0)             # every span holds an element of the row
    m_safe = tl.where(m == float("-inf"), 0.0, m)      # an all -inf span: sum 0, not NaN
    s = tl.sum(tl.sum(tl.exp(x - m_safe), 1), 0)
    tl.store(PART_M + r64 * tl.num_programs(0) + p, m)
    tl.store(PART_S + r64 * tl.num_programs(0) + p, s)

    # Each chunk's M largest keys, largest first: the max, taken out (keys are unique), again.
    key = tl.where(in_row, _pack(x, offs), EMPTY)
    top = TOP + (r64 * C + p * SUB + tl.arange(0, SUB)) * M
    best = tl.max(key, 1)
    tl.store(top, best)
    for j in tl.static_range(1, M):
        key = tl.where(key == best[:, None], EMPTY, key)
        best = tl.max(key, 1)
        tl.store(top + j, best)


@triton.jit
def _collect(e, cc, T, n, n_re, cand, reread, CAP, CW: tl.constexpr, M: tl.constexpr,
             ENT: tl.constexpr):
    """Chunks cc's entries e [CB, M] (descending a row; EMPTY past C): append those >= T to
    cand, except a chunk's whose M-th entry reaches T (it may hold more: listed in `reread`).
    Returns the counts after."""
    live = tl.max(e, 1) >= T
    last = tl.min(e, 1)                      # the M-th entry; EMPTY where the chunk ran out
    # A chunk of at most M elements is recorded whole.
    again = live & (last >= T) & (last != EMPTY) & (CW > M)
    hit = tl.reshape((e >= T) & (e != EMPTY) & ~again[:, None], [ENT])
    flat = tl.reshape(e, [ENT])
    pos = n + tl.cumsum(hit.to(tl.int32), 0) - 1
    tl.store(cand + pos, flat, mask=hit & (pos < CAP))
    at = n_re + tl.cumsum(again.to(tl.int32), 0) - 1
    tl.store(reread + at, cc, mask=again)
    return n + tl.sum(hit.to(tl.int32), 0), n_re + tl.sum(again.to(tl.int32), 0)


@triton.jit
def _exact_candidates(x_row, V, KP, cand, FB: tl.constexpr):
    """Write the keys of exactly the k' first elements of the row in (value desc, id asc)
    order, unsorted, to cand[0, k'). Reads the row 34 times: for rows whose threshold let more
    than CAP candidates (or fewer than k') through."""
    # T = the k'-th largest key: largest T with #(keys >= T) >= k'.
    lo = tl.full([], KEY_NEG_INF, tl.int64)
    hi = tl.full([], KEY_POS_INF, tl.int64) + 1
    for _ in range(32):
        mid = (lo + (hi - lo) // 2).to(tl.int32)
        cnt = tl.zeros([], tl.int32)
        for off in range(0, V, FB):
            o = off + tl.arange(0, FB)
            ok = o < V
            key = _key(tl.load(x_row + o, mask=ok, other=float("-inf")).to(tl.float32))
            cnt += tl.sum((ok & (key >= mid)).to(tl.int32), 0)
        up = cnt >= KP
        lo = tl.where(up, mid.to(tl.int64), lo)
        hi = tl.where(up, hi, mid.to(tl.int64))
    T = lo.to(tl.int32)
    above = tl.zeros([], tl.int32)
    for off in range(0, V, FB):
        o = off + tl.arange(0, FB)
        ok = o < V
        key = _key(tl.load(x_row + o, mask=ok, other=float("-inf")).to(tl.float32))
        above += tl.sum((ok & (key > T)).to(tl.int32), 0)
    # All keys > T, and the first (k' - above) keys == T by id.
    need_eq = KP - above
    pos = tl.zeros([], tl.int32)
    eq_seen = tl.zeros([], tl.int32)
    for off in range(0, V, FB):
        o = off + tl.arange(0, FB)
        ok = o < V
        x = tl.load(x_row + o, mask=ok, other=float("-inf")).to(tl.float32)
        key = _key(x)
        eq = (ok & (key == T)).to(tl.int32)
        eq_rank = eq_seen + tl.cumsum(eq, 0) - 1
        sel = (ok & (key > T)) | ((eq != 0) & (eq_rank < need_eq))
        at = pos + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(cand + at, _pack(x, o), mask=sel)
        pos += tl.sum(sel.to(tl.int32), 0)
        eq_seen += tl.sum(eq, 0)


@triton.jit
def _finish_kernel(
    X, TOP, PART_M, PART_S, CAND, REREAD, COUNT, OUT_LP, OUT_ID,
    V, n1, stride0, stride1, P, C, KP, CAP,
    CW: tl.constexpr, M: tl.constexpr, CP: tl.constexpr, CB: tl.constexpr, PB: tl.constexpr,
    RB: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr, FB: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    row = tl.program_id(0)
    r64 = row.to(tl.int64)
    top = TOP + r64 * C * M
    cand = CAND + r64 * CAP
    reread = REREAD + r64 * CP
    x_row = _row_ptr(X, row, n1, stride0, stride1)

    # Everything the common case reads, loaded at once with no load waiting on another: the
    # chunk maxima, the first CB chunks' entries (all of them at the loop's shape) and the
    # first PB span partials.
    c = tl.arange(0, CP)
    mx = tl.load(top + c * M, mask=c < C, other=EMPTY)
    cc = tl.arange(0, CB)
    ENT: tl.constexpr = CB * M
    e = tl.load(top + cc[:, None] * M + tl.arange(0, M)[None, :], mask=(cc < C)[:, None], other=EMPTY)
    o = tl.arange(0, PB)
    pm = tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf"))
    ps = tl.load(PART_S + r64 * P + o, mask=o < P, other=0.0)

    # T: the k'-th largest chunk max (padding sorts last). Fewer than k' chunks: EMPTY, and
    # every entry is a candidate and every chunk with more than M elements is read again.
    ordered = tl.sort(mx, descending=True)
    T = tl.max(tl.where(c == KP - 1, ordered, EMPTY), 0)
    n, n_re = _collect(e, cc, T, tl.zeros([], tl.int32), tl.zeros([], tl.int32), cand, reread,
                       CAP, CW, M, ENT)
    for c0 in range(CB, C, CB):
        e = tl.load(top + (c0 + cc)[:, None] * M + tl.arange(0, M)[None, :],
                    mask=(c0 + cc < C)[:, None], other=EMPTY)
        n, n_re = _collect(e, c0 + cc, T, n, n_re, cand, reread, CAP, CW, M, ENT)

    # log(sum exp(x)) = M + log S over the P span partials.
    big = tl.max(pm, 0)
    for p0 in range(PB, P, PB):
        o = p0 + tl.arange(0, PB)
        big = tl.maximum(big, tl.max(tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf")), 0))
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    S = tl.sum(ps * tl.exp(pm - big_safe), 0)
    for p0 in range(PB, P, PB):
        o = p0 + tl.arange(0, PB)
        pm = tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf"))
        ps = tl.load(PART_S + r64 * P + o, mask=o < P, other=0.0)
        S += tl.sum(ps * tl.exp(pm - big_safe), 0)
    log_s = tl.log(S)

    # The chunks that may hold more elements >= T than they recorded: read again, every
    # element >= T appended (their recorded entries were left out above).
    tl.debug_barrier()       # the list's stores, visible to every thread
    for q in range(0, n_re):
        chunk = tl.load(reread + q)
        for w0 in range(0, CW, RB):
            ow = chunk * CW + w0 + tl.arange(0, RB)
            ok = ow < V
            kw = _pack(tl.load(x_row + ow, mask=ok, other=float("-inf")).to(tl.float32), ow)
            sel = ok & (kw >= T)
            pos = n + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(cand + pos, kw, mask=sel & (pos < CAP))
            n += tl.sum(sel.to(tl.int32), 0)
    tl.store(COUNT + 2 * r64, n)             # what this call found, for tests and tuning
    tl.store(COUNT + 2 * r64 + 1, n_re)

    # The candidates (all elements >= T) hold the top k' iff there are at least k' of them,
    # whatever T was; more than CAP did not fit. Either way: the exact selection instead.
    fallback = (n > CAP) | (n < KP)
    if fallback:
        _exact_candidates(x_row, V, KP, cand, FB)
    n = tl.where(fallback, KP, n)
    tl.debug_barrier()    # the candidates' stores, visible to every thread below

    if n <= BJ:
        # One block (the common case): sorted at once, a slot's place is its rank.
        j = tl.arange(0, BJ)
        keys = tl.sort(tl.load(cand + j, mask=j < n, other=EMPTY), descending=True)
        value, ids = _unpack(keys)
        w = j < KP
        tl.store(OUT_LP + r64 * KP + j, (value - big) - log_s, mask=w)
        tl.store(OUT_ID + r64 * KP + j, ids.to(tl.int64), mask=w)
    else:
        # rank(i) = #{j : key_j > key_i} (keys are unique: ranks 0 .. n-1, each slot once).
        for i0 in range(0, n, BI):
            i = i0 + tl.arange(0, BI)
            im = i < n
            ki = tl.load(cand + i, mask=im, other=EMPTY)
            rank = tl.zeros([BI], tl.int32)
            for j0 in range(0, n, BJ):
                jj = j0 + tl.arange(0, BJ)
                kj = tl.load(cand + jj, mask=jj < n, other=EMPTY)
                rank += tl.sum((kj[None, :] > ki[:, None]).to(tl.int32), 1)
            value, ids = _unpack(ki)
            w = im & (rank < KP)
            tl.store(OUT_LP + r64 * KP + rank, (value - big) - log_s, mask=w)
            tl.store(OUT_ID + r64 * KP + rank, ids.to(tl.int64), mask=w)


# ---------------------------------------------------------------------------------------------


@dataclass
class Workspace:
    """Per-row scratch of one `topk_logprobs` plan; it may hold anything between calls."""
    top: torch.Tensor         # int64 [rows * C * M]   each chunk's M largest keys
    part_m: torch.Tensor      # float32 [rows * P]     span max
    part_s: torch.Tensor      # float32 [rows * P]     span sum exp(x - max)
    cand: torch.Tensor        # int64 [rows * CAP]     candidate keys
    reread: torch.Tensor      # int32 [rows * CP]      chunks to read again
    count: torch.Tensor       # int32 [rows, 2]        the last call's (candidates, chunks re-read)


def _interpreting() -> bool:
    # triton.jit read TRITON_INTERPRET when the kernels were defined: ask them, not the env.
    return not isinstance(_select_kernel, triton.runtime.JITFunction)


def plan(V: int, k: int, config: dict | None = None) -> dict:
    """Tile sizes for rows of V logits and top-k (host only, no device work).
    `config` overrides BLOCK (elements per program, power of 2), SUB (chunks per program),
    M (keys recorded a chunk, power of 2), CAP (candidate slots per row), num_warps /
    finish_warps (for tuning and tests)."""
    if V < 1 or k < 1:
        raise ValueError(f"need V >= 1 and k >= 1 (got V={V}, k={k})")
    config = dict(config or {})
    kp = min(k, V)
    block = config.pop("BLOCK", None) or min(2048, max(16, triton.next_power_of_2(V)))
    # Keep C = P * SUB within MAX_CHUNKS (SUB >= 1): very long rows get longer spans.
    block = max(block, triton.next_power_of_2(triton.cdiv(V, MAX_CHUNKS)))
    P = triton.cdiv(V, block)
    sub = config.pop("SUB", None)
    if sub is None:
        want = min(CHUNKS_PER_K * kp, MAX_CHUNKS)
        sub = min(block, triton.next_power_of_2(triton.cdiv(want, P)))
        while P * sub > MAX_CHUNKS and sub > 1:
            sub //= 2
    if block & (block - 1) or sub & (sub - 1) or sub > block:
        raise ValueError(f"BLOCK ({block}) and SUB ({sub}) must be powers of 2, SUB <= BLOCK")
    cw = block // sub
    m = min(config.pop("M", None) or 4, cw)
    if m & (m - 1):
        raise ValueError(f"M ({m}) must be a power of 2")
    C = P * sub
    cp = triton.next_power_of_2(C)
    cap = max(config.pop("CAP", None) or MIN_CAP, kp)
    p = dict(V=V, kp=kp, BLOCK=block, SUB=sub, CW=cw, M=m, P=P, C=C, CP=cp,
             CB=min(cp, max(1, 2048 // m)), CAP=cap, PB=min(1024, triton.next_power_of_2(P)),
             RB=min(cw, 1024), BI=64, BJ=128, FB=1024, num_warps=4, finish_warps=8)
    p.update(config)
    return p


def _rows_view(logits: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, n1, stride0, stride1): row r starts at (r // n1) * stride0 + (r % n1) * stride1."""
    V = logits.shape[-1]
    if logits.dim() == 1:
        return 1, 1, 0, 0
    try:
        x3 = logits.view(-1, logits.shape[-2], V)
    except RuntimeError:
        raise ValueError(f"logits {tuple(logits.shape)} with strides {logits.stride()}: the "
                         "leading dims must merge into [-1, n, V] without a copy") from None
    return x3.shape[0] * x3.shape[1], x3.shape[1], x3.stride(0), x3.stride(1)


def _sizes(rows: int, p: dict) -> dict:
    return {"top": rows * p["C"] * p["M"], "part_m": rows * p["P"], "part_s": rows * p["P"],
            "cand": rows * p["CAP"], "reread": rows * p["CP"], "count": rows * 2}


def alloc_workspace(logits: torch.Tensor, k: int, config: dict | None = None) -> Workspace:
    """Scratch for `topk_logprobs(logits-like, k)`: allocate once (outside a CUDA graph) and pass
    it as `workspace=` with the same k and config; reusable across calls of that shape."""
    p = plan(logits.shape[-1], k, config)
    rows = _rows_view(logits)[0] if logits.numel() else 0
    dtypes = {"top": torch.int64, "part_m": torch.float32, "part_s": torch.float32,
              "cand": torch.int64, "reread": torch.int32, "count": torch.int32}
    return Workspace(**{name: torch.empty(max(n, 1), dtype=dtypes[name], device=logits.device)
                        for name, n in _sizes(rows, p).items()})


def topk_logprobs(logits: torch.Tensor, k: int,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  workspace: Workspace | None = None, config: dict | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_probs float32 [..., k'], ids int64 [..., k']), k' = min(k, V), of logits [..., V]
    (float32 / bf16 / fp16, last dim contiguous): rows sorted descending, ties by lower id,
    log_probs = topk - logsumexp over the whole row. Written into `out` (contiguous) when given;
    `workspace` from `alloc_workspace` with the same k and config. Two launches, no sync."""
    if logits.dim() < 1:
        raise ValueError("logits need a vocabulary dimension")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits must be float32, bf16 or fp16, got {logits.dtype}")
    if logits.stride(-1) != 1 and logits.shape[-1] > 1:
        raise ValueError("logits need a contiguous last dimension")
    if logits.device.type != "cuda" and not _interpreting():
        raise RuntimeError("topk_logprobs on CPU tensors needs TRITON_INTERPRET=1")
    V = logits.shape[-1]
    p = plan(V, k, config)
    kp = p["kp"]
    shape = (*logits.shape[:-1], kp)
    if out is None:
        out = (torch.empty(shape, dtype=torch.float32, device=logits.device),
               torch.empty(shape, dtype=torch.int64, device=logits.device))
    lp, ids = out
    if (lp.shape != shape or ids.shape != shape or lp.dtype != torch.float32
            or ids.dtype != torch.int64 or not lp.is_contiguous() or not ids.is_contiguous()):
        raise ValueError(f"out must be contiguous float32 and int64 tensors of shape {shape}")
    if logits.numel() == 0:
        return lp, ids
    rows, n1, s0, s1 = _rows_view(logits)
    if rows > 65535:   # grid dimension 1 (the spans go first)
        raise ValueError(f"at most 65535 rows per call, got {rows}")
    if workspace is None:
        workspace = alloc_workspace(logits, k, config)
    ws = workspace
    if any(getattr(ws, name).numel() < n for name, n in _sizes(rows, p).items()):
        raise ValueError("workspace too small for these inputs (alloc_workspace with the same k and config)")

    grid = (p["P"], rows)
    launch = pdl.launch_options(logits.device)
    _select_kernel[grid](
        logits, ws.top, ws.part_m, ws.part_s, V, n1, s0, s1,
        BLOCK=p["BLOCK"], SUB=p["SUB"], M=p["M"], num_warps=p["num_warps"], **launch)
    _finish_kernel[(rows,)](
        logits, ws.top, ws.part_m, ws.part_s, ws.cand, ws.reread, ws.count, lp, ids,
        V, n1, s0, s1, p["P"], p["C"], kp, p["CAP"],
        CW=p["CW"], M=p["M"], CP=p["CP"], CB=p["CB"], PB=p["PB"], RB=p["RB"], BI=p["BI"],
        BJ=p["BJ"], FB=p["FB"], num_warps=p["finish_warps"], **launch)
    return lp, ids
