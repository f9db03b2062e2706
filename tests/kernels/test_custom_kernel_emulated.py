"""The CUDA verify-attention kernels, run on the CPU through the emulator (no GPU needed).

kernels/verify/verify_attention.cu is compiled as C++ with -DTVA_EMULATE against
tests/emulator/cuda_emulation.h: threads become fibers, ldmatrix / mma.sync / shuffles follow the
PTX fragment layouts, cp.async lands as late as wait_group allows. The same extern "C" entry
points as the GPU build are called through ctypes with the same parameter struct as
kernels/verify/custom_verify.py, and the output is compared with the float64 reference. Three schedules:
warps in lockstep; warps skewed at random; skewed with copies landing at issue (the stage-reuse
race). Each one catches a missing barrier or wait that the others may not (verified by breaking
the kernel on purpose while writing these tests).
"""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from cuda_checks import with_nan_tail
from emulator.emulate import emulated_library
from harness.kernels import build
from harness.kernels.verify import custom_verify as cv, verify_reference as ref
from harness.worker.workloads import kernel as kw

SCHEDULES = {"lockstep": (0, 0), "skewed": (0, 12345), "skewed-early-copies": (1, 777)}


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    lib = emulated_library("verify/verify_attention.cu", tmp_path_factory.mktemp("emu"))
    build._declare(lib)
    assert lib.tva_struct_size() == ctypes.sizeof(cv._Params)
    return lib


def _point(attention="gqa", b=1, heads=4, kv_heads=1, T=16, d=64, layout="contiguous", ps=16):
    dv = kw.MLA_DV if attention == "mla" else d
    return kw.Point(attention, b, 0, T, heads, kv_heads, d, dv, layout, ps)


