"""DDTree tree build as one CUDA C++ kernel (kernels/tree/tree_build.cu), called from Python.

    build_tree(log_probs, token_ids, budget, out, num_threads=None)

Same contract and bit-identical outputs as kernels/triton_tree_build.build_tree (the output
layout is that of harness.decode.tree_gpu): one CTA per sequence, whose first warp pops the N
nodes in the reference heap's order from a frontier held in its registers (no block-wide
barrier per node or depth); the other warps load the inputs and write the outputs. Limits:
budget N <= 256, D <= 16 positions.

The call never synchronises with the host and allocates nothing for float32 / float64 /
bfloat16 log-probs and int64 token ids whose last dimension is contiguous (others are converted
first), so it can be captured in a CUDA graph; make the first call outside the capture (it
compiles and loads the library: kernels/build.py, cached on disk). Importing this module works
on a host without a GPU.
"""

from __future__ import annotations

import ctypes

import torch

MAX_BUDGET, MAX_DEPTH, MAX_THREADS = 256, 16, 256   # = tree_build.cu
LP_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}


class _Params(ctypes.Structure):
    """Mirror of ttb::Params (every field 8 bytes wide)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("log_probs", "token_ids", "tokens", "depths", "parents",
                 "first_child", "next_sibling", "scores", "bits", "visibility")] + \
               [(name, ctypes.c_int64) for name in
                ("batch", "budget", "depth", "kp", "words", "lp_dtype",
                 "lp_sb", "lp_sd", "ids_sb", "ids_sd")]


def _lib():
    from harness.kernels.build import TREE_BUILD_SOURCE, load_library

    lib = load_library(source=TREE_BUILD_SOURCE)
    if lib.ttb_struct_size() != ctypes.sizeof(_Params):
        raise RuntimeError("tree_build.cu and cuda_tree_build.py disagree on the parameter struct")
    return lib


DEFAULT_THREADS = 256   # one warp pops; the others share the loads and stores around it (session 6 on the H200, N 64: 256 threads 25.9 us, 128: 27.5, 32: 36.5)


def prepare_inputs(log_probs: torch.Tensor, token_ids: torch.Tensor):
    """(log_probs, token_ids) as the kernel reads them: float32/float64/bfloat16 and int64, last
    dim contiguous. Returns the inputs themselves when they already are (no copy)."""
    lp = log_probs if log_probs.dtype in LP_DTYPES else log_probs.float()
    lp = lp if lp.stride(-1) == 1 else lp.contiguous()
    ids = token_ids if token_ids.dtype == torch.int64 else token_ids.long()
    ids = ids if ids.stride(-1) == 1 else ids.contiguous()
    return lp, ids


def make_params(lp: torch.Tensor, ids: torch.Tensor, budget: int, out, num_threads: int) -> _Params:
    """The launch parameters (checked here; the launcher re-checks the limits and returns
    cudaErrorInvalidValue). Inputs as returned by `prepare_inputs`."""
    b, D, k = lp.shape
    N, kp = int(budget), min(k, int(budget))
    T, W = N + 1, (N + 32) // 32
    if ids.shape != lp.shape:
        raise ValueError(f"token_ids {tuple(ids.shape)} must match log_probs {tuple(lp.shape)}")
    if not 1 <= N <= MAX_BUDGET or not 1 <= D <= MAX_DEPTH:
        raise ValueError(f"the CUDA tree build supports budget 1..{MAX_BUDGET} and 1..{MAX_DEPTH} "
                         f"positions (got {N}, {D})")
    if num_threads % 32 or not 32 <= num_threads <= MAX_THREADS:
        raise ValueError(f"num_threads must be a multiple of 32 in [32, {MAX_THREADS}] (got {num_threads})")
    expect = {"tokens": ((b, N), torch.int64), "depths": ((b, N), torch.int64),
              "parents": ((b, T), torch.int64), "first_child": ((b, T), torch.int64),
              "next_sibling": ((b, T), torch.int64), "scores": ((b, N), torch.float32),
              "bits": ((b, T, W), torch.int32), "visibility": ((b, T, T), torch.bool)}
    for name, (shape, dtype) in expect.items():
        t = getattr(out, name)
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous() or t.device != lp.device:
            raise ValueError(f"out.{name} must be a contiguous {dtype} {shape} on {lp.device}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if ids.device != lp.device:
        raise ValueError(f"token_ids must be on {lp.device}")
    p = _Params()
    p.log_probs, p.token_ids = lp.data_ptr(), ids.data_ptr()
    for name in expect:
        setattr(p, name, getattr(out, name).data_ptr())
    p.batch, p.budget, p.depth, p.kp, p.words = b, N, D, kp, W
    p.lp_dtype = LP_DTYPES[lp.dtype]
    p.lp_sb, p.lp_sd = lp.stride(0), lp.stride(1)
    p.ids_sb, p.ids_sd = ids.stride(0), ids.stride(1)
    return p


def build_tree(log_probs: torch.Tensor, token_ids: torch.Tensor, budget: int, out,
               num_threads: int | None = None) -> None:
    """Write the trees of log_probs / token_ids [b, D, k] (rows sorted descending) into `out` (a
    tree_gpu.GpuTree of contiguous tensors). Asynchronous on the current stream."""
    if log_probs.device.type != "cuda":
        raise ValueError("the CUDA tree build needs CUDA tensors")
    threads = num_threads or DEFAULT_THREADS
    lp, ids = prepare_inputs(log_probs, token_ids)
    p = make_params(lp, ids, budget, out, threads)
    with torch.cuda.device(lp.device):
        lib = _lib()
        stream = torch.cuda.current_stream(lp.device).cuda_stream
        rc = lib.ttb_build_tree(ctypes.byref(p), threads, ctypes.c_void_p(stream))
    if rc != 0:
        raise RuntimeError(f"CUDA tree build launch failed: {lib.ttb_error_string(rc).decode()}")
