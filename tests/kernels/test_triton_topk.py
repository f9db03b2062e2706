"""Top-k log-probs in Triton (harness.kernels.tree.triton_topk) under the Triton interpreter, on CPU,
against a float64 reference.

The reference ranks a row by a stable descending sort of its values: (value desc, id asc), the
kernel's tie rule, so ids must match exactly, ties included; where a row has no ties among the
values that matter the ids also equal torch.topk's. Log-probs are compared with
float64 topk - logsumexp. Every call writes into NaN / -1 filled outputs and a workspace
filled with garbage (except the arrival counters, which alloc_workspace zeroes and every call
leaves at zero), so a kernel that skips an output slot or reads a stale value fails. bf16 is
checked on the GPU (test_triton_topk_gpu.py, `pytest -m gpu`): the interpreter mishandles it.
"""

from __future__ import annotations

import zlib

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.tree import triton_topk  # noqa: E402  (not interpreted here: see conftest.interp)

# |log-prob - float64 reference| allowed: a few float32 ulp of the magnitudes involved.
LP_TOL = 1e-5




def gen_for(*case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def _run(inputs: list[torch.Tensor], k: int, config: dict | None) -> list[dict]:
    """In the interpreter: one workspace, poisoned, for all `inputs` in turn (same shape).
    Returns per call the outputs, the candidate count per row and the arrival counters after."""
    ws = triton_topk.alloc_workspace(inputs[0], k, config)
    assert int(ws.arrive.abs().sum()) == 0
    for name in ("maxima", "part_m", "part_s", "thresh", "cand_v"):
        getattr(ws, name).fill_(float("nan"))
    ws.count.fill_(123456)
    ws.cand_i.fill_(-7)
    res = []
    for x in inputs:
        kp = min(k, x.shape[-1])
        lp = torch.full((*x.shape[:-1], kp), float("nan"))
        ids = torch.full((*x.shape[:-1], kp), -1, dtype=torch.long)
        got = triton_topk.topk_logprobs(x, k, out=(lp, ids), workspace=ws, config=config)
        assert got[0] is lp and got[1] is ids
        res.append(dict(lp=lp, ids=ids, count=ws.count.clone(), arrive=ws.arrive.clone(),
                        plan=triton_topk.plan(x.shape[-1], k, config)))
    return res


def run(interp, inputs, k, config=None) -> list[dict]:
    return interp.apply(_run, ([inputs] if isinstance(inputs, torch.Tensor) else inputs, k, config))


def reference(x: torch.Tensor, k: int):
    """(log_probs float64, ids) by (value desc, id asc): a stable descending sort."""
    x64 = x.double()
    kp = min(k, x.shape[-1])
    vals, ids = torch.sort(x64, dim=-1, descending=True, stable=True)
    return vals[..., :kp] - torch.logsumexp(x64, -1, keepdim=True), ids[..., :kp]


def check(x, k, r):
    ref_lp, ref_ids = reference(x, k)
    assert r["lp"].shape == ref_lp.shape and r["ids"].shape == ref_ids.shape
    assert (r["ids"] >= 0).all() and (r["ids"] < x.shape[-1]).all(), "an id slot was not written"
    assert not r["lp"].isnan().any(), "a log-prob slot was not written"
    assert torch.equal(r["ids"], ref_ids)
    fin = ref_lp.isfinite()
    assert torch.equal(r["lp"].isfinite(), fin) and torch.equal(r["lp"][~fin], ref_lp[~fin].float())
    err = (r["lp"][fin].double() - ref_lp[fin]).abs().max().item() if fin.any() else 0.0
    assert err <= LP_TOL, err
    assert int(r["arrive"].abs().sum()) == 0, "arrival counters not reset"
    return err


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,k,config", [
    ((1,), 1, None),                  # V = 1
    ((3, 1), 4, None),                # k > V = 1
    ((2, 7), 3, None),
    ((2, 7), 7, None),                # k = V
    ((2, 7), 10, None),               # k > V
    ((4, 100), 1, None),
    ((2, 3, 333), 16, {"BLOCK": 32}),   # b x D rows, 11 programs per row, SUB > 1
    ((2, 1000), 64, {"BLOCK": 64}),
    ((1, 3000), 256, None),           # 2 programs of 2048, k' = 256
    ((2, 500), 500, {"BLOCK": 128}),  # k = V over several programs
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_matches_reference(interp, shape, k, config, dtype):
    g = gen_for(shape, k, config, dtype)
    x = (torch.randn(*shape, generator=g) * 8).to(dtype)
    r = run(interp, x, k, config)[0]
    check(x, k, r)
    if dtype == torch.float32:   # no ties among random float32 values: torch.topk's ids too
        assert torch.equal(r["ids"], torch.topk(x, min(k, shape[-1])).indices)


def test_drafter_scale_and_torch_float32_path(interp):
    # Standardised logits x 32 (|lse| ~ 150: float32's step there is 1.5e-5): within 1e-5 of
    # float64, and of torch's float32 topk - logsumexp up to its rounding of lse.
    g = gen_for("x32")
    x = torch.randn(3, 4000, generator=g)
    x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * 32
    r = run(interp, x, 64)[0]
    check(x, 64, r)
    top, ids = torch.topk(x, 64)
    torch_lp = top - torch.logsumexp(x, -1, keepdim=True)
    assert torch.equal(r["ids"], ids)
    lse_ulp = torch.logsumexp(x, -1).abs().max().item() * 2 ** -23
    assert (r["lp"] - torch_lp).abs().max().item() <= lse_ulp + 1e-6


def test_strided_rows(interp):
    # A [b, D, V] view of a bigger [b, T, V] tensor: rows are not evenly spaced; and rows
    # padded past V ([rows, W] sliced to [rows, V]).
    g = gen_for("strided")
    big = torch.randn(2, 5, 300, generator=g) * 8
    x = big[:, 1:4]
    r = run(interp, x, 20, {"BLOCK": 64})[0]
    check(x, 20, r)
    x = (torch.randn(3, 320, generator=g) * 8)[:, :300]
    r = run(interp, x, 20, {"BLOCK": 64})[0]
    check(x, 20, r)


def test_empty_batch(interp):
    lp, ids = interp.apply(triton_topk.topk_logprobs, (torch.randn(2, 0, 50), 8))
    assert lp.shape == ids.shape == (2, 0, 8) and lp.dtype == torch.float32 and ids.dtype == torch.long


@pytest.mark.parametrize("kind", ["zeros", "constant", "ties", "masked", "ascending"])
def test_many_candidates_fallback(interp, kind):
    # More candidates than CAP slots: the exact per-row selection. CAP = k' here (the least
    # allowed) so that any tie at the threshold overflows it; the counts prove it ran.
    g = gen_for("fallback", kind)
    V, k = 700, 24
    if kind == "zeros":
        x = torch.zeros(2, V)
    elif kind == "constant":
        x = torch.full((2, V), -3.5)
        x[1] = 41.0
    elif kind == "ties":          # few distinct values: long runs of equal ones at the cut
        x = torch.randint(0, 5, (2, V), generator=g).float()
    elif kind == "masked":        # -inf logits (a masked vocabulary), fewer finite than k
        x = torch.full((2, V), float("-inf"))
        x[0, torch.randperm(V, generator=g)[:10]] = torch.randn(10, generator=g)
        x[1, 5] = 0.0
    elif kind == "ascending":     # the top k all in the last chunks: a loose threshold
        x = torch.arange(V, dtype=torch.float32).repeat(2, 1) / 8
    r = run(interp, x, k, {"BLOCK": 64, "CAP": k})[0]
    check(x, k, r)
    assert (r["count"][:2] > k).all(), "the fallback path did not run"


def test_negative_zero_ties_positive_zero(interp):
    # -0.0 == +0.0 (as in torch): tied, so the lower ids go first, on the threshold path and
    # on the fallback (CAP = 3 < 4 candidates), whose integer keys must not split the zeros.
    x = torch.full((2, 40), -1.0)
    x[:, [3, 9, 17, 30]] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
    for config in ({"BLOCK": 16}, {"BLOCK": 16, "CAP": 3}):
        r = run(interp, x, 3, config)[0]
        assert r["ids"].tolist() == [[3, 9, 17]] * 2
        check(x, 3, r)
    assert (r["count"][:2] > 3).all()


def test_fallback_ignores_stale_candidates(interp):
    # Overflowing rows whose first CAP appended candidates hold some of the top k' too: the
    # ranking must cover only the k' the fallback wrote, not the stale slots after them.
    x = torch.ones(2, 700)
    x[0, 5:8] = 5.0
    x[1, 300:303] = 5.0
    r = run(interp, x, 4, {"BLOCK": 64, "CAP": 8})[0]
    assert r["ids"].tolist() == [[5, 6, 7, 0], [300, 301, 302, 0]]
    check(x, 4, r)
    assert (r["count"][:2] > 8).all()


@pytest.mark.parametrize("BS", [1024, 1], ids=["sorted", "counted"])
def test_crowded_rows_rank_many_candidates(interp, BS):
    # The row's largest values in its first chunks (a vocabulary ordered by frequency puts its
    # likely words together): the k'-th largest chunk max is a low threshold, so ~200
    # candidates pass, more than one ranking block (BJ). Up to BS they are sorted at once
    # (BS 1: ranked by counting, block by block); both must give the reference.
    g = gen_for("crowded", BS)
    x = torch.randn(2, 4096, generator=g)
    x[:, :200] += 10
    config = {"BLOCK": 256, "BS": BS}
    r = run(interp, x, 24, config)[0]
    check(x, 24, r)
    bj = r["plan"]["BJ"]
    assert ((r["count"][:2] > bj) & (r["count"][:2] <= 1024)).all(), r["count"][:2]


def test_threshold_is_the_kth_largest_chunk_max(interp):
    # One element per chunk (SUB = BLOCK) and distinct values: exactly k' elements reach the
    # threshold, none more (a looser threshold is still correct, only slower).
    g = gen_for("tight")
    x = torch.randn(3, 100, generator=g)
    config = {"BLOCK": 16, "SUB": 16}
    for k in (1, 10, 100):
        r = run(interp, x, k, config)[0]
        check(x, k, r)
        assert r["count"][:3].tolist() == [k] * 3


def test_repeated_calls_share_the_workspace(interp):
    # One workspace, three inputs (a tie-heavy one in the middle, overflowing CAP): each call
    # must start from clean counters, whatever the previous one left.
    g = gen_for("repeat")
    xs = [torch.randn(2, 3, 400, generator=g) * 8,
          torch.randint(0, 3, (2, 3, 400), generator=g).float(),
          torch.randn(2, 3, 400, generator=g) * 8]
    rs = run(interp, xs, 16, {"BLOCK": 32, "CAP": 64})
    for x, r in zip(xs, rs):
        check(x, 16, r)
    assert (rs[1]["count"][:6] > 64).all() and (rs[2]["count"][:6] <= 64).all()


def _run_with_threshold(x: torch.Tensor, k: int, value: float, config: dict | None):
    """In the interpreter: the call, with the stats kernel's threshold replaced by `value`."""
    real = triton_topk._stats_kernel

    class Overwrite:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                real[grid](*args, **kwargs)
                args[4].fill_(value)          # THRESH
            return launch

    triton_topk._stats_kernel = Overwrite()
    try:
        return _run([x], k, config)[0]
    finally:
        triton_topk._stats_kernel = real


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 2.0, float("-inf")])
def test_result_does_not_depend_on_the_threshold(interp, value):
    # A threshold that lets fewer than k' through (inf, NaN, 2.0 here: ~2 % of the row) or more
    # than CAP (-inf) must still give the exact result, through the fallback where needed.
    g = gen_for("any threshold", value)
    x = torch.randn(2, 600, generator=g)
    r = interp.apply(_run_with_threshold, (x, 30, value, {"BLOCK": 64, "CAP": 200}))
    check(x, 30, r)
    hits = (x >= value).sum(-1) if value == value else torch.zeros(2, dtype=torch.long)
    assert torch.equal(r["count"][:2].long(), hits)


