"""Programmatic dependent launch (kernels/pdl.py): where it is on, and that every kernel that
may be launched with it waits for the kernel before first thing (or, listed with its reason,
reads only memory no kernel writes before it). A PDL kernel that touched other memory before
its wait would race the kernel ahead of it; these checks hold the convention for kernels added
later. The PTX-level check is test_triton_compile.py's
test_pdl_kernels_wait_before_any_access."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels import pdl  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _enabled_on_cuda() -> bool:
    return pdl.enabled(torch.device("cuda", 0))


def test_off_where_it_does_not_exist(interp):
    assert pdl.launch_options(torch.device("cpu")) == {"PDL": False}
    # Under the interpreter, even for a CUDA device (and without asking CUDA anything).
    assert interp.apply(_enabled_on_cuda, ()) is False


# Kernels that read memory before their wait, and through which pointers: memory no kernel
# writes (the one-row GEMV's first weight step, loaded while the kernel before still runs).
READS_BEFORE_WAIT = {"_gemv_kernel": {"w_ptrs"}}
WAITS = ("pdl.wait_then_release(PDL)", "pdl.wait(PDL)")


@pytest.mark.parametrize("path", ["fused/triton_fused.py", "linear/skinny_linear.py",
                                  "verify/triton_verify.py", "tree/triton_topk.py",
                                  "accept/triton_accept.py"])
def test_every_pdl_triton_kernel_waits_first(path):
    """First thing: wait_then_release, or wait with a release later in the kernel (the one-row
    GEMV lets its dependents launch after its loop). Before the wait a kernel touches no memory,
    except the reads READS_BEFORE_WAIT allows it."""
    tree = ast.parse((KERNELS / path).read_text())
    kernels = [f for f in tree.body if isinstance(f, ast.FunctionDef)
               and any(a.arg == "PDL" for a in f.args.args)]
    assert kernels, f"no PDL kernel in {path}"
    for fn in kernels:
        body = [s for s in fn.body if not (isinstance(s, ast.Expr)
                                           and isinstance(s.value, ast.Constant))]  # docstring
        waits = [i for i, s in enumerate(body) if ast.unparse(s) in WAITS]
        assert waits, f"{path}:{fn.lineno} {fn.name} never waits at its top level"
        allowed = READS_BEFORE_WAIT.get(fn.name, set())
        for stmt in body[:waits[0]]:
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.Call) and ast.unparse(node.func).startswith("tl.")):
                    continue
                op = ast.unparse(node.func)
                assert op not in ("tl.store", "tl.atomic_add", "tl.atomic_xchg", "tl.atomic_cas"), \
                    f"{path}:{node.lineno} {fn.name}: {op} before its wait"
                if op == "tl.load":
                    assert ast.unparse(node.args[0]) in allowed, \
                        f"{path}:{node.lineno} {fn.name} loads {ast.unparse(node.args[0])} before its wait"
        if ast.unparse(body[waits[0]]) == "pdl.wait(PDL)":   # it lets the next kernel launch later
            calls = [ast.unparse(n) for n in ast.walk(fn) if isinstance(n, ast.Call)]
            assert "pdl.release(PDL)" in calls, f"{path}:{fn.lineno} {fn.name} never releases"
        if not allowed:
            assert waits[0] == 0, f"{path}:{fn.lineno} {fn.name} starts {ast.unparse(body[0])!r}"


def test_every_launch_passes_the_launch_options():
    """A kernel with a PDL parameter launched without launch_options would miss the overlap;
    one launched with launch_pdl but PDL=False would race. Every launch site passes both
    together: `**pdl.launch_options(device)` (or a name bound to it)."""
    for path in ("fused/triton_fused.py", "linear/skinny_linear.py", "verify/triton_verify.py",
                 "tree/triton_topk.py", "accept/triton_accept.py"):
        tree = ast.parse((KERNELS / path).read_text())
        bound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and "pdl.launch_options(" in ast.unparse(n.value) for t in n.targets}
        launches = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Subscript)
                    and ast.unparse(n.func.value).endswith("_kernel")]
        assert launches, path
        for call in launches:
            spread = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert any(v.startswith("pdl.launch_options(") or v in bound for v in spread), \
                f"{path}:{call.lineno} launches {ast.unparse(call.func.value)} without launch_options"


def test_every_cuda_verify_kernel_waits_first():
    src = (KERNELS / "verify" / "verify_attention.cu").read_text()
    kernels = re.findall(r"__global__ void[^{]*?\b(\w+)\(const (?:__grid_constant__ )?\w+ \w\) \{\n\s*(\S[^\n]*)"
                         r"\n\s*(\S[^\n]*)", src)
    # gqa, gqa pipelined, its tail, gqa by tensor copies, mla, mla_pv, mla by tensor copies, combine
    assert len(kernels) == 8, kernels
    for name, first, second in kernels:
        # A trace build's stamp may come first (kernels/trace.cuh: its own counter and rows, no
        # memory the kernel before writes; nothing at all in the default build), and so may a
        # tensor map's prefetch (the kernel's own parameter, which no kernel before writes).
        if first.startswith("const int trace_row = trace::begin(") or "prefetch_tensormap(" in first:
            first = second
        assert first == "wait_for_previous_kernel();", (name, first)
    assert _launches_with_pdl(src)


def test_a_kernel_after_a_cublas_gemm_launches_plainly(monkeypatch):
    """A PDL launch only where the kernel before triggers its dependents (ours do, first
    thing): after cuBLAS's GEMMs (the verify's 65 rows, or linear_impl torch) a plain launch
    of a kernel that still triggers its own dependents."""
    from harness.decode.kernel_choice import Kernels
    from harness.decode.model import gemm_overlaps
    monkeypatch.setattr(pdl, "enabled", lambda device: True)     # as on a Hopper GPU
    assert pdl.launch_options(torch.device("cuda")) == {"PDL": True, "launch_pdl": True}
    # launched plainly, it still releases the kernel after it (its own wait is then a no-op)
    assert pdl.launch_options(torch.device("cuda"), overlap=False) == {"PDL": True, "launch_pdl": False}
    skinny, cublas = Kernels(linear="triton"), Kernels(linear="torch")
    assert gemm_overlaps(1, 4096, skinny) and gemm_overlaps(16, 12288, skinny)
    assert not gemm_overlaps(65, 4096, skinny)          # more rows than the skinny kernel takes
    assert not gemm_overlaps(16, 4100, skinny)          # a depth it hands to cuBLAS
    assert not gemm_overlaps(1, 4096, cublas)


def test_the_cuda_tree_build_waits_first():
    src = (KERNELS / "tree" / "tree_build.cu").read_text()
    first = re.findall(r"__global__ void[^{]*?\btree_build_kernel\(const Params p\) \{\n\s*(\S[^\n]*)", src)
    assert first == ["wait_for_previous_kernel();"], first
    assert _launches_with_pdl(src)


def _launches_with_pdl(src: str) -> bool:
    """The file's launch macro is sm90.cuh's pdl_launch, which asks for programmatic stream
    serialization."""
    header = (KERNELS / "sm90.cuh").read_text()
    return (re.search(r"#define T\w+_LAUNCH\(kernel, grid, block, smem, stream, p\) pdl_launch\(", src) is not None
            and '#include "../sm90.cuh"' in src
            and "cudaLaunchAttributeProgrammaticStreamSerialization" in header)


def test_the_stream_k_gemm_reads_only_weights_before_its_wait():
    """kernels/linear/stream_linear.cu: the producer issues weight copies before waiting for the
    kernel ahead (no kernel writes weights); the token copies, the signal warp's count and every
    consumer's stores come after a wait."""
    src = (KERNELS / "linear" / "stream_linear.cu").read_text()
    assert _launches_with_pdl(src)
    producer = src[src.index("__device__ __forceinline__ void produce("):src.index("struct Mma {")]
    before, after = producer.split("griddep_wait();", 1)
    assert "&p.map_w" in before and "&p.map_x" not in before
    assert "&p.map_x" in after
    body = src[src.index("stream_linear_kernel(const __grid_constant__ Params p) {"):]
    signal, rest = body.split("// the producer warp", 1)
    assert signal.index("griddep_wait();") < signal.index("atomicAdd(")
    consumers = rest.split("// The consumer warpgroups", 1)[1]
    assert consumers.index("griddep_wait();") < consumers.index("finish_segment(")
