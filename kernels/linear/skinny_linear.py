"""Linear layers for the few rows of a decode step: y = x @ W^T with x [M, K], M <= 16.

Plain decoding multiplies 1 row a sequence, the DFlash draft block 16 (15 drafted positions
and the bonus token), by weight matrices of 8-1200 MB: the work is streaming W from HBM once.
cuBLAS's choices for these shapes on an H200 leave multiprocessors idle (q/k/v at one row: 96
tiles for 132 of them) or split K and sum the splits in a second kernel (o_proj, down_proj),
so a graph-captured Qwen3-8B step at one row ran 442 kernels where this kernel makes it 370.

The kernel computes y^T = W x^T: W's rows are the MMA's M side (tiles of BLOCK_N = 64), the
token rows its N side, padded to one 16-row MMA tile. Where N / BLOCK_N tiles would leave a
third of the GPU idle, K is split: every split writes an fp32 partial tile, and the split that
arrives last at a tile (a per-tile counter) sums the partials in split order and writes y; it
resets the counter, so one workspace serves every later call, graph replays included. The sum's
order is fixed, so a result never depends on which split finished first.

One row (plain decoding at batch 1) takes a plain GEMV instead (`_gemv_kernel`: no tensor cores,
eight weight rows a program, 1024 columns a step, fp32 products summed per column lane and then
across the lanes): on the H200 a layer's four GEMMs at one row take 96.1 µs against the tile
kernel's 106.4, and graph-captured plain decoding runs 3.5-6.1 % faster (kernels/NOTES.md, "One
row as a plain GEMV"); the lm_head's 151936 rows stay on the tile kernel (GEMV_MAX_N: on the
GEMV, plain decoding measured 0.2-0.7 % slower).

More rows (the 65-row verify, prefill) go to cuBLAS: at 65 rows it was faster than every
variant of this kernel tried on the H200 (0.62-0.97x its time: kernels/NOTES.md, "Skinny
linear"). Reference: torch.nn.functional.linear. Benchmark: the op workload's `linear` family
(scenarios/ops.yaml). Tests: tests/kernels/test_skinny_linear.py (interpreter) and
test_skinny_linear_gpu.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from harness.kernels import pdl

# The most rows the kernel takes: one MMA tile of token rows. At 65 rows (the verify) cuBLAS
# measured faster on the H200 in every variant tried (kernels/NOTES.md): more go to cuBLAS.
MAX_ROWS = 16
# One-row weights of at most this many rows take the GEMV (the layers' q/k/v, o, gate/up and
# down projections of Qwen3-8B: 4096-24576); the lm_head (151936) keeps the tile kernel, whose
# split-K plan read it faster than the GEMV's 8-row programs on the H200.
GEMV_MAX_N = 32768
GEMV_BLOCK_N, GEMV_WARPS, GEMV_STAGES = 8, 4, 3


def takes(rows: int, K: int) -> bool:
    """Whether `linear` runs this kernel for `rows` rows of depth K (else cuBLAS)."""
    return rows <= MAX_ROWS and K % 16 == 0


@triton.jit
def _skinny_kernel(X, W, Y, PART, LOCK, M, N, stride_xm, stride_wn, stride_ym, k_split,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   SPLIT: tl.constexpr, PDL: tl.constexpr):
    pdl.wait_then_release(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    kk = pid_k * k_split + tl.arange(0, BLOCK_K)
    w_ptrs = W + n[:, None].to(tl.int64) * stride_wn + kk[None, :]
    x_ptrs = X + m[None, :] * stride_xm + kk[:, None]                 # x^T tile [BLOCK_K, BLOCK_M]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in range(0, k_split, BLOCK_K):
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        x = tl.load(x_ptrs, mask=m_ok[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K

    y_ptrs = Y + m[None, :] * stride_ym + n[:, None]                  # y^T tile
    if SPLIT:
        # Partials [split, BLOCK_M, N] in fp32; the last split to arrive at this tile sums them.
        p_ptrs = PART + (pid_k * BLOCK_M + m[None, :]).to(tl.int64) * N + n[:, None]
        tl.store(p_ptrs, acc, mask=n_ok[:, None])
        # Every thread's partial stores come before the arrival, which one thread makes with
        # release semantics (CUTLASS's semaphores: a block barrier, then the release).
        tl.debug_barrier()
        n_splits = tl.num_programs(1)
        arrived = tl.atomic_add(LOCK + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in range(0, n_splits):            # split order: the same sum every call
                q_ptrs = PART + (s * BLOCK_M + m[None, :]).to(tl.int64) * N + n[:, None]
                # .cg: from L2, where the other splits' stores are, never a stale L1 line
                acc += tl.load(q_ptrs, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(LOCK + pid_n, 0)
            tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])
    else:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


@triton.jit
def _gemv_kernel(X, W, Y, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr,
                 PDL: tl.constexpr):
    """y = W x for one row x [K]: program i takes weight rows i BLOCK_N .., each thread a few
    columns of them; products accumulate in fp32 per column lane over K / BLOCK_K steps, then
    one sum across the lanes (a fixed order: the same bits every call). It loads its first
    weight step before waiting for the kernel before (below), and lets the next kernel launch
    after its loop, not first thing: with these unmasked loads, releasing first thing made plain
    decoding 0.4-1.5 % slower on the H200 (kernels/NOTES.md, "One row as a plain GEMV")."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    w_ptrs = W + n[:, None].to(tl.int64) * stride_wn + tl.arange(0, BLOCK_K)[None, :]
    x_ptrs = X + tl.arange(0, BLOCK_K)
    # The first step's weights go out before the wait: no kernel writes them, only x depends on
    # the kernel before, so under PDL they stream while that kernel (a norm, the attention's
    # combine, silu_mul) still runs, where HBM would otherwise idle.
    if EVEN_N:                    # no mask: masked, these loads made the kernel 9 % slower on the H200
        w = tl.load(w_ptrs)
    else:
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
    pdl.wait(PDL)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc += w.to(tl.float32) * tl.load(x_ptrs).to(tl.float32)[None, :]
    for _ in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        x = tl.load(x_ptrs)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    pdl.release(PDL)
    tl.store(Y + n, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=n_ok)