def test_full_vocabulary_row(interp):
    # The real vocabulary once: 75 programs of 2048 per row, 150 chunks (k = 64).
    g = gen_for("vocab")
    x = torch.randn(1, 2, 151936, generator=g) * 8
    r = run(interp, x, 64)[0]
    assert r["plan"]["P"] == 75 and r["plan"]["C"] >= 128
    check(x, 64, r)
    assert torch.equal(r["ids"], torch.topk(x, 64).indices)
    assert (r["count"][:2] < 2 * 64).all()        # a tight threshold on random rows


def test_rejects_bad_inputs(interp):
    f = triton_topk.topk_logprobs
    x = torch.randn(2, 50)
    with pytest.raises(ValueError, match="float32, bf16 or fp16"):
        interp.apply(f, (x.double(), 4))
    with pytest.raises(ValueError, match="contiguous last dimension"):
        interp.apply(f, (x.t(), 4))
    with pytest.raises(ValueError, match="k >= 1"):
        interp.apply(f, (x, 0))
    with pytest.raises(ValueError, match="out must be"):
        interp.apply(f, (x, 4), {"out": (torch.empty(2, 5), torch.empty(2, 5, dtype=torch.long))})
    small = triton_topk.alloc_workspace(torch.randn(1, 50), 4)
    with pytest.raises(ValueError, match="workspace too small"):
        interp.apply(f, (x, 4), {"workspace": small})
    with pytest.raises(ValueError, match="merge"):
        interp.apply(f, (torch.randn(4, 3, 2, 50)[::2, ::2], 4))
    # Here (not interpreted) CPU tensors cannot run: a clear error, not a Triton crash.
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        f(x, 4)


