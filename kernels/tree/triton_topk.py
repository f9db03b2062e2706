"""Top-k log-probs of drafter logits in Triton: `topk(logits, k) - logsumexp(logits)` per row.

For logits [..., V] (V = 151936, rows = b x D drafted positions) this replaces torch.topk +
torch.logsumexp (~124 µs on an H200 at b=2, D=15, k=64) with three launches that read the
logits twice (once from HBM, once from L2), with no host sync and no allocation other than the
outputs and the workspace, so a CUDA graph can capture it.

  1. `_stats_kernel`, grid (P, rows): program p reads elements [p*BLOCK, (p+1)*BLOCK) of its row
     as SUB chunks of BLOCK/SUB and stores each chunk's max, plus the span's (max, sum exp(x -
     max)) for the logsumexp. The row's last program to finish (an arrival counter) selects the
     k'-th largest of the row's C = P*SUB chunk maxima (one sort): a threshold t with at least
     k' elements >= t (k' distinct chunks have a max >= t), so the top k' all lie at or above
     it. C is chosen near 2k': then typically ~1.1-1.4 k' elements pass (one chunk rarely
     holds two of the top k'). The last program also resets the arrival counter, and program 0 zeroes the
     candidate counter, so every call (and graph replay) starts clean.
  2. `_gather_kernel`, same grid: each program reads its span again (from L2) and appends its
     (value, id) pairs with value >= t to the row's candidate buffer of CAP slots, each taking
     its slot with an atomic add on the row's counter.
  3. `_finish_kernel`, one program per row: logsumexp from the partials; then each candidate's
     rank = #candidates that precede it in (value desc, id asc), and those with rank < k' are
     written at their rank. Ties are thus broken by lower token id, deterministically. Up to
     BJ candidates (the common case) are ranked by counting in one block; up to BS (rows whose
     large values share chunks: a vocabulary ordered by frequency puts its likely words
     together) by one sort of packed (value, id) keys; more, by counting block by block.
     More than CAP candidates (all-equal rows, heavy ties, adversarial layouts), or fewer than
     k' (impossible with a correct threshold; checked anyway, so the result never depends on
     it): an exact selection over the whole row instead (bisection on order-preserving integer
     keys, 32 passes, then one compaction pass that keeps exactly the k' first in (value desc,
     id asc)); slow (~34 row reads by one program) but exact.

Comparisons use float32 values (bf16 / fp16 are widened exactly), -0.0 == +0.0 as in torch.
Log-probs are (x - max) - log(sum exp(x - max)) in float32: a few ulp of |log-prob| from the
float64 value (<= 1.7e-6 measured at the drafter's x32 scale, interpreter), which is below
torch's own float32 path, whose logsumexp is rounded at |lse| (half an ulp: 7.6e-6 at
|lse| ~ 150), so the two differ by up to about that. NaN logits are not supported. Any k works;
past BS candidates the ranking is quadratic in them, so k' in the thousands gets slow.
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
# Below every packed (key, id) of _finish_kernel's sort: the empty slots sort last.
KEY64_EMPTY = tl.constexpr(-2**63)

MAX_CHUNKS = 4096     # chunk maxima per row: the last stats program holds them in registers
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
def _stats_kernel(
    X, MAXIMA, PART_M, PART_S, THRESH, COUNT, ARRIVE,
    V, n1, stride0, stride1, P, KP,
    BLOCK: tl.constexpr, SUB: tl.constexpr, CP: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1)
    r64 = row.to(tl.int64)
    x_row = _row_ptr(X, row, n1, stride0, stride1)
    CW: tl.constexpr = BLOCK // SUB
    offs = p * BLOCK + tl.arange(0, SUB)[:, None] * CW + tl.arange(0, CW)[None, :]
    x = tl.load(x_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)

    chunk_max = tl.max(x, 1)                                           # [SUB]
    tl.store(MAXIMA + r64 * (P * SUB) + p * SUB + tl.arange(0, SUB), chunk_max)
    m = tl.max(chunk_max, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)      # an all -inf span: sum 0, not NaN
    s = tl.sum(tl.sum(tl.exp(x - m_safe), 1), 0)
    tl.store(PART_M + r64 * P + p, m)
    tl.store(PART_S + r64 * P + p, s)
    if p == 0:
        tl.store(COUNT + row, 0)          # _gather_kernel appends from 0 (a later launch)

    # Last program of the row: every thread's stores above, then one release by the atomic
    # (the barrier orders the other threads' stores before it); the acquire side reads the
    # maxima past L1 (.cg).
    tl.debug_barrier()
    arrived = tl.atomic_add(ARRIVE + row, 1, sem="acq_rel", scope="gpu")
    if arrived == P - 1:
        c = tl.arange(0, CP)
        valid = c < P * SUB
        mx = tl.load(MAXIMA + r64 * (P * SUB) + c, mask=valid, other=float("-inf"),
                     cache_modifier=".cg")
        key = _key(mx)
        # The k'-th largest of the maxima, off one sort (padding sorts last, as -inf): the
        # 32-step bisection over the key range it replaced cost the three launches ~2 us on the
        # H200 (20.6 -> 18.6 us). Fewer than k' chunks: key(-inf), every element passes.
        ordered = tl.sort(tl.where(valid, key, KEY_NEG_INF), descending=True)
        tl.store(THRESH + row, _unkey(tl.max(tl.where(c == KP - 1, ordered, KEY_NEG_INF), 0)))
        tl.store(ARRIVE + row, 0)         # ready for the next call / graph replay


@triton.jit
def _gather_kernel(
    X, THRESH, COUNT, CAND_V, CAND_I,
    V, n1, stride0, stride1, CAP,
    BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1)
    r64 = row.to(tl.int64)
    x_row = _row_ptr(X, row, n1, stride0, stride1)
    offs = p * BLOCK + tl.arange(0, BLOCK)
    in_row = offs < V
    x = tl.load(x_row + offs, mask=in_row, other=float("-inf")).to(tl.float32)
    t = tl.load(THRESH + row)
    hit = in_row & (x >= t)
    # One atomic per passing element for its slot, no block-wide count and scan: a span holds
    # ~1 of the row's ~1.2 k' passing elements, so nearly every program had to run the scan
    # (the order of the slots does not matter: _finish_kernel ranks them).
    pos = tl.atomic_add(COUNT + row + tl.zeros([BLOCK], tl.int32), 1, mask=hit, sem="relaxed")
    keep = hit & (pos < CAP)            # past CAP: only counted (_finish_kernel's fallback)
    tl.store(CAND_V + r64 * CAP + pos, x, mask=keep)
    tl.store(CAND_I + r64 * CAP + pos, offs, mask=keep)


@triton.jit
def _exact_candidates(x_row, V, KP, cand_v, cand_i, FB: tl.constexpr):
    """Write exactly the k' first elements of the row in (value desc, id asc) order, unsorted,
    to cand_v / cand_i[0, k'). Reads the row 34 times: for rows whose threshold let more than
    CAP candidates (or fewer than k') through."""
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
        tl.store(cand_v + at, x, mask=sel)
        tl.store(cand_i + at, o, mask=sel)
        pos += tl.sum(sel.to(tl.int32), 0)
        eq_seen += tl.sum(eq, 0)


@triton.jit
def _rank_block(vi, ii, vj, ij, jm):
    """Per i: #{j in the block (mask jm) : j precedes i in (value desc, id asc)}."""
    before = (vj[None, :] > vi[:, None]) | ((vj[None, :] == vi[:, None]) & (ij[None, :] < ii[:, None]))
    return tl.sum((before & jm[None, :]).to(tl.int32), 1)


@triton.jit
def _finish_kernel(
    X, PART_M, PART_S, COUNT, CAND_V, CAND_I, OUT_LP, OUT_ID,
    V, n1, stride0, stride1, P, KP, CAP,
    PB: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr, BS: tl.constexpr, FB: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    row = tl.program_id(0)
    r64 = row.to(tl.int64)
    cand_v = CAND_V + r64 * CAP
    cand_i = CAND_I + r64 * CAP

    # Everything the common case needs is loaded at once, with no load waiting on another: the
    # count, the first BJ candidate slots (slots past the count hold anything and are masked
    # below) and the first PB span partials. The program is a chain of global round trips
    # otherwise (6.6 us for 15 rows with the count, partials and candidates loaded in turn).
    n = tl.load(COUNT + row)
    j = tl.arange(0, BJ)
    vj0 = tl.load(cand_v + j, mask=j < CAP, other=0.0)
    ij0 = tl.load(cand_i + j, mask=j < CAP, other=0)
    o = tl.arange(0, PB)
    m = tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf"))
    s = tl.load(PART_S + r64 * P + o, mask=o < P, other=0.0)

    # log(sum exp(x)) = M + log S over the P span partials.
    M = tl.max(m, 0)
    for p0 in range(PB, P, PB):
        o = p0 + tl.arange(0, PB)
        M = tl.maximum(M, tl.max(tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf")), 0))
    M_safe = tl.where(M == float("-inf"), 0.0, M)
    S = tl.sum(s * tl.exp(m - M_safe), 0)
    for p0 in range(PB, P, PB):
        o = p0 + tl.arange(0, PB)
        m = tl.load(PART_M + r64 * P + o, mask=o < P, other=float("-inf"))
        s = tl.load(PART_S + r64 * P + o, mask=o < P, other=0.0)
        S += tl.sum(s * tl.exp(m - M_safe), 0)
    log_s = tl.log(S)

    # The candidates (all elements >= t) hold the top k' iff there are at least k' of them,
    # whatever t was; more than CAP did not fit. Either way: the exact selection instead.
    fallback = (n > CAP) | (n < KP)
    if fallback:
        _exact_candidates(_row_ptr(X, row, n1, stride0, stride1), V, KP, cand_v, cand_i, FB)
    n = tl.where(fallback, KP, n)
    tl.debug_barrier()    # the fallback's candidate stores, visible to every thread below

    # Rank by counting: rank(i) = #{j : v_j > v_i or (v_j == v_i and id_j < id_i)}. Ids are
    # unique, so ranks are 0 .. n-1 and n >= k' of them: every output slot is written once.
    if (n <= BJ) & (~fallback):
        # One block (the common case: ~1.3 k' candidates): rank the loaded slots among themselves.
        jm = j < n
        rank = _rank_block(vj0, ij0, vj0, ij0, jm)
        w = jm & (rank < KP)
        tl.store(OUT_LP + r64 * KP + rank, (vj0 - M) - log_s, mask=w)
        tl.store(OUT_ID + r64 * KP + rank, ij0.to(tl.int64), mask=w)
    elif n <= BS:
        # Up to BS candidates (rows whose large values share chunks, which loosens the
        # threshold; a fallback's k'): one sort by a packed key, value descending then id
        # ascending, so a slot's place is its rank. Counting would take (n / BJ)^2 blocks.
        q = tl.arange(0, BS)
        qm = q < n
        vq = tl.load(cand_v + q, mask=qm, other=0.0)
        iq = tl.load(cand_i + q, mask=qm, other=0)
        packed = (_key(vq).to(tl.int64) << 32) | (0x7FFFFFFF - iq).to(tl.int64)
        ordered = tl.sort(tl.where(qm, packed, KEY64_EMPTY), descending=True)
        w = q < KP
        tl.store(OUT_LP + r64 * KP + q, (_unkey((ordered >> 32).to(tl.int32)) - M) - log_s, mask=w)
        tl.store(OUT_ID + r64 * KP + q, (0x7FFFFFFF - (ordered & 0x7FFFFFFF)).to(tl.int64), mask=w)
    else:
        for i0 in range(0, n, BI):
            i = i0 + tl.arange(0, BI)
            im = i < n
            vi = tl.load(cand_v + i, mask=im, other=0.0)
            ii = tl.load(cand_i + i, mask=im, other=0)
            rank = tl.zeros([BI], tl.int32)
            for j0 in range(0, n, BJ):
                jj = j0 + tl.arange(0, BJ)
                jm = jj < n
                vj = tl.load(cand_v + jj, mask=jm, other=0.0)
                ij = tl.load(cand_i + jj, mask=jm, other=0)
                rank += _rank_block(vi, ii, vj, ij, jm)
            w = im & (rank < KP)
            tl.store(OUT_LP + r64 * KP + rank, (vi - M) - log_s, mask=w)
            tl.store(OUT_ID + r64 * KP + rank, ii.to(tl.int64), mask=w)


# ---------------------------------------------------------------------------------------------


@dataclass
class Workspace:
    """Per-row scratch of one `topk_logprobs` plan. `arrive` must be zero between calls
    (alloc_workspace zeroes it; every completed call leaves it zero); the rest may hold
    anything."""
    maxima: torch.Tensor      # float32 [rows * C]     chunk maxima
    part_m: torch.Tensor      # float32 [rows * P]     span max
    part_s: torch.Tensor      # float32 [rows * P]     span sum exp(x - max)
    thresh: torch.Tensor      # float32 [rows]
    count: torch.Tensor       # int32 [rows]           candidates appended
    arrive: torch.Tensor      # int32 [rows]           stats programs finished
    cand_v: torch.Tensor      # float32 [rows * CAP]
    cand_i: torch.Tensor      # int32 [rows * CAP]


def _interpreting() -> bool:
    # triton.jit read TRITON_INTERPRET when the kernels were defined: ask them, not the env.
    return not isinstance(_stats_kernel, triton.runtime.JITFunction)


def plan(V: int, k: int, config: dict | None = None) -> dict:
    """Tile sizes for rows of V logits and top-k (host only, no device work).
    `config` overrides BLOCK (elements per program, power of 2), SUB (chunks per program),
    CAP (candidate slots per row), num_warps / finish_warps (for tuning and tests)."""
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
        # ~2k' chunks: the threshold then passes ~1.1-1.4 k' elements of random rows (1.27 k' on
        # average at the loop's shape, 1.12 with 4k' chunks). Fewer maxima to sort won over a
        # few more candidates to rank: 16.0 against 18.6 us on the H200 (kernels/NOTES.md).
        want = min(2 * kp, MAX_CHUNKS)
        sub = min(block, triton.next_power_of_2(triton.cdiv(want, P)))
        while P * sub > MAX_CHUNKS and sub > 1:
            sub //= 2
    if block & (block - 1) or sub & (sub - 1) or sub > block:
        raise ValueError(f"BLOCK ({block}) and SUB ({sub}) must be powers of 2, SUB <= BLOCK")
    C = P * sub
    cap = max(config.pop("CAP", None) or MIN_CAP, kp)
    p = dict(V=V, kp=kp, BLOCK=block, SUB=sub, P=P, C=C, CP=triton.next_power_of_2(C), CAP=cap,
             PB=min(1024, triton.next_power_of_2(P)), BI=64, BJ=128, BS=1024, FB=1024,
             num_warps=4, finish_warps=8)
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


def alloc_workspace(logits: torch.Tensor, k: int, config: dict | None = None) -> Workspace:
    """Scratch for `topk_logprobs(logits-like, k)`: allocate once (outside a CUDA graph) and pass
    it as `workspace=` with the same k and config; reusable across calls of that shape."""
    p = plan(logits.shape[-1], k, config)
    rows = _rows_view(logits)[0] if logits.numel() else 0
    dev = logits.device

    def f32(n):
        return torch.empty(max(n, 1), dtype=torch.float32, device=dev)

    return Workspace(maxima=f32(rows * p["C"]), part_m=f32(rows * p["P"]), part_s=f32(rows * p["P"]),
                     thresh=f32(rows), count=torch.zeros(max(rows, 1), dtype=torch.int32, device=dev),
                     arrive=torch.zeros(max(rows, 1), dtype=torch.int32, device=dev),
                     cand_v=f32(rows * p["CAP"]),
                     cand_i=torch.empty(max(rows * p["CAP"], 1), dtype=torch.int32, device=dev))


def topk_logprobs(logits: torch.Tensor, k: int,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  workspace: Workspace | None = None, config: dict | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_probs float32 [..., k'], ids int64 [..., k']), k' = min(k, V), of logits [..., V]
    (float32 / bf16 / fp16, last dim contiguous): rows sorted descending, ties by lower id,
    log_probs = topk - logsumexp over the whole row. Written into `out` (contiguous) when given;
    `workspace` from `alloc_workspace` with the same k and config. Three launches, no sync."""
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
    if rows > 65535:   # grid dimension 1 (the spans go first: a row's last program comes early)
        raise ValueError(f"at most 65535 rows per call, got {rows}")
    if workspace is None:
        workspace = alloc_workspace(logits, k, config)
    ws = workspace
    need = {"maxima": rows * p["C"], "part_m": rows * p["P"], "part_s": rows * p["P"],
            "thresh": rows, "count": rows, "arrive": rows, "cand_v": rows * p["CAP"],
            "cand_i": rows * p["CAP"]}
    if any(getattr(ws, name).numel() < n for name, n in need.items()):
        raise ValueError("workspace too small for these inputs (alloc_workspace with the same k and config)")

    grid = (p["P"], rows)
    launch = pdl.launch_options(logits.device)
    _stats_kernel[grid](
        logits, ws.maxima, ws.part_m, ws.part_s, ws.thresh, ws.count, ws.arrive,
        V, n1, s0, s1, p["P"], kp,
        BLOCK=p["BLOCK"], SUB=p["SUB"], CP=p["CP"], num_warps=p["num_warps"], **launch)
    _gather_kernel[grid](
        logits, ws.thresh, ws.count, ws.cand_v, ws.cand_i,
        V, n1, s0, s1, p["CAP"],
        BLOCK=p["BLOCK"], num_warps=p["num_warps"], **launch)
    _finish_kernel[(rows,)](
        logits, ws.part_m, ws.part_s, ws.count, ws.cand_v, ws.cand_i, lp, ids,
        V, n1, s0, s1, p["P"], kp, p["CAP"],
        PB=p["PB"], BI=p["BI"], BJ=p["BJ"], BS=p["BS"], FB=p["FB"], num_warps=p["finish_warps"],
        **launch)
    return lp, ids
