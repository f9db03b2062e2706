"""Tests for the DDTree CPU heap tree build (harness/decode/tree.py).

The reference here is written independently of the heap: it enumerates candidate nodes by
rank path (exhaustively when the space is small, level by level otherwise) and takes the N best
by cumulative log-prob. On inputs without ties that set is unique, so the heap must match it.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from harness.decode.tree import (
    Tree,
    build_tree_cpu,
    topk_logprobs,
    tree_positions,
    visibility_matrix,
)

# ---------------------------------------------------------------------------------------------
# Independent reference and helpers


def random_topk(depth: int, k: int, vocab: int, rng: random.Random) -> tuple[list, list]:
    """Random per-position top-k: log-probs < 0 sorted descending, distinct token ids per row.

    Continuous random values make exact ties (and near-ties) vanishingly unlikely; the
    reference below still checks the selection boundary is not a near-tie.
    """
    lp = [sorted((-rng.expovariate(0.7) - 1e-3 for _ in range(k)), reverse=True) for _ in range(depth)]
    ids = [rng.sample(range(vocab), k) for _ in range(depth)]
    return lp, ids


def path_score(lp: list[list[float]], ranks: tuple[int, ...]) -> float:
    return math.fsum(lp[d][r] for d, r in enumerate(ranks))


def best_rank_paths(lp: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """The `budget` best rank paths (non-empty, length <= D), best first.

    Exhaustive when the candidate space is small. Otherwise level by level: the best N nodes at
    depth d all have parents among the best N at depth d-1 (if N depth-(d-1) nodes beat the
    parent, their children with the same last rank would be N depth-d nodes beating the child),
    and the global best N at depth d are among the best N at depth d. So expanding only the best N
    per level by every rank is exact, without any heap.
    """
    depth_limit, k = len(lp), len(lp[0])
    space = sum(k**d for d in range(1, depth_limit + 1))
    if space <= 20000:
        pool = [p for d in range(1, depth_limit + 1) for p in itertools.product(range(k), repeat=d)]
    else:
        pool, level = [], [()]
        for _ in range(depth_limit):
            level = [p + (r,) for p in level for r in range(k)]
            level = sorted(level, key=lambda p: -path_score(lp, p))[:budget]
            pool.extend(level)
    ranked = sorted(pool, key=lambda p: -path_score(lp, p))
    if len(ranked) > budget:
        # The heap accumulates scores incrementally (float rounding differs from fsum): only a
        # clear gap at the cut makes "the N best" well defined for both.
        gap = path_score(lp, ranked[budget - 1]) - path_score(lp, ranked[budget])
        assert gap > 1e-9, "test input has a near-tie at the selection boundary; change the seed"
    return ranked[:budget]


def node_path(tree: Tree, node: int) -> list[int]:
    """Nodes from depth 1 down to `node` (root excluded), by walking parents."""
    path = []
    while node > 0:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


def rank_paths(tree: Tree, ids: list[list[int]]) -> list[tuple[int, ...]]:
    """Each node's rank path, recovered from its token path (tokens are distinct per row)."""
    rank_of = [{t: r for r, t in enumerate(row)} for row in ids]
    out = []
    for node in range(1, tree.num_nodes + 1):
        toks = [tree.tokens[n - 1] for n in node_path(tree, node)]
        out.append(tuple(rank_of[d][t] for d, t in enumerate(toks)))
    return out


def check_structure(tree: Tree, lp: list[list[float]], ids: list[list[int]]) -> None:
    """Invariants every built tree must satisfy, independent of which nodes were chosen."""
    n = tree.num_nodes
    assert len(tree.depths) == n
    for field in (tree.parents, tree.first_child, tree.next_sibling, tree.child_maps):
        assert len(field) == n + 1
    assert tree.parents[0] == -1
    for i in range(1, n + 1):
        p = tree.parents[i]
        assert 0 <= p < i, "parents must precede children"
        assert tree.depths[i - 1] == (tree.depths[p - 1] if p else 0) + 1
        assert 1 <= tree.depths[i - 1] <= len(lp)
        assert tree.tokens[i - 1] in ids[tree.depths[i - 1] - 1]

    # Children derived from parents alone, in index (= pop) order.
    children = [[] for _ in range(n + 1)]
    for i in range(1, n + 1):
        children[tree.parents[i]].append(i)
    for p in range(n + 1):
        linked, c = [], tree.first_child[p]
        while c != -1:
            linked.append(c)
            c = tree.next_sibling[c]
        assert linked == children[p]
        assert tree.child_maps[p] == {tree.tokens[c - 1]: c for c in children[p]}
        assert len(tree.child_maps[p]) == len(children[p]), "duplicate token under one parent"

    # Pop order is best-first: with log-probs <= 0, sorted rows, a push never beats its pop.
    scores = [path_score(lp, p) for p in rank_paths(tree, ids)]
    assert all(a >= b - 1e-9 for a, b in zip(scores, scores[1:]))


