"""The Triton accept (harness.kernels.accept.triton_accept) under the Triton interpreter, on CPU,
against the tensor-op accept it replaces (harness.decode.fast.accept_path) and the bookkeeping
the decoder does with tensor ops (FastSpecDecoder._book).

Trees come from the torch tree build on random drafter log-probs (padding included where the
budget exceeds what the drafter offers); the target's logits are random with the tree's path
planted for a random number of levels, so accepted lengths vary from 1 to the tree's depth, and
with the planted maxima repeated later in the row (and in later spans), so the argmax's tie rule
(the first maximal column, torch's) decides the bonus token. Every output starts as garbage, so
a slot the kernel skips fails. bf16 logits and the decode loop are checked on the GPU
(tests/kernels/test_triton_accept_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")

from harness.decode import tree_gpu  # noqa: E402
from harness.decode.attention import visibility_bits  # noqa: E402
from harness.decode.fast import accept_path, book  # noqa: E402


def make_case(seed: int, b: int, budget: int, D: int, k: int, V: int, ties: bool):
    """A batch of trees and target logits [b, T, V] that follow each tree for a while."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(b, D, k, generator=g).sort(-1, descending=True).values.log_softmax(-1)
    ids = torch.stack([torch.randperm(V - 1, generator=g)[:k] for _ in range(b * D)]).view(b, D, k)
    tree = tree_gpu.build_tree_gpu(lp, ids, budget, impl="torch")
    T = budget + 1
    bonus = torch.randint(0, V, (b,), generator=g)
    tree_ids = torch.cat([bonus[:, None], tree.tokens], 1)
    depth = torch.cat([torch.zeros(b, 1, dtype=torch.long), tree.depths], 1)
    logits = torch.randn(b, T, V, generator=g)
    for i in range(b):
        # Plant the first child's token as the argmax at a random number of nodes down the
        # drafter's best chain: the path is accepted that far, then the target disagrees.
        node, levels, chain = 0, int(torch.randint(0, D + 1, (1,), generator=g)), {0}
        for _ in range(levels):
            child = int(tree.first_child[i, node])
            if child < 0:
                break
            logits[i, node, tree_ids[i, child]] = 10.0
            node = child
            chain.add(node)
        # And at half the nodes off it: children that follow under a parent that is not on
        # the path (they must stay off it: every ancestor's bit counts).
        for n in range(T):
            child = int(tree.first_child[i, n])
            if n not in chain and child >= 0 and torch.rand(1, generator=g) < 0.5:
                logits[i, n, tree_ids[i, child]] = 10.0
    if ties:
        # The row's maximum again at a later column: the first one must win.
        top, at = logits.max(-1)
        later = (at + 1 + torch.randint(0, V, at.shape, generator=g)) % V
        later = torch.maximum(later, at)
        logits.scatter_(-1, later[..., None], top[..., None])
    return dict(logits=logits, tree_ids=tree_ids, parents=tree.parents.clone(),
                first_child=tree.first_child.clone(), depth=depth, vis=tree.visibility.clone())


