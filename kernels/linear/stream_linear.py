"""The verify forward's weight GEMMs on Hopper: y = x @ W^T for 17-72 rows, one CUDA C++ kernel.

    linear(x, weight) -> y          x [..., K] bf16 with 17..72 rows in all, weight [N, K]

kernels/linear/stream_linear.cu: stream-K over one persistent CTA a multiprocessor, weights and
tokens by tensor copies (TMA) into an eight-stage ring, m64n72k16 warpgroup MMAs with the weight
rows on the M side, and the first stages' weight copies issued before the wait for the kernel
ahead (programmatic dependent launch), so the GEMM's ramp hides under that kernel's tail. The
tree-verify forward's 65 rows (a 64-node tree and its root) take it where a cell asks
(linear_impl: wgmma); the skinny Triton kernel keeps up to 16 rows (skinny_linear.py), cuBLAS
everything else. On the H200 (kernels/NOTES.md, session 27) one layer's four GEMMs take 1.05-1.07x
cuBLAS's time (q/k/v and o 1.17-1.19x: the stream-K fix-up; the lm_head 1.02x faster), and the
loop makes 0.96-0.97x cuBLAS's tokens/s while its idle falls from 1.4-2.8 to 0.2-0.4 %: opt-in
until it wins (scenarios/linear-ab.yaml is the A/B). A second kernel beside it (whole tiles dealt
to thread-block clusters, summed through distributed shared memory) took 1.6-2.6x cuBLAS's time
in session 27 and was removed (kernels/NOTES.md).

The call never synchronises with the host and allocates only its output, so it can be captured
in a CUDA graph; make the first call outside the capture (it compiles and loads the library:
kernels/build.py, cached on disk). Importing this module works on a host without a GPU.

Reference: torch.nn.functional.linear. Tests: tests/kernels/test_stream_linear_emulated.py
(the CUDA source on the CPU emulator) and test_stream_linear_gpu.py. Benchmark: the op
workload's `linear` family at 65 rows (scenarios/ops.yaml), and the decode loop's cells with
linear_impl wgmma; bench_shapes.py beside this file sweeps the launch `Shape` against cuBLAS.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_ROWS, MAX_ROWS = 17, 72        # fewer rows: the skinny kernel; MAX_ROWS = stream_linear.cu's NT
GROUP_ROWS, ACC, MAX_GROUPS = 128, 72, 2     # = stream_linear.cu's
MAX_SMEM = 232448                  # an H200 CTA's dynamic shared memory at most
STAGE_BYTES = {1: 128 * 64 * 2 + 72 * 64 * 2, 2: 2 * 128 * 64 * 2 + 72 * 64 * 2}


@dataclass(frozen=True)
class Shape:
    """A launch's shape: `groups` consumer warpgroups a CTA (a tile of 128 weight rows each,
    sharing each stage's token tile), a ring of `stages` stages (two are held by the MMAs in
    flight), `ctas` CTAs (None: one a multiprocessor; never more). The default measured fastest
    on the H200 at Qwen3-8B's shapes (kernels/NOTES.md, "The verify's weight GEMMs on wgmma")."""
    groups: int = 1
    stages: int = 8
    ctas: int | None = None
    pdl: bool = True          # launched with programmatic dependent launch (False: for A/B timings)

    def __post_init__(self):
        if self.groups not in STAGE_BYTES or not 3 <= self.stages <= 16:
            raise ValueError(f"groups must be 1 or 2 and stages 3..16 (got {self.groups}, {self.stages})")
        if 2048 + self.stages * STAGE_BYTES[self.groups] > MAX_SMEM:
            raise ValueError(f"{self.stages} stages of {self.groups} groups exceed {MAX_SMEM} bytes")


