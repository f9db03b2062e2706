"""Tests for the fixed-shape DDTree build (harness/decode/tree_gpu.py) on CPU tensors.

The reference is the CPU heap of harness/decode/tree.py (itself checked against an independent
enumeration in test_tree.py). The GPU build must give the same tree: the same set of root-to-node
token paths on tie-free inputs (the issue's criterion) and, by construction, the same nodes in the
same pop order, ties included. The Triton kernel is checked against the torch path under the
Triton interpreter; on a GPU, tests/kernels/test_tree_build_gpu.py checks both kernel builds
and CUDA-graph capture (`pytest -m gpu`), and the op workload times them (scenarios/ops.yaml).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.decode.attention import visibility_bits
from harness.decode.tree import build_tree_cpu, token_paths, topk_logprobs, visibility_matrix
from harness.decode.tree_gpu import (
    GpuTree,
    build_tree_gpu,
    candidate_pairs,
    num_real_nodes,
    topk_logprobs_batched,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These are many tiny ops: intra-op threads only add contention on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


FIELDS = ("tokens", "depths", "parents", "first_child", "next_sibling", "visibility", "bits", "scores")


def random_topk(b: int, depth: int, k: int, vocab: int, seed: int, grid: float | None = None):
    """Per-position top-k: log-probs < 0 sorted descending, distinct token ids per row. With
    `grid`, log-probs are rounded to multiples of it: exact ties everywhere, like bf16 logits."""
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.empty(b, depth, k, dtype=torch.float64).exponential_(0.7, generator=gen) - 1e-3
    if grid is not None:
        lp = (lp / grid).floor() * grid
    lp = lp.float().sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(b * depth)])
    return lp, ids.view(b, depth, k)


def assert_same_as_heap(t: GpuTree, lp: torch.Tensor, ids: torch.Tensor, budget: int) -> None:
    for i in range(lp.shape[0]):
        heap = build_tree_cpu(lp[i], ids[i], budget)
        n = heap.num_nodes
        assert n == num_real_nodes(lp.shape[1], lp.shape[2], budget)
        tokens, parents = t.tokens[i].tolist(), t.parents[i].tolist()
        assert token_paths(tokens, parents, n) == token_paths(heap.tokens, heap.parents, n)
        # Same order too: the build follows the heap's pop order, tie-break included.
        assert tokens[:n] == heap.tokens
        assert t.depths[i, :n].tolist() == heap.depths
        assert parents[: n + 1] == heap.parents
        assert t.first_child[i, : n + 1].tolist() == heap.first_child
        assert t.next_sibling[i, : n + 1].tolist() == heap.next_sibling
        assert torch.equal(t.visibility[i, : n + 1, : n + 1], visibility_matrix(heap))


def assert_valid_tree(t: GpuTree, n: int) -> None:
    """Structure invariants of every sequence: n real nodes first, padding after."""
    b, N = t.tokens.shape
    assert torch.equal(t.bits, visibility_bits(t.visibility))
    for i in range(b):
        par, dep = t.parents[i].tolist(), [0] + t.depths[i].tolist()
        fc, ns = t.first_child[i].tolist(), t.next_sibling[i].tolist()
        scores = t.scores[i].tolist()
        assert par[0] == -1 and ns[0] == -1
        children = {p: [] for p in range(N + 1)}
        for v in range(1, n + 1):
            assert 0 <= par[v] < v                       # parents precede children
            assert dep[v] == dep[par[v]] + 1
            assert scores[v - 1] > float("-inf")
            children[par[v]].append(v)
        assert scores[:n] == sorted(scores[:n], reverse=True)
        for v in range(n + 1, N + 1):                    # padding: unreachable, invisible
            assert (par[v], dep[v], fc[v], ns[v], t.tokens[i, v - 1].item()) == (-1, 0, -1, -1, 0)
            assert scores[v - 1] == float("-inf")
        for p in range(N + 1):                           # links enumerate exactly the children
            chain, c = [], fc[p]
            while c != -1:
                chain.append(c)
                c = ns[c]
            assert chain == children[p]
            sib_tokens = [t.tokens[i, c - 1].item() for c in chain]
            assert len(set(sib_tokens)) == len(sib_tokens)
        vis = t.visibility[i]
        for v in range(N + 1):                           # ancestors and self, via parents
            expect, a = {v}, par[v]
            while a >= 0:
                expect.add(a)
                a = par[a]
            assert set(torch.nonzero(vis[v]).flatten().tolist()) == expect


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("budget", [16, 32, 64, 128, 256])
def test_same_tree_as_the_heap(budget, block):
    for seed in range(2):
        lp, ids = random_topk(2, block - 1, budget, 1000, seed=100 * budget + 10 * block + seed)
        t = build_tree_gpu(lp, ids, budget)
        assert_same_as_heap(t, lp, ids, budget)
        if budget <= 64:
            assert_valid_tree(t, budget)


@pytest.mark.parametrize("budget", [16, 64, 256])
def test_ties_break_like_the_heap(budget):
    """bf16-like inputs: log-probs on a grid (ties between siblings, cousins and depths) and
    certain tokens (log-prob 0: a child ties its parent)."""
    lp, ids = random_topk(2, 15, budget, 1000, seed=budget, grid=0.5)
    lp[:, 4, :2] = 0.0
    lp[:, 9, 0] = 0.0
    lp = lp.sort(-1, descending=True).values
    t = build_tree_gpu(lp, ids, budget)
    assert_same_as_heap(t, lp, ids, budget)
    assert_valid_tree(t, budget)


def test_scores_are_cumulative_log_probs():
    lp, ids = random_topk(2, 7, 32, 1000, seed=3)
    t = build_tree_gpu(lp, ids, 32)
    for i in range(2):
        rank_of = [{tok: r for r, tok in enumerate(row)} for row in ids[i].tolist()]
        for v in range(1, 33):
            total, node = 0.0, v
            while node > 0:
                d = t.depths[i, node - 1].item() - 1
                total += lp[i, d, rank_of[d][t.tokens[i, node - 1].item()]].item()
                node = t.parents[i, node].item()
            assert t.scores[i, v - 1].item() == torch.tensor(total, dtype=torch.float64).float().item()


def test_wider_rows_than_the_budget():
    lp, ids = random_topk(1, 7, 40, 1000, seed=5)
    t = build_tree_gpu(lp, ids, 16)
    assert_same_as_heap(t, lp, ids, 16)


@pytest.mark.parametrize("depth,k,budget", [(7, 2, 256), (7, 1, 16), (3, 3, 64), (1, 5, 16), (2, 4, 32)])
def test_candidate_space_smaller_than_budget_pads(depth, k, budget):
    lp, ids = random_topk(2, depth, k, 50, seed=depth * k)
    n = num_real_nodes(depth, k, budget)
    assert n == sum(k**d for d in range(1, depth + 1)) < budget
    t = build_tree_gpu(lp, ids, budget)
    assert t.tokens.shape == (2, budget) and t.visibility.shape == (2, budget + 1, budget + 1)
    assert_same_as_heap(t, lp, ids, budget)
    assert_valid_tree(t, n)


def test_masked_log_probs_stay_real_nodes():
    """-inf log-probs (masked logits) are clamped, so those nodes still rank above padding."""
    lp, ids = random_topk(1, 3, 3, 50, seed=9)
    lp[:, :, 2] = float("-inf")
    t = build_tree_gpu(lp, ids, 64)
    assert_valid_tree(t, 39)


def test_out_buffers_are_fully_overwritten():
    lp1, ids1 = random_topk(2, 7, 32, 500, seed=1)
    lp2, ids2 = random_topk(2, 7, 32, 500, seed=2)
    out = GpuTree.empty(2, 32, "cpu")
    for f in FIELDS:  # poison
        x = getattr(out, f)
        x.fill_(True) if x.dtype == torch.bool else x.fill_(77)
    for lp, ids in ((lp1, ids1), (lp2, ids2)):
        got = build_tree_gpu(lp, ids, 32, out=out)
        assert got is out
        fresh = build_tree_gpu(lp, ids, 32)
        for f in FIELDS:
            assert torch.equal(getattr(out, f), getattr(fresh, f)), f


def test_fixed_shapes_and_no_host_reads():
    """On meta tensors any .item()/.tolist()/data-dependent shape raises: the build is pure
    device work with shapes known from (b, D, k, N) alone, as CUDA-graph capture needs."""
    lp = torch.empty(3, 15, 64, device="meta")
    ids = torch.empty(3, 15, 64, dtype=torch.long, device="meta")
    t = build_tree_gpu(lp, ids, 64, impl="torch")
    shapes = {f: (tuple(getattr(t, f).shape), getattr(t, f).dtype) for f in FIELDS}
    assert shapes == {
        "tokens": ((3, 64), torch.int64), "depths": ((3, 64), torch.int64),
        "parents": ((3, 65), torch.int64), "first_child": ((3, 65), torch.int64),
        "next_sibling": ((3, 65), torch.int64), "visibility": ((3, 65, 65), torch.bool),
        "bits": ((3, 65, 3), torch.int32), "scores": ((3, 64), torch.float32)}
    with pytest.raises(RuntimeError):
        lp.sum().item()  # the premise: a host read on meta fails


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_logprobs_batched_matches_per_row(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 300, generator=gen) * 4).to(dtype)
    lp, ids = topk_logprobs_batched(logits, 16)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64 and lp.shape == (2, 5, 16)
    for i in range(2):
        ref_lp, ref_ids = topk_logprobs(logits[i], 16)
        assert torch.equal(lp[i], ref_lp) and torch.equal(ids[i], ref_ids)
    assert topk_logprobs_batched(logits, 1000)[0].shape == (2, 5, 300)


def test_candidate_pairs_cover_the_dominance_bound():
    J, R = candidate_pairs(64, 64, "cpu")
    pairs = set(zip(J.tolist(), R.tolist()))
    assert pairs == {(j, r) for j in range(64) for r in range(64) if (j + 1) * (r + 1) <= 64}
    J, R = candidate_pairs(16, 3, "cpu")
    assert max(R.tolist()) == 2 and len(J) == 16 + 8 + 5


def test_bad_shapes_raise():
    lp, ids = random_topk(1, 3, 4, 50, seed=0)
    with pytest.raises(ValueError):
        build_tree_gpu(lp[0], ids[0], 8)
    with pytest.raises(ValueError):
        build_tree_gpu(lp, ids[:, :2], 8)
    with pytest.raises(ValueError):
        build_tree_gpu(lp, ids, 0)
    with pytest.raises(ValueError, match="impl must be"):
        build_tree_gpu(lp, ids, 8, impl="metal")
    with pytest.raises(ValueError):      # the CUDA kernel on CPU tensors: refused, not run
        build_tree_gpu(lp, ids, 8, impl="cuda")


# ---------------------------------------------------------------------------------------------
# The Triton kernel, run by the Triton interpreter on CPU tensors.


def _interpreted_build(lp, ids, budget: int) -> dict:
    """Runs where TRITON_INTERPRET=1 was set before triton was imported (see conftest.interp)."""
    from harness.kernels.tree import triton_tree_build

    out = GpuTree.empty(lp.shape[0], budget, "cpu")
    for f in FIELDS:  # poison: every output element must be written
        x = getattr(out, f)
        x.fill_(True) if x.dtype == torch.bool else x.fill_(77)
    J, R = candidate_pairs(budget, min(lp.shape[2], budget), "cpu")
    triton_tree_build.build_tree(lp, ids, budget, J, R, out)
    return {f: getattr(out, f) for f in FIELDS}




def _interpreted_build_into_views(lp, ids, budget: int) -> dict:
    """The Triton build through build_tree_gpu into the decode loop's buffers: tokens and
    depths are columns 1.. of [b, 1 + N] arrays (strided for b > 1), the rest dense."""
    b = lp.shape[0]
    out = GpuTree.empty(b, budget, "cpu")
    wide = {f: torch.full((b, budget + 1), 77, dtype=torch.long) for f in ("tokens", "depths")}
    out = dataclasses.replace(out, **{f: w[:, 1:] for f, w in wide.items()})
    for f in FIELDS:
        x = getattr(out, f)
        x.fill_(True) if x.dtype == torch.bool else x.fill_(77)
    build_tree_gpu(lp, ids, budget, out=out, impl="triton")
    return {**{f: getattr(out, f) for f in FIELDS}, "root_columns": [w[:, 0] for w in wide.values()]}


@pytest.mark.parametrize("batch", [1, 3])
def test_the_build_writes_into_strided_views(interp, batch):
    lp, ids = random_topk(batch, 7, 16, 1000, seed=batch)
    want = build_tree_gpu(lp, ids, 16, impl="torch")
    got = interp.apply(_interpreted_build_into_views, (lp, ids, 16))
    for f in FIELDS:
        assert torch.equal(got[f], getattr(want, f)), f
    for col in got["root_columns"]:          # column 0 (the root's) is the caller's
        assert (col == 77).all()


@pytest.mark.parametrize("depth,k,budget,grid", [
    (15, 16, 16, None),      # B = 16, N = 16
    (7, 32, 32, 0.5),        # B = 8, N = 32, ties
    (3, 3, 64, None),        # candidate space 39 < 64: padding
])
def test_triton_kernel_equals_torch_path(interp, depth, k, budget, grid):
    lp, ids = random_topk(2, depth, k, 1000, seed=budget + depth, grid=grid)
    want = build_tree_gpu(lp, ids, budget, impl="torch")
    got = interp.apply(_interpreted_build, (lp, ids, budget))
    for f in FIELDS:
        assert torch.equal(got[f], getattr(want, f)), f