def random_tree_case(seed: int, b: int, T: int, D: int, V: int):
    """Trees of T nodes with random shapes (node i's parent any earlier node of depth < D, so
    late nodes have children too) and logits in which the argmax at every other node is one
    of its children: nodes that follow under parents that do not, at every index, so each
    ancestor bit of the tree mask counts."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((b, T), -1, dtype=torch.long)
    depth = torch.zeros(b, T, dtype=torch.long)
    first_child = torch.full((b, T), -1, dtype=torch.long)
    tree_ids = torch.zeros(b, T, dtype=torch.long)
    vis = torch.zeros(b, T, T, dtype=torch.bool)
    logits = torch.randn(b, T, V, generator=g)
    for i in range(b):
        vis[i, 0, 0] = True
        tree_ids[i, 0] = int(torch.randint(0, V, (1,), generator=g))
        children: dict[int, list[int]] = {}
        for n in range(1, T):
            open_ = [m for m in range(n) if depth[i, m] < D]
            p = open_[int(torch.randint(0, len(open_), (1,), generator=g))]
            parents[i, n], depth[i, n] = p, depth[i, p] + 1
            children.setdefault(p, []).append(n)
            vis[i, n] = vis[i, p]
            vis[i, n, n] = True
        for p, kids in children.items():
            first_child[i, p] = kids[0]
            tokens = torch.randperm(V, generator=g)[:len(kids)]
            tree_ids[i, kids] = tokens
            if torch.rand(1, generator=g) < 0.6:
                logits[i, p, tokens[int(torch.randint(0, len(kids), (1,), generator=g))]] = 10.0
    return dict(logits=logits, tree_ids=tree_ids, parents=parents, first_child=first_child,
                depth=depth, vis=vis)


def _run_triton(case, B, lengths, step, draws):
    from harness.kernels.accept import triton_accept
    b, T, V = case["logits"].shape
    out = dict(bonus=torch.full((b,), -5, dtype=torch.long),
               record=torch.full((b, 1 + B), -5, dtype=torch.long),
               idx=torch.full((b, B), -5, dtype=torch.long),
               src=torch.full((b, B), -5, dtype=torch.long),
               dst=torch.full((b, B), -5, dtype=torch.long),
               lengths=lengths.clone(), step_index=torch.tensor([step]))
    ws = triton_accept.alloc_workspace(b, T, V, "cpu")
    ws.part_v.fill_(float("nan"))
    ws.part_i.fill_(-9)
    ws.next.fill_(-9)
    triton_accept.accept(case["logits"], tree_ids=case["tree_ids"], parents=case["parents"],
                         first_child=case["first_child"], depth=case["depth"], bits=visibility_bits(case["vis"]),
                         draws=draws, workspace=ws, **out)
    return {**out, "next": ws.next}


def expected(case, B, lengths, step, draws):
    """The tensor-op accept and bookkeeping the decoder runs with accept_impl torch."""
    want = None if draws is None else draws[step % draws.shape[0]]
    idx, accepted, bonus = accept_path(case["logits"], case["tree_ids"], case["parents"],
                                       case["first_child"], case["depth"], case["vis"], B,
                                       synthetic=draws is not None, want=want)
    b = lengths.shape[0]
    lengths = lengths.clone()
    step_index = torch.tensor([step], device=lengths.device)
    record = torch.zeros(b, 1 + B, dtype=torch.long, device=lengths.device)
    src, dst = book(idx, accepted, case["tree_ids"], lengths, step_index, record)
    return dict(bonus=bonus, idx=idx, record=record, src=src, dst=dst, lengths=lengths,
                step_index=step_index, next=case["logits"].argmax(-1))


CASES = [
    # seed, batch, budget, depth D, k, vocabulary, ties
    (1, 1, 16, 7, 4, 300, False),
    (2, 3, 64, 15, 8, 9000, True),      # three argmax spans a row, the planted max tied later
    (3, 2, 40, 15, 2, 500, True),       # a narrow drafter: padding nodes past the real ones
    (4, 2, 130, 6, 64, 4500, False),    # T = 131 > one 128-node block; two spans
]


@pytest.mark.parametrize("seed,b,T,D,V", [(8, 2, 100, 6, 300), (10, 2, 65, 15, 400)])
@pytest.mark.parametrize("synthetic", [False, True])
def test_triton_accept_equals_the_tensor_ops_on_random_shapes(interp, seed, b, T, D, V, synthetic):
    case = random_tree_case(seed, b, T, D, V)
    B = D + 1
    lengths = torch.arange(b) * 1000 + 17
    draws = torch.randint(1, B + 1, (4, b), generator=torch.Generator().manual_seed(seed)) if synthetic else None
    got = interp.apply(_run_triton, (case, B, lengths, 3, draws))
    want = expected(case, B, lengths, 3, draws)
    for name, value in want.items():
        assert torch.equal(got[name], value), (name, got[name], value)


@pytest.mark.parametrize("case_args", CASES, ids=[f"seed{c[0]}" for c in CASES])
@pytest.mark.parametrize("synthetic", [False, True])
def test_triton_accept_equals_the_tensor_ops(interp, case_args, synthetic):
    seed, b, budget, D, k, V, ties = case_args
    case = make_case(seed, b, budget, D, k, V, ties)
    B = D + 1
    lengths = torch.randint(100, 1000, (b,), generator=torch.Generator().manual_seed(seed))
    draws = None
    if synthetic:
        draws = torch.randint(1, B + 1, (5, b), generator=torch.Generator().manual_seed(seed + 1))
    step = 7
    got = interp.apply(_run_triton, (case, B, lengths, step, draws))
    want = expected(case, B, lengths, step, draws)
    for name, value in want.items():
        assert torch.equal(got[name], value), (name, got[name], value)
    if not synthetic:
        # The planted paths make the accepted lengths vary (not all 1, not all the same).
        assert int(want["record"][:, 0].max()) > 1


def test_a_workspace_of_another_shape_is_refused():
    from harness.kernels.accept import triton_accept
    case = make_case(1, 1, 16, 7, 4, 300, False)
    ws = triton_accept.alloc_workspace(2, 17, 300, "cpu")
    z = lambda *s: torch.zeros(*s, dtype=torch.long)  # noqa: E731
    with pytest.raises(ValueError, match="workspace of another shape"):
        triton_accept.accept(case["logits"], tree_ids=case["tree_ids"], parents=case["parents"],
                             first_child=case["first_child"], depth=case["depth"],
                             bits=visibility_bits(case["vis"]), lengths=z(1), step_index=z(1), bonus=z(1),
                             record=z(1, 9), idx=z(1, 8), src=z(1, 8), dst=z(1, 8), draws=None,
                             workspace=ws)
