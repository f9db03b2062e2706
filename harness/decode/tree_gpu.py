"""DDTree draft-tree construction on the device: fixed shapes, no host sync, graph-capturable.

`tree.build_tree_cpu` pops nodes from a heap in the order of the key
    (-cumulative log-prob, rank path)          rank path compared lexicographically,
so its tree is the N first nodes of that total order (children and later siblings never precede
a node, so the heap's frontier always holds the next one). This module computes the same N
nodes, in the same order, with fixed-shape tensor work:

  1. Beam per depth. The N first depth-d nodes all extend the N first depth-(d-1) nodes: if a
     node's parent were not among them, N depth-(d-1) nodes would precede the parent, and
     their children with the node's last rank would precede the node. Among the N x k'
     extensions (k' = min(k, N)) of beam slot j by rank r, only pairs with (j+1)(r+1) <= N
     can make the cut: every (j' <= j, r' <= r) precedes (j, r), because beams and log-prob
     rows are sorted. That leaves ~N ln N candidates per depth; ranking them and keeping N
     is the sequential part (D-1 steps).
  2. Merge. Beams are sorted, so the N first nodes overall come from D-1 merges of sorted
     lists of N (each position = own index + how many entries of the other list precede it).
  3. Tree arrays. Parents come from the beam's parent slots; a node's children are the ranks
     0, 1, ... of its parent's extensions, so first_child = rank 0 child and next_sibling =
     rank r+1 child; visibility by gathering parent rows (depth <= D).

Ties are broken exactly as the heap breaks them (same-depth: parent's lexicographic rank, then
rank; across depths: compare the deeper node's ancestor at the shallower depth, a prefix going
first), and scores are accumulated in float64 like the heap's Python floats (a sum of a few
float32 log-probs is exact in float64 unless they span some 29 binades). So the tree equals the
heap's node for node, bf16 ties included, not just as a set. `scores` are returned in float32.

Fewer candidates than the budget (sum_d k'^d < N, e.g. a tiny vocabulary): the heap builds
fewer nodes; here the shapes stay [b, N] and nodes n+1..N are padding, exactly like the
baseline loop pads a short tree: token 0, depth 0, parent -1, no links, score -inf, visibility
self only. Nothing links to a padding node and no real node sees one, so the accept walk can
never reach one and the verify mask never shows one to a real query. n = `num_real_nodes(...)`
is static, so the padding sits in fixed columns. Log-probs below -1e30 (-inf from masked logits)
are clamped to -1e30 so that real nodes always rank above padding (the heap, where all such
nodes tie at -inf, may then order them differently).

Three implementations of the same algorithm, bit-identical outputs (`impl=`; a decoder passes
its Kernels.tree_build):
  * "torch", `_build_torch`: plain tensor ops, runs on any device (CPU tests, the reference);
  * "triton", harness.kernels.tree.triton_tree_build: one Triton program per sequence (one launch),
    the CUDA default, for the 30 µs budget of a decode step;
  * "cuda", harness.kernels.tree.cuda_tree_build: one CUDA C++ kernel that pops the N nodes in
    this order directly, by one warp with the heap's frontier in its registers (N <= 256, D <= 16).
All need log-prob rows sorted descending (as `topk_logprobs_batched` returns them). The pair
table (torch, Triton) is cached per (N, k', device): call once before CUDA-graph capture (any
warm-up does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from harness.decode.attention import visibility_bits

LOG_PROB_FLOOR = -1e30  # real nodes stay finite (D * floor >> float64 min), padding is -inf
NEG_INF = float("-inf")


@dataclass
class GpuTree:
    """A batch of trees with fixed shapes, on the input's device. Node 0 is the root."""

    tokens: torch.Tensor        # [b, N] int64, node i+1 <-> tokens[:, i] (padding: 0)
    depths: torch.Tensor        # [b, N] int64, 1-based (padding: 0)
    parents: torch.Tensor       # [b, N+1] int64, parents[:, 0] = -1, parents[:, i] < i (padding: -1)
    first_child: torch.Tensor   # [b, N+1] int64, -1 = none
    next_sibling: torch.Tensor  # [b, N+1] int64, -1 = none; siblings in score (pop) order
    visibility: torch.Tensor    # [b, N+1, N+1] bool, ancestors and self
    bits: torch.Tensor          # [b, N+1, W] int32 = attention.visibility_bits(visibility)
    scores: torch.Tensor        # [b, N] float32 cumulative log-prob (padding: -inf)

    @staticmethod
    def empty(batch: int, budget: int, device) -> "GpuTree":
        """Preallocated outputs for `build_tree_gpu(..., out=)` (static addresses for graphs)."""
        T, W = budget + 1, (budget + 1 + 31) // 32
        L = lambda *s: torch.empty(*s, dtype=torch.long, device=device)  # noqa: E731
        return GpuTree(L(batch, budget), L(batch, budget), L(batch, T), L(batch, T), L(batch, T),
                       torch.empty(batch, T, T, dtype=torch.bool, device=device),
                       torch.empty(batch, T, W, dtype=torch.int32, device=device),
                       torch.empty(batch, budget, dtype=torch.float32, device=device))


