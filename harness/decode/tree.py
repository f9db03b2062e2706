"""DDTree draft-tree construction: the CPU heap baseline.

The drafter gives, for each of the D = B-1 drafted positions, a distribution over the vocabulary.
DDTree keeps the top-k tokens per position (k = node budget N) and grows a tree of candidate
continuations best-first by cumulative log-prob: a node at depth d with rank r extends its parent's
path with token ids[d-1][r]. Because every log-prob is <= 0 and each row is sorted descending, a
node never scores above its parent or its previous sibling, so the best-first pop order yields the
N best nodes, parents before children.

`build_tree_cpu` follows the reference heap (liranringel/ddtree, ddtree.py `build_ddtree_tree`)
step for step, including its host sync (`.tolist()` of the top-k) and its heap-key tie-break, because
it is the baseline the GPU tree-build paths are measured and checked against. Do not "optimise" it
in ways that change which nodes are chosen or their order.

Node indexing everywhere: index 0 is the root (the bonus token, already committed by the target),
nodes 1..N are drafted tokens in pop order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from harness.decode import tree_gpu


@dataclass
class Tree:
    """A built draft tree. N = len(tokens) (== budget unless the candidate space is smaller)."""

    tokens: list[int]  # node i+1 has token tokens[i], in pop order
    depths: list[int]  # 1-based depth of node i+1
    parents: list[int]  # len N+1; parents[0] = -1, parents[i] in [0, i)
    first_child: list[int]  # len N+1; first child in pop order, -1 if none
    next_sibling: list[int]  # len N+1; next child of the same parent in pop order, -1 if none
    child_maps: list[dict[int, int]]  # len N+1; token -> child index, for the greedy accept walk

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)


def topk_logprobs(draft_logits: torch.Tensor, k: int,
                  impl: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position top-k log-probs and token ids of the drafted positions.

    draft_logits: [D, V] on any device and dtype. Returns (log_probs [D, k'] float32,
    token_ids [D, k'] int64) on the same device, k' = min(k, V), rows sorted descending.
    The normaliser is taken over the full vocabulary (topk - logsumexp), in float32 even for
    bf16 logits, as the reference does: bf16 log-probs would create spurious ties.
    impl "torch" (torch.topk + logsumexp) unless the caller asks for "triton" (a decoder with
    Kernels.topk triton: see tree_gpu.topk_logprobs_batched).
    """
    if impl == "triton":
        # The same kernel as the GPU tree build, so tree_build cpu and gpu see the same bits.
        lp, ids = tree_gpu.topk_logprobs_batched(draft_logits[None], k, impl="triton")
        return lp[0], ids[0]
    if impl != "torch":
        raise ValueError(f"impl must be torch or triton (got {impl!r})")
    logits = draft_logits.float()
    k = min(int(k), logits.shape[-1])
    top_logits, token_ids = torch.topk(logits, k=k, dim=-1)
    log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
    return top_logits - log_z, token_ids


def build_tree_cpu(log_probs: torch.Tensor, token_ids: torch.Tensor, budget: int) -> Tree:
    """Best-first heap over (depth, rank) candidates, as in the DDTree reference.

    log_probs / token_ids: [D, k] from `topk_logprobs` (any device: they are moved to the host
    here, and that sync is part of what this baseline costs). Builds min(budget, #candidates)
    nodes; the candidate space is sum_{d=1..D} k^d, so small k and D can exhaust it early.
    """
    # One host transfer per tensor; Python floats are doubles, so scores accumulate in float64
    # exactly as the reference's float(np.float32) arithmetic does.
    lp: list[list[float]] = log_probs.tolist()
    ids: list[list[int]] = token_ids.tolist()
    depth_limit = len(lp)
    k = len(lp[0]) if depth_limit else 0

    parents = [-1]
    tokens: list[int] = []
    depths: list[int] = []
    first_child = [-1]
    next_sibling = [-1]
    child_maps: list[dict[int, int]] = [{}]
    if budget <= 0 or depth_limit == 0 or k == 0:
        return Tree(tokens, depths, parents, first_child, next_sibling, child_maps)

    # last_child[p]: most recently popped child of p, to append to its sibling chain in O(1).
    last_child = [-1]

    # Heap entries: (-score, rank_path, parent_index, depth, rank). heapq is a min-heap, hence the
    # negated score. The rank path (ranks from depth 1 to this node) is the reference's tie-break:
    # equal scores pop in lexicographic rank-path order. Rank paths are unique, so comparison never
    # reaches the remaining fields. Ties are common with bf16 drafter logits, so this matters for
    # reproducing the reference's tree exactly.
    heap: list[tuple[float, tuple[int, ...], int, int, int]] = [(-lp[0][0], (0,), 0, 1, 0)]
    while heap and len(tokens) < budget:
        neg_score, ranks, parent, depth, rank = heapq.heappop(heap)
        score = -neg_score

        node = len(tokens) + 1
        token = ids[depth - 1][rank]
        tokens.append(token)
        depths.append(depth)
        parents.append(parent)
        first_child.append(-1)
        next_sibling.append(-1)
        last_child.append(-1)
        child_maps.append({})
        child_maps[parent][token] = node
        if last_child[parent] < 0:
            first_child[parent] = node
        else:
            next_sibling[last_child[parent]] = node
        last_child[parent] = node

        # Next sibling: same parent, next rank at this depth. Computed incrementally (swap this
        # rank's log-prob for the next one's), as the reference does, rather than re-summing the path.
        if rank + 1 < k:
            sibling_score = score - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling_score, ranks[:-1] + (rank + 1,), parent, depth, rank + 1))
        # First child: best token at the next position, under this node.
        if depth < depth_limit:
            child_score = score + lp[depth][0]
            heapq.heappush(heap, (-child_score, ranks + (0,), node, depth + 1, 0))

    return Tree(tokens, depths, parents, first_child, next_sibling, child_maps)


def visibility_matrix(tree: Tree) -> torch.Tensor:
    """bool [N+1, N+1]: row i sees column j iff j == i or j is an ancestor of i (root 0 included).

    Built by pointer chasing: after step s every row has marked its ancestor s levels up, so
    max-depth vectorised steps suffice (<= D, i.e. <= 15 for B = 16), instead of the reference's
    N per-row copies. The result is identical; the baseline only gets cheaper, never dearer.
    """
    n = len(tree.parents)
    vis = torch.eye(n, dtype=torch.bool)
    if n == 1:
        return vis
    parent = torch.tensor(tree.parents, dtype=torch.long)
    parent[0] = 0  # the root is its own fixed point, so finished rows keep re-marking column 0
    rows = torch.arange(n)
    ancestor = parent.clone()
    for _ in range(max(tree.depths)):
        vis[rows, ancestor] = True
        ancestor = parent[ancestor]
    return vis


def tree_positions(tree: Tree) -> list[int]:
    """Position offset of each tree token relative to the committed length: root 0, node = depth."""
    return [0] + list(tree.depths)


def token_paths(tokens: list[int], parents: list[int], n: int) -> set[tuple[int, ...]]:
    """Root-to-node token paths of nodes 1..n (node i has token tokens[i-1], parent parents[i]):
    two trees are the same tree when these sets are equal, whatever their node order."""
    paths = set()
    for node in range(1, n + 1):
        path = []
        while node > 0:
            path.append(tokens[node - 1])
            node = parents[node]
        paths.add(tuple(reversed(path)))
    return paths
