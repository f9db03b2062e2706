"""The CUDA top-k kernel (kernels/tree/topk.cu), run on the CPU through the emulator.

The .cu is compiled as C++ with -DTVA_EMULATE against tests/kernels/emulator/cuda_emulation.h
(threads as fibers, warps skewed at random between barriers, shared memory poisoned) and called
through ctypes with the parameter struct of kernels/tree/cuda_topk.py. Ids must equal a float64
stable descending sort's (value desc, id asc: ties included), log-probs float64's topk -
logsumexp within a few float32 ulp, every output slot written (they start NaN / -1), the
workspace poisoned, and the arrival counters back at zero after every call. Blocks run one after
another here, so the last slice of a row is the last block: the merge runs on every multi-slice
case. The exact-select path (a slice whose threshold passes more than CAP = 2048 elements) runs
on all-equal, few-valued and masked rows of more than 2048 logits a slice.
"""

from __future__ import annotations

import ctypes
import zlib

import pytest
import torch

from harness.kernels import build
from harness.kernels.tree import cuda_topk
from emulator.emulate import emulated_library
from test_triton_topk import check

SKEWED, LOCKSTEP = 4242, 0
CAP = 2048   # = topk.cu


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    lib = emulated_library("tree/topk.cu", tmp_path_factory.mktemp("emu"))
    build._declare_topk(lib)
    assert lib.ttk_struct_size() == ctypes.sizeof(cuda_topk._Params)
    return lib


