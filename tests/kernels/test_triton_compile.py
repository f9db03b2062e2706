"""The Triton kernels compile for the GPUs they are meant for, on a machine without one.

The interpreter (tests/decode/test_fused_ops.py, test_triton_verify.py) checks what a kernel computes,
but it runs Python, not the compiler: a construct that the interpreter accepts and the NVIDIA
backend rejects (a pointer select, a scalar branch, a layout the backend cannot lower) would only
show on a GPU host. So each kernel is compiled ahead of time here, through Triton's whole
pipeline down to a cubin by Triton's own ptxas, for sm_90 (H200) and sm_120 (RTX PRO 6000
Blackwell), with the dtypes and constexprs the decode loop uses.
"""

from __future__ import annotations

import inspect
import re

import pytest

triton = pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from harness.kernels.fused import triton_fused  # noqa: E402
from harness.kernels.linear import skinny_linear  # noqa: E402
from harness.kernels.accept import triton_accept  # noqa: E402

ARCHS = [90, 120]


def compile_for(fn, arch: int, types: dict[str, str], constexprs: dict, num_warps: int):
    """Compile `fn` with argument types by name (pointers "*bf16", ints "i32"/"i64", floats
    "fp32"; an argument named in `constexprs` is a constexpr) for sm_<arch>."""
    sig = {name: ("constexpr" if name in constexprs else types[name]) for name in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps))


def typed(fn, pointers: dict[str, str], floats=("eps",), i64=()) -> dict[str, str]:
    """Pointers as given, `floats` fp32, strides and `i64` int64, everything else int32."""
    return {n: pointers.get(n) or ("fp32" if n in floats else
                                   "i64" if n.startswith("stride") or n in i64 else "i32")
            for n in fn.arg_names}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("has_res", [False, True])
