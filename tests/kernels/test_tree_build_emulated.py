"""The CUDA tree-build kernel (kernels/tree/tree_build.cu), run on the CPU through the emulator.

The .cu is compiled as C++ with -DTVA_EMULATE against tests/emulator/cuda_emulation.h (threads
as fibers, warp collectives as barriers of the warp's lanes, shared memory poisoned) and called
through ctypes with the parameter struct of kernels/tree/cuda_tree_build.py. Its outputs must equal
the torch path of harness/decode/tree_gpu.py bit for bit (every GpuTree field, poisoned first)
and the CPU heap node for node, ties included. Warps run skewed (a random subset sits out each
scheduling round), so a missing __syncthreads reads stale shared memory and shows as a wrong
tree: checked while writing these tests by deleting barriers and flipping the tie rule.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from harness.decode.tree_gpu import GpuTree, build_tree_gpu, topk_logprobs_batched
from harness.kernels import build
from harness.kernels.tree import cuda_tree_build as ctb
from emulator.emulate import emulated_library
from test_tree_gpu import FIELDS, assert_same_as_heap, assert_valid_tree, random_topk

SKEWED, LOCKSTEP = 4242, 0
SKEW_SEEDS = (4242, 777)   # the main cases run under two random schedules


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    lib = emulated_library("tree/tree_build.cu", tmp_path_factory.mktemp("emu"))
    build._declare_tree_build(lib)
    assert lib.ttb_struct_size() == ctypes.sizeof(ctb._Params)
    return lib


def emulated_build(lib, lp, ids, budget: int, threads: int | None = None, skew: int = SKEWED) -> GpuTree:
    """Launch the emulated kernel on CPU tensors, into poisoned outputs."""
    lib.emu_configure(0, skew)
    lib.emu_clear_fault()
    out = GpuTree.empty(lp.shape[0], budget, "cpu")
    for f in FIELDS:
        x = getattr(out, f)
        x.fill_(True) if x.dtype == torch.bool else x.fill_(77)
    threads = threads or ctb.DEFAULT_THREADS
    lp, ids = ctb.prepare_inputs(lp, ids)
    p = ctb.make_params(lp, ids, budget, out, threads)
    rc = lib.ttb_build_tree(ctypes.byref(p), threads, None)
    assert rc == 0, f"launch failed ({rc}): {lib.emu_last_fault().decode()}"
    return out


def assert_equal_to_torch(got: GpuTree, lp, ids, budget: int) -> None:
    want = build_tree_gpu(lp, ids, budget, impl="torch")
    for f in FIELDS:
        assert torch.equal(getattr(got, f), getattr(want, f)), f


def drafter_topk(b: int, depth: int, k: int, seed: int, scale: float = 1.0, dtype=torch.float32):
    """Sorted top-k log-probs of random normal logits (vocabulary 2000) and their ids."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, depth, 2000, generator=gen) * scale).to(dtype)
    return topk_logprobs_batched(logits, k)


# (budget, depth, k): k >= budget (k' = N) and k < budget (k' < N), B = 8 and 16.
CASES = [(16, 7, 16), (16, 15, 11), (64, 15, 64), (64, 7, 40), (256, 15, 256), (256, 7, 100)]


@pytest.mark.parametrize("scale", [1.0, 32.0], ids=["flat", "peaked"])
@pytest.mark.parametrize("budget,depth,k", CASES)
def test_equals_torch_and_heap(emu, budget, depth, k, scale):
    lp, ids = drafter_topk(2, depth, k, seed=budget * depth + k, scale=scale)
    for skew in SKEW_SEEDS:
        got = emulated_build(emu, lp, ids, budget, skew=skew)
        assert_equal_to_torch(got, lp, ids, budget)
    assert_same_as_heap(got, lp, ids, budget)


@pytest.mark.parametrize("budget", [16, 64, 256])
def test_ties_break_like_torch_and_heap(emu, budget):
    """bf16-like log-probs on a grid (ties between siblings, cousins and depths) and certain
    tokens (log-prob 0: a child ties its parent)."""
    lp, ids = random_topk(2, 15, budget, 1000, seed=budget, grid=0.5)
    lp[:, 4, :2] = 0.0
    lp[:, 9, 0] = 0.0
    lp = lp.sort(-1, descending=True).values
    for skew in SKEW_SEEDS:
        got = emulated_build(emu, lp, ids, budget, skew=skew)
        assert_equal_to_torch(got, lp, ids, budget)
    assert_same_as_heap(got, lp, ids, budget)
    if budget <= 64:
        assert_valid_tree(got, budget)


def test_a_single_tie_in_a_pop(emu):
    """Ties that come alone: the kernel decides a pop by scores and only re-decides it with the
    rank paths when two compared scores are equal, so each kind of equal pair must be caught on
    its own. Sequence 0 is hand-made: the first pop's child and sibling tie (-2 and -2) and
    nothing else does (the child pops first: path (0, 0) before (1,)). The rest: few distinct
    values on a coarse grid over a small tree, so most pops tie at most one pair."""
    gen = torch.Generator().manual_seed(5)
    lp = -torch.randint(1, 40, (96, 4, 6), generator=gen).double() / 8
    lp[0] = torch.tensor([[-1.0, -2.0, -9.0, -9.5, -9.75, -9.875],
                          [-1.0, -7.0, -7.5, -7.75, -7.875, -8.0],
                          [-3.0, -9.1, -9.2, -9.3, -9.4, -9.6],
                          [-4.0, -9.7, -9.8, -9.9, -10.0, -10.1]])
    lp = lp.float().sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(100, generator=gen)[:6] for _ in range(96 * 4)]).view(96, 4, 6)
    for budget in (6, 16):
        got = emulated_build(emu, lp, ids, budget)
        assert_equal_to_torch(got, lp, ids, budget)
        assert_same_as_heap(got, lp, ids, budget)


