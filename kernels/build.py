"""Build the CUDA verify-attention library on the GPU host, at first use, for that host's GPU.

`load_library()` compiles kernels/verify/verify_attention.cu with torch's extension builder
(torch.utils.cpp_extension.load: ninja + nvcc, no torch headers needed by the source) for the
architecture of the current device (sm_90a on an H200 — the arch-specific target, for wgmma —
sm_120 on an RTX PRO 6000 Blackwell, anything else as its own SASS plus PTX), and opens the result with ctypes. Builds are cached on
disk by (source hash, flags, arch, torch and CUDA versions) under $HARNESS_CACHE_DIR (default
~/.cache/specdec-harness/kernels), so a worker compiles once per host and version; the builder's
file lock keeps concurrent workers on one host from building the same thing twice.

`load_library(source=TREE_BUILD_SOURCE)` builds kernels/tree/tree_build.cu (the DDTree tree build,
kernels/tree/cuda_tree_build.py) the same way, into its own cached library keyed by that source;
`source=STREAM_LINEAR_SOURCE` kernels/linear/stream_linear.cu (the verify's weight GEMMs).

Importing this module needs neither a GPU nor nvcc; only `load_library()` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import threading
from pathlib import Path

SOURCE = Path(__file__).parent / "verify" / "verify_attention.cu"
TREE_BUILD_SOURCE = Path(__file__).parent / "tree" / "tree_build.cu"
STREAM_LINEAR_SOURCE = Path(__file__).parent / "linear" / "stream_linear.cu"
# -lineinfo costs nothing at run time and lets a profiler (or compute-sanitizer) map to source lines.
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
# HARNESS_KERNEL_DEBUG=1: a debug build (its own cache entry) whose launchers wait for each kernel
# and return its execution error, so a fault is pinned to the launch that made it (not
# graph-capturable; for ci/gpu/selfcheck.sh's compute-sanitizer pass and bug hunts only).
DEBUG_FLAGS = ("-DTVA_DEBUG",)
# HARNESS_KERNEL_TMA=1: a build (its own cache entry) whose pipelined GQA verify on a contiguous
# cache (custom_impl wgmma_pv and wgmma_sumcheck) feeds its K and V tiles by tensor copies (TMA)
# instead of cp.async, and so does MLA's wgmma_pv (mla_tma_kernel), to A/B against the default
# build in one process or device call (kernels/NOTES.md, "Tensor copies", session 56).
TMA_FLAGS = ("-DTVA_TMA",)
# HARNESS_KERNEL_TRACE=1: a build (its own cache entry) whose verify kernels stamp each CTA's
# start, wait, phases and end (kernels/trace.cuh), for kernels/verify/anatomy.py. The stamps are
# a few stores by thread 0 a CTA; the default build has none of them.
TRACE_FLAGS = ("-DTVA_TRACE",)


def _on(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def nvcc_flags() -> tuple[str, ...]:
    return (NVCC_FLAGS + (DEBUG_FLAGS if _on("HARNESS_KERNEL_DEBUG") else ())
            + (TMA_FLAGS if _on("HARNESS_KERNEL_TMA") else ())
            + (TRACE_FLAGS if _on("HARNESS_KERNEL_TRACE") else ()))

# Architectures built as exactly that machine code; any other GPU gets its own SASS plus PTX.
# Hopper builds 9.0a: its wgmma instructions exist only in the arch-specific target.
_EXACT_ARCHS = {(8, 0): "8.0", (8, 6): "8.6", (8, 9): "8.9", (9, 0): "9.0a", (10, 0): "10.0",
                (12, 0): "12.0"}

_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}


def cache_dir() -> Path:
    root = os.environ.get("HARNESS_CACHE_DIR") or os.path.join("~", ".cache", "specdec-harness")
    return Path(os.path.expanduser(root)) / "kernels"


def arch_list(capability: tuple[int, int]) -> str:
    """TORCH_CUDA_ARCH_LIST value for a device of compute capability `capability`."""
    return _EXACT_ARCHS.get(tuple(capability), f"{capability[0]}.{capability[1]}+PTX")


# Headers the sources include (a change to one is a change to every build).
HEADERS = (Path(__file__).parent / "sm90.cuh", Path(__file__).parent / "trace.cuh")


def build_key(arch: str, source: Path = SOURCE) -> str:
    """What a cached build depends on: the source and the headers, the flags, the arch, torch
    and its CUDA."""
    import torch

    h = hashlib.sha256()
    h.update(Path(source).read_bytes())
    for header in HEADERS:
        h.update(header.read_bytes())
    h.update(repr((nvcc_flags(), arch, torch.__version__, torch.version.cuda)).encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_library(device=None, verbose: bool = False, source: Path = SOURCE) -> ctypes.CDLL:
    """The compiled library of `source` (default: the verify kernels) for `device` (default: the
    current CUDA device), built if needed."""
    import torch

    if _on("HARNESS_KERNEL_WS"):     # a build this tree no longer has: never the default in its place
        raise RuntimeError("HARNESS_KERNEL_WS: the warp-specialised verify build was removed (level at "
                           "65 tree tokens, slower at 16: kernels/NOTES.md, session 45); unset it")
    source = Path(source)
    if not torch.cuda.is_available():
        what = "the custom verify kernel" if source == SOURCE else source.name
        raise RuntimeError(f"{what} needs a CUDA GPU (none is visible)")
    capability = torch.cuda.get_device_capability(device)
    arch = arch_list(capability)
    prefix = "tree_verify" if source == SOURCE else source.stem
    name = f"{prefix}_{build_key(arch, source)}"
    with _lock:
        if name in _libraries:
            return _libraries[name]
        from torch.utils import cpp_extension

        build_dir = cache_dir() / name
        build_dir.mkdir(parents=True, exist_ok=True)
        # Always through the builder, also when the library exists: its lock file makes a worker
        # that finds another one mid-build wait for it, and ninja then finds nothing to do.
        with _env(TORCH_CUDA_ARCH_LIST=arch):
            cpp_extension.load(name=name, sources=[str(source)], extra_cuda_cflags=list(nvcc_flags()),
                               build_directory=str(build_dir), is_python_module=False,
                               verbose=verbose)
        lib = ctypes.CDLL(str(build_dir / f"{name}.so"))
        {SOURCE: _declare, TREE_BUILD_SOURCE: _declare_tree_build,
         STREAM_LINEAR_SOURCE: _declare_stream_linear}[source](lib)
        _libraries[name] = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    """C signatures of the extern "C" entry points (see the bottom of verify_attention.cu)."""
    c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
    lib.tva_gqa_forward.argtypes = [c_void_p, c_int, c_int, c_int, c_int, c_void_p]
    lib.tva_gqa_forward.restype = c_int
    lib.tva_mla_forward.argtypes = [c_void_p, c_int, c_int, c_void_p]
    lib.tva_mla_forward.restype = c_int
    lib.tva_gqa_occupancy.argtypes = [c_int, c_int, c_int, c_int]
    lib.tva_gqa_occupancy.restype = c_int
    lib.tva_gqa_smem_bytes.argtypes = [c_int, c_int, c_int]
    lib.tva_gqa_smem_bytes.restype = c_int
    lib.tva_mla_smem_bytes.argtypes = []
    lib.tva_mla_smem_bytes.restype = c_int
    lib.tva_error_string.argtypes = [c_int]
    lib.tva_error_string.restype = ctypes.c_char_p
    lib.tva_struct_size.argtypes = []
    lib.tva_struct_size.restype = c_int
    lib.tva_trace_row_size.argtypes = []
    lib.tva_trace_row_size.restype = c_int
    lib.tva_trace_read.argtypes = [c_void_p, c_int]
    lib.tva_trace_read.restype = c_int


def _declare_tree_build(lib: ctypes.CDLL) -> None:
    """C signatures of the extern "C" entry points of tree_build.cu."""
    c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
    lib.ttb_build_tree.argtypes = [c_void_p, c_int, c_void_p]
    lib.ttb_build_tree.restype = c_int
    lib.ttb_smem_bytes.argtypes = [c_int, c_int, c_int]
    lib.ttb_smem_bytes.restype = c_int
    lib.ttb_error_string.argtypes = [c_int]
    lib.ttb_error_string.restype = ctypes.c_char_p
    lib.ttb_struct_size.argtypes = []
    lib.ttb_struct_size.restype = c_int


def _declare_stream_linear(lib: ctypes.CDLL) -> None:
    """C signatures of the extern "C" entry points of stream_linear.cu."""
    c_int, c_void_p = ctypes.c_int, ctypes.c_void_p
    lib.tsl_linear.argtypes = [c_void_p, c_void_p]
    lib.tsl_linear.restype = c_int
    lib.tsl_error_string.argtypes = [c_int]
    lib.tsl_error_string.restype = ctypes.c_char_p
    lib.tsl_struct_size.argtypes = []
    lib.tsl_struct_size.restype = c_int
