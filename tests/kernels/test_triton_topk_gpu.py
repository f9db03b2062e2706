"""The Triton top-k log-probs (harness.kernels.tree.triton_topk) on a GPU, at the drafter's shapes.

b in 1, 2, 4 sequences of D = 15 drafted positions over V = 151936 (qwen3-8b's vocabulary),
k in 16, 64, 128, 256, on four kinds of logits: float32 randn x 8, the random drafter's
(an lm_head product standardised per row, x 32), bf16 randn x 8 (ties: bf16 keeps 8 bits) and
"crowded" rows whose largest values sit among the first ids (as a vocabulary ordered by
frequency puts its likely words), which pass several hundred candidates to the ranking.
The reference is independent of the kernel: a stable descending sort in float64, i.e. (value
desc, id asc), the kernel's tie rule, so ids must equal it exactly, ties included, and
log-probs must be within LP_TOL of float64 topk - logsumexp; without ties the ids also equal
torch.topk's. Every call writes into NaN / -1 filled outputs and a poisoned workspace (as in
test_triton_topk.py, which runs the same kernels under the interpreter on CPU, bf16 excepted).
Then: no host sync, a CUDA graph replayed on new logits equal to eager calls, and the exact
fallback on rows whose values are all equal. The kernel's timing is the op workload's
(`op: topk`, scenarios/ops.yaml).
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_checks import capture, no_host_sync

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.tree import triton_topk

pytestmark = pytest.mark.gpu

VOCAB = 151936
D = 15
LP_TOL = 1e-5          # |log-prob - float64|: a few float32 ulp of the magnitudes involved
KINDS = ("f32", "drafter", "bf16", "crowded")


def logits_for(kind: str, b: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "f32":
        return torch.randn(b, D, VOCAB, generator=g, device=device) * 8
    if kind == "bf16":
        return (torch.randn(b, D, VOCAB, generator=g, device=device) * 8).to(torch.bfloat16)
    if kind == "crowded":    # ids 0..511 lifted above the rest, in random order
        x = torch.randn(b, D, VOCAB, generator=g, device=device) * 8
        x[..., :512] += 64
        return x
    if kind == "drafter":   # an lm_head over random hidden states, standardised x 32
        h = torch.randn(b, D, 256, generator=g, device=device)
        w = torch.randn(256, VOCAB, generator=g, device=device)
        x = h @ w                # float32: a bf16 product would tie (the bf16 kind does)
        std, mean = torch.std_mean(x, dim=-1, keepdim=True)
        return (x - mean) / std * 32
    raise ValueError(kind)


def reference(x: torch.Tensor, k: int):
    """(log-probs float64, ids) in (value desc, id asc) order: a stable descending sort."""
    x64 = x.double()
    vals, ids = torch.sort(x64, dim=-1, descending=True, stable=True)
    return vals[..., :k] - torch.logsumexp(x64, -1, keepdim=True), ids[..., :k]


def poisoned_call(x: torch.Tensor, k: int):
    """The kernel into NaN / -1 outputs with a workspace full of garbage (but the arrival
    counters, which alloc_workspace zeroes and every call leaves at zero)."""
    ws = triton_topk.alloc_workspace(x, k)
    for name in ("maxima", "part_m", "part_s", "thresh", "cand_v"):
        getattr(ws, name).fill_(float("nan"))
    ws.count.fill_(123456)
    ws.cand_i.fill_(-7)
    lp = torch.full((*x.shape[:-1], k), float("nan"), device=x.device)
    ids = torch.full((*x.shape[:-1], k), -1, dtype=torch.long, device=x.device)
    got = triton_topk.topk_logprobs(x, k, out=(lp, ids), workspace=ws)
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
    assert bool((lp[..., 1:] <= lp[..., :-1]).all())
    err = (lp.double() - ref_lp).abs().max().item()
    assert err <= LP_TOL, err
    top, t_ids = torch.topk(x.float(), k, dim=-1)
    if kind == "bf16":        # ties: torch may pick other ids of equal value
        assert torch.equal(x.float().gather(-1, ids), top)
    else:
        assert torch.equal(ids, t_ids)


@pytest.mark.parametrize("k", [16, 64, 256])
def test_no_host_sync(cuda, k):
    x = logits_for("bf16", 2, 5, cuda)
    ws = triton_topk.alloc_workspace(x, k)
    triton_topk.topk_logprobs(x, k, workspace=ws)          # compiles, outside the check
    triton_topk.topk_logprobs(x, k)
    with no_host_sync():
        triton_topk.topk_logprobs(x, k, workspace=ws)
        triton_topk.topk_logprobs(x, k)                    # its own outputs and workspace


@pytest.mark.parametrize("b,k", [(1, 16), (2, 64), (4, 256)])
def test_graph_replays_equal_eager_calls_on_new_logits(cuda, b, k):
    x = logits_for("f32", b, 100, cuda)
    ws = triton_topk.alloc_workspace(x, k)
    out = (torch.empty(b, D, k, device=cuda), torch.empty(b, D, k, dtype=torch.long, device=cuda))
    graph = capture(lambda: triton_topk.topk_logprobs(x, k, out=out, workspace=ws))
    for seed, kind in ((101, "f32"), (102, "bf16"), (103, "drafter"), (104, "crowded")):
        new = logits_for(kind, b, seed, cuda).float()
        x.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want_lp, want_ids = reference(new, k)             # and the reference, not only eager
        eager = triton_topk.topk_logprobs(new, k)
        assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])
        assert torch.equal(out[1], want_ids)
        assert (out[0].double() - want_lp).abs().max().item() <= LP_TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_equal_rows_take_the_exact_fallback(cuda, dtype):
    """Every value ties: more candidates than slots, the whole-row selection instead; ids are
    the k lowest (id asc), log-probs -log V."""
    x = torch.full((2, D, VOCAB), 1.5, device=cuda, dtype=dtype)
    x[1, 3, 77] = 2.0                                      # one row with a unique maximum
    lp, ids = poisoned_call(x, 64)
    ref_lp, ref_ids = reference(x, 64)
    assert torch.equal(ids, ref_ids)
    assert torch.equal(ids[0], torch.arange(64, device=cuda).expand(D, 64))
    assert (lp[0] + math.log(VOCAB)).abs().max().item() < 1e-5
    assert (lp.double() - ref_lp).abs().max().item() <= LP_TOL
