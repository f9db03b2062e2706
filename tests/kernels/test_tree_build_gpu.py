"""The GPU tree builds (harness.kernels.tree: the Triton kernel and the CUDA C++ kernel) on a GPU.

Drafter logits [2, B-1, 151936] of three kinds: "flat" float32 randn x 1 (many survivors per
depth), "peaked" standardised float32 x 32 (drafter-like) and "bf16" randn x 8 in bfloat16
(equal top logits: ties). Their top-k goes through topk_logprobs_batched with both top-k
implementations (torch, the Triton kernel: the two the loop can pick). Every build, triton and
cuda, must equal the torch-ops build (harness/decode/tree_gpu.py) bit for bit in every GpuTree
field, and the CPU heap (harness/decode/tree.py, the reference the decode loop's baseline uses)
node for node, ties included. Then: no host sync, and a CUDA graph of top-k + build replayed on
new logits equal to an eager build. The emulator (test_tree_build_emulated.py) and the
interpreter (tests/decode/test_tree_gpu.py) check the same kernels on CPU at small sizes;
this adds the compilers, the hardware and the loop's vocabulary. Timing: the op workload
(`op: tree_build`, scenarios/ops.yaml).
"""

from __future__ import annotations

import pytest
import torch
from cuda_checks import capture, no_host_sync
from test_tree_gpu import FIELDS, assert_same_as_heap

from harness.decode import tree as ddtree
from harness.decode.tree_gpu import GpuTree, build_tree_gpu, topk_logprobs_batched

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")

pytestmark = pytest.mark.gpu

VOCAB = 151936
BATCH = 2
KINDS = ("flat", "peaked", "bf16")
IMPLS = ("triton", "cuda")
# (budget N, block B): the loop's N 16..256 at B 16 and 8 (D = B - 1), one compile each.
SHAPES = [(16, 16), (64, 16), (256, 16), (32, 8), (128, 8)]


def logits_for(kind: str, D: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(BATCH, D, VOCAB, generator=g, device=device)
    if kind == "peaked":
        x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * 32
    elif kind == "bf16":
        x = (x * 8).to(torch.bfloat16)
    return x


def on_host(t: GpuTree) -> GpuTree:
    return GpuTree(**{f: getattr(t, f).cpu() for f in FIELDS})


def assert_same(got: GpuTree, want: GpuTree, what: str) -> None:
    bad = [f for f in FIELDS if not torch.equal(getattr(got, f), getattr(want, f))]
    assert not bad, f"{what}: {bad} differ"


@pytest.mark.parametrize("topk", ["torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,B", SHAPES)
def test_triton_and_cuda_builds_equal_torch_build_and_heap(cuda, N, B, kind, topk):
    logits = logits_for(kind, B - 1, N * 100 + B, cuda)
    lp, ids = topk_logprobs_batched(logits, N, impl=topk)
    if topk == "torch":
        # The batched top-k is the per-row one the baseline loop runs: the same values (ids of
        # equal logits may come in another order) and the same log-probs up to float32
        # rounding of the logsumexp (on a GPU a batch reduces in another order): a few ulps at
        # the normaliser's magnitude (~130 for the peaked logits, where an ulp is 1.5e-5).
        for i in range(BATCH):
            row_lp, row_ids = ddtree.topk_logprobs(logits[i], N)
            ulp = torch.finfo(torch.float32).eps * float(row_lp.abs().max() + logits[i].float().abs().max())
            torch.testing.assert_close(lp[i], row_lp, atol=4 * ulp, rtol=0)
            x = logits[i].float()
            assert torch.equal(x.gather(-1, ids[i]), x.gather(-1, row_ids))
    want = build_tree_gpu(lp, ids, N, impl="torch")
    assert_same_as_heap(on_host(want), lp.cpu(), ids.cpu(), N)
    for impl in IMPLS:
        out = GpuTree.empty(BATCH, N, cuda)
        for f in FIELDS:             # poison: every element must be written
            x = getattr(out, f)
            x.fill_(True) if x.dtype == torch.bool else x.fill_(77)
        got = build_tree_gpu(lp, ids, N, out=out, impl=impl)
        assert got is out
        assert_same(got, want, impl)


@pytest.mark.parametrize("impl", ("torch",) + IMPLS)
def test_no_host_sync(cuda, impl):
    N, B = 64, 16
    logits = logits_for("bf16", B - 1, 7, cuda)
    lp, ids = topk_logprobs_batched(logits, N, impl="triton")
    out = GpuTree.empty(BATCH, N, cuda)
    build_tree_gpu(lp, ids, N, out=out, impl=impl)         # compile, load, pair table
    with no_host_sync():
        topk_logprobs_batched(logits, N, impl="triton")
        build_tree_gpu(lp, ids, N, out=out, impl=impl)


@pytest.mark.parametrize("impl", ("torch",) + IMPLS)
@pytest.mark.parametrize("topk", ["torch", "triton"])
def test_graph_of_topk_and_build_replays_equal_eager(cuda, topk, impl):
    """The tree phase of a full-graph step: top-k and build captured with a static input and
    static outputs; replays on new logits equal an eager build on them."""
    N, B = 64, 16
    logits = logits_for("bf16", B - 1, 11, cuda)
    tree = GpuTree.empty(BATCH, N, cuda)

    def step():
        build_tree_gpu(*topk_logprobs_batched(logits, N, impl=topk), N, out=tree, impl=impl)

    graph = capture(step)
    for seed in (12, 13):
        logits.copy_(logits_for("bf16", B - 1, seed, cuda))
        graph.replay()
        torch.cuda.synchronize()
        lp, ids = topk_logprobs_batched(logits, N, impl=topk)
        assert_same(tree, build_tree_gpu(lp, ids, N, impl="torch"), f"{impl} replay")
