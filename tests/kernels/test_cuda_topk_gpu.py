"""The CUDA C++ top-k log-probs (harness.kernels.tree.cuda_topk, kernels/tree/topk.cu) on a GPU,
at the drafter's shapes: the cases of test_triton_topk_gpu.py (b 1, 2, 4 sequences of 15
positions over qwen3-8b's 151936 logits, k 16-256, float32 / drafter-like / bf16 logits) against
the same float64 reference (ids exactly, ties included; log-probs within LP_TOL), into NaN / -1
outputs with a poisoned workspace; then every slice count giving the same bits, no host sync, a
CUDA graph replayed on new logits equal to eager calls, and the exact select on all-equal rows.
test_topk_emulated.py runs the same kernel on CPU through the emulator. The kernel's timing is
the op workload's (`op: topk`, `topk_impl: cuda`, scenarios/ops.yaml).
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_checks import capture, no_host_sync

from harness.kernels.tree import cuda_topk
from test_triton_topk_gpu import D, KINDS, LP_TOL, VOCAB, logits_for, reference

pytestmark = pytest.mark.gpu


def poisoned_call(x: torch.Tensor, k: int, slices: int | None = None):
    ws = cuda_topk.alloc_workspace(x, k, slices=slices)
    ws.part_keys.fill_(-3)
    ws.part_m.fill_(float("nan"))
    ws.part_s.fill_(float("nan"))
    lp = torch.full((*x.shape[:-1], k), float("nan"), device=x.device)
    ids = torch.full((*x.shape[:-1], k), -1, dtype=torch.long, device=x.device)
    got = cuda_topk.topk_logprobs(x, k, out=(lp, ids), workspace=ws)
    assert got[0] is lp and got[1] is ids
    torch.cuda.synchronize()
    assert int(ws.arrive.abs().sum()) == 0, "arrival counters not reset"
    return lp, ids


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [16, 64, 128, 256])
@pytest.mark.parametrize("b", [1, 2, 4])
def test_exact_ids_in_reference_order_and_float64_log_probs(cuda, b, k, kind):
    x = logits_for(kind, b, b * 1000 + k, cuda)
    lp, ids = poisoned_call(x, k)
    ref_lp, ref_ids = reference(x, k)
    assert not lp.isnan().any() and (ids >= 0).all(), "an output slot was not written"
    assert torch.equal(ids, ref_ids)
    err = (lp.double() - ref_lp).abs().max().item()
    assert err <= LP_TOL, err


def test_every_slice_count_gives_the_same_bits(cuda):
    x = logits_for("drafter", 1, 7, cuda)
    want = poisoned_call(x, 64)
    for slices in (7, 9, 18, 33, 64):
        got = poisoned_call(x, 64, slices=slices)
        assert torch.equal(got[1], want[1]), slices
        assert (got[0] - want[0]).abs().max().item() <= 1e-5, slices   # the sum's order differs


@pytest.mark.parametrize("k", [16, 64, 256])
def test_no_host_sync(cuda, k):
    x = logits_for("bf16", 2, 5, cuda)
    ws = cuda_topk.alloc_workspace(x, k)
    cuda_topk.topk_logprobs(x, k, workspace=ws)            # builds and loads, outside the check
    with no_host_sync():
        cuda_topk.topk_logprobs(x, k, workspace=ws)


@pytest.mark.parametrize("b,k", [(1, 16), (2, 64), (4, 256)])
def test_graph_replays_equal_eager_calls_on_new_logits(cuda, b, k):
    x = logits_for("f32", b, 100, cuda)
    ws = cuda_topk.alloc_workspace(x, k)
    out = (torch.empty(b, D, k, device=cuda), torch.empty(b, D, k, dtype=torch.long, device=cuda))
    graph = capture(lambda: cuda_topk.topk_logprobs(x, k, out=out, workspace=ws))
    for seed, kind in ((101, "f32"), (102, "bf16"), (103, "drafter")):
        new = logits_for(kind, b, seed, cuda).float()
        x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want_lp, want_ids = reference(new, k)
        eager = cuda_topk.topk_logprobs(new, k)
        assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])
        assert torch.equal(out[1], want_ids)
        assert (out[0].double() - want_lp).abs().max().item() <= LP_TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_equal_rows_take_the_exact_select(cuda, dtype):
    x = torch.full((2, D, VOCAB), 1.5, device=cuda, dtype=dtype)
    x[1, 3, 77] = 2.0
    lp, ids = poisoned_call(x, 64)
    ref_lp, ref_ids = reference(x, 64)
    assert torch.equal(ids, ref_ids)
    assert torch.equal(ids[0], torch.arange(64, device=cuda).expand(D, 64))
    assert (lp[0] + math.log(VOCAB)).abs().max().item() < 1e-5
    assert (lp.double() - ref_lp).abs().max().item() <= LP_TOL