def _run(lib, pt: kw.Point, lengths, splits, *, warps=None, wgmma=False, seed=0, lengths_dtype=torch.int32,
         key_ramp=None, v_row_pad=0, nan_tail=0, outputs=None, self_only=False, edit=None):
    inp = kw.make_inputs(pt, lengths, seed, torch.device("cpu"), torch.bfloat16)
    if edit is not None:             # the caller shapes the inputs (q, k, v) itself
        edit(inp)
    if self_only:                    # each tree token sees itself alone of the tree (not a real tree)
        eye = torch.eye(pt.tokens, dtype=torch.bool).expand(pt.batch, pt.tokens, pt.tokens)
        inp["bits"] = ref.pack_visibility(eye.contiguous())
    if nan_tail:                     # a contiguous cache longer than any sequence, NaN past each one
        with_nan_tail(inp, lengths, pt.tokens, nan_tail)
    if v_row_pad:                    # V rows strided apart from K's (a view of wider rows, NaN between)
        wide = torch.full((*inp["v"].shape[:-1], inp["v"].shape[-1] + v_row_pad), float("nan"),
                          dtype=inp["v"].dtype)
        wide[..., :inp["v"].shape[-1]] = inp["v"]
        inp["v"] = wide[..., :inp["v"].shape[-1]]
    if key_ramp is not None:         # keys scaled along the sequence (contiguous cache): scores grow
        n = inp["k"].shape[2]
        inp["k"] = (inp["k"].float() * key_ramp(torch.arange(n, dtype=torch.float32))[:, None]).to(torch.bfloat16)
        if pt.mla:                   # the values are the latent's first 512 columns
            inp["v"] = inp["k"][..., :kw.MLA_DV]
    inp["lengths"] = inp["lengths"].to(lengths_dtype)
    b, T = pt.batch, pt.tokens
    if "page_table" in inp:          # a pool's unwritten slots hold anything: never read them
        for i, L in enumerate(lengths):
            n, ps = L + T, pt.page_size
            if n % ps:
                last = int(inp["page_table"][i, (n - 1) // ps])
                inp["k"][last, :, n % ps:] = float("nan")
                if not pt.mla:
                    inp["v"][last, :, n % ps:] = float("nan")
    out = torch.full((b, pt.heads, T, pt.dv), float("nan"), dtype=torch.bfloat16)
    ws = (torch.full((splits * b * pt.heads * T * pt.dv,), float("nan")),
          torch.full((splits * b * pt.heads * T,), float("nan")))
    table = inp.get("page_table")
    page_size = pt.page_size if table is not None else 1
    scale = 1.0 / math.sqrt(pt.dk)
    lib.emu_clear_fault()
    p = cv._params(inp["q"], inp["k"], inp["k"] if pt.mla else inp["v"], out, inp["lengths"],
                   inp["bits"], table, ws, pt.kv_heads, splits, page_size, scale)
    if pt.mla:
        rc = lib.tva_mla_forward(ctypes.byref(p), int(table is not None), int(wgmma), None)
    else:
        w = warps or cv.gqa_warps(pt.heads // pt.kv_heads * T)
        rc = lib.tva_gqa_forward(ctypes.byref(p), pt.dk, w, int(table is not None), int(wgmma), None)
    assert rc == 0, f"launch failed ({rc}): {lib.emu_last_fault().decode()}"
    if outputs is not None:          # the caller keeps the output itself
        outputs.append(out)
    return ref.relative_error(out, kw.reference(pt, inp))


# (point, lengths, splits, warps): every feature at least once, small enough for seconds.
GQA_CASES = {
    "d128-g4-T16-3splits-b2": (_point(b=2, heads=8, kv_heads=2, T=16, d=128), [300, 171], 3, None),
    "d64-g8-T65-4splits": (_point(b=2, heads=8, kv_heads=1, T=65, d=64), [97, 260], 4, None),
    "g1-T1-decode": (_point(heads=4, kv_heads=4, T=1, d=128), [200], 2, None),
    "g4-T64-8warps": (_point(b=2, heads=16, kv_heads=4, T=64, d=64), [130, 64], 2, 8),
    "T128-one-split-direct-write": (_point(heads=2, kv_heads=1, T=128, d=128), [40], 1, None),
    "paged-ps16": (_point(b=2, heads=8, kv_heads=2, T=17, d=128, layout="paged"), [150, 77], 3, None),
    "paged-ps1": (_point(b=2, heads=4, kv_heads=2, T=33, d=64, layout="paged", ps=1), [90, 33], 2, None),
    "paged-ps7": (_point(b=2, heads=4, kv_heads=2, T=33, d=64, layout="paged", ps=7), [90, 33], 2, None),
    "empty-prefix": (_point(T=16), [0], 1, None),
    "more-splits-than-tiles": (_point(T=16), [1000], 40, None),
    # An odd split count: the combine's shared-memory float2 array once started 4 mod 8 bytes
    # (the H200's cudaErrorMisalignedAddress at 33 splits); the emulator now faults on it.
    "odd-33-splits": (_point(b=1, heads=8, kv_heads=2, T=16, d=128), [1200], 33, None),
    # More splits than the combine's warps hold in flight at once (4 warps x 8 for head_dim 128):
    # each warp folds several chunks, its running max moving between them.
    "combine-chunks-71-splits": (_point(b=1, heads=8, kv_heads=2, T=16, d=128), [4500], 71, None),
}
MLA_CASES = {
    "mla-H8-T16": (_point("mla", heads=8, T=16, d=576), [100], 1),
    "mla-b2-T17-3splits": (_point("mla", b=2, heads=4, T=17, d=576), [150, 61], 3),
    "mla-paged-ps16": (_point("mla", heads=16, T=5, d=576, layout="paged"), [70], 2),
    "mla-paged-ps1-empty": (_point("mla", b=2, heads=2, T=33, d=576, layout="paged", ps=1), [0, 40], 1),
    # Seven tiles in one split: every stage and the P tile reused several times.
    "mla-long-split": (_point("mla", heads=4, T=5, d=576), [400], 1),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(GQA_CASES))
def test_gqa_kernel_matches_reference(emu, case, schedule):
    emu.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits, warps = GQA_CASES[case]
    assert _run(emu, pt, lengths, splits, warps=warps) < 5e-3


# The wgmma variant (S = Q K^T on warpgroup MMA, 4 or 8 warps): K stored as swizzled 64-column
# blocks and read through descriptors.
WGMMA_CASES = {
    "wgmma-d128-4warps-b2": (_point(b=2, heads=8, kv_heads=2, T=16, d=128), [300, 171], 3, 4),
    "wgmma-d64-8warps-T65": (_point(b=2, heads=8, kv_heads=1, T=65, d=64), [97, 260], 4, 8),
    "wgmma-d128-8warps-T64": (_point(heads=16, kv_heads=4, T=64, d=128), [130], 2, 8),
    "wgmma-paged-ps16": (_point(b=2, heads=8, kv_heads=2, T=17, d=128, layout="paged"), [150, 77], 3, 4),
    "wgmma-paged-ps1-decode": (_point(heads=4, kv_heads=1, T=1, d=64, layout="paged", ps=1), [70], 1, 4),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(WGMMA_CASES))
def test_gqa_wgmma_kernel_matches_reference(emu, case, schedule):
    emu.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits, warps = WGMMA_CASES[case]
    assert _run(emu, pt, lengths, splits, warps=warps, wgmma=True) < 5e-3


# The pipelined kernel (wgmma 2: S and P V on wgmma, K and V in rings loaded three and two tiles
# ahead): splits of one, two and three tiles (the prologue's edges), empty splits, a partial row
# block (65 tokens), both warp counts, paged with a page per key.
PV_CASES = {c: v for c, v in WGMMA_CASES.items() if v[0].dk == 128} | {
    "pv-T65-5-row-blocks": (_point(b=2, heads=8, kv_heads=2, T=65, d=128), [300, 97], 5, 4),
    "pv-one-two-three-tiles": (_point(b=3, heads=4, kv_heads=1, T=16, d=128), [10, 70, 150], 1, 4),
    "pv-more-splits-than-tiles": (_point(heads=4, kv_heads=1, T=16, d=128), [200], 12, 4),
    "pv-paged-ps1-8warps": (_point(heads=16, kv_heads=2, T=16, d=128, layout="paged", ps=1), [250], 2, 8),
    # A page size that is no power of two: the multiply-high division (IntDiv) rounds right.
    "pv-paged-ps7": (_point(b=2, heads=8, kv_heads=2, T=17, d=128, layout="paged", ps=7), [150, 77], 3, 4),
    # Splits of many tiles: the ring's steady state, where a V tile's copy reuses the pages its K
    # tile read an iteration earlier (short splits never reach it).
    "pv-paged-ps16-long-splits": (_point(b=2, heads=8, kv_heads=2, T=16, d=128, layout="paged"), [900, 500], 2, 4),
    # Partial last row blocks: 16 rows over long splits, one block of 16 rows writing the output
    # itself, and 4 rows paged in the ring's steady state.
    "pv-tail-16-rows-long-splits": (_point(heads=8, kv_heads=2, T=20, d=128), [700], 2, 4),
    "pv-tail-only-block-one-split": (_point(b=2, heads=4, kv_heads=1, T=4, d=128), [130, 45], 1, 4),
    "pv-tail-paged-ps1": (_point(heads=4, kv_heads=1, T=65, d=128, layout="paged", ps=1), [400], 2, 4),
    # More page sizes: a page per 8 keys (a thread's row step at 4 warps), pages across tiles
    # (24) over five row blocks, a page per tile (64), and 8 warps on 16- and 24-key pages; the
    # lengths end mid-page, where the unwritten slots hold NaN (_run).
    "pv-paged-ps8": (_point(b=2, heads=8, kv_heads=2, T=17, d=128, layout="paged", ps=8), [150, 77], 3, 4),
    "pv-paged-ps24-T65-long": (_point(b=2, heads=8, kv_heads=2, T=65, d=128, layout="paged", ps=24), [700, 333], 2, 4),
    "pv-paged-ps64": (_point(heads=4, kv_heads=1, T=16, d=128, layout="paged", ps=64), [301], 3, 4),
    "pv-paged-ps16-8warps": (_point(heads=16, kv_heads=2, T=16, d=128, layout="paged"), [250], 2, 8),
    "pv-paged-ps24-8warps": (_point(heads=16, kv_heads=2, T=16, d=128, layout="paged", ps=24), [250], 2, 8),
}


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_v_strided_apart_from_k(emu, layout):
    """K and V with different strides (V's rows padded): a copy that took K's row offsets for V
    reads the padding (NaN)."""
    emu.emu_configure(*SCHEDULES["skewed"])
    pt = _point(b=2, heads=8, kv_heads=2, T=65, d=128, layout=layout)
    assert _run(emu, pt, [500, 333], 2, warps=4, wgmma=2, v_row_pad=8) < 5e-3


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(PV_CASES))
def test_gqa_wgmma_pv_kernel_matches_reference(emu, case, schedule):
    """P V on wgmma too (wgmma 2): V stored as K is and read as an MN-major operand. head_dim
    128 only: the old single-stage kernel's d64 instance passed here but failed the float64
    check on the H200 (kernels/NOTES.md), so the pipelined kernel exists for 128 alone."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits, warps = PV_CASES[case]
    assert _run(emu, pt, lengths, splits, warps=warps, wgmma=2) < 5e-3


# The tail kernel (wgmma 3): M = nb 64 + rem rows with 0 < rem <= nb run as nb row blocks, CTA i
# carrying row 64 nb + i on its tiles (S^T and O^T on m64n8 wgmmas, a softmax a warp). 65 tree
# tokens over 1, 2, 4 and 8 query heads a KV head (nb tail rows, one a CTA); 129 (8 blocks, 4
# tail rows: CTAs without one); one split writing the output itself; splits long enough to cycle
# V's three stages and P^T's two buffers many times; empty splits; an empty prefix; NaN past each
# sequence; and shapes without a tail (rem > nb: 33 tokens x 8 heads; rem 0) that run the plain
# pipelined kernel.
TAIL_CASES = {
    "tail-g4-T65-b2": (_point(b=2, heads=8, kv_heads=2, T=65, d=128), [300, 97], 2),
    "tail-g1-T65": (_point(heads=1, kv_heads=1, T=65, d=128), [150], 2),
    "tail-g2-T65-one-split": (_point(b=2, heads=4, kv_heads=2, T=65, d=128), [200, 70], 1),
    "tail-g8-T65": (_point(heads=8, kv_heads=1, T=65, d=128), [130], 3),
    "tail-g4-T129-empty-tail-ctas": (_point(heads=4, kv_heads=1, T=129, d=128), [180], 2),
    "tail-g4-T65-long-split": (_point(heads=4, kv_heads=1, T=65, d=128), [1100], 1),
    "tail-g4-T65-long-splits": (_point(b=2, heads=8, kv_heads=2, T=65, d=128), [900, 500], 2),
    "tail-more-splits-than-tiles": (_point(heads=4, kv_heads=1, T=65, d=128), [60], 9),
    "tail-empty-prefix": (_point(heads=4, kv_heads=1, T=65, d=128), [0], 1),
    "tail-none-g8-T33": (_point(heads=8, kv_heads=1, T=33, d=128), [200], 2),
    "tail-none-T64": (_point(heads=4, kv_heads=1, T=64, d=128), [200], 2),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(TAIL_CASES))
def test_gqa_tail_kernel_matches_reference(emu, case, schedule):
    """The tail kernel against float64, the cache holding NaN past each sequence (a tail row
    that read a key past its tree, or a V row past the split unmasked, would carry it)."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits = TAIL_CASES[case]
    assert _run(emu, pt, lengths, splits, warps=4, wgmma=3, nan_tail=37) < 5e-3


@pytest.mark.parametrize("case", ["tail-g4-T65-long-splits", "tail-g2-T65-one-split", "tail-g4-T129-empty-tail-ctas"])
def test_tail_kernel_with_lagging_warps(emu, case):
    """Warp 0 of every CTA races ahead (warps 1-3 run one round in 64) with copies landing at
    issue: a warp that refills V_{j-1}'s stage or P^T_{j-1}'s buffer while another still has
    P_{j-1} V_{j-1} in flight changes an operand under it (random skew rarely lags a warp that
    far; the second barrier a tile is what this case checks)."""
    emu.emu_configure(1, 4242)
    emu.emu_slow_rank(0, 64, 0)
    try:
        pt, lengths, splits = TAIL_CASES[case]
        assert _run(emu, pt, lengths, splits, warps=4, wgmma=3, nan_tail=37) < 5e-3
    finally:
        emu.emu_slow_rank(0, 0, 1)
        emu.emu_configure(0, 0)


@pytest.mark.parametrize("schedule", ["lockstep", "skewed"])
def test_tail_rescales_when_the_max_grows(emu, schedule):
    """As test_wgmma_pv_rescales_when_the_max_grows, for the tail rows: each warp's running max
    of its keys moves mid-split, and the other warps must rescale the O^T rows they hold for
    that warp's column before the next tile's product (a kernel that skips it fails here)."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt = _point(b=2, heads=8, kv_heads=2, T=65, d=128)
    ramp = lambda j: 1.0 + 0.04 * j
    assert _run(emu, pt, [300, 250], 2, warps=4, wgmma=3, key_ramp=ramp) < 5e-3


def test_tail_row_blocks_and_the_plans_row_blocks():
    """Where the tail kernel runs and how many row blocks the split plan counts for it: the
    plan's side of the rule (the launcher sizes its grid by its own copy, tail_row_blocks in
    verify_attention.cu, which the launch-count and dry-run tests exercise)."""
    assert cv.tail_row_blocks(4 * 65) == 4 and cv.tail_row_blocks(65) == 1 and cv.tail_row_blocks(8 * 65) == 8
    assert cv.tail_row_blocks(4 * 129) == 8                  # 4 tail rows over 8 CTAs
    assert cv.tail_row_blocks(8 * 33) == 0 and cv.tail_row_blocks(256) == 0 and cv.tail_row_blocks(40) == 0
    assert cv.row_blocks(260, 4, "wgmma_tail", paged=False) == 4
    assert cv.row_blocks(260, 4, "wgmma_tail", paged=True) == 5      # paged: the plain pipelined kernel
    assert cv.row_blocks(260, 4, "wgmma_pv", paged=False) == 5


@pytest.fixture(scope="module")
def emu_tma(tmp_path_factory):
    """The same source built with -DTVA_TMA: the pipelined kernel's contiguous K and V tiles by
    tensor copies through tensor maps, waited for on mbarriers."""
    lib = emulated_library("verify/verify_attention.cu", tmp_path_factory.mktemp("emu_tma"), defines=("TVA_TMA",))
    build._declare(lib)
    return lib


TMA_CASES = {c: v for c, v in PV_CASES.items() if v[0].layout == "contiguous" and v[3] == 4}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(TMA_CASES))
def test_gqa_tma_kernel_matches_reference(emu_tma, case, schedule):
    """The tensor-copy build (4 warps, contiguous): every ring stage's barrier through its
    phases, the prologue's edges, empty splits; the cache runs 37 rows past the longest sequence
    and holds NaN past each one, which the boxes read and the V rows must not pass on."""
    emu_tma.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits, warps = TMA_CASES[case]
    assert _run(emu_tma, pt, lengths, splits, warps=warps, wgmma=2, nan_tail=37) < 5e-3


# MLA in the tensor-copy build: the contiguous cases, and splits of which some hold no tile.
MLA_TMA_CASES = {c: v for c, v in MLA_CASES.items() if v[0].layout == "contiguous"} | {
    "mla-b2-empty-prefix-9splits": (_point("mla", b=2, heads=4, T=5, d=576), [0, 200], 9),
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(MLA_TMA_CASES))
def test_mla_tma_kernel_equals_the_cp_async_kernel(emu, case, schedule):
    """mla_tma_kernel (impl wgmma_tma, code 12) is bit-equal to mla_pv_kernel (wgmma_pv), each
    stage's barrier through its phases (seven tiles in one split), on a cache running 37 rows
    past the longest sequence with NaN past each one: the boxes read those rows, and the V rows
    must not pass them on."""
    pt, lengths, splits = MLA_TMA_CASES[case]
    outs, copies = [], []
    emu.emu_configure(*SCHEDULES[schedule])
    for code in (2, 12):
        before = emu.emu_tensor_copy_count()
        assert _run(emu, pt, lengths, splits, wgmma=code, nan_tail=37, outputs=outs) < 5e-3
        copies.append(emu.emu_tensor_copy_count() - before)
    assert torch.equal(outs[0], outs[1])
    assert copies[0] == 0 and copies[1] > 0 and copies[1] % 9 == 0     # nine boxes a tile, by code 12 alone


@pytest.mark.parametrize("case", ["mla-long-split", "mla-b2-empty-prefix-9splits"])
def test_the_tensor_copy_build_runs_mla_wgmma_pv_by_tensor_copies(emu, emu_tma, case):
    """-DTVA_TMA sends wgmma_pv (code 2) to mla_tma_kernel too: bit-equal to wgmma_tma in the
    default build, with NaN past each sequence (mla_pv_kernel zero-fills those rows itself)."""
    pt, lengths, splits = MLA_TMA_CASES[case]
    outs = []
    for lib, code in ((emu, 12), (emu_tma, 2)):
        lib.emu_configure(*SCHEDULES["skewed-early-copies"])
        before = lib.emu_tensor_copy_count()
        _run(lib, pt, lengths, splits, wgmma=code, nan_tail=37, outputs=outs)
        assert lib.emu_tensor_copy_count() > before, code      # by boxes, not cp.async
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("case", list(TMA_CASES))
def test_gqa_wgmma_tma_is_the_tensor_copy_builds_pipelined_kernel(emu, emu_tma, case):
    """impl wgmma_tma (code 12) in the default build runs gqa_tma_kernel: bit-equal to the
    -DTVA_TMA build's wgmma_pv and to the default build's (cp.async), NaN past each sequence."""
    pt, lengths, splits, warps = TMA_CASES[case]
    outs, copies = [], []
    for lib, code in ((emu, 12), (emu_tma, 2), (emu, 2)):
        lib.emu_configure(*SCHEDULES["skewed"])
        before = lib.emu_tensor_copy_count()
        assert _run(lib, pt, lengths, splits, warps=warps, wgmma=code, nan_tail=37, outputs=outs) < 5e-3
        copies.append(lib.emu_tensor_copy_count() - before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert copies[0] == copies[1] > 0 and copies[2] == 0


@pytest.mark.parametrize("schedule", ["lockstep", "skewed-early-copies"])
def test_mla_tma_kernel_rescales_when_the_max_grows(emu, schedule):
    """As test_mla_wgmma_pv_rescales_when_the_max_grows, for wgmma_tma."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt = _point("mla", heads=4, T=5, d=576)
    assert _run(emu, pt, [400], 1, wgmma=12, nan_tail=37, key_ramp=lambda j: 1.0 + 0.04 * j) < 5e-3


@pytest.mark.parametrize("case", ["T65-random", "T65-growing-keys"])
def test_sumcheck_tma_kernel_equals_the_pipelined_tma_kernel(emu_tma, case):
    """The sum-checked softmax in the tensor-copy build (gqa_tma_kernel<..., SUMCHECK>): bit-equal
    to that build's wgmma_pv, on random keys and on keys growing along the sequence (the exact
    path), with NaN past each sequence read by the boxes."""
    emu_tma.emu_configure(*SCHEDULES["skewed-early-copies"])
    pt, lengths, splits, warps, extra = SUMCHECK_EQUAL_CASES[case]
    outs = {}
    for wgmma in (2, 6):
        _run(emu_tma, pt, lengths, splits, warps=warps, wgmma=wgmma, nan_tail=37,
             outputs=outs.setdefault(wgmma, []), **extra)
    assert torch.equal(outs[2][0], outs[6][0])


# The sum-checked softmax (wgmma 6: the tile max only where P's partial sums pass 2^7): every
# shape the pipelined kernel runs, contiguous and paged, 4 and 8 warps; its copies and barriers
# are wgmma_pv's (checked under every schedule above), so one schedule, the racy one.
@pytest.mark.parametrize("case", list(PV_CASES))
def test_gqa_sumcheck_kernel_matches_reference(emu, case):
    emu.emu_configure(*SCHEDULES["skewed-early-copies"])
    pt, lengths, splits, warps = PV_CASES[case]
    assert _run(emu, pt, lengths, splits, warps=warps, wgmma=6) < 5e-3


SUMCHECK_EQUAL_CASES = {
    # random scores: after a split's first tile every sum stays far below the bound
    "T65-random": (_point(b=2, heads=8, kv_heads=2, T=65, d=128), [700, 333], 3, 4, {}),
    "paged-ps16-8warps": (_point(heads=16, kv_heads=2, T=16, d=128, layout="paged"), [900], 2, 8, {}),
    # keys growing along the sequence: sums past the bound, the exact path with and without a
    # rescale of O
    "T65-growing-keys": (_point(b=2, heads=8, kv_heads=2, T=65, d=128), [300, 250], 2, 4,
                         {"key_ramp": lambda j: 1.0 + 0.04 * j}),
    "paged-growing-keys": (_point(b=2, heads=8, kv_heads=2, T=17, d=128, layout="paged"), [300, 200], 2, 4,
                           {"key_ramp": lambda j: 1.0 + 0.04 * j}),
}


@pytest.mark.parametrize("case", list(SUMCHECK_EQUAL_CASES))
def test_sumcheck_kernel_equals_the_pipelined_kernel(emu, case):
    """A tile whose sums pass the bound runs wgmma_pv's softmax itself, and one whose sums do
    not would not have moved the max there: the outputs are bit-equal to wgmma_pv's (the split
    partials and their merge included), whichever path each tile took."""
    emu.emu_configure(*SCHEDULES["skewed"])
    pt, lengths, splits, warps, extra = SUMCHECK_EQUAL_CASES[case]
    outs = {}
    for wgmma in (2, 6):
        _run(emu, pt, lengths, splits, warps=warps, wgmma=wgmma, outputs=outs.setdefault(wgmma, []), **extra)
    assert torch.equal(outs[2][0], outs[6][0])


def test_sumcheck_takes_the_exact_path_for_a_row_that_has_seen_nothing(emu):
    """Tree token 64 sees only itself (key 64, the second tile): through the first tile its max
    is -inf. Its one score is ~+-700 in log2 units (keys x 500), so P against a reference of 0
    would underflow to zeros where the score is negative (l = 0: a zero row instead of V_64); the
    row must take the exact path, which sets the max from the score."""
    emu.emu_configure(*SCHEDULES["lockstep"])
    pt = _point(b=2, heads=8, kv_heads=2, T=65, d=128)
    big = lambda j: torch.full_like(j, 500.0)
    assert _run(emu, pt, [0, 0], 1, warps=4, wgmma=6, self_only=True, key_ramp=big) < 5e-3


@pytest.mark.parametrize("schedule", ["lockstep", "skewed"])
def test_wgmma_pv_rescales_when_the_max_grows(emu, schedule):
    """The pipelined kernel moves a row's reference max only when a tile's max exceeds it by
    more than 2^8 (RESCALE_LOG2); random keys rarely do after the first tile. Keys scaled up
    along the sequence make each split's max jump past the margin again later on, so O's
    rescale runs mid-split (a kernel that skips it fails here)."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt = _point(b=2, heads=8, kv_heads=2, T=65, d=128)
    ramp = lambda j: 1.0 + 0.04 * j               # scores' spread grows ~13x over 300 keys
    assert _run(emu, pt, [300, 250], 2, warps=4, wgmma=2, key_ramp=ramp) < 5e-3


def test_wgmma_pv_is_refused_below_head_dim_128(emu):
    pt = _point(heads=4, kv_heads=1, T=16, d=64)
    with pytest.raises(AssertionError, match="launch failed"):
        _run(emu, pt, [100], 1, warps=4, wgmma=2)


@pytest.mark.parametrize("wgmma", [0, 1, 2], ids=["mma", "wgmma", "wgmma_pv"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("case", list(MLA_CASES))
def test_mla_kernel_matches_reference(emu, case, schedule, wgmma):
    emu.emu_configure(*SCHEDULES[schedule])
    pt, lengths, splits = MLA_CASES[case]
    assert _run(emu, pt, lengths, splits, wgmma=wgmma) < 5e-3


@pytest.mark.parametrize("splits", [48, 57])
def test_mla_combine_on_either_slice_width(emu, splits):
    """More than COMBINE_NARROW_SPLITS (48) splits of a 512-wide row take the combine's 64-column
    slices (eight warps a row, a chunk of 32 splits), 48 the 128-column ones: both against the
    reference, with splits of one tile, of part of one and empty ones (b 2, one sequence empty)."""
    emu.emu_configure(0, 0)
    pt = _point("mla", b=2, heads=2, T=5, d=576)
    assert _run(emu, pt, [300, 0], splits, wgmma=2) < 5e-3


@pytest.mark.parametrize("schedule", ["lockstep", "skewed"])
def test_mla_wgmma_pv_rescales_when_the_max_grows(emu, schedule):
    """mla_pv_kernel's lazy rescale, as the GQA one's: keys scaled up along the sequence make
    the max jump past RESCALE_LOG2 again mid-split, so O's rescale runs there."""
    emu.emu_configure(*SCHEDULES[schedule])
    pt = _point("mla", heads=4, T=5, d=576)
    assert _run(emu, pt, [400], 1, wgmma=2, key_ramp=lambda j: 1.0 + 0.04 * j) < 5e-3


def test_int64_lengths_and_every_warp_count(emu):
    emu.emu_configure(0, 0)
    pt = _point(b=2, heads=8, kv_heads=2, T=16, d=128)
    for warps in (2, 4, 8):
        assert _run(emu, pt, [129, 64], 2, warps=warps, lengths_dtype=torch.int64) < 5e-3


def test_a_wrong_mask_is_caught(emu):
    """The check is not vacuous: the same kernel fed another tree's bits is far off."""
    emu.emu_configure(0, 0)
    pt = _point(T=16, d=64)
    inp = kw.make_inputs(pt, [64], 0, torch.device("cpu"), torch.bfloat16)
    out = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16)
    wrong_bits = ref.pack_visibility(torch.ones(1, 16, 16, dtype=torch.bool))   # everything visible
    p = cv._params(inp["q"], inp["k"], inp["v"], out, inp["lengths"], wrong_bits, None,
                   (torch.empty(0), torch.empty(0)), 1, 1, 1, 1 / 8)
    assert emu.tva_gqa_forward(ctypes.byref(p), 64, 4, 0, 0, None) == 0
    assert ref.relative_error(out, kw.reference(pt, inp)) > 0.05


