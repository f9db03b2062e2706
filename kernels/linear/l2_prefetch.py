"""A weight matrix asked into L2 ahead of its GEMM, while a kernel that leaves DRAM idle runs.

The verify forward's o_proj at 65 rows (a cuBLAS GEMM over 33.5 MB of Qwen3-8B weights) streams
its weights at ~60 % of the copy rate on an H200: a 13 µs kernel spends its first and last
microseconds ramping up and draining. Right before it the verify attention runs for 20-170 µs
with DRAM mostly idle (it is bound by its instruction stream, not by bytes: kernels/NOTES.md).
`prefetch` launches a small kernel that asks the L2 for the weights with bulk prefetches
(`cp.async.bulk.prefetch.L2`: one instruction a 16 KB chunk, nothing returned to the SM) and
then waits for the kernel before it, so the copy engine fetches the weights in the shadow of
the attention and the GEMM finds some or all of them in L2.

A prefetch is a hint: nothing depends on it for correctness, it writes no memory, and a line it
fetched that is evicted again before the GEMM reads it costs only DRAM bandwidth nobody was
using. It runs on Hopper and later (sm_90+), where the instruction exists; elsewhere (CPUs, the
interpreter, older GPUs) `enabled` is false and the call sites skip it.

Launch order: the kernel issues its prefetches before its PDL wait (the weights are written by
no kernel of the step) and lets the kernel after it launch once the kernel before has finished,
so placed between two kernels of a PDL chain it keeps the chain's order and adds no boundary of
its own beyond its launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from harness.kernels import pdl

CHUNK_BYTES = 16384    # one bulk prefetch (the instruction's size is an immediate: see the asm)
LANES = 32             # chunks a program asks for: one a thread of its one warp


def chunks(nbytes: int) -> int:
    """Bulk prefetches that cover `nbytes` (the last one may overlap the one before)."""
    return -(-nbytes // CHUNK_BYTES)


def chunk_start(i: int, nbytes: int) -> int:
    """Byte offset of chunk i: whole chunks, the last one moved back to end at `nbytes` so that
    no prefetch reads past the tensor (`nbytes` is a multiple of 16 and at least a chunk)."""
    return min(i * CHUNK_BYTES, nbytes - CHUNK_BYTES)


def takes(t: torch.Tensor) -> bool:
    """Whether `prefetch` can cover t: contiguous, 16-byte aligned and sized, one chunk or more."""
    nbytes = t.numel() * t.element_size()
    return (t.is_contiguous() and t.data_ptr() % 16 == 0 and nbytes % 16 == 0
            and nbytes >= CHUNK_BYTES)


@triton.jit
def _prefetch_kernel(BASE, n_chunks, last_start, LANES: tl.constexpr, PDL: tl.constexpr):
    # Chunk c starts at c * 16384, the last at last_start; lanes past the end repeat the last
    # chunk (a prefetch of a line already asked for costs nothing).
    c = tl.minimum(tl.program_id(0) * LANES + tl.arange(0, LANES), n_chunks - 1)
    offset = tl.minimum(c.to(tl.int64) * 16384, last_start)
    ptr = BASE.to(tl.pointer_type(tl.int8)) + offset
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 16384;\n\tmov.u32 $0, 0;",
                              "=r,l", [ptr], dtype=tl.int32, is_pure=False, pack=1)
    pdl.wait_then_release(PDL)


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether `prefetch` runs on `device`: a CUDA GPU of compute capability 9.0 or later, the
    compiled Triton (not the interpreter, which cannot run inline PTX)."""
    if device.type != "cuda" or not isinstance(_prefetch_kernel, triton.runtime.JITFunction):
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def prefetch(t: torch.Tensor, overlap: bool = True) -> bool:
    """Ask L2 for all of t's bytes; returns whether a kernel was launched (False where the GPU
    or the tensor does not allow it: then nothing happens). `overlap` as pdl.launch_options."""
    if not enabled(t.device) or not takes(t):
        return False
    nbytes = t.numel() * t.element_size()
    n = chunks(nbytes)
    _prefetch_kernel[(triton.cdiv(n, LANES),)](t, n, chunk_start(n - 1, nbytes), LANES=LANES,
                                               num_warps=1, **pdl.launch_options(t.device, overlap))
    return True