@pytest.mark.parametrize("budget", [8, 16, 64, 128, 256])     # 1, 2 and 4 frontier slots a lane
def test_runs_and_their_ties(emu, budget):
    """A round pops a node's rank-0 descendants while each beats every other candidate strictly
    by score. Peaked and coarse log-probs (rank 0 at 0, -1/8 or -1/4, the rest on a grid of
    1/8 below): long runs, and run nodes that tie a candidate whose rank path pops first (so a
    run that went on at an equal score would take the wrong node), or tie each other's
    siblings in the merge."""
    gen = torch.Generator().manual_seed(budget)
    n, depth, k = (64 if budget <= 64 else 8), 6, 5      # sequences: the big trees emulate slowly
    first = -torch.randint(0, 3, (n, depth, 1), generator=gen).double() / 8
    rest = -torch.randint(1, 12, (n, depth, k - 1), generator=gen).double() / 8
    lp = torch.cat([first, rest], -1).float().sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(100, generator=gen)[:k] for _ in range(n * depth)]).view(n, depth, k)
    got = emulated_build(emu, lp, ids, budget)
    assert_equal_to_torch(got, lp, ids, budget)
    assert_same_as_heap(got, lp, ids, budget)


@pytest.mark.parametrize("budget", [64, 128])
def test_bf16_logits_ties(emu, budget):
    """The realistic tie source: bf16 drafter logits (x8: many equal top values)."""
    lp, ids = drafter_topk(2, 15, budget, seed=7 + budget, scale=8.0, dtype=torch.bfloat16)
    assert (lp[..., 1:] == lp[..., :-1]).any()
    got = emulated_build(emu, lp, ids, budget)
    assert_equal_to_torch(got, lp, ids, budget)
    assert_same_as_heap(got, lp, ids, budget)


@pytest.mark.parametrize("budget,threads", [(16, 32), (64, 32), (64, 256), (128, 96), (200, 64)])
def test_every_block_size(emu, budget, threads):
    """One warp alone (it pops, loads and writes), more warps than work, 1..8 frontier slots a
    lane (N 16 .. 200), more nodes than threads in the epilogue."""
    lp, ids = drafter_topk(2, 15, budget, seed=threads)
    assert_equal_to_torch(emulated_build(emu, lp, ids, budget, threads=threads), lp, ids, budget)


def test_lockstep_schedule(emu):
    lp, ids = random_topk(2, 15, 64, 1000, seed=3, grid=0.5)
    assert_equal_to_torch(emulated_build(emu, lp, ids, 64, skew=LOCKSTEP), lp, ids, 64)


@pytest.mark.parametrize("depth,k,budget", [(7, 2, 256), (3, 3, 64), (1, 5, 16), (2, 4, 32), (1, 64, 64)])
def test_small_candidate_space_pads(emu, depth, k, budget):
    lp, ids = random_topk(2, depth, k, 1000, seed=depth * k)
    got = emulated_build(emu, lp, ids, budget)
    assert_equal_to_torch(got, lp, ids, budget)
    assert_same_as_heap(got, lp, ids, budget)


def test_masked_log_probs(emu):
    """-inf log-probs are clamped to -1e30 exactly as the torch path does."""
    lp, ids = random_topk(2, 5, 8, 50, seed=9)
    lp[:, :, 5:] = float("-inf")
    assert_equal_to_torch(emulated_build(emu, lp, ids, 64), lp, ids, 64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_input_dtypes_and_strides(emu, dtype):
    """float64 / bfloat16 are read as they are, float16 converted; a strided view works."""
    lp, ids = random_topk(3, 7, 48, 1000, seed=11)
    lp = lp.to(dtype).sort(-1, descending=True).values
    wide = torch.zeros(3, 9, 48, dtype=dtype)
    wide[:, 1:8] = lp
    view = wide[:, 1:8]                     # batch stride 9 * 48, not contiguous
    got = emulated_build(emu, view, ids.int(), 32)
    assert_equal_to_torch(got, lp, ids, 32)


def test_outputs_of_a_second_launch_are_independent(emu):
    """Shared memory is poisoned per block and every output element is written per launch."""
    lp1, ids1 = drafter_topk(2, 15, 64, seed=1)
    lp2, ids2 = drafter_topk(2, 15, 64, seed=2)
    assert_equal_to_torch(emulated_build(emu, lp1, ids1, 64), lp1, ids1, 64)
    assert_equal_to_torch(emulated_build(emu, lp2, ids2, 64), lp2, ids2, 64)


def test_limits_are_refused(emu):
    lp, ids = drafter_topk(1, 7, 64, seed=0)
    out = GpuTree.empty(1, 64, "cpu")
    with pytest.raises(ValueError):          # not a whole number of warps
        ctb.make_params(lp, ids, 64, out, 100)
    with pytest.raises(ValueError):
        ctb.make_params(lp, ids, 64, out, 1024)
    big = GpuTree.empty(1, 300, "cpu")
    with pytest.raises(ValueError):
        ctb.make_params(lp, ids, 300, big, 128)
    p = ctb.make_params(lp, ids, 64, out, 64)
    assert emu.ttb_build_tree(ctypes.byref(p), 48, None) != 0     # not a whole number of warps
    p.budget = 257
    assert emu.ttb_build_tree(ctypes.byref(p), 128, None) != 0