def gen_for(*case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


def emulated_topk(lib, inputs, k: int, slices: int | None = None, skew: int = SKEWED) -> list[dict]:
    """Every input in turn through one poisoned workspace (same shape), into NaN / -1 outputs."""
    inputs = [inputs] if isinstance(inputs, torch.Tensor) else inputs
    lib.emu_configure(0, skew)
    lib.emu_clear_fault()
    x0 = cuda_topk.prepare_logits(inputs[0])
    ws = cuda_topk.alloc_workspace(x0, k, slices=slices, sms=1)
    assert int(ws.arrive.abs().sum()) == 0
    ws.part_keys.fill_(-3)
    ws.part_m.fill_(float("nan"))
    ws.part_s.fill_(float("nan"))
    res = []
    for x in inputs:
        x = cuda_topk.prepare_logits(x)
        lp, ids = cuda_topk.empty_out(x, ws.kp)
        lp.fill_(float("nan"))
        ids.fill_(-1)
        p = cuda_topk.make_params(x, (lp, ids), ws)
        rc = lib.ttk_topk(ctypes.byref(p), None)
        assert rc == 0, f"launch failed ({rc}): {lib.emu_last_fault().decode()}"
        res.append(dict(lp=lp, ids=ids, arrive=ws.arrive.clone(), slices=ws.slices))
    return res


@pytest.mark.parametrize("shape,k,slices", [
    ((1,), 1, None),                  # V = 1
    ((3, 1), 4, None),                # k > V = 1
    ((2, 7), 3, None),
    ((2, 7), 7, 2),                   # k = V, a slice of 3 elements <= k': no threshold
    ((2, 7), 10, 3),                  # k > V
    ((2, 3, 333), 16, 5),             # b x D rows
    ((2, 3000), 64, 1),               # one slice: no merge
    ((2, 3000), 64, 7),
    ((1, 5000), 256, 16),             # k' = 256, the largest merge (16 x 256)
    ((2, 500), 200, 2),               # k' of 200 over slices of 250
])
def test_matches_reference(emu, shape, k, slices):
    g = gen_for(shape, k, slices)
    x = torch.randn(*shape, generator=g) * 8
    r = emulated_topk(emu, x, k, slices)[0]
    check(x, k, r)
    assert torch.equal(r["ids"], torch.topk(x, min(k, shape[-1])).indices)   # no ties here


def test_drafter_scale_under_two_schedules(emu):
    # Standardised logits x 32, as the loop's drafter: |lse| ~ 150.
    g = gen_for("x32")
    x = torch.randn(3, 4000, generator=g)
    x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * 32
    for skew in (SKEWED, 777, LOCKSTEP):
        check(x, 64, emulated_topk(emu, x, 64, slices=4, skew=skew)[0])


def test_bf16_and_fp16_logits(emu):
    g = gen_for("half")
    x = torch.randn(2, 2, 1500, generator=g) * 8
    for dtype in (torch.bfloat16, torch.float16):
        xs = x.to(dtype)
        r = emulated_topk(emu, xs, 64, slices=3)[0]
        assert (xs[..., 1:] == xs[..., :-1]).any() or dtype == torch.float16
        check(xs.float(), 64, r)


def test_strided_rows(emu):
    g = gen_for("strided")
    big = torch.randn(2, 5, 700, generator=g) * 8
    check(big[:, 1:4], 20, emulated_topk(emu, big[:, 1:4], 20, slices=3)[0])
    x = (torch.randn(3, 720, generator=g) * 8)[:, :700]
    check(x, 20, emulated_topk(emu, x, 20, slices=2)[0])


@pytest.mark.parametrize("kind", ["zeros", "ties", "masked", "ascending", "one_slice_zeros"])
def test_ties_and_the_exact_select(emu, kind):
    """Slices of 2500 logits (> CAP): rows whose threshold passes more than CAP elements take the
    exact select (zeros, few values); masked rows have fewer finite logits than k'; ascending
    rows put the whole top k' in the last slice."""
    g = gen_for("exact", kind)
    V, k, slices = 5000, 64, 2
    if kind in ("zeros", "one_slice_zeros"):
        x = torch.zeros(2, V)
        x[1, 4000:4003] = 1.0          # three above, the rest from the lowest ids of the zeros
        slices = 1 if kind == "one_slice_zeros" else 2
    elif kind == "ties":
        x = torch.randint(0, 3, (2, V), generator=g).float()
    elif kind == "masked":
        x = torch.full((2, V), float("-inf"))
        x[0, torch.randperm(V, generator=g)[:10]] = torch.randn(10, generator=g)
        x[1, 4321] = 0.0
    else:
        x = torch.arange(V, dtype=torch.float32).repeat(2, 1) / 8
    r = emulated_topk(emu, x, k, slices)[0]
    check(x, k, r)
    if kind in ("zeros", "one_slice_zeros"):
        assert r["ids"][0].tolist() == list(range(64))
        assert r["ids"][1].tolist() == [4000, 4001, 4002] + list(range(61))


def test_all_masked_row_is_nan_like_torch(emu):
    x = torch.full((2, 3000), float("-inf"))
    x[1, 7] = 2.0
    r = emulated_topk(emu, x, 8, slices=2)[0]
    want = x[0].topk(8).values - torch.logsumexp(x[0], -1)
    assert want.isnan().all() and r["lp"][0].isnan().all()
    assert r["ids"][0].tolist() == list(range(8))
    check(x[1:], 8, {**r, "lp": r["lp"][1:], "ids": r["ids"][1:]})


def test_negative_zero_ties_positive_zero(emu):
    x = torch.full((2, 40), -1.0)
    x[:, [3, 9, 17, 30]] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
    for slices in (1, 3):
        r = emulated_topk(emu, x, 3, slices)[0]
        assert r["ids"].tolist() == [[3, 9, 17]] * 2
        check(x, 3, r)


def test_repeated_calls_share_the_workspace(emu):
    # As a graph replays one launch: each call starts from the counters the last one left.
    g = gen_for("repeat")
    a = torch.randn(2, 3000, generator=g) * 8
    b = torch.zeros(2, 3000)
    c = torch.randn(2, 3000, generator=g) * 32
    for x, r in zip((a, b, c), emulated_topk(emu, [a, b, c], 64, slices=3)):
        check(x, 64, r)


def test_plan_limits():
    assert cuda_topk.plan(151936, 64, 15, 132) == dict(kp=64, slices=9, slice_len=16882)
    assert cuda_topk.plan(151936, 64, 60, 132)["slices"] == 7      # at most 24576 a slice
    assert cuda_topk.plan(151936, 256, 1, 132)["slices"] == 16     # at most 4096 to merge
    assert cuda_topk.plan(10, 64, 1, 132) == dict(kp=10, slices=10, slice_len=1)
    with pytest.raises(ValueError, match="k <= 256"):
        cuda_topk.plan(151936, 257, 1, 132)
    with pytest.raises(ValueError, match="slices must be in"):
        cuda_topk.plan(151936, 64, 1, 132, slices=2)
    with pytest.raises(ValueError, match="needs 41 slices"):
        cuda_topk.plan(1_000_000, 256, 1, 132)
