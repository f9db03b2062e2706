"""DDTree tree build in one Triton launch: one program per sequence, no host sync.

The algorithm, its exactness argument and the output layout are those of
`harness.decode.tree_gpu` (read its docstring first); this is `_build_torch` fused into one
program, so that a decode step pays one launch instead of a few dozen small ops per depth.
Outputs are bit-identical to `_build_torch`.

Per sequence, with N = budget, D drafted positions, k' = min(k, N), P candidate pairs:
  depth 1        the k' ranks of position 1 (rows arrive sorted)
  depths 2..D    the P pruned extensions (j, r) of the previous beam; those below a cheap bound
                 on the N-th best value (the best corner of an a x b rectangle of extensions with
                 ab >= N) are dropped, typically leaving 1-3 N of them; the survivors are ranked
                 in pop order, (score desc, lexicographic key asc), by counting for each one how
                 many others precede it (tiles of float64 compares: no sort primitive, and ranks
                 are unique because keys are); the N first form the new beam, stored at their
                 rank. Then lex ranks of the new beam and of each member's ancestors, and a merge
                 of the beam into the running N-first list (merge position = own index + how
                 many of the other list precede it).
  nodes          tokens, depths, scores, parents (via a grid -> node map), first child / next
                 sibling (the child of the same parent with rank r-1 links to rank r), ancestor
                 bitmasks by walking parents, the bool visibility from the bitmasks.
Scores are float64 (as the heap's Python floats), stored as float32. The steps communicate
through a small global workspace, separated by `tl.debug_barrier()` (a CTA-wide barrier, which
also makes the global writes of the block visible to the block). The whole build is serial per
sequence (one CTA), so its time is latency: D-1 rounds of a few dependent steps each. Tile
sizes keep ~8 elements per thread (no register spills at N = 16..256 for sm_90, checked with
ptxas); `num_warps` trades parallel compares against the redundant work of small vectors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG_PROB_FLOOR = -1e30   # = harness.decode.tree_gpu.LOG_PROB_FLOOR (log-probs are clamped to it)


@triton.jit
def _tree_build_kernel(
    LP, IDS, PAIR_J, PAIR_R, F64WS, I32WS,
    TOK, DEP, PAR, FC, NS, SCORE, BITS, VIS,
    stride_lp_b, stride_lp_d, stride_ids_b, stride_ids_d,
    N: tl.constexpr, D: tl.constexpr, KP: tl.constexpr, P: tl.constexpr, W: tl.constexpr,
    FLOOR: tl.constexpr,
    PB: tl.constexpr,                     # pow2 >= P candidates
    RBLK: tl.constexpr, QB: tl.constexpr, # rank count tile: survivors x chunk of survivors
    LB: tl.constexpr, MB: tl.constexpr,   # beam / list (pow2 >= N) x chunk of the merge
    DB: tl.constexpr,                     # pow2 >= D
    NB: tl.constexpr, WB: tl.constexpr,   # pow2 >= N + 1 node rows, pow2 >= W words
    RB: tl.constexpr,                     # visibility rows per iteration
):
    NEG = float("-inf")
    pid = tl.program_id(0).to(tl.int64)
    lp_row = LP + pid * stride_lp_b
    ids_row = IDS + pid * stride_ids_b
    # Workspace of this sequence (layout mirrors _workspace_sizes below).
    f64 = F64WS + pid * (PB + D * N + 2 * N)
    cand_score = f64                      # [PB]
    score = f64 + PB                      # [D, N] beam scores, pop order
    best_score = score + D * N            # [2, N] running N-first list, double-buffered
    i32 = I32WS + pid * (2 * PB + 3 * D * N + N + D * N * D + 2 * N + (N + 1) * KP)
    cand_lex = i32                        # [PB] candidates that survive the bound, compacted
    cand_pair = cand_lex + PB             # [PB] their index in the pair table
    parent = cand_pair + PB               # [D, N] parent slot in the previous beam
    rank = parent + D * N                 # [D, N] rank at this depth's position
    node_of = rank + D * N                # [D, N] grid -> node index
    beam_key = node_of + D * N            # [N] lex keys of the beam being built
    lex = beam_key + N                    # [D, N, D] lex rank of the ancestor at each depth
    best_grid = lex + D * N * D           # [2, N] grid id (depth index * N + slot)
    child = best_grid + 2 * N             # [N + 1, KP] (parent node, rank) -> node
    tok_row = TOK + pid * N
    dep_row = DEP + pid * N
    score_row = SCORE + pid * N
    par_row = PAR + pid * (N + 1)
    fc_row = FC + pid * (N + 1)
    ns_row = NS + pid * (N + 1)
    bits_row = BITS + pid * ((N + 1) * W)
    vis_row = VIS + pid * ((N + 1) * (N + 1))

    nd = tl.arange(0, NB)
    nm = nd < N + 1
    tl.store(fc_row + nd, tl.full([NB], -1, tl.int64), mask=nm)
    tl.store(ns_row + nd, tl.full([NB], -1, tl.int64), mask=nm)

    # Depth 1: the k' ranks of position 1, already in pop order; slots >= k' are padding.
    s = tl.arange(0, LB)
    sm = s < N
    y = tl.load(lp_row + s, mask=s < KP, other=0.0).to(tl.float64)
    y = tl.where(s < KP, tl.maximum(y, FLOOR), NEG)
    tl.store(score + s, y, mask=sm)
    tl.store(parent + s, tl.zeros([LB], tl.int32), mask=sm)
    tl.store(rank + s, tl.minimum(s, KP - 1), mask=sm)
    tl.store(lex + s * D, s, mask=sm)
    tl.store(best_score + s, y, mask=sm)
    tl.store(best_grid + s, s, mask=sm)
    tl.debug_barrier()

    p = tl.arange(0, PB)
    pm = p < P
    pj = tl.load(PAIR_J + p, mask=pm, other=0).to(tl.int32)
    pr = tl.load(PAIR_R + p, mask=pm, other=0).to(tl.int32)
    e = tl.arange(0, DB)
    for d in range(1, D):
        prev = d - 1
        # Candidates: beam slot j of depth d x rank r of position d+1.
        lp_d = tl.load(lp_row + d * stride_lp_d + pr, mask=pm, other=0.0).to(tl.float64)
        c = tl.load(score + prev * N + pj, mask=pm, other=NEG) + tl.maximum(lp_d, FLOOR)
        c = tl.where(pm, c, NEG)
        ck = tl.load(lex + (prev * N + pj) * D + prev, mask=pm, other=0) * KP + pr

        # Keep only candidates that can make the cut: any a x b rectangle of extensions
        # (slots < a, ranks < b, ab >= N) holds N values >= its corner, so the N-th best is
        # >= the best corner. Typically 1-3 N of the ~N ln N candidates survive, and ranking
        # costs their square (each a float64 compare: the FP64 pipe is the bottleneck).
        a = s + 1
        b = (N + a - 1) // a
        ok = sm & (b <= KP)
        corner = tl.load(score + prev * N + s, mask=ok, other=NEG) + \
            tl.maximum(tl.load(lp_row + d * stride_lp_d + b - 1, mask=ok, other=0.0).to(tl.float64), FLOOR)
        tau = tl.max(tl.where(ok, corner, NEG), axis=0)
        live = pm & (c >= tau)
        slot = tl.cumsum(live.to(tl.int32), axis=0) - 1
        M = tl.sum(live.to(tl.int32), axis=0)                 # >= N (or all P if tau = -inf)
        tl.store(cand_score + slot, c, mask=live)
        tl.store(cand_lex + slot, ck, mask=live)
        tl.store(cand_pair + slot, p, mask=live)
        tl.debug_barrier()

        # Pop-order rank of each survivor = how many survivors precede it (keys are unique).
        for r0 in range(0, M, RBLK):
            rows = r0 + tl.arange(0, RBLK)
            rm = rows < M
            cr = tl.load(cand_score + rows, mask=rm, other=NEG)
            kr = tl.load(cand_lex + rows, mask=rm, other=0)
            acc = tl.zeros([RBLK, QB], dtype=tl.int32)
            for q0 in range(0, M, QB):
                q = q0 + tl.arange(0, QB)
                qm = q < M
                cq = tl.load(cand_score + q, mask=qm, other=NEG)
                kq = tl.load(cand_lex + q, mask=qm, other=0)
                before = (cq[None, :] > cr[:, None]) | ((cq[None, :] == cr[:, None]) & (kq[None, :] < kr[:, None]))
                acc += (before & qm[None, :]).to(tl.int32)
            pos = tl.sum(acc, axis=1)
            keep = rm & (pos < N)
            pair = tl.load(cand_pair + rows, mask=keep, other=0)
            tl.store(score + d * N + pos, cr, mask=keep)
            tl.store(parent + d * N + pos, tl.load(PAIR_J + pair, mask=keep, other=0).to(tl.int32), mask=keep)
            tl.store(rank + d * N + pos, tl.load(PAIR_R + pair, mask=keep, other=0).to(tl.int32), mask=keep)
            tl.store(beam_key + pos, kr, mask=keep)
        tl.debug_barrier()

        # Lex rank of each new beam slot among the beam, and its ancestors' (from the parent).
        bk = tl.load(beam_key + s, mask=sm, other=0)
        acc_lex = tl.zeros([LB, MB], dtype=tl.int32)
        for t0 in range(0, N, MB):
            t = t0 + tl.arange(0, MB)
            kt = tl.load(beam_key + t, mask=t < N, other=0)
            acc_lex += ((kt[None, :] < bk[:, None]) & (t < N)[None, :]).to(tl.int32)
        lr = tl.sum(acc_lex, axis=1)
        par_slot = tl.load(parent + d * N + s, mask=sm, other=0)
        anc = tl.load(lex + (prev * N + par_slot)[:, None] * D + e[None, :],
                      mask=sm[:, None] & (e < d)[None, :], other=0)
        anc = tl.where((e == d)[None, :], lr[:, None], anc)
        tl.store(lex + (d * N + s)[:, None] * D + e[None, :], anc, mask=sm[:, None] & (e <= d)[None, :])
        tl.debug_barrier()

        # Merge the beam into the running list. Beam node t precedes list node i iff its score
        # is higher, or equal with its ancestor at i's depth lex-smaller than i (equal: i is
        # that ancestor, a prefix, and goes first). Padding (-inf) precedes nothing. Each side
        # counts the other side's entries that precede it (same predicate, both ways round).
        src = prev % 2
        dst = d % 2
        gs = tl.load(best_score + src * N + s, mask=sm, other=NEG)
        gg = tl.load(best_grid + src * N + s, mask=sm, other=0)
        ge = gg // N
        glex = tl.load(lex + gg * D + ge, mask=sm, other=0)
        acc_g = tl.zeros([LB, MB], dtype=tl.int32)
        for t0 in range(0, N, MB):
            t = t0 + tl.arange(0, MB)
            tm = t < N
            bs = tl.load(score + d * N + t, mask=tm, other=NEG)
            tie = (bs[None, :] == gs[:, None]) & (bs > NEG)[None, :] & sm[:, None] & tm[None, :]
            alex = tl.load(lex + (d * N + t)[None, :] * D + ge[:, None], mask=tie, other=0)
            beam_first = (bs > NEG)[None, :] & ((gs == NEG)[:, None] | (bs[None, :] > gs[:, None]) |
                                               (tie & (alex < glex[:, None])))
            acc_g += (beam_first & tm[None, :]).to(tl.int32)
        gpos = s + tl.sum(acc_g, axis=1)
        bsr = tl.load(score + d * N + s, mask=sm, other=NEG)
        acc_b = tl.zeros([LB, MB], dtype=tl.int32)
        for i0 in range(0, N, MB):
            i = i0 + tl.arange(0, MB)
            im = i < N
            gsc = tl.load(best_score + src * N + i, mask=im, other=NEG)
            ggc = tl.load(best_grid + src * N + i, mask=im, other=0)
            gec = ggc // N
            glexc = tl.load(lex + ggc * D + gec, mask=im, other=0)
            tie = (bsr[:, None] == gsc[None, :]) & (bsr > NEG)[:, None] & sm[:, None] & im[None, :]
            alex = tl.load(lex + (d * N + s)[:, None] * D + gec[None, :], mask=tie, other=0)
            beam_first = (bsr > NEG)[:, None] & ((gsc == NEG)[None, :] | (bsr[:, None] > gsc[None, :]) |
                                                (tie & (alex < glexc[None, :])))
            acc_b += tl.where(beam_first, 0, 1) * im[None, :].to(tl.int32)
        bpos = s + tl.sum(acc_b, axis=1)
        tl.store(best_score + dst * N + gpos, gs, mask=sm & (gpos < N))
        tl.store(best_grid + dst * N + gpos, gg, mask=sm & (gpos < N))
        tl.store(best_score + dst * N + bpos, bsr, mask=sm & (bpos < N))
        tl.store(best_grid + dst * N + bpos, d * N + s, mask=sm & (bpos < N))
        tl.debug_barrier()

    # Nodes 1..N in pop order.
    fin = (D - 1) % 2
    sc = tl.load(best_score + fin * N + s, mask=sm, other=NEG)
    g = tl.load(best_grid + fin * N + s, mask=sm, other=0)
    real = sm & (sc > NEG)
    d0 = g // N
    r = tl.load(rank + g, mask=sm, other=0)
    js = tl.load(parent + g, mask=sm, other=0)
    tok = tl.load(ids_row + d0 * stride_ids_d + r, mask=real, other=0)
    tl.store(tok_row + s, tok, mask=sm)
    tl.store(dep_row + s, tl.where(real, d0 + 1, 0), mask=sm)
    tl.store(score_row + s, sc.to(tl.float32), mask=sm)
    tl.store(node_of + g, s + 1, mask=real)
    tl.debug_barrier()
    par = tl.load(node_of + (d0 - 1) * N + js, mask=real & (d0 > 0), other=0)
    par = tl.where(real, par, -1)
    tl.store(par_row + 1 + s, par, mask=sm)
    tl.store(par_row + s, tl.full([LB], -1, tl.int64), mask=s == 0)
    tl.store(child + par * KP + r, s + 1, mask=real)
    tl.debug_barrier()
    # Children of a node are its ranks 0, 1, ... (pop order): rank 0 is the first child and
    # rank r-1 links to rank r.
    older = tl.load(child + par * KP + r - 1, mask=real & (r > 0), other=0)
    tl.store(fc_row + par, s + 1, mask=real & (r == 0))
    tl.store(ns_row + older, s + 1, mask=real & (r > 0))

    # Ancestor bitmasks: walk each row's parents (depth <= D), OR-ing one bit per node.
    w = tl.arange(0, WB)
    acc = tl.zeros([NB, WB], dtype=tl.int32)
    cur = nd
    alive = nm
    for _ in range(D + 1):
        safe = tl.maximum(cur, 0)
        hit = alive[:, None] & ((safe // 32)[:, None] == w[None, :])
        acc = acc | tl.where(hit, (1 << (safe % 32))[:, None], 0)
        cur = tl.load(par_row + safe, mask=alive, other=-1).to(tl.int32)
        alive = alive & (cur >= 0)
    tl.store(bits_row + nd[:, None] * W + w[None, :], acc, mask=nm[:, None] & (w < W)[None, :])
    tl.debug_barrier()

    # Bool visibility, read back from the bitmasks.
    jm = nm
    for r0 in range(0, N + 1, RB):
        rows = r0 + tl.arange(0, RB)
        m = (rows < N + 1)[:, None] & jm[None, :]
        word = tl.load(bits_row + rows[:, None] * W + (nd // 32)[None, :], mask=m, other=0)
        bit = (word >> (nd % 32)[None, :]) & 1
        tl.store(vis_row + rows[:, None] * (N + 1) + nd[None, :], bit != 0, mask=m)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _workspace_sizes(N: int, D: int, KP: int, PB: int) -> tuple[int, int]:
    """Per-sequence workspace: float64 and int32 elements (mirrors the kernel's layout)."""
    return PB + D * N + 2 * N, 2 * PB + 3 * D * N + N + D * N * D + 2 * N + (N + 1) * KP


def launch_config(N: int, D: int, k: int, P: int, num_warps: int | None = None) -> dict:
    """The kernel's constexprs and num_warps for budget N, D positions, k ranks, P pairs."""
    if num_warps is None:
        num_warps = 4 if N <= 32 else 8 if N <= 64 else 16
    # Tiles of ~8 elements per thread: with 64-bit scores and pointers, more spills registers
    # (checked with ptxas for sm_90 at N = 16..256).
    lanes = 32 * 8 * num_warps
    W = (N + 1 + 31) // 32
    PB, LB, NB = _pow2(P), _pow2(N), _pow2(N + 1)
    RBLK = min(PB, 2 * LB)                            # survivors are typically 1-3 N
    return dict(N=N, D=D, KP=min(k, N), P=P, W=W, FLOOR=LOG_PROB_FLOOR,
                PB=PB, RBLK=RBLK, QB=max(1, lanes // RBLK),
                LB=LB, MB=max(1, min(LB, lanes // LB)), DB=_pow2(D),
                NB=NB, WB=_pow2(W), RB=max(1, min(NB, lanes // NB)), num_warps=num_warps)


def build_tree(log_probs: torch.Tensor, token_ids: torch.Tensor, budget: int,
               pair_j: torch.Tensor, pair_r: torch.Tensor, out, num_warps: int | None = None) -> None:
    """Write the trees of log_probs / token_ids [b, D, k] into `out` (a tree_gpu.GpuTree of
    contiguous tensors). pair_j / pair_r: tree_gpu.candidate_pairs(budget, min(k, budget))."""
    b, D, k = log_probs.shape
    lp = log_probs if log_probs.stride(-1) == 1 else log_probs.contiguous()
    ids = token_ids if token_ids.stride(-1) == 1 else token_ids.contiguous()
    outs = (out.tokens, out.depths, out.parents, out.first_child, out.next_sibling, out.scores,
            out.bits, out.visibility)
    if not all(t.is_contiguous() and t.device == lp.device for t in outs):
        raise ValueError("out tensors must be contiguous and on the inputs' device")
    cfg = launch_config(budget, D, k, pair_j.numel(), num_warps)
    n64, n32 = _workspace_sizes(budget, D, cfg["KP"], cfg["PB"])
    f64ws = torch.empty(b * n64, dtype=torch.float64, device=lp.device)
    i32ws = torch.empty(b * n32, dtype=torch.int32, device=lp.device)
    _tree_build_kernel[(b,)](
        lp, ids, pair_j, pair_r, f64ws, i32ws, *outs,
        lp.stride(0), lp.stride(1), ids.stride(0), ids.stride(1), **cfg)
