"""Programmatic dependent launch (PDL) for the Triton kernels of the decode step.

A decode step is hundreds of small kernels in one CUDA graph, and on an H200 the GPU idles
~0.45 µs at each boundary while the next grid is launched (kernels/NOTES.md). A kernel launched
with PDL (CUDA's programmatic stream serialization, Hopper and later) may be scheduled before the
kernel ahead of it on the stream has finished: its programs start, wait at
`griddepcontrol.wait` until that kernel has completed and its writes are visible, and only then
read or write memory. So each PDL kernel here waits first thing (`wait_then_release`) and then
lets the kernel after it launch early, which overlaps a launch with the tail of the kernel before.

`launch_options(device)` is what a launch site adds: `launch_pdl` and the kernel's `PDL`
constexpr, both off where PDL does not exist (CPUs, the Triton interpreter, GPUs before compute
capability 9.0, a Triton without `gdc_wait`), so the same code runs everywhere. The custom
verify kernels do the same in CUDA C++ (verify_attention.cu, `tva_launch`).

Measured on the H200 (kernels/NOTES.md, "Programmatic dependent launch"): graph-captured plain
decoding of Qwen3-8B idles 0.3-0.4 % of a step instead of 2.3-3.3 % and its steps are 1.4-4.2 %
shorter; the Triton top-k's three launches 18.05 -> 15.00 µs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait for the kernel before (its writes are visible after this): before any access to
    memory that kernel may write (the one-row GEMV reads its weights, which no kernel writes,
    before it)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    """From here on the kernel after this one may launch (it waits in turn before any access);
    a kernel may release after its main loop (the one-row GEMV) rather than first thing."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """First thing in a PDL kernel: wait for the kernel before, then let the one after launch."""
    wait(PDL)
    release(PDL)


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    try:
        from triton.language.extra import cuda as tl_cuda
    except ImportError:
        return False
    return (hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents")
            and torch.cuda.get_device_capability(index) >= (9, 0))


def enabled(device: torch.device) -> bool:
    """Whether launches on `device` use PDL."""
    # Under the interpreter triton.jit made plain functions (it read TRITON_INTERPRET when
    # they were defined): ask ours, not the env, as the kernels' own modules do.
    if device.type != "cuda" or not isinstance(wait_then_release, triton.runtime.JITFunction):
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device, overlap: bool = True) -> dict:
    """The keyword arguments a launch on `device` adds: the kernel's PDL constexpr and
    Triton's launch_pdl. `overlap` False: a plain launch, for a kernel right after one that does
    not let its dependents launch early (a cuBLAS GEMM, a torch kernel): there a PDL launch
    only waits longer, ~0.3 µs a boundary after a 65-row cuBLAS GEMM on the H200
    (kernels/NOTES.md, "Plain launches after cuBLAS"). The kernel still releases the one after
    it: launched plainly, its own wait is a no-op (the kernel before has finished), and its
    release lets a PDL kernel after it (the verify after the q/k norm that follows the q/k/v
    GEMM) launch under it instead of after it (kernels/NOTES.md, "Session 36")."""
    on = enabled(device)
    return {"PDL": on, "launch_pdl": on and overlap} if on else {"PDL": False}
