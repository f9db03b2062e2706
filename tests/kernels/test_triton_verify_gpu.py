"""Tree-verify attention on a GPU at the decode loop's shapes: the Triton kernel
(harness.kernels.verify.triton_verify) in bf16, and every verify mode through the loop's own
dispatch (harness.decode.attention.attend: sdpa, triton, flex, custom), against the float64
reference (harness.kernels.verify.verify_reference).

Shapes: qwen3-8b attention (GQA 32/8, d 128), T = 1 + N tree tokens in {16, 65} and T = 1 (plain
decoding's plan: 128-key tiles), committed
prefixes 4096 / 16384 / 65536, batch 1 and a batch of 2 with different lengths; q a transposed
view and k, v views of a bigger cache buffer, as the model passes them. The tree keys are scaled
up so the tree part carries real weight next to 65k prefix keys (else a tree-mask bug would hide
below the tolerance). For the Triton kernel the cache past each sequence's lengths[b] + T holds
NaN and the output starts as NaN, so a read it must not make or a row it skips fails. Then: no
host sync, CUDA-graph replays with new q / lengths / tree bits equal eager calls, fp16 and
fp32, any split count, other tile configs. The interpreter runs the same kernel on CPU in fp32
and fp16 (test_triton_verify.py); the custom CUDA kernel has its own file
(test_custom_verify_gpu.py). Timing: the kernel workload (scenarios/kernels.yaml,
scenarios/ops.yaml).
"""

from __future__ import annotations

import math

import pytest
import torch
from cuda_checks import capture, no_host_sync
from harness.kernels.verify import verify_reference as ref

from harness.decode import attention
from harness.decode.kernel_choice import Kernels

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.verify import triton_verify

pytestmark = pytest.mark.gpu

HQ, HKV, D = 32, 8, 128
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-4}
BOOST = 6.0                   # tree keys x this: the tree's softmax mass is not negligible


