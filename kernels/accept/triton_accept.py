"""The accept phase of a speculative step in two Triton launches.

Given the verify forward's logits [b, T, V] over a tree of T nodes (root first), the step must
find the target's argmax at every node, the accepted path (node i is accepted iff every node on
its root path carries the target's argmax at its parent), the next bonus token, the record the
host reads, and the KV slots the commit moves. With tensor ops that is ~30 kernels of 1-2 µs
each, plus torch's argmax over the 65 x 151936 logits (24 µs), each boundary idling ~0.4 µs
(an H200 trace of graph-captured decoding at 4096 keys, kernels/NOTES.md). Here:

  1. `_argmax_kernel`, grid (spans, rows = b T): program p reads columns [p BLOCK, (p+1) BLOCK)
     of its row and writes the span's largest value and the first column holding it.
  2. `_accept_kernel`, one program for the whole batch: per sequence, the row's argmax from the
     partials (the largest value; among equal ones the lowest column, which is torch.argmax's
     first maximal value), then the path, exactly as `harness.decode.fast.accept_path` computes
     it with tensor ops (the reference this is tested against; the ancestor test on the verify's
     tree-mask bits instead of the [T, T] visibility), then the bookkeeping: the bonus
     token, the record [accepted, tokens...], the commit's source and destination slots, and the
     lengths and step index advanced. One program because the step index is read by every
     sequence (synthetic acceptance) and advanced once, and a batch is a few sequences.

NaN logits count as +inf (torch.argmax ranks NaN above everything; where a row holds both,
the first of either may differ). No host sync and no allocation beyond the workspace, so a CUDA
graph captures it. Dtype-generic: the tests run it under TRITON_INTERPRET=1 on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from harness.kernels import pdl

BLOCK = 4096          # columns per argmax program: 38 spans a row at V = 151936 (kernels/NOTES.md)
BIG = tl.constexpr(2147483647)


@triton.jit
def _argmax_kernel(X, PART_V, PART_I, V, n1, stride0, stride1, P,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    p = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    x_row = X + (row // n1) * stride0 + (row % n1) * stride1
    cols = p * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)
    m = tl.max(x, 0)
    first = tl.min(tl.where((x == m) & (cols < V), cols, BIG), 0)
    tl.store(PART_V + row * P + p, m)
    tl.store(PART_I + row * P + p, first)


@triton.jit
def _follows(s, b, T, TREE_IDS, PARENTS, FIRST_CHILD, NEXT, SYNTHETIC: tl.constexpr):
    """Whether node s follows its parent: its token is the target's argmax there (greedy), or
    it is the parent's first child (synthetic: the drafter's best chain). The root always."""
    ok = s < T
    parent = tl.maximum(tl.load(PARENTS + b * T + s, mask=ok, other=0), 0)
    if SYNTHETIC:
        f = tl.load(FIRST_CHILD + b * T + parent, mask=ok, other=-1) == s
    else:
        f = tl.load(TREE_IDS + b * T + s, mask=ok, other=-1) == tl.load(NEXT + b * T + parent, mask=ok, other=-2)
    return f | (s == 0)


@triton.jit
def _accept_kernel(PART_V, PART_I, NEXT, TREE_IDS, PARENTS, FIRST_CHILD, DEPTH, BITS, DRAWS,
                   LENGTHS, STEP, BONUS, RECORD, IDX, SRC, DST,
                   nb, T, W, B, P, n_draws,
                   TB: tl.constexpr, PB: tl.constexpr, BP: tl.constexpr,
                   SYNTHETIC: tl.constexpr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    step = tl.load(STEP)
    d = tl.arange(0, BP)
    pp = tl.arange(0, PB)
    WB: tl.constexpr = TB // 32               # ancestor-mask words of a block of TB nodes
    for b in range(0, nb):
        # The target's argmax at every node, from the spans' partials.
        for t0 in range(0, T, TB):
            t = t0 + tl.arange(0, TB)
            ok = (t < T)[:, None] & (pp < P)[None, :]
            at = (b * T + t)[:, None].to(tl.int64) * P + pp[None, :]
            v = tl.load(PART_V + at, mask=ok, other=float("-inf"))
            i = tl.load(PART_I + at, mask=ok, other=BIG)
            best = tl.max(v, 1)
            nxt = tl.min(tl.where(v == best[:, None], i, BIG), 1)
            tl.store(NEXT + b * T + t, nxt.to(tl.int64), mask=t < T)
        tl.debug_barrier()          # the gathers below read other threads' NEXT

        # On the path iff the node and all its ancestors follow: no bit of its ancestor mask
        # (BITS, the verify's tree mask: bit s of row t set iff s is t or an ancestor) falls on
        # a node that does not follow. Those nodes form one chain from the root. Per depth:
        # whether the chain reaches it, and its node there (the first such node; 0 when none,
        # as argmax of zeros).
        reach = tl.zeros([BP], tl.int32)
        chain = tl.full([BP], BIG, tl.int32)
        for t0 in range(0, T, TB):
            t = t0 + tl.arange(0, TB)
            bad = tl.zeros([TB], tl.int32)
            for s0 in range(0, T, TB):
                s = s0 + tl.arange(0, TB)
                fol = _follows(s, b, T, TREE_IDS, PARENTS, FIRST_CHILD, NEXT, SYNTHETIC)
                # The block's "does not follow" bits as WB words (distinct bits: sum == or).
                lost = tl.reshape((~fol & (s < T)).to(tl.int32), (WB, 32))
                words = tl.sum(lost << tl.arange(0, 32)[None, :], 1)
                w = s0 // 32 + tl.arange(0, WB)
                mask = tl.load(BITS + (b * T + t)[:, None].to(tl.int64) * W + w[None, :],
                               mask=(t < T)[:, None] & (w < W)[None, :], other=0)
                bad |= tl.max(((mask & words[None, :]) != 0).to(tl.int32), 1)
            on = (bad == 0) & (t < T)
            depth = tl.load(DEPTH + b * T + t, mask=t < T, other=-1)
            hit = on[None, :] & (depth[None, :] == d[:, None])                 # [BP, TB]
            reach |= tl.max(hit.to(tl.int32), 1)
            chain = tl.minimum(chain, tl.min(tl.where(hit, t[None, :], BIG), 1))
        chain = tl.where(chain == BIG, 0, chain)
        ok = (reach != 0) & (d < B)
        if SYNTHETIC:
            # Cut at this step's drawn length (cyclic draws: a long run never indexes past them).
            want = tl.load(DRAWS + (step % n_draws) * nb + b)
            ok &= d < want
        accepted = tl.sum(ok.to(tl.int32), 0)
        last = tl.sum(tl.where(d == accepted - 1, chain, 0), 0)
        idx = tl.where(ok, chain, last)

        length = tl.load(LENGTHS + b)
        tl.store(BONUS + b, tl.load(NEXT + b * T + last))
        tl.store(RECORD + b * (1 + B), accepted.to(tl.int64))
        tl.store(RECORD + b * (1 + B) + 1 + d, tl.load(TREE_IDS + b * T + idx, mask=d < B), mask=d < B)
        tl.store(IDX + b * B + d, idx.to(tl.int64), mask=d < B)
        tl.store(SRC + b * B + d, length + idx, mask=d < B)
        tl.store(DST + b * B + d, length + d, mask=d < B)
        tl.store(LENGTHS + b, length + accepted)
    tl.store(STEP, step + 1)


@dataclass
class Workspace:
    """Scratch of one (batch, tree size, vocabulary) shape: the spans' partials and the argmax."""
    part_v: torch.Tensor
    part_i: torch.Tensor
    next: torch.Tensor       # [b, T] the target's argmax at each node (an output too)