def test_misaligned_accesses_fault_like_the_gpu(emu):
    """The alignment checks are live: a q view starting 8 bytes into its storage (16-byte
    cp.async from it) fails the launch with cudaErrorMisalignedAddress and says where."""
    emu.emu_configure(0, 0)
    pt = _point(T=16, d=64)
    inp = kw.make_inputs(pt, [64], 0, torch.device("cpu"), torch.bfloat16)
    q = torch.empty(inp["q"].numel() + 4, dtype=torch.bfloat16)[4:].view_as(inp["q"])
    q.copy_(inp["q"])
    out = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16)
    p = cv._params(q, inp["k"], inp["v"], out, inp["lengths"], inp["bits"], None,
                   (torch.empty(0), torch.empty(0)), 1, 1, 1, 1 / 8)
    emu.emu_clear_fault()
    assert emu.tva_gqa_forward(ctypes.byref(p), 64, 4, 0, 0, None) == 716
    assert "cp.async 16: global address" in emu.emu_last_fault().decode()
    # A typed store through a misaligned pointer (the output, 2 bytes off) is caught by the
    # -fsanitize=alignment hook with its source line.
    bad_out = torch.empty(out.numel() + 1, dtype=torch.bfloat16)[1:].view_as(out)
    p = cv._params(inp["q"], inp["k"], inp["v"], bad_out, inp["lengths"], inp["bits"], None,
                   (torch.empty(0), torch.empty(0)), 1, 1, 1, 1 / 8)
    emu.emu_clear_fault()
    assert emu.tva_gqa_forward(ctypes.byref(p), 64, 4, 0, 0, None) == 716
    assert "verify_attention.cu:" in emu.emu_last_fault().decode()
    emu.emu_clear_fault()