def make_set(lengths: list[int], T: int, seed: int, device, dtype=torch.bfloat16, poison=False):
    """q [b, 32, T, 128] (a transposed view); k, v views [:, :, :S] of a cache buffer with
    spare slots; a random tree (visibility and bits). With `poison`, every cache slot at and
    past lengths[b] + T is NaN."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, S = len(lengths), max(lengths) + T
    q = torch.randn(b, T, HQ, D, generator=g, device=device).to(dtype).transpose(1, 2)
    k_buf = torch.randn(b, HKV, S + 64, D, generator=g, device=device).to(dtype)
    v_buf = torch.randn(b, HKV, S + 64, D, generator=g, device=device).to(dtype)
    for i, L in enumerate(lengths):
        k_buf[i, :, L:L + T] *= BOOST
        if poison:
            k_buf[i, :, L + T:] = float("nan")
            v_buf[i, :, L + T:] = float("nan")
    vis = ref.random_tree(b, T, torch.Generator().manual_seed(seed)).to(device)
    return {"q": q, "k": k_buf[:, :, :S], "v": v_buf[:, :, :S], "vis": vis,
            "bits": attention.visibility_bits(vis),
            "lengths": torch.tensor(lengths, dtype=torch.int32, device=device)}


def expected(s: dict) -> torch.Tensor:
    return ref.reference_attention(s["q"], s["k"], s["v"], s["lengths"], s["bits"])


def rel_err(out: torch.Tensor, want: torch.Tensor) -> float:
    """max |out - ref| / max |ref|; NaN anywhere gives inf, never a pass."""
    out = out.double()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - want).abs().max() / want.abs().max())


def triton_call(s: dict, dtype=torch.bfloat16, **kwargs) -> torch.Tensor:
    """The kernel into a NaN output with a NaN workspace (allocated as the loop allocates it)."""
    b, _, T, _ = s["q"].shape
    out = torch.full((b, HQ, T, D), float("nan"), dtype=dtype, device=s["q"].device)
    ws = triton_verify.alloc_workspace(s["q"], s["k"], kwargs.get("num_splits"), kwargs.get("config"))
    for w in ws:
        w.fill_(float("nan"))
    got = triton_verify.tree_verify_attention(s["q"], s["k"], s["v"], s["lengths"], s["bits"],
                                              out=out, workspace=ws, **kwargs)
    assert got is out
    return out


SHAPES = [(T, lengths) for T in (1, 16, 65) for ctx in (4096, 16384, 65536)
          for lengths in ([ctx], [ctx, ctx // 2 + 123])]


@pytest.mark.parametrize("T,lengths", SHAPES, ids=[f"T{T}-{'/'.join(map(str, L))}" for T, L in SHAPES])
def test_triton_matches_float64_reference(cuda, T, lengths):
    s = make_set(lengths, T, seed=T + sum(lengths), device=cuda, poison=True)
    assert rel_err(triton_call(s), expected(s)) <= TOL[torch.bfloat16]


# Every verify mode through the loop's dispatch (attention.attend with the decoder's Mask).
# flex compiles once per shape (seconds) and fails to compile at T 65 (docs/ARCHITECTURE.md).
ATTEND = [("sdpa", 16, [4096, 2171]), ("sdpa", 65, [16384, 8315]), ("triton", 16, [4096, 2171]),
          ("triton", 65, [16384, 8315]), ("custom", 16, [4096, 2171]), ("custom", 65, [16384, 8315]),
          ("flex", 16, [4096, 2171])]


@pytest.mark.parametrize("mode,T,lengths", ATTEND, ids=[f"{m}-T{T}" for m, T, _ in ATTEND])
@pytest.mark.parametrize("into_out", [False, True])
def test_every_verify_mode_through_attend(cuda, mode, T, lengths, into_out):
    """The decode loop's call: q [b, h, T, d], the cache as [:, :, :kv_len] views, a Mask of
    int64 lengths; `into_out` as the fused forward calls it (a transposed [b, T, h, d] buffer)."""
    s = make_set(lengths, T, seed=7 * T, device=cuda)
    lengths64 = s["lengths"].long()
    mask = attention.Mask(lengths64, s["vis"], s["k"].shape[2], kernels=Kernels(verify=mode),
                          bits=s["bits"])
    if into_out:
        buf = torch.full((len(lengths), T, HQ, D), float("nan"), dtype=torch.bfloat16, device=cuda)
        got = attention.attend(s["q"], s["k"], s["v"], mask, out=buf.transpose(1, 2))
        assert not buf.isnan().any()
    else:
        got = attention.attend(s["q"], s["k"], s["v"], mask)
    assert got.shape == (len(lengths), HQ, T, D)
    assert rel_err(got, expected(s)) <= TOL[torch.bfloat16]


def test_triton_graph_replays_new_inputs_without_host_syncs(cuda):
    """Captured once; replays with new q / lengths / tree bits copied into the captured buffers
    equal eager calls and the reference, an empty prefix included; the call never syncs."""
    T, lengths = 16, [16384, 9000]
    s = make_set(lengths, T, seed=3, device=cuda)
    q = s["q"].contiguous()
    ws = triton_verify.alloc_workspace(q, s["k"])
    out = torch.empty(2, HQ, T, D, dtype=torch.bfloat16, device=cuda)

    def call():
        return triton_verify.tree_verify_attention(q, s["k"], s["v"], s["lengths"], s["bits"],
                                                   out=out, workspace=ws)

    call()                                       # compile outside the checks
    with no_host_sync():
        call()
    graph = capture(call)
    g = torch.Generator(device=cuda).manual_seed(4)
    for step, new_lengths in enumerate(([16384, 9000], [12000, 16380], [0, 5])):
        q.copy_(torch.randn(q.shape, generator=g, device=cuda).to(torch.bfloat16))
        s["lengths"].copy_(torch.tensor(new_lengths, dtype=torch.int32))
        s["bits"].copy_(attention.visibility_bits(ref.random_tree(2, T, torch.Generator().manual_seed(step)).to(cuda)))
        graph.replay()
        torch.cuda.synchronize()
        eager = triton_verify.tree_verify_attention(q, s["k"], s["v"], s["lengths"], s["bits"])
        assert torch.equal(out, eager), new_lengths
        assert rel_err(out, ref.reference_attention(q, s["k"], s["v"], s["lengths"], s["bits"])) <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_triton_other_dtypes(cuda, dtype):
    """fp16, and fp32 (what the lossless decode checks run in)."""
    s = make_set([4096, 1234], 65, seed=2, device=cuda, dtype=dtype, poison=True)
    assert rel_err(triton_call(s, dtype), expected(s)) <= TOL[dtype]


@pytest.mark.parametrize("splits", [1, 7, 64, 128])
def test_triton_any_split_count(cuda, splits):
    s = make_set([16384, 9000], 16, seed=5, device=cuda, poison=True)
    assert rel_err(triton_call(s, num_splits=splits), expected(s)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("config", [{"BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 3, "num_warps": 4},
                                    {"BLOCK_M": 128, "BLOCK_N": 128, "num_stages": 2, "num_warps": 8}],
                         ids=["BM64-BN32", "BM128-BN128"])
def test_triton_other_tile_configs(cuda, config):
    s = make_set([4096], 65, seed=6, device=cuda, poison=True)
    assert rel_err(triton_call(s, config=config), expected(s)) <= TOL[torch.bfloat16]