def _on_triton(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can take `t`: a CUDA tensor, or any under TRITON_INTERPRET=1."""
    if t.is_cuda:
        return True
    from harness.kernels.tree import triton_topk
    return triton_topk._interpreting()


# One workspace per (shape, k, device): the decode loop calls from one stream, so calls never
# overlap (two concurrent calls on one workspace would race).
_TOPK_WORKSPACES: dict = {}


def topk_logprobs_batched(draft_logits: torch.Tensor, k: int,
                          impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """[b, D, V] logits -> (log_probs [b, D, k'] float32, ids [b, D, k'] int64), k' = min(k, V),
    rows sorted descending, log_probs = topk - logsumexp over the full vocabulary in float32:
    the same ops as `tree.topk_logprobs`, batched. impl "triton" (a decoder's Kernels.topk):
    the Triton kernel where Triton can run (CUDA tensors, or any under TRITON_INTERPRET=1),
    exact, equal log-probs to within float32 rounding of the normaliser; torch elsewhere."""
    if impl not in ("torch", "triton"):
        raise ValueError(f"impl must be torch or triton (got {impl!r})")
    if impl == "triton" and _on_triton(draft_logits):
        from harness.kernels.tree import triton_topk
        key = (tuple(draft_logits.shape), int(k), str(draft_logits.device))
        if key not in _TOPK_WORKSPACES:   # first call outside a graph capture (any warm-up)
            _TOPK_WORKSPACES[key] = triton_topk.alloc_workspace(draft_logits, k)
        return triton_topk.topk_logprobs(draft_logits, k, workspace=_TOPK_WORKSPACES[key])
    logits = draft_logits.float()
    k = min(int(k), logits.shape[-1])
    top_logits, token_ids = torch.topk(logits, k=k, dim=-1)
    return top_logits - torch.logsumexp(logits, dim=-1, keepdim=True), token_ids


def num_real_nodes(depth_limit: int, k: int, budget: int) -> int:
    """Nodes the heap builds: min(budget, sum_{d=1..D} k^d). The rest of a GpuTree is padding."""
    total, level = 0, 1
    for _ in range(depth_limit):
        level *= k
        total += level
        if total >= budget:
            return budget
    return total


_PAIRS: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def candidate_pairs(budget: int, kp: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(parent slot j, rank r) with (j+1)(r+1) <= budget, r < kp: int64 [P] each, cached."""
    key = (budget, kp, str(torch.device(device)))
    if key not in _PAIRS:
        pairs = [(j, r) for j in range(budget) for r in range(min(kp, budget // (j + 1)))]
        t = torch.tensor(pairs, dtype=torch.long).T
        _PAIRS[key] = (t[0].contiguous().to(device), t[1].contiguous().to(device))
    return _PAIRS[key]


def build_tree_gpu(log_probs: torch.Tensor, token_ids: torch.Tensor, budget: int,
                   out: GpuTree | None = None, impl: str = "auto") -> GpuTree:
    """Build the DDTree of every sequence: log_probs [b, D, k] (rows sorted descending, any
    float dtype), token_ids [b, D, k]. Returns a GpuTree with N = budget nodes per sequence
    (written into `out` when given). impl: "torch", "triton" (CUDA), "cuda" (CUDA C++ kernel,
    N <= 256, D <= 16) or "auto" (triton on CUDA, torch elsewhere: what a decoder with the
    default Kernels builds with)."""
    if log_probs.dim() != 3 or token_ids.shape != log_probs.shape:
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and token_ids "
                         f"{tuple(token_ids.shape)} must both be [b, D, k]")
    b, D, k = log_probs.shape
    if budget < 1 or D < 1 or k < 1:
        raise ValueError(f"need budget >= 1, D >= 1 and k >= 1 (got {budget}, {D}, {k})")
    if out is None:
        out = GpuTree.empty(b, budget, log_probs.device)
    if impl == "auto":
        impl = "triton" if log_probs.is_cuda else "torch"
    if impl in ("triton", "cuda"):
        if impl == "triton":
            from harness.kernels.tree.triton_tree_build import build_tree as triton_build
            J, R = candidate_pairs(budget, min(k, budget), log_probs.device)
            build_tree = lambda lp, ids, n, o: triton_build(lp, ids, n, J, R, o)  # noqa: E731
        else:
            from harness.kernels.tree.cuda_tree_build import build_tree
        # The kernels write rows densely: a field the caller passed as a strided view is built
        # in a dense temporary and copied into it; the others are written in place.
        strided = [f.name for f in dataclasses.fields(GpuTree)
                   if not getattr(out, f.name).is_contiguous()]
        dense = dataclasses.replace(out, **{n: torch.empty_like(getattr(out, n),
                                                                memory_format=torch.contiguous_format)
                                            for n in strided})
        build_tree(log_probs, token_ids, budget, dense)
        for n in strided:
            getattr(out, n).copy_(getattr(dense, n))
        return out
    if impl != "torch":
        raise ValueError(f"impl must be auto, torch, triton or cuda (got {impl!r})")
    return _build_torch(log_probs, token_ids, budget, out)


def _build_torch(log_probs: torch.Tensor, token_ids: torch.Tensor, N: int, out: GpuTree) -> GpuTree:
    b, D, k = log_probs.shape
    kp = min(k, N)
    dev = log_probs.device
    J, R = candidate_pairs(N, kp, dev)
    lp = log_probs[..., :kp].double().clamp_min(LOG_PROB_FLOOR)        # [b, D, k']
    slots = torch.arange(N, device=dev)

    # Beams: score, parent slot, rank, and lexicographic rank of every ancestor (lex[:, d, s, e]
    # = lex rank at depth e of the depth-e ancestor of slot s of depth d), all sorted by pop order.
    score = torch.full((b, D, N), NEG_INF, dtype=torch.float64, device=dev)
    parent = torch.zeros(b, D, N, dtype=torch.long, device=dev)
    rank = torch.zeros(b, D, N, dtype=torch.long, device=dev)
    lex = torch.zeros(b, D, N, D, dtype=torch.long, device=dev)
    score[:, 0, :kp] = lp[:, 0]                         # depth 1: the k' ranks, already in order
    rank[:, 0] = slots.clamp(max=kp - 1)                # (slots >= k' are padding)
    lex[:, 0, :, 0] = slots
    best_score, best_grid = score[:, 0].clone(), slots.expand(b, N)     # N first so far
    for d in range(1, D):
        cand = score[:, d - 1][:, J] + lp[:, d][:, R]                   # [b, P]
        cand_lex = lex[:, d - 1, :, d - 1][:, J] * kp + R               # same parent: rank order
        by_lex = cand_lex.argsort(dim=1, stable=True)
        by_score = cand.gather(1, by_lex).argsort(dim=1, descending=True, stable=True)
        top = by_lex.gather(1, by_score)[:, :N]                         # pop order, N first
        score[:, d] = cand.gather(1, top)
        parent[:, d] = J[top]
        rank[:, d] = R[top]
        beam_lex = cand_lex.gather(1, top).argsort(dim=1).argsort(dim=1)
        lex[:, d] = lex[:, d - 1].gather(1, parent[:, d, :, None].expand(b, N, D))
        lex[:, d, :, d] = beam_lex
        best_score, best_grid = _merge(best_score, best_grid, score[:, d], lex, d, N)

    # Nodes 1..N in pop order; grid id = depth index * N + beam slot.
    valid = best_score > NEG_INF
    g = best_grid
    d0 = g // N
    node_rank = rank.view(b, D * N).gather(1, g)
    node_parent_slot = parent.view(b, D * N).gather(1, g)
    zero = torch.zeros((), dtype=torch.long, device=dev)
    out.tokens.copy_(torch.where(valid, token_ids.reshape(b, D * k).gather(1, d0 * k + node_rank), zero))
    out.depths.copy_(torch.where(valid, d0 + 1, zero))
    out.scores.copy_(best_score)
    node_of_grid = torch.zeros(b, D * N, dtype=torch.long, device=dev).scatter_(
        1, g, (slots + 1).expand(b, N))
    par = node_of_grid.gather(1, (d0 - 1).clamp(min=0) * N + node_parent_slot)
    par = torch.where(valid, torch.where(d0 == 0, zero, par), zero - 1)
    parents = torch.cat([torch.full((b, 1), -1, dtype=torch.long, device=dev), par], 1)
    out.parents.copy_(parents)

    # Children of p are its ranks 0, 1, ... in pop order: child[p, r] = node.
    width = kp + 1                                       # column k' stays -1: no next sibling
    dump = (N + 1) * width                               # padding nodes write here
    child = torch.full((b, dump + 1), -1, dtype=torch.long, device=dev)
    key = torch.where(valid, par * width + node_rank, dump)
    child.scatter_(1, key, (slots + 1).expand(b, N))
    out.first_child.copy_(child[:, :dump].view(b, N + 1, width)[:, :, 0])
    nxt = torch.where(valid, child.gather(1, torch.where(valid, key + 1, dump)), zero - 1)
    out.next_sibling[:, 0] = -1
    out.next_sibling[:, 1:] = nxt

    # Visibility: row i = row parent(i) | {i}; D rounds reach every ancestor of depth <= D.
    T = N + 1
    jump = torch.where(parents >= 0, parents, torch.arange(T, device=dev))   # root, padding: self
    eye = torch.eye(T, dtype=torch.bool, device=dev).expand(b, T, T)
    vis = eye.clone()
    index = jump[:, :, None].expand(b, T, T)
    for _ in range(D):
        vis = vis.gather(1, index) | eye
    out.visibility.copy_(vis)
    out.bits.copy_(visibility_bits(vis))
    return out


def _merge(best_score, best_grid, beam_score, lex, d: int, N: int):
    """Merge the sorted N first nodes of depths < d+1 with the sorted depth-(d+1) beam; keep N.

    beam node t precedes list node i iff its score is higher, or equal and its ancestor at
    node i's depth has a smaller lexicographic rank (equal: i is its ancestor, a prefix, first).
    Padding (-inf) never precedes anything."""
    b = best_score.shape[0]
    e = best_grid // N                                                   # list node depth index
    lex_flat = lex.view(b, -1)
    D = lex.shape[-1]
    list_lex = lex_flat.gather(1, best_grid * D + e)                     # [b, i]
    anc_lex = lex[:, d].gather(2, e[:, None, :].expand(b, N, N)).transpose(1, 2)  # [b, i, t]
    s_list, s_beam = best_score[:, :, None], beam_score[:, None, :]
    beam_first = (s_beam > NEG_INF) & ((s_list == NEG_INF) | (s_beam > s_list) |
                                       ((s_beam == s_list) & (anc_lex < list_lex[:, :, None])))
    slots = torch.arange(N, device=best_score.device)
    pos = torch.cat([slots + beam_first.sum(2), slots + (~beam_first).sum(1)], 1)   # [b, 2N]
    grid = torch.cat([best_grid, (d * N + slots).expand(b, N)], 1)
    merged_score = torch.empty(b, 2 * N, dtype=best_score.dtype, device=best_score.device)
    merged_grid = torch.empty(b, 2 * N, dtype=torch.long, device=best_score.device)
    merged_score.scatter_(1, pos, torch.cat([best_score, beam_score], 1))
    merged_grid.scatter_(1, pos, grid)
    return merged_score[:, :N], merged_grid[:, :N]