# -- host-side planning (pure Python) -------------------------------------------------------------

def test_wgmma_needs_whole_warpgroups(emu):
    emu.emu_configure(0, 0)
    pt = _point(T=16, d=64)
    inp = kw.make_inputs(pt, [64], 0, torch.device("cpu"), torch.bfloat16)
    out = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16)
    p = cv._params(inp["q"], inp["k"], inp["v"], out, inp["lengths"], inp["bits"], None,
                   (torch.empty(0), torch.empty(0)), 1, 1, 1, 1 / 8)
    assert emu.tva_gqa_forward(ctypes.byref(p), 64, 2, 0, 1, None) != 0      # 2 warps: refused


def test_warps_minimise_padding():
    assert cv.gqa_warps(1 * 4) == 2        # decode step, group 4: 32 rows of 16 * 2
    assert cv.gqa_warps(16 * 4) == 4       # T 16, group 4: exactly one block of 64
    assert cv.gqa_warps(64 * 4) == 8       # T 64, group 4: two blocks of 128
    assert cv.gqa_warps(8 * 16) == 8       # group 8, T 16: one block of 128, KV read once
    assert cv.gqa_warps(65 * 4) == 8       # 260 rows: 3 x 128, not 9 x 32 (nine L2 re-reads)
    # The pipelined wgmma_pv kernel: 4 warps at every shape (faster on the H200 at 16, 64, 65
    # tree tokens); the others follow gqa_warps.
    assert [cv.plan_warps(r, "wgmma_pv") for r in (64, 256, 260, 1024)] == [4, 4, 4, 4]
    assert cv.plan_warps(256, "wgmma") == cv.gqa_warps(256, wgmma=True) == 8
    assert cv.plan_warps(256, "mma") == cv.gqa_warps(256) == 8