class Args(ctypes.Structure):
    """Mirror of tsl::Args (every field 8 bytes wide)."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("x", "w", "y", "partials", "counters")] + \
               [(name, ctypes.c_int64) for name in
                ("M", "N", "K", "x_stride", "w_stride", "y_stride", "ctas", "groups", "stages",
                 "pdl")]


# linear_impl wgmma's launch.
DEFAULT_SHAPE = Shape()


def takes(rows: int, K: int, dtype: torch.dtype) -> bool:
    """Whether `linear` runs this kernel for `rows` rows of depth K (the caller checks the GPU:
    Hopper, sm_90)."""
    return MIN_ROWS <= rows <= MAX_ROWS and K % 8 == 0 and dtype == torch.bfloat16


def partial_floats(ctas: int, groups: int = MAX_GROUPS) -> int:
    """The fp32 workspace a grid of `ctas` needs: each CTA's part of a tile another CTA owns."""
    return ctas * ACC * 128 * groups


class _Workspace:
    """Each device's partials and tile counters, made on first use and kept: a CUDA graph that
    captured a call keeps their addresses, so a buffer is never replaced, only a larger one
    added for a larger N. The kernel resets every counter it counts, so one zeroed allocation
    serves every later call; calls on one stream run one after another, so they share it."""

    def __init__(self):
        self._partials: dict[torch.device, list[torch.Tensor]] = {}
        self._counters: dict[tuple[torch.device, int], torch.Tensor] = {}

    def get(self, device: torch.device, ctas: int, tiles: int):
        kept = self._partials.setdefault(device, [])
        if not kept or kept[-1].numel() < partial_floats(ctas):
            kept.append(torch.empty(partial_floats(ctas), dtype=torch.float32, device=device))
        key = (device, tiles)
        if key not in self._counters:
            self._counters[key] = torch.zeros(tiles, dtype=torch.int32, device=device)
        return kept[-1], self._counters[key]


WORKSPACE = _Workspace()


def _lib():
    from harness.kernels.build import STREAM_LINEAR_SOURCE, load_library

    lib = load_library(source=STREAM_LINEAR_SOURCE)
    if lib.tsl_struct_size() != ctypes.sizeof(Args):
        raise RuntimeError("stream_linear.cu and stream_linear.py disagree on the argument struct")
    return lib


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def linear(x: torch.Tensor, weight: torch.Tensor, shape: Shape = DEFAULT_SHAPE) -> torch.Tensor:
    """F.linear(x, weight) for x [..., K] of MIN_ROWS..MAX_ROWS rows in all, bf16, on a CUDA
    device (others: F.linear)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], weight.shape[0]
    if not takes(M, K, x.dtype) or x.device.type != "cuda":
        return F.linear(x, weight)
    if x2.stride(-1) != 1 or weight.stride(-1) != 1 or weight.shape[1] != K or weight.dtype != x.dtype:
        raise ValueError("x and weight need the same dtype and the same, contiguous last dimension")
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if not _hopper(index):
        raise ValueError("the stream-K linear kernel (linear_impl wgmma) runs wgmma: it needs a Hopper "
                         "GPU (compute capability 9.0)")
    grid = int(shape.ctas) if shape.ctas is not None else _sm_count(index)
    tiles = -(-N // GROUP_ROWS)           # enough counters for any tile size
    partials, counters = WORKSPACE.get(x.device, max(grid, _sm_count(index)), tiles)
    y = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    a = Args(x=x2.data_ptr(), w=weight.data_ptr(), y=y.data_ptr(), partials=partials.data_ptr(),
             counters=counters.data_ptr(), M=M, N=N, K=K, x_stride=x2.stride(0),
             w_stride=weight.stride(0), y_stride=N, ctas=grid, groups=shape.groups,
             stages=shape.stages, pdl=int(shape.pdl))
    with torch.cuda.device(x.device):
        lib = _lib()
        stream = torch.cuda.current_stream(x.device).cuda_stream
        rc = lib.tsl_linear(ctypes.byref(a), ctypes.c_void_p(stream))
    if rc != 0:
        why = (f"the driver refused a tensor map (CUresult {-rc})" if rc < 0
               else lib.tsl_error_string(rc).decode())
        raise RuntimeError(f"stream-K linear launch failed: {why}")
    return y