def gemv_block_k(K: int) -> int:
    """The GEMV's columns a step: 1024 (the H200 sweep's best at every layer shape), or the
    largest power of two below it that divides K (K is a multiple of 16)."""
    return next(b for b in (1024, 512, 256, 128, 64, 32, 16) if K % b == 0)


@dataclass(frozen=True)
class Config:
    """One launch configuration. `split`: K cut into this many ranges (1: none)."""

    block_n: int = 64
    block_k: int = 128
    split: int = 1
    num_warps: int = 4
    num_stages: int = 4


@functools.lru_cache(maxsize=None)       # a pure function of the shape, asked at every call
def default_config(M: int, N: int, K: int, sm_count: int) -> Config:
    """Tiles of 64 weight rows, 128 deep, four warps, four stages; K split in two while there
    are programs for fewer than 2/3 of the multiprocessors, each split at least 1024 deep.
    Measured on the H200 (one sweep of 287 configurations over Qwen3-8B's five weight shapes;
    kernels/NOTES.md, "Skinny linear"): within 2 % of the sweep's best at every shape at 1 and
    16 rows, except gate/up at 16 rows (3.4 % behind eight warps and three stages, which lose
    at 1 row and on lm_head); q/k/v's 96 programs unsplit beat 192 split in two."""
    block_n, block_k = 64, next(b for b in (128, 64, 32, 16) if K % b == 0)
    tiles = triton.cdiv(N, block_n)
    split = 1
    while (3 * tiles * split < 2 * sm_count and K % (2 * split * block_k) == 0
           and K // (2 * split) >= 1024):
        split *= 2
    return Config(block_n=block_n, block_k=block_k, split=split)


class _Workspace:
    """The split-K partials and tile counters of each (device, N, split, tiles), made on first
    use and kept: a CUDA graph that captured a call keeps its addresses, so a buffer is never
    replaced. Counters are reset by the kernel itself, so one zeroed allocation serves every
    later call; calls on one stream run one after another, so they share it."""

    def __init__(self):
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, N: int, split: int, tiles: int):
        key = (device, N, split, tiles)
        if key not in self._buffers:
            self._buffers[key] = (
                torch.empty(split * MAX_ROWS * N, dtype=torch.float32, device=device),
                torch.zeros(tiles, dtype=torch.int32, device=device))
        return self._buffers[key]


WORKSPACE = _Workspace()


def linear(x: torch.Tensor, weight: torch.Tensor, config: Config | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight) for x [..., K]. More than MAX_ROWS rows in all (the verify,
    prefill), or a K that is not a multiple of 16 (the MMA's depth), go to torch's F.linear
    (cuBLAS), which computes the same. weight [N, K], K-contiguous; with `config`, K a
    multiple of its block_k * split. One row and no `config`: the GEMV (GEMV_MAX_N)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], weight.shape[0]
    if not takes(M, K) or x.device.type != "cuda" and not _interpreting():
        return F.linear(x, weight)
    if x2.stride(-1) != 1 or weight.stride(-1) != 1 or weight.shape[1] != K:
        raise ValueError("x and weight need the same, contiguous last dimension")
    gemv = config is None and M == 1 and N <= GEMV_MAX_N
    if config is None and not gemv:
        config = default_config(M, N, K, _sm_count(x.device))
    if config is not None and K % (config.block_k * config.split):
        raise ValueError(f"K {K} is not a multiple of block_k {config.block_k} x split {config.split}")
    y = out if out is not None else torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, N)
    if gemv:
        _gemv_kernel[(triton.cdiv(N, GEMV_BLOCK_N),)](
            x2, weight, y2, N, K, weight.stride(0), BLOCK_N=GEMV_BLOCK_N, BLOCK_K=gemv_block_k(K),
            EVEN_N=N % GEMV_BLOCK_N == 0,
            num_warps=GEMV_WARPS, num_stages=GEMV_STAGES, **pdl.launch_options(x.device))
        return y
    tiles = triton.cdiv(N, config.block_n)
    if config.split > 1:
        part, lock = WORKSPACE.get(x.device, N, config.split, tiles)
    else:
        part, lock = y2, y2                     # never touched without a split
    _skinny_kernel[(tiles, config.split)](
        x2, weight, y2, part, lock, M, N, x2.stride(0), weight.stride(0), y2.stride(0),
        K // config.split, BLOCK_N=config.block_n, BLOCK_K=config.block_k, BLOCK_M=MAX_ROWS,
        SPLIT=config.split > 1, num_warps=config.num_warps,
        num_stages=config.num_stages, **pdl.launch_options(x.device))
    return y


def _interpreting() -> bool:
    # triton.jit read TRITON_INTERPRET when the kernel was defined: ask it, not the env.
    return not isinstance(_skinny_kernel, triton.runtime.JITFunction)


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
