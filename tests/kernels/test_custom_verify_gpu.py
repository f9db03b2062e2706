"""The custom CUDA verify kernels on a real GPU (`pytest -m gpu`; skipped without one): every
variant against the float64 reference, CUDA-graph capture, the Python API's contracts. The same
kernels run on the CPU through the emulator in test_custom_kernel_emulated.py; these tests add
the real compiler, hardware and sizes. The kernel workload's own check of every mode at the
benchmark's points is tests/worker/test_kernel_workload_gpu.py; compute-sanitizer runs the
kernels in ci/gpu/selfcheck.sh; the timing is the kernel workload's (scenarios/kernels.yaml).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from cuda_checks import with_nan_tail
from harness.kernels.verify import verify_reference as ref
from harness.worker.workloads import kernel as kw

pytestmark = pytest.mark.gpu
TOL = 1e-2
DEV = torch.device("cuda")       # a name only: nothing touches CUDA before a test runs


def point(attention="gqa", b=1, heads=32, kv_heads=8, T=16, d=128, layout="contiguous", ps=16, ctx=0):
    dv = kw.MLA_DV if attention == "mla" else d
    return kw.Point(attention, b, ctx, T, heads, kv_heads, d, dv, layout, ps)


def check(pt: kw.Point, lengths, seed=0, nan_tail=0, **kwargs) -> float:
    inp = kw.make_inputs(pt, lengths, seed, DEV, torch.bfloat16, tree_boost=kw.check_boost(max(lengths)))
    if nan_tail:      # a contiguous cache `nan_tail` rows longer than any sequence, NaN past each one
        with_nan_tail(inp, lengths, pt.tokens, nan_tail)
    out = torch.full((pt.batch, pt.heads, pt.tokens, pt.dv), float("nan"), dtype=torch.bfloat16, device=DEV)
    from harness.kernels.verify import custom_verify as cv

    table, scale = inp.get("page_table"), 1.0 / math.sqrt(pt.dk)
    if pt.mla:
        cv.mla_tree_verify_attention(inp["q"], inp["k"], inp["lengths"], inp["bits"], scale,
                                     page_table=table, out=out, **kwargs)
    elif table is not None:
        cv.tree_verify_attention_paged(inp["q"], inp["k"], inp["v"], table, inp["lengths"], inp["bits"],
                                       scale, out=out, **kwargs)
    else:
        cv.tree_verify_attention(inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"], scale,
                                 out=out, **kwargs)
    torch.cuda.synchronize()
    return ref.relative_error(out, kw.reference(pt, inp))


# name -> (point, lengths): head dims 64/128, groups 1/4/8, T 1/16/64/65/128, batch 2 with
# different lengths, contiguous / paged 16 / paged 1, MLA.
CASES = {
    "d128-g4-T16": (point(T=16), [4096]),
    "d128-g4-T64-b2": (point(b=2, T=64), [5000, 1234]),
    "d128-g4-T65": (point(T=65), [3000]),
    "d128-g4-T128": (point(T=128), [2049]),
    "d128-g4-T1": (point(T=1), [7777]),
    "d64-g1-T16-b2": (point(b=2, heads=8, kv_heads=8, T=16, d=64), [999, 4000]),
    "d64-g8-T65": (point(heads=32, kv_heads=4, T=65, d=64), [2500]),
    "d128-g8-T16": (point(heads=64, kv_heads=8, T=16), [3333]),
    "paged16-d128-g4-T16-b2": (point(b=2, T=16, layout="paged", ps=16), [4100, 700]),
    "paged1-d128-g4-T64": (point(T=64, layout="paged", ps=1), [1500]),
    "paged16-d64-g8-T65": (point(heads=16, kv_heads=2, T=65, d=64, layout="paged"), [2222]),
    # 65 and 17 tree tokens at G 4, paged: a last row block of 4 rows
    "paged16-d128-g4-T65-b2": (point(b=2, T=65, layout="paged", ps=16), [3000, 1100]),
    "paged1-d128-g4-T17": (point(T=17, layout="paged", ps=1), [2500]),
    "long-d128-g4-T16": (point(T=16), [65536]),
    "mla-H8-T16": (point("mla", heads=8, kv_heads=1, T=16, d=576), [4096]),
    "mla-H64-T16-b2": (point("mla", b=2, heads=64, kv_heads=1, T=16, d=576), [3000, 1000]),
    "mla-H16-T65-paged16": (point("mla", heads=16, kv_heads=1, T=65, d=576, layout="paged"), [2000]),
    "mla-H8-T16-paged1": (point("mla", heads=8, kv_heads=1, T=16, d=576, layout="paged", ps=1), [1000]),
    "mla-long": (point("mla", heads=8, kv_heads=1, T=16, d=576), [65536]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_reference(case):
    pt, lengths = CASES[case]
    assert check(pt, lengths) <= TOL


WGMMA_CASES = list(CASES)          # GQA (forced to >= 4 warps) and MLA


@pytest.fixture
def hopper(cuda):
    if torch.cuda.get_device_capability(cuda) != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")


@pytest.mark.parametrize("case", WGMMA_CASES)
def test_wgmma_variant_matches_float64_reference(case, hopper):
    pt, lengths = CASES[case]
    assert check(pt, lengths, impl="wgmma") <= TOL


@pytest.mark.parametrize("case", WGMMA_CASES)
def test_wgmma_pv_variant_matches_float64_reference(case, hopper):
    """P V on wgmma too: V read through an MN-major descriptor (GQA at head_dim 128, and MLA;
    other GQA head dims are refused: the d64 instance failed this check, relative error 0.56)."""
    pt, lengths = CASES[case]
    if not pt.mla and pt.dk != 128:
        with pytest.raises(ValueError, match="supports head_dim 128 only"):
            check(pt, lengths, impl="wgmma_pv")
        return
    assert check(pt, lengths, impl="wgmma_pv") <= TOL


# The tail kernel (impl wgmma_tail): 65 tree tokens over 1, 4 and 8 query heads a KV head (1, 4,
# 8 row blocks and as many tail rows), 129 (tail rows on half the CTAs), long contexts, one
# split (the output written by the kernel) and many; shapes without a tail run wgmma_pv.
TAIL_CASES = {
    "g4-T65": (point(T=65), [3000]),
    "g4-T65-b2-long": (point(b=2, T=65), [65536, 20000]),
    "g1-T65": (point(heads=8, kv_heads=8, T=65), [5000]),
    "g8-T65": (point(heads=64, kv_heads=8, T=65), [4096]),
    "g4-T129": (point(T=129), [3000]),
    "g4-T16-no-tail": (point(T=16), [4096]),
    "paged16-g4-T65-no-tail": (point(b=2, T=65, layout="paged", ps=16), [3000, 1100]),
}


def test_wgmma_tail_equals_wgmma_pv_closely_and_replays_in_a_graph(hopper):
    """The tail rows sum their keys in another order (four warps' partial softmaxes) than the
    plain kernel's fifth row block: close, not equal. A captured call replays equal to an eager
    one, without a host sync."""
    from harness.kernels.verify import custom_verify as cv

    pt = point(b=2, T=65)
    inp = kw.make_inputs(pt, [9000, 3000], 5, DEV, torch.bfloat16)
    args = (inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"])
    a = cv.tree_verify_attention(*args, impl="wgmma_pv")
    b = cv.tree_verify_attention(*args, impl="wgmma_tail")
    assert ref.relative_error(b, a.double()) < 5e-3
    pl = cv.plan(inp["q"], pt.kv_heads, inp["k"].shape[2], False, impl="wgmma_tail")
    assert pl["m_blocks"] == 4
    _replays_equal(lambda out: cv.tree_verify_attention(*args, impl="wgmma_tail", out=out), b)


@pytest.mark.parametrize("impl", ["wgmma_tail", "wgmma_sumcheck"])
def test_a_gqa_variant_runs_the_mla_latent_as_wgmma_pv(impl, hopper):
    """The MLA latent has no kernel of the GQA kernel's variants: they run its wgmma_pv kernel,
    not a launch error."""
    pt = point("mla", heads=8, kv_heads=1, T=16, d=576)
    assert check(pt, [3000], impl=impl) <= TOL


# The sum-checked softmax (impl wgmma_sumcheck): every shape the pipelined kernel runs (paged and
# 8 warps too), bit-equal to it whichever path each tile takes.
SUMCHECK_CASES = {
    "g4-T65": (point(T=65), [3000]),
    "g4-T65-b2-long": (point(b=2, T=65), [65536, 20000]),
    "g4-T64": (point(T=64), [4097]),
    "g4-T16-b2": (point(b=2, T=16), [16384, 70]),
    "g1-T65": (point(heads=8, kv_heads=8, T=65), [5000]),
    "g8-T65": (point(heads=64, kv_heads=8, T=65), [4096]),
    "paged16-g4-T65": (point(b=2, T=65, layout="paged", ps=16), [3000, 1100]),
    "paged1-g4-T16": (point(b=2, T=16, layout="paged", ps=1), [5000, 700]),
    "g8-T64-8warps": (point(heads=64, kv_heads=8, T=64), [4096]),
}


@pytest.mark.parametrize("keys", ["random", "growing", "paged"])
def test_wgmma_sumcheck_equals_wgmma_pv_and_replays_in_a_graph(keys, hopper):
    """Random keys (after each split's first tile every tile stays on the fast path), keys that
    grow along the sequence (tiles past the bound: the exact path, with and without a rescale),
    a paged cache: bit-equal to wgmma_pv, and a captured call replays equal to an eager one."""
    from harness.kernels.verify import custom_verify as cv

    pt = point(b=2, T=65, layout="paged" if keys == "paged" else "contiguous")
    inp = kw.make_inputs(pt, [9000, 3000], 5, DEV, torch.bfloat16)
    if keys == "growing":
        ramp = 1.0 + 3.0 * torch.arange(inp["k"].shape[2], device=DEV) / inp["k"].shape[2]
        inp["k"] = (inp["k"].float() * ramp[:, None]).to(torch.bfloat16)
    if keys == "paged":
        call = functools.partial(cv.tree_verify_attention_paged, inp["q"], inp["k"], inp["v"], inp["page_table"],
                                 inp["lengths"], inp["bits"])
    else:
        call = functools.partial(cv.tree_verify_attention, inp["q"], inp["k"], inp["v"], inp["lengths"],
                                 inp["bits"])
    a = call(impl="wgmma_pv")
    b = call(impl="wgmma_sumcheck")
    assert torch.equal(a, b)
    _replays_equal(lambda out: call(impl="wgmma_sumcheck", out=out), b)


# The pipelined kernel's variants, each over its shapes: NaN past each sequence on a contiguous
# cache (a row reading past its keys, a tail row's included, would carry it), 8 warps where the
# case says so, and any split count.
VARIANT_CASES = {"wgmma_tail": TAIL_CASES, "wgmma_sumcheck": SUMCHECK_CASES}


@pytest.mark.parametrize("impl,case", [(impl, c) for impl, cases in VARIANT_CASES.items() for c in cases])
def test_pipelined_variant_matches_float64_reference(impl, case, hopper):
    pt, lengths = VARIANT_CASES[impl][case]
    nan_tail = 37 if pt.layout == "contiguous" else 0
    warps = 8 if case.endswith("8warps") else None
    assert check(pt, lengths, impl=impl, nan_tail=nan_tail, num_warps=warps) <= TOL


@pytest.mark.parametrize("impl", list(VARIANT_CASES))
@pytest.mark.parametrize("splits", [1, 2, 7, 64])
def test_pipelined_variant_any_split_count(impl, splits, hopper):
    assert check(point(b=2, T=65), [3000, 150], num_splits=splits, impl=impl) <= TOL


def _replays_equal(call, eager: torch.Tensor) -> None:
    """`call(out)` captured in a graph (no host sync) replays equal to `eager`."""
    out = torch.empty_like(eager)
    call(out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.cuda.set_sync_debug_mode("error")
        try:
            call(out)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_wgmma_variant_equals_mma_variant_closely(hopper):
    """Same inputs, both variants: they differ only in fp32 summation order of Q K^T."""
    from harness.kernels.verify import custom_verify as cv

    pt = point(b=2, T=64)
    inp = kw.make_inputs(pt, [5000, 3000], 4, DEV, torch.bfloat16)
    args = (inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"])
    a, b = cv.tree_verify_attention(*args, impl="mma"), cv.tree_verify_attention(*args, impl="wgmma")
    assert ref.relative_error(b, a.double()) < 5e-3


@pytest.mark.parametrize("splits", [1, 2, 7, 64])
def test_any_split_count(splits):
    assert check(point(b=2, T=17), [3000, 150], num_splits=splits) <= TOL
    assert check(point("mla", heads=8, kv_heads=1, T=17, d=576), [3000], num_splits=splits) <= TOL


@pytest.mark.parametrize("splits", [1, 2, 7, 64])
def test_any_split_count_mla_wgmma_pv(splits, hopper):
    assert check(point("mla", heads=8, kv_heads=1, T=17, d=576), [3000], num_splits=splits,
                 impl="wgmma_pv") <= TOL


@pytest.mark.parametrize("warps", [2, 4, 8])
def test_any_warp_count(warps):
    assert check(point(b=2, T=33), [3000, 150], num_warps=warps) <= TOL


def test_graph_capture_replays_new_inputs():
    """Captured once, replayed with new q / cache / lengths / tree bits copied into the same
    buffers: equals eager calls, and never syncs the host."""
    from harness.kernels.verify import custom_verify as cv

    pt = point(b=2, T=16)
    a = kw.make_inputs(pt, [3000, 2000], 1, DEV, torch.bfloat16)
    b = kw.make_inputs(pt, [2500, 3000], 2, DEV, torch.bfloat16)   # the same cache shape as a
    static = {k: v.clone() for k, v in a.items() if torch.is_tensor(v)}
    pl = cv.plan(static["q"], pt.kv_heads, static["k"].shape[2], False)
    ws = cv.alloc_workspace(static["q"], pl["num_splits"], pt.dv)
    out = torch.empty(2, pt.heads, 16, pt.dv, dtype=torch.bfloat16, device=DEV)
    call = lambda: cv.tree_verify_attention(static["q"], static["k"], static["v"], static["lengths"],  # noqa: E731
                                            static["bits"], out=out, workspace=ws)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):          # (entering the capture synchronises by itself)
        torch.cuda.set_sync_debug_mode("error")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for inp in (b, a):
        for k, v in static.items():
            v.copy_(inp[k])
        graph.replay()
        torch.cuda.synchronize()
        eager = cv.tree_verify_attention(inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"])
        assert torch.equal(out, eager)


def test_view_of_a_bigger_cache_and_int64_lengths():
    """k, v as a slice of a larger buffer (the decode loop's cache), lengths as int64."""
    from harness.kernels.verify import custom_verify as cv

    pt = point(b=2, T=16)
    inp = kw.make_inputs(pt, [3000, 1000], 3, DEV, torch.bfloat16)
    big_k = torch.randn(2, 8, 5000, 128, device=DEV, dtype=torch.bfloat16)
    big_v = torch.randn(2, 8, 5000, 128, device=DEV, dtype=torch.bfloat16)
    n = inp["k"].shape[2]
    big_k[:, :, :n] = inp["k"]
    big_v[:, :, :n] = inp["v"]
    got = cv.tree_verify_attention(inp["q"], big_k[:, :, :4500], big_v[:, :, :4500],
                                   inp["lengths"].long(), inp["bits"])
    assert ref.relative_error(got, kw.reference(pt, inp)) <= TOL


def test_rejects_bad_inputs():
    from harness.kernels.verify import custom_verify as cv

    pt = point(T=16)
    inp = kw.make_inputs(pt, [100], 0, DEV, torch.bfloat16)
    with pytest.raises(TypeError):
        cv.tree_verify_attention(inp["q"].float(), inp["k"], inp["v"], inp["lengths"], inp["bits"])
    with pytest.raises(ValueError):
        cv.tree_verify_attention(inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"][:, :, :0])
    with pytest.raises(ValueError):     # group 3: not a power of two
        cv.tree_verify_attention(inp["q"][:, :24], inp["k"][:, :8], inp["v"][:, :8], inp["lengths"],
                                 inp["bits"])


@pytest.mark.parametrize("case", ["d128-g4-T16", "d128-g4-T64-b2", "d128-g4-T65", "d128-g4-T128"])
def test_the_tensor_copy_build_matches_the_reference(case, monkeypatch):
    """HARNESS_KERNEL_TMA=1 (kernels/build.py's TMA_FLAGS): the pipelined kernel feeds its
    contiguous K and V tiles by tensor copies. The cache runs 37 rows past the longest sequence
    and holds NaN past each one: the boxes read those rows, and their V rows must not reach P V."""
    monkeypatch.setenv("HARNESS_KERNEL_TMA", "1")
    pt, lengths = CASES[case]
    assert check(pt, lengths, impl="wgmma_pv", nan_tail=37) < TOL


@pytest.mark.parametrize("case", ["mla-H8-T16", "mla-H64-T16-b2", "mla-long"])
def test_the_tensor_copy_build_runs_mla_by_tensor_copies(case, monkeypatch, hopper):
    """HARNESS_KERNEL_TMA=1 runs MLA's wgmma_pv as mla_tma_kernel (nine boxes a tile): within the
    float64 check with NaN past each sequence, and bit-equal to the cp.async kernel."""
    from harness.kernels.verify import custom_verify as cv

    pt, lengths = CASES[case]
    inp = kw.make_inputs(pt, lengths, 1, DEV, torch.bfloat16)
    call = functools.partial(cv.mla_tree_verify_attention, inp["q"], inp["k"], inp["lengths"], inp["bits"],
                             impl="wgmma_pv")
    plain = call()                                   # the default build: cp.async
    monkeypatch.setenv("HARNESS_KERNEL_TMA", "1")
    assert check(pt, lengths, impl="wgmma_pv", nan_tail=37) < TOL
    assert torch.equal(plain, call())


@pytest.mark.parametrize("case", ["mla-H8-T16", "mla-H64-T16-b2", "mla-long", "d128-g4-T65", "d128-g4-T64-b2",
                                  "mla-H16-T65-paged16", "paged16-d128-g4-T65-b2"])
def test_wgmma_tma_matches_the_reference_and_wgmma_pv(case, hopper):
    """custom_impl wgmma_tma in the default build (mla_tma_kernel, gqa_tma_kernel; a paged cache
    runs wgmma_pv's kernel): within the float64 check with NaN past each sequence of a contiguous
    cache, and bit-equal to wgmma_pv."""
    from harness.kernels.verify import custom_verify as cv

    pt, lengths = CASES[case]
    if pt.layout == "contiguous":
        assert check(pt, lengths, impl="wgmma_tma", nan_tail=37) < TOL
    else:
        assert check(pt, lengths, impl="wgmma_tma") < TOL
    inp = kw.make_inputs(pt, lengths, 2, DEV, torch.bfloat16)
    table = inp.get("page_table")
    if pt.mla:
        call = functools.partial(cv.mla_tree_verify_attention, inp["q"], inp["k"], inp["lengths"], inp["bits"],
                                 page_table=table)
    elif table is not None:
        call = functools.partial(cv.tree_verify_attention_paged, inp["q"], inp["k"], inp["v"], table,
                                 inp["lengths"], inp["bits"])
    else:
        call = functools.partial(cv.tree_verify_attention, inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"])
    assert torch.equal(call(impl="wgmma_pv"), call(impl="wgmma_tma"))


def test_the_trace_build_stamps_every_cta_of_a_call(monkeypatch, hopper):
    """HARNESS_KERNEL_TRACE=1 (kernels/trace.cuh): one call at 65 tree tokens over 4096 keys
    leaves a row for each CTA of the split kernel and of its combine, their stamps in order, and
    anatomy.py's medians from them; the trace build's output is the default build's bit for bit
    (the stamps change no result)."""
    from harness.kernels.verify import anatomy, custom_verify as cv

    pt = point(T=65)
    inp = kw.make_inputs(pt, [4096], 3, DEV, torch.bfloat16)
    call = functools.partial(cv.tree_verify_attention, inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"],
                             impl="wgmma_sumcheck")
    plain = call()
    assert cv.read_trace() is None                       # the default build has no trace
    monkeypatch.setenv("HARNESS_KERNEL_TRACE", "1")
    cv.read_trace()                                      # builds the trace library, empties its rows
    traced = call()
    rows, n = cv.read_trace()
    assert torch.equal(plain, traced)
    plan = cv.plan(inp["q"], 8, 4096 + 65, paged=False, impl="wgmma_sumcheck")
    ctas = plan["m_blocks"] * plan["num_splits"] * 8
    splits = [r for r in rows if r["kernel"] == anatomy.SPLIT]
    combines = [r for r in rows if r["kernel"] == anatomy.COMBINE]
    assert n == len(rows) and len(splits) == ctas and len(combines) > 0
    for r in splits:
        assert all(a <= b for a, b in zip(r["clock"], r["clock"][1:])), r
        assert r["start_ns"] <= r["end_ns"]
    got = anatomy.anatomy(rows, tiles=cv.split_tiles(4096 + 65, plan["num_splits"]))
    assert got["calls"] == 1 and 0 < got["loop_us"] < got["split_us"]