def test_splits_avoid_a_partial_second_wave():
    # 16 CTAs per split on 132 one-CTA slots: 8 splits (128 CTAs, one wave), never 9 (144: two).
    assert cv.best_splits(16, 132, 65600, 320) == 8
    # 8 CTAs per split, 264 slots: 33 splits fill exactly one wave.
    assert cv.best_splits(8, 264, 65552, 192) == 33
    # One row block (16 tree tokens x 4 heads) counts one CTA a multiprocessor: 16 splits of
    # 16400 keys (128 CTAs), not the 33 that two a multiprocessor would take; five row blocks
    # (65 tree tokens) count both, and so does one row block over a paged cache whose kernel
    # looks each row's page up in every thread (mma, wgmma; not the pipelined wgmma_pv).
    assert cv.gqa_slots(1, 2, 132) == 132 and cv.gqa_slots(5, 2, 132) == 264
    assert cv.gqa_slots(1, 2, 132, per_row_pages=True) == 264
    assert cv.best_splits(8, cv.gqa_slots(1, 2, 132), 16400, 192) == 16
    assert cv.best_splits(40, cv.gqa_slots(5, 2, 132), 65601, 192) == 13
    # A cost every CTA adds to the whole call (MLA's partials) takes fewer splits where a split
    # holds few tiles: 43 for two row blocks over 16400 keys (six tiles a CTA, one wave of 86)
    # where the per-wave model filled the wave with 65 (four tiles); from 65536 keys the loop
    # outweighs it and 65 stay.
    assert cv.best_splits(2, 132, 16400, 64, shared_keys=0) == 65
    assert cv.best_splits(2, 132, 16400, 64, shared_keys=5) == 43
    assert cv.best_splits(2, 132, 65552, 64, shared_keys=5) == 65
    # Tiny contexts never split below one tile per split.
    assert cv.best_splits(8, 264, 100, 192) <= 2
    assert cv.best_splits(1, 1, 10**6, 64) == 1