def as_tensors(lp, ids):
    return torch.tensor(lp, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------
# build_tree_cpu


@pytest.mark.parametrize("depth", [1, 3, 7, 15])
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_heap_selects_the_best_nodes(seed, budget, depth):
    rng = random.Random(1000 * seed + 10 * budget + depth)
    k = budget  # DDTree: top-k width per position = node budget
    lp_t, ids_t = as_tensors(*random_topk(depth, k, vocab=4 * k + 7, rng=rng))
    # The heap sees float32-rounded values; the reference must score those same values.
    lp, ids = lp_t.tolist(), ids_t.tolist()

    tree = build_tree_cpu(lp_t, ids_t, budget)

    expected = best_rank_paths(lp, budget)
    assert tree.num_nodes == len(expected)
    assert set(rank_paths(tree, ids)) == set(expected)
    check_structure(tree, lp, ids)


def test_budget_larger_than_candidate_space():
    # vocab 3, D 2: at most 3 + 9 = 12 nodes whatever the budget.
    logits = torch.randn(2, 3, generator=torch.Generator().manual_seed(7))
    lp_t, ids_t = topk_logprobs(logits, k=50)
    assert lp_t.shape == (2, 3)
    tree = build_tree_cpu(lp_t, ids_t, budget=50)
    assert tree.num_nodes == 12
    lp, ids = lp_t.tolist(), ids_t.tolist()
    assert set(rank_paths(tree, ids)) == set(itertools.chain(
        itertools.product(range(3), repeat=1), itertools.product(range(3), repeat=2)))
    check_structure(tree, lp, ids)


def test_single_position_is_a_flat_fan():
    lp, ids = [[-0.1, -0.5, -2.0, -3.0]], [[11, 5, 9, 2]]
    tree = build_tree_cpu(*as_tensors(lp, ids), budget=3)
    assert tree.tokens == [11, 5, 9]
    assert tree.depths == [1, 1, 1]
    assert tree.parents == [-1, 0, 0, 0]
    assert tree.first_child == [1, -1, -1, -1]
    assert tree.next_sibling == [-1, 2, 3, -1]
    assert tree.child_maps == [{11: 1, 5: 2, 9: 3}, {}, {}, {}]


def test_hand_worked_order():
    # Depth 1: 0.6 / 0.3 ; depth 2: 0.9 / 0.1  (as log-probs).
    # Scores: a=ln.6 (-.51), b=ln.3 (-1.20), a->c = ln.54 (-.62), a->d = ln.06, b->c = ln.27 (-1.31).
    lp = [[math.log(0.6), math.log(0.3)], [math.log(0.9), math.log(0.1)]]
    ids = [[100, 200], [300, 400]]
    tree = build_tree_cpu(*as_tensors(lp, ids), budget=4)
    assert tree.tokens == [100, 300, 200, 300]
    assert tree.parents == [-1, 0, 1, 0, 3]
    assert tree.depths == [1, 2, 1, 2]
    assert tree.child_maps[0] == {100: 1, 200: 3}
    assert tree_positions(tree) == [0, 1, 2, 1, 2]


def test_ties_break_by_rank_path_like_the_reference():
    # Uniform rows: every depth-1 node ties, every depth-2 node ties. The reference's heap key
    # (-score, rank path) pops ties in lexicographic rank-path order: breadth-first, rank order.
    k = 4
    lp = [[math.log(1 / k)] * k for _ in range(3)]
    ids = [[10 * d + r for r in range(k)] for d in range(3)]
    tree = build_tree_cpu(*as_tensors(lp, ids), budget=10)
    assert rank_paths(tree, ids) == [(0,), (1,), (2,), (3,),
                                     (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_degenerate_inputs_give_a_root_only_tree():
    lp_t, ids_t = as_tensors([[-0.1, -0.2]], [[1, 2]])
    for tree in (build_tree_cpu(lp_t, ids_t, 0),
                 build_tree_cpu(torch.empty(0, 4), torch.empty(0, 4, dtype=torch.long), 8)):
        assert tree.num_nodes == 0
        assert tree.parents == [-1] and tree.first_child == [-1] and tree.child_maps == [{}]
        assert visibility_matrix(tree).tolist() == [[True]]
        assert tree_positions(tree) == [0]


# ---------------------------------------------------------------------------------------------
# visibility_matrix, tree_positions


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_visibility_is_ancestors_and_self(seed):
    rng = random.Random(seed)
    depth, budget = rng.choice([(1, 8), (3, 16), (7, 64), (15, 64)])
    tree = build_tree_cpu(*as_tensors(*random_topk(depth, budget, 500, rng)), budget)
    vis = visibility_matrix(tree)
    n = tree.num_nodes + 1
    assert vis.dtype == torch.bool and vis.shape == (n, n)

    expected = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            expected[i, j] = True
            j = tree.parents[j]
    assert torch.equal(vis, expected)
    assert vis[0].tolist() == [True] + [False] * (n - 1), "the root sees only itself"
    assert vis[:, 0].all(), "everyone sees the root"
    assert tree_positions(tree) == [0] + tree.depths
    # A row sees exactly depth+1 tokens: its ancestors, one per level, and itself.
    assert vis.sum(1).tolist() == [p + 1 for p in tree_positions(tree)]


# ---------------------------------------------------------------------------------------------
# topk_logprobs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_topk_logprobs_matches_float64_log_softmax(dtype):
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(15, 1000, generator=g) * 4).to(dtype)
    lp, ids = topk_logprobs(logits, k=32)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64
    assert lp.shape == ids.shape == (15, 32)

    ref = torch.log_softmax(logits.double(), dim=-1)
    ref_lp, _ = ref.topk(32, dim=-1)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=0, atol=1e-5)
    # Ids index the values they claim (robust to the order of tied values).
    torch.testing.assert_close(ref.gather(1, ids), ref_lp, rtol=0, atol=1e-5)
    assert (lp[:, :-1] >= lp[:, 1:]).all()


def test_topk_logprobs_clamps_k_to_vocab():
    lp, ids = topk_logprobs(torch.randn(3, 5), k=64)
    assert lp.shape == ids.shape == (3, 5)
    assert torch.allclose(lp.exp().sum(1), torch.ones(3))
    assert sorted(ids[0].tolist()) == list(range(5))
