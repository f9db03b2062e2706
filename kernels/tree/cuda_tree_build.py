"""DDTree tree build as one CUDA C++ kernel (kernels/tree/tree_build.cu), called from Python.

    build_tree(log_probs, token_ids, budget, pair_j, pair_r, out, num_threads=None)

Same contract and bit-identical outputs as kernels/triton_tree_build.build_tree (the algorithm
and the output layout are those of harness.decode.tree_gpu): one CTA per sequence keeps all of
its state in shared memory, so a build is ~D x 3 barriers of shared-memory work instead of
the Triton kernel's global-memory round trips. Limits: budget N <= 256, D <= 16 positions.

The call never synchronises with the host and allocates nothing for float32 / float64 /
bfloat16 log-probs and int64 token ids whose last dimension is contiguous (others are converted
first), so it can be captured in a CUDA graph; make the first call outside the capture (it
compiles and loads the library: kernels/build.py, cached on disk). Importing this module works
on a host without a GPU.
"""

from __future__ import annotations

import ctypes
import functools

import torch

MAX_BUDGET, MAX_DEPTH, MAX_THREADS, MAX_PAIR_ITERS = 256, 16, 512, 8   # = tree_build.cu
LP_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2}


class _Params(ctypes.Structure):
    """Mirror of ttb::Params (every field 8 bytes wide)."""

    _fields_ = [(name, ctypes.c_void_p) for name in
                ("log_probs", "token_ids", "pair_j", "pair_r", "tokens", "depths", "parents",
                 "first_child", "next_sibling", "scores", "bits", "visibility")] + \
               [(name, ctypes.c_int64) for name in
                ("batch", "budget", "depth", "kp", "pairs", "words", "lp_dtype",
                 "lp_sb", "lp_sd", "ids_sb", "ids_sd")]


def _lib():
    from harness.kernels.build import TREE_BUILD_SOURCE, load_library

    lib = load_library(source=TREE_BUILD_SOURCE)
    if lib.ttb_struct_size() != ctypes.sizeof(_Params):
        raise RuntimeError("tree_build.cu and cuda_tree_build.py disagree on the parameter struct")
    return lib


@functools.lru_cache(maxsize=None)
def pair_count(budget: int, kp: int) -> int:
    """P of tree_gpu.candidate_pairs(budget, kp): pairs (j, r), r < kp, (j+1)(r+1) <= budget."""
    return sum(min(kp, budget // (j + 1)) for j in range(budget))


def default_threads(budget: int) -> int:
    """Threads per CTA: 256 up to N = 32, 512 above (more survivors to rank per depth)."""
    return 256 if budget <= 32 else 512


def prepare_inputs(log_probs: torch.Tensor, token_ids: torch.Tensor):
    """(log_probs, token_ids) as the kernel reads them: float32/float64/bfloat16 and int64, last
    dim contiguous. Returns the inputs themselves when they already are (no copy)."""
    lp = log_probs if log_probs.dtype in LP_DTYPES else log_probs.float()
    lp = lp if lp.stride(-1) == 1 else lp.contiguous()
    ids = token_ids if token_ids.dtype == torch.int64 else token_ids.long()
    ids = ids if ids.stride(-1) == 1 else ids.contiguous()
    return lp, ids


def make_params(lp: torch.Tensor, ids: torch.Tensor, budget: int, pair_j: torch.Tensor,
                pair_r: torch.Tensor, out, num_threads: int) -> _Params:
    """The launch parameters (checked here; the launcher re-checks the limits and returns
    cudaErrorInvalidValue). Inputs as returned by `prepare_inputs`."""
    b, D, k = lp.shape
    N, kp, P = int(budget), min(k, int(budget)), pair_j.numel()
    T, W = N + 1, (N + 32) // 32
    if ids.shape != lp.shape:
        raise ValueError(f"token_ids {tuple(ids.shape)} must match log_probs {tuple(lp.shape)}")
    if not 1 <= N <= MAX_BUDGET or not 1 <= D <= MAX_DEPTH:
        raise ValueError(f"the CUDA tree build supports budget 1..{MAX_BUDGET} and 1..{MAX_DEPTH} "
                         f"positions (got {N}, {D})")
    if num_threads % 32 or not 32 <= num_threads <= MAX_THREADS or P > MAX_PAIR_ITERS * num_threads:
        raise ValueError(f"num_threads must be a multiple of 32 in [32, {MAX_THREADS}] and at least "
                         f"{-(-P // MAX_PAIR_ITERS)} for {P} pairs (got {num_threads})")
    if pair_r.numel() != P or P != pair_count(N, kp) or pair_j.dtype != torch.int64 \
            or pair_r.dtype != torch.int64 or not (pair_j.is_contiguous() and pair_r.is_contiguous()):
        raise ValueError("pair_j / pair_r must be tree_gpu.candidate_pairs(budget, min(k, budget))")
    expect = {"tokens": ((b, N), torch.int64), "depths": ((b, N), torch.int64),
              "parents": ((b, T), torch.int64), "first_child": ((b, T), torch.int64),
              "next_sibling": ((b, T), torch.int64), "scores": ((b, N), torch.float32),
              "bits": ((b, T, W), torch.int32), "visibility": ((b, T, T), torch.bool)}
    for name, (shape, dtype) in expect.items():
        t = getattr(out, name)
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous() or t.device != lp.device:
            raise ValueError(f"out.{name} must be a contiguous {dtype} {shape} on {lp.device}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    for name, t in (("token_ids", ids), ("pair_j", pair_j), ("pair_r", pair_r)):
        if t.device != lp.device:
            raise ValueError(f"{name} must be on {lp.device}")
    p = _Params()
    p.log_probs, p.token_ids = lp.data_ptr(), ids.data_ptr()
    p.pair_j, p.pair_r = pair_j.data_ptr(), pair_r.data_ptr()
    for name in expect:
        setattr(p, name, getattr(out, name).data_ptr())
    p.batch, p.budget, p.depth, p.kp, p.pairs, p.words = b, N, D, kp, P, W
    p.lp_dtype = LP_DTYPES[lp.dtype]
    p.lp_sb, p.lp_sd = lp.stride(0), lp.stride(1)
    p.ids_sb, p.ids_sd = ids.stride(0), ids.stride(1)
    return p


def build_tree(log_probs: torch.Tensor, token_ids: torch.Tensor, budget: int,
               pair_j: torch.Tensor, pair_r: torch.Tensor, out, num_threads: int | None = None) -> None:
    """Write the trees of log_probs / token_ids [b, D, k] (rows sorted descending) into `out` (a
    tree_gpu.GpuTree of contiguous tensors). pair_j / pair_r: tree_gpu.candidate_pairs(budget,
    min(k, budget)). Asynchronous on the current stream."""
    if log_probs.device.type != "cuda":
        raise ValueError("the CUDA tree build needs CUDA tensors")
    threads = num_threads or default_threads(budget)
    lp, ids = prepare_inputs(log_probs, token_ids)
    p = make_params(lp, ids, budget, pair_j, pair_r, out, threads)
    with torch.cuda.device(lp.device):
        lib = _lib()
        stream = torch.cuda.current_stream(lp.device).cuda_stream
        rc = lib.ttb_build_tree(ctypes.byref(p), threads, ctypes.c_void_p(stream))
    if rc != 0:
        raise RuntimeError(f"CUDA tree build launch failed: {lib.ttb_error_string(rc).decode()}")