def test_a_paged_pool_past_32_gib_is_refused():
    """The pipelined paged kernel's copies address a row as a 32-bit count of 16-byte chunks: a
    pool whose last row lies 2^31 chunks or more from a head's first row is refused before any
    launch (the mma and wgmma kernels' 64-bit offsets are not limited)."""
    fits = torch.empty((2**20 - 1, 8, 16, 128), dtype=torch.bfloat16, device="meta")   # 32 GiB - 32 KiB
    cv._check_pool_span("k_pages", fits)
    too_big = torch.empty((2**20 + 1, 8, 16, 128), dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="k_pages spans .*wgmma_pv.* at most 32 GiB"):
        cv._check_pool_span("k_pages", too_big)


# -- launch configurations (the emulator checks them as the CUDA runtime does on an H200) -------

H200_SMS, H200_SMEM_OPTIN = 132, 232448


def _launch_params(b, hq, hkv, T, splits, page_size=1):
    """A parameter struct with shapes only: in dry-run mode no block runs, so no pointer is read."""
    p = cv._Params()
    p.batch, p.heads_q, p.heads_kv, p.tokens, p.num_splits, p.page_size = b, hq, hkv, T, splits, page_size
    p.sm_scale = 0.1
    return p


def _h200_splits(lib, b, hq, hkv, T, d, max_keys, mla=False, wgmma=False, paged=False):
    """cv.plan's split count with the H200's SM count (plan itself asks the GPU)."""
    if mla:
        m_blocks = math.ceil(hq * T / 64)
        return 8, cv.best_splits(b * m_blocks, H200_SMS, max_keys, cv.TILE_KEYS, shared_keys=cv.MLA_SHARED_KEYS)
    impl = {code: name for name, code in cv._IMPL_CODE.items()}[int(wgmma)]
    warps = cv.plan_warps(hq // hkv * T, impl)   # as custom_verify.plan picks
    m_blocks = cv.row_blocks(hq // hkv * T, warps, impl, paged)
    occupancy = max(1, (228 * 1024) // (lib.tva_gqa_smem_bytes(d, warps, int(wgmma)) + 1024))
    slots = cv.gqa_slots(m_blocks, occupancy, H200_SMS, per_row_pages=paged and impl not in cv.PIPELINED)
    return warps, cv.best_splits(b * hkv * m_blocks, slots, max_keys,
                                 cv._overhead_keys(16 * warps, d, 4 * d))


# The H200 benchmark's points in the order its first run took them, in one process: the
# first launch of one kernel instance must not hide another's missing shared-memory opt-in
# (the H200's "invalid argument" for every configuration but the first one launched).
H200_POINTS = [  # (name, b, hq, hkv, T, d, context, layout, page size, wgmma)
    ("gqa-T16-4096", 1, 32, 8, 16, 128, 4096, "contiguous", 1, False),
    ("gqa-T16-65536", 1, 32, 8, 16, 128, 65536, "contiguous", 1, False),
    ("gqa-T64-65536", 1, 32, 8, 64, 128, 65536, "contiguous", 1, False),
    ("gqa-T64-131072", 1, 32, 8, 64, 128, 131072, "contiguous", 1, False),
    ("gqa-d64-T1-decode", 4, 32, 8, 1, 64, 65536, "contiguous", 1, False),
    ("mla-H8-T16-65536", 1, 8, 1, 16, 576, 65536, "mla", 1, False),
    ("mla-H64-T16-paged", 2, 64, 1, 16, 576, 65536, "mla-paged", 16, False),
    ("paged-ps16-T16-65536", 1, 32, 8, 16, 128, 65536, "paged", 16, False),
    ("paged-ps1-T16-65536", 1, 32, 8, 16, 128, 65536, "paged", 1, False),
    ("wg-gqa-T16-65536", 1, 32, 8, 16, 128, 65536, "contiguous", 1, True),
    ("wg-gqa-T64-65536", 1, 32, 8, 64, 128, 65536, "contiguous", 1, True),
    ("wg-mla-H8-T16-65536", 1, 8, 1, 16, 576, 65536, "mla", 1, True),
    ("pv-mla-H8-T16-65536", 1, 8, 1, 16, 576, 65536, "mla", 1, 2),
    ("pv-mla-H64-T16-paged", 2, 64, 1, 16, 576, 65536, "mla-paged", 16, 2),
    ("tail-gqa-T65-65536", 1, 32, 8, 65, 128, 65536, "contiguous", 1, 3),
    ("tail-gqa-T65-4096-b4", 4, 32, 8, 65, 128, 4096, "contiguous", 1, 3),
    ("tail-paged-ps16-T65", 1, 32, 8, 65, 128, 65536, "paged", 16, 3),
    ("sumcheck-gqa-T65-65536", 1, 32, 8, 65, 128, 65536, "contiguous", 1, 6),
    ("sumcheck-gqa-T65-4096-b4", 4, 32, 8, 65, 128, 4096, "contiguous", 1, 6),
    ("sumcheck-paged-ps16-T65", 1, 32, 8, 65, 128, 65536, "paged", 16, 6),
]


def test_h200_launch_configurations_are_accepted(emu):
    emu.emu_dry_run(1)
    try:
        for name, b, hq, hkv, T, d, ctx, layout, ps, wgmma in H200_POINTS:
            mla = layout.startswith("mla")
            warps, splits = _h200_splits(emu, b, hq, hkv, T, d, ctx + T, mla=mla, wgmma=wgmma,
                                         paged=layout == "paged")
            for s in sorted({1, splits, cv.MAX_REQUESTED_SPLITS}):
                p = _launch_params(b, hq, hkv, T, s, ps)
                emu.emu_clear_fault()
                before = emu.emu_launch_count()
                if mla:
                    rc = emu.tva_mla_forward(ctypes.byref(p), int(layout == "mla-paged"), int(wgmma), None)
                else:
                    rc = emu.tva_gqa_forward(ctypes.byref(p), d, warps, int(layout == "paged"), int(wgmma), None)
                assert rc == 0, f"{name} splits={s}: {emu.emu_last_fault().decode()}"
                assert emu.emu_launch_count() - before == (1 if s == 1 else 2)   # main (+ combine)
    finally:
        emu.emu_dry_run(0)
        emu.emu_clear_fault()


def test_every_kernel_fits_the_h200_shared_memory(emu):
    """The launchers' own sizes (exported by the same source) fit the H200's per-block opt-in."""
    sizes = {(d, w, wg): emu.tva_gqa_smem_bytes(d, w, wg) for d in (64, 128) for w in (2, 4, 8)
             for wg in (0, 1) if not (wg and w == 2)}
    assert sizes[(128, 8, 0)] == 131072 and sizes[(128, 4, 0)] == 114688
    assert max(sizes.values()) <= H200_SMEM_OPTIN
    assert 200 * 1024 < emu.tva_mla_smem_bytes() <= H200_SMEM_OPTIN


@pytest.mark.parametrize("wgmma", [4, 5, 7, 8, 9, 10, 11, -1])
def test_a_code_without_a_variant_is_refused(emu, wgmma):
    """tva_gqa_forward refuses a code that names no variant (4, 5, 7, 8, 9 and 10 once did,
    variants since removed) with cudaErrorInvalidValue and launches nothing, at every warp count,
    head dim and layout: not a kernel of another code whose sum with the warps it matches (8 at 2
    warps is 16, the mma kernel at 4 warps). tva_gqa_occupancy answers 0 for it, its error value."""
    emu.emu_dry_run(1)
    try:
        for d in (64, 128):
            for warps in (2, 4, 8):
                for paged in (0, 1):
                    p = _launch_params(1, 32, 8, 65, 4, 16 if paged else 1)
                    emu.emu_clear_fault()
                    before = emu.emu_launch_count()
                    assert emu.tva_gqa_forward(ctypes.byref(p), d, warps, paged, wgmma, None) == 1, (d, warps, paged)
                    assert emu.emu_launch_count() == before, (d, warps, paged)
                    assert emu.tva_gqa_occupancy(d, warps, paged, wgmma) == 0
    finally:
        emu.emu_dry_run(0)
        emu.emu_clear_fault()


def test_launch_limits_are_enforced(emu):
    """The emulator's runtime checks are live: a grid with more than 65535 (batch x KV heads)
    and a kernel whose opt-in was never raised are refused with cudaErrorInvalidValue (1)."""
    emu.emu_dry_run(1)
    try:
        p = _launch_params(65536, 8, 8, 1, 2)          # grid z = 65536 * 8 > 65535
        emu.emu_clear_fault()
        assert emu.tva_gqa_forward(ctypes.byref(p), 64, 2, 0, 0, None) == 1
        assert "grid" in emu.emu_last_fault().decode()
    finally:
        emu.emu_dry_run(0)
        emu.emu_clear_fault()