def test_add_rmsnorm_compiles(arch, has_res):
    fn = triton_fused._add_rmsnorm_kernel
    types = typed(fn, {n: "*bf16" for n in ("X", "R", "W", "OUT", "RES_OUT")})
    k = compile_for(fn, arch, types, dict(HAS_RES=has_res, BLOCK=4096, PDL=False), num_warps=8)
    assert k.asm["cubin"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("half,half_block", [(64, 64), (144, 256)])   # qwen3-8b d 128; kimi d 288
def test_qk_norm_rope_store_compiles(arch, half, half_block):
    fn = triton_fused._qk_norm_rope_store_kernel
    ptrs = {n: "*bf16" for n in ("QKV", "QW", "KW", "COS", "SIN", "Q_OUT", "KC", "VC")}
    ptrs["SLOTS"] = "*i64"
    k = compile_for(fn, arch, typed(fn, ptrs), dict(HALF=half, HALF_BLOCK=half_block, PDL=False),
                    num_warps=1)
    assert k.asm["cubin"]


@pytest.mark.parametrize("arch", ARCHS)
def test_silu_mul_compiles(arch):
    fn = triton_fused._silu_mul_kernel
    k = compile_for(fn, arch, typed(fn, {"GU": "*bf16", "OUT": "*bf16"}),
                    dict(BLOCK=1024, PDL=False), num_warps=4)
    assert k.asm["cubin"]


@pytest.mark.parametrize("arch", ARCHS)
def test_standardise_compiles(arch):
    fn = triton_fused._span_moments_kernel
    k = compile_for(fn, arch, typed(fn, {"X": "*bf16", "MOMENTS": "*fp32"}),
                    dict(BLOCK=4096, PDL=True), num_warps=8)
    assert k.asm["cubin"]
    fn = triton_fused._standardise_kernel
    k = compile_for(fn, arch, typed(fn, {"X": "*bf16", "OUT": "*fp32", "MOMENTS": "*fp32"},
                                    floats=("scale",)), dict(BLOCK=4096, PB=64, PDL=True), num_warps=8)
    assert k.asm["cubin"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d,d_block", [(128, 128), (288, 512)])    # qwen3-8b; kimi's 288
def test_move_kv_compiles(arch, d, d_block):
    fn = triton_fused._move_kv_kernel
    ptrs = {"K": "*bf16", "V": "*bf16", "SRC": "*i64", "DST": "*i64"}
    k = compile_for(fn, arch, typed(fn, ptrs), dict(D=d, ROWS=16, D_BLOCK=d_block, PDL=False),
                    num_warps=4)
    assert k.asm["cubin"]
    assert "bar.sync" in k.asm["ptx"]        # the barrier between the reads and the writes


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("split", [False, True])
def test_skinny_linear_compiles(arch, split):
    fn = skinny_linear._skinny_kernel
    ptrs = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}
    k = compile_for(fn, arch, typed(fn, ptrs), dict(BLOCK_N=64, BLOCK_K=128, BLOCK_M=16,
                                                    SPLIT=split, PDL=False), num_warps=4)
    assert k.asm["cubin"]
    if split:   # the partials' arrival: an acq_rel atomic at GPU scope after a block barrier
        assert "atom.global.gpu.acq_rel.add" in k.asm["ptx"] and "bar.sync" in k.asm["ptx"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("synthetic", [False, True])
def test_accept_kernels_compile(arch, synthetic):
    fn = triton_accept._argmax_kernel
    k = compile_for(fn, arch, typed(fn, {"X": "*bf16", "PART_V": "*fp32", "PART_I": "*i32"}),
                    dict(BLOCK=triton_accept.BLOCK, PDL=True), num_warps=8)
    assert k.asm["cubin"]
    fn = triton_accept._accept_kernel
    ptrs = {n: "*i64" for n in ("NEXT", "TREE_IDS", "PARENTS", "FIRST_CHILD", "DEPTH", "DRAWS",
                                "LENGTHS", "STEP", "BONUS", "RECORD", "IDX", "SRC", "DST")}
    ptrs.update(PART_V="*fp32", PART_I="*i32", BITS="*i32")
    k = compile_for(fn, arch, typed(fn, ptrs), dict(TB=128, PB=32, BP=16, SYNTHETIC=synthetic,
                                                    PDL=True), num_warps=4)
    ptx = k.asm["ptx"]
    # The argmax is stored by some threads and gathered by others: a barrier between.
    assert "bar.sync" in ptx
    assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


@pytest.mark.parametrize("arch", ARCHS)
def test_pdl_kernels_wait_before_any_access(arch):
    """With PDL (Hopper and later) a kernel may start before the one ahead of it finishes: the
    grid-dependency wait must come before the first global load or store."""
    fn = triton_fused._add_rmsnorm_kernel
    types = typed(fn, {n: "*bf16" for n in ("X", "R", "W", "OUT", "RES_OUT")})
    ptx = compile_for(fn, arch, types, dict(HAS_RES=True, BLOCK=4096, PDL=True), num_warps=8).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "griddepcontrol.launch_dependents" in ptx
    assert wait < ptx.index("ld.global") and wait < ptx.index("st.global")
    fn = skinny_linear._skinny_kernel
    ptrs = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}
    ptx = compile_for(fn, arch, typed(fn, ptrs), dict(BLOCK_N=64, BLOCK_K=128, BLOCK_M=16,
                                                      SPLIT=True, PDL=True), num_warps=4).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert all(wait < ptx.index(op) for op in ("ld.global", "st.global", "cp.async") if op in ptx)
    # The GEMV loads its first weight step before the wait (no kernel writes weights), x and
    # everything else after it, and releases its dependents after its loop.
    fn = skinny_linear._gemv_kernel
    ptx = compile_for(fn, arch, typed(fn, {"X": "*bf16", "W": "*bf16", "Y": "*bf16"}),
                      dict(BLOCK_N=8, BLOCK_K=1024, EVEN_N=True, PDL=True), num_warps=4).asm["ptx"]
    wait, release = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    early = ptx[:wait]
    assert "ld.global" in early and "st.global" not in early and "cp.async" not in early
    # Which source lines the loads before the wait come from (PTX .loc: file 1 is the kernel's).
    src, first = inspect.getsourcelines(fn.fn)
    x_lines = {first + i for i, text in enumerate(src) if "tl.load(x_ptrs" in text}
    w_lines = {first + i for i, text in enumerate(src) if "tl.load(w_ptrs" in text}
    early_lines = {int(n) for n in re.findall(r"\.loc\s+1 (\d+) ", early)}
    assert early_lines & w_lines and not early_lines & x_lines, (early_lines, x_lines)
    assert wait < release < ptx.index("st.global")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("T", [1, 65])
def test_verify_kernels_compile(arch, T):
    """The Triton verify's split and combine kernels with the plans of plain decoding (4 query rows
    a KV head, 128-key tiles) and of 65 tree tokens (64-row blocks, 64-key tiles)."""
    from harness.kernels.verify import triton_verify
    block_m, block_n = (16, 128) if T == 1 else (64, 64)
    fn = triton_verify._split_kernel
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Lengths": "*i64", "Bits": "*i32",
            "Acc": "*fp32", "ML": "*fp32"}
    k = compile_for(fn, arch, typed(fn, ptrs, floats=("qk_scale",)),
                    dict(G=4, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=128, DOT_PRECISION=None,
                         PDL=True), num_warps=4)
    assert k.asm["cubin"]
    fn = triton_verify._combine_kernel
    ptrs = {"Acc": "*fp32", "ML": "*fp32", "Lengths": "*i64", "Out": "*bf16"}
    k = compile_for(fn, arch, typed(fn, ptrs), dict(G=4, BLOCK_N=block_n, BLOCK_D=128, SPLIT_BLOCK=16,
                                                    ROWS=1, PDL=True), num_warps=4)
    assert k.asm["cubin"]