@pytest.mark.parametrize("V", [1, 7, 100, 4096, 151936, 10 ** 7])
@pytest.mark.parametrize("k", [1, 16, 64, 256, 5000])
def test_plan_gives_a_valid_threshold(V, k):
    # The threshold needs C >= k' chunks (else it falls back to -inf: correct but slow), and
    # the last stats program holds all C maxima in one tile.
    p = triton_topk.plan(V, k)
    kp = min(k, V)
    assert p["P"] * p["BLOCK"] >= V > (p["P"] - 1) * p["BLOCK"]
    assert p["C"] == p["P"] * p["SUB"] <= triton_topk.MAX_CHUNKS and p["CP"] >= p["C"]
    assert p["SUB"] <= p["BLOCK"] and p["CAP"] >= kp
    if kp <= triton_topk.MAX_CHUNKS:   # ~2k' chunks, or one element per chunk
        assert p["C"] >= kp
        assert p["C"] >= min(2 * kp, triton_topk.MAX_CHUNKS // 2) or p["SUB"] == p["BLOCK"]


# ---------------------------------------------------------------------------------------------
# The NVIDIA backend (the interpreter runs Python, not the compiler): each kernel goes through
# Triton's whole pipeline to a cubin, with the constexprs of the real vocabulary.


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION is unset")
@pytest.mark.parametrize("arch", [90, 120])
@pytest.mark.parametrize("k", [16, 256])
def test_kernels_compile_for_the_gpu(arch, k):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    p = triton_topk.plan(151936, k)
    ptr = {"X": "*bf16", "COUNT": "*i32", "ARRIVE": "*i32", "CAND_I": "*i32", "OUT_ID": "*i64"}
    for fn, constexprs, warps in (
            (triton_topk._stats_kernel, dict(BLOCK=p["BLOCK"], SUB=p["SUB"], CP=p["CP"]), p["num_warps"]),
            (triton_topk._gather_kernel, dict(BLOCK=p["BLOCK"]), p["num_warps"]),
            (triton_topk._finish_kernel, dict(PB=p["PB"], BI=p["BI"], BJ=p["BJ"], BS=p["BS"], FB=p["FB"]),
             p["finish_warps"])):
        pointers = fn.arg_names[:fn.arg_names.index("V")]     # the tensors come first
        sig = {n: "constexpr" if n in constexprs else ptr.get(n, "*fp32") if n in pointers else
               "i64" if n.startswith("stride") else "i32" for n in fn.arg_names}
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
        assert kernel.asm["cubin"], fn.__name__


# ---------------------------------------------------------------------------------------------
# Into the decode loop (a cell's topk_impl: triton, which its decoder passes as impl=)


def _through_the_loop(logits: torch.Tensor, k: int, budget: int):
    """In the interpreter, asked for the Triton top-k as a decoder with Kernels.topk triton
    asks: the batched top-k the GPU tree build uses, the per-row one the host heap uses, and
    the trees both build."""
    from harness.decode import tree, tree_gpu
    lp, ids = tree_gpu.topk_logprobs_batched(logits, k, impl="triton")
    rows = [tree.topk_logprobs(logits[i], k, impl="triton") for i in range(logits.shape[0])]
    gpu = tree_gpu.build_tree_gpu(lp, ids, budget, impl="torch")
    heap = [tree.build_tree_cpu(*row, budget) for row in rows]
    return lp, ids, rows, gpu.parents, [t.parents for t in heap]


def test_triton_topk_routes_both_tree_builds_through_the_kernel(interp):
    from harness.decode import tree_gpu
    g = gen_for("switch")
    logits = torch.randn(2, 5, 3000, generator=g) * 8
    lp, ids, rows, gpu_parents, heap_parents = interp.apply(_through_the_loop, (logits, 16, 24))
    want_lp, want_ids = tree_gpu.topk_logprobs_batched(logits, 16)    # torch, in this process
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(lp, want_lp, atol=LP_TOL, rtol=0)
    for i, (row_lp, row_ids) in enumerate(rows):                      # the host path: same bits
        assert torch.equal(row_ids, ids[i]) and torch.equal(row_lp, lp[i])
    assert [list(map(int, p)) for p in gpu_parents] == heap_parents