def alloc_workspace(batch: int, T: int, V: int, device) -> Workspace:
    """Allocate once, outside a CUDA graph capture, and pass to every `accept` of the shape."""
    P = triton.cdiv(V, BLOCK)
    return Workspace(part_v=torch.empty(batch * T * P, dtype=torch.float32, device=device),
                     part_i=torch.empty(batch * T * P, dtype=torch.int32, device=device),
                     next=torch.empty(batch, T, dtype=torch.long, device=device))


def accept(logits: torch.Tensor, *, tree_ids, parents, first_child, depth, bits, lengths,
           step_index, bonus, record, idx, src, dst, draws: torch.Tensor | None,
           workspace: Workspace, overlap: bool = True) -> None:
    """The accept and the commit's bookkeeping of one step, in place (no host sync).

    In: logits [b, T, V] (last dim contiguous), the tree [b, T] (tree_ids, parents (root -1),
    first_child, depth) and its ancestor masks bits [b, T, ceil(T / 32)] int32 (bit s of row t:
    s is t or an ancestor of t; attention.visibility_bits, the verify's tree mask), int64 lengths
    [b] and step_index [1], draws [n, b] (synthetic acceptance; None: greedy). Out: bonus [b],
    record [b, 1 + B] (accepted length, then the tokens of idx), idx [b, B] (the accepted node at
    each depth, padded with the last one), src / dst [b, B] (the KV slots lengths + idx and
    lengths + d the commit moves), lengths advanced by the accepted length, step_index by one.
    `overlap`: whether the first launch may overlap the kernel before (pdl.launch_options;
    false after the verify's lm_head on cuBLAS, which does not trigger its dependents)."""
    b, T, V = logits.shape
    B = idx.shape[1]
    if logits.stride(-1) != 1:
        raise ValueError("logits need a contiguous last dimension")
    for name, t, shape in (("tree_ids", tree_ids, (b, T)), ("parents", parents, (b, T)),
                           ("first_child", first_child, (b, T)), ("depth", depth, (b, T)),
                           ("bits", bits, (b, T, (T + 31) // 32)), ("lengths", lengths, (b,)),
                           ("step_index", step_index, (1,)), ("bonus", bonus, (b,)),
                           ("record", record, (b, 1 + B)), ("idx", idx, (b, B)),
                           ("src", src, (b, B)), ("dst", dst, (b, B))):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous {shape}, got {tuple(t.shape)}")
    P = triton.cdiv(V, BLOCK)
    if workspace.part_v.numel() < b * T * P or tuple(workspace.next.shape) != (b, T):
        raise ValueError("workspace of another shape (alloc_workspace with this batch, T and V)")
    launch = pdl.launch_options(logits.device)
    _argmax_kernel[(P, b * T)](logits, workspace.part_v, workspace.part_i, V, T,
                               logits.stride(0), logits.stride(1), P, BLOCK=BLOCK, num_warps=4,
                               **pdl.launch_options(logits.device, overlap))
    synthetic = draws is not None
    _accept_kernel[(1,)](workspace.part_v, workspace.part_i, workspace.next, tree_ids, parents,
                         first_child, depth, bits, draws if synthetic else lengths,
                         lengths, step_index, bonus, record, idx, src, dst,
                         b, T, bits.shape[2], B, P, draws.shape[0] if synthetic else 1,
                         TB=max(32, min(triton.next_power_of_2(T), 128)), PB=triton.next_power_of_2(P),
                         BP=triton.next_power_of_2(B), SYNTHETIC=synthetic, num_warps=4, **launch)
