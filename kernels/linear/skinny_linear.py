"""Linear layers for the few rows of a decode step: y = x @ W^T with x [M, K], M <= 80.

A decode step multiplies 1 (autoregressive), 16 (the draft block) or 65 (the tree-verify block)
rows by weight matrices of 8-300 MB: the work is streaming W from HBM once, and what decides
its time is whether every multiprocessor streams an equal share from the first microsecond to
the last. On an H200 at 65 rows cuBLAS reaches 3.1 TB/s on the q/k/v projection (N 6144: 96
tiles of 64 rows for 132 multiprocessors) and 2.6 TB/s on o_proj, against 4.2 TB/s that a copy
reaches (trace of the loop at 4096 keys, kernels/NOTES.md, "Skinny linear").

The kernel computes y^T = W x^T: W's rows are the MMA's M side (tiles of BLOCK_N >= 64, the
warpgroup MMA's size), the token rows its N side, padded to BLOCK_M (16 or 64) plus a TAIL of
16 rows for M in 65..80, so 65 rows cost 80 rows of MMA work rather than 128. Where N / BLOCK_N
tiles are too few to fill the GPU, K is split: every split writes an fp32 partial tile, and
the split that finishes last for a tile (a per-tile counter) sums the partials in split order
and writes y; it resets the counter, so a workspace serves every later call. The sum's order is
fixed, so a result never depends on which split finished first.

Reference: `torch.nn.functional.linear`. Benchmark: `.bench` below (graph replays over weight
copies larger than L2). Tests: tests/kernels/test_skinny_linear.py (interpreter on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 80          # 64 + a 16-row tail: the most rows the kernel takes
# Above this many rows cuBLAS measured faster on the H200 (65 rows: 0.83-0.97x its time on
# Qwen3-8B's shapes, kernels/NOTES.md): `linear` hands them to it unless given a config.
KERNEL_ROWS = 16


@triton.jit
def _skinny_kernel(X, W, Y, PART, LOCK, M, N, stride_xm, stride_wn, stride_ym, k_split,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   TAIL: tl.constexpr, SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    kk = pid_k * k_split + tl.arange(0, BLOCK_K)
    m = tl.arange(0, BLOCK_M)
    w_ptrs = W + n[:, None].to(tl.int64) * stride_wn + kk[None, :]
    x_ptrs = X + m[None, :] * stride_xm + kk[:, None]                 # x^T tile [BLOCK_K, BLOCK_M]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if TAIL:
        mt = BLOCK_M + tl.arange(0, TAIL)
        xt_ptrs = X + mt[None, :] * stride_xm + kk[:, None]
        acc_t = tl.zeros((BLOCK_N, TAIL), dtype=tl.float32)
    for _ in range(0, k_split, BLOCK_K):
        w = tl.load(w_ptrs, mask=n_ok[:, None], other=0.0)
        x = tl.load(x_ptrs, mask=(m < M)[None, :], other=0.0)
        acc = tl.dot(w, x, acc)
        if TAIL:
            xt = tl.load(xt_ptrs, mask=(mt < M)[None, :], other=0.0)
            acc_t = tl.dot(w, xt, acc_t)
            xt_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K

    if SPLIT:
        # Partials [split, rows, N] in fp32; the last split to arrive at this tile sums them.
        rows = BLOCK_M + TAIL
        p_ptrs = PART + (pid_k * rows + m[None, :]).to(tl.int64) * N + n[:, None]
        tl.store(p_ptrs, acc, mask=n_ok[:, None])
        if TAIL:
            pt_ptrs = PART + (pid_k * rows + mt[None, :]).to(tl.int64) * N + n[:, None]
            tl.store(pt_ptrs, acc_t, mask=n_ok[:, None])
        # Every thread's partial stores come before the arrival (one thread's release, as
        # CUTLASS's semaphores: a block barrier, then the release).
        tl.debug_barrier()
        n_splits = tl.num_programs(1)
        arrived = tl.atomic_add(LOCK + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == n_splits - 1:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            if TAIL:
                acc_t = tl.zeros((BLOCK_N, TAIL), dtype=tl.float32)
            for s in range(0, n_splits):            # split order: the same sum every call
                q_ptrs = PART + (s * rows + m[None, :]).to(tl.int64) * N + n[:, None]
                acc += tl.load(q_ptrs, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
                if TAIL:
                    qt_ptrs = PART + (s * rows + mt[None, :]).to(tl.int64) * N + n[:, None]
                    acc_t += tl.load(qt_ptrs, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(LOCK + pid_n, 0)
            y_ptrs = Y + m[None, :] * stride_ym + n[:, None]
            tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & (m < M)[None, :])
            if TAIL:
                yt_ptrs = Y + mt[None, :] * stride_ym + n[:, None]
                tl.store(yt_ptrs, acc_t.to(Y.dtype.element_ty), mask=n_ok[:, None] & (mt < M)[None, :])
    else:
        y_ptrs = Y + m[None, :] * stride_ym + n[:, None]
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=n_ok[:, None] & (m < M)[None, :])
        if TAIL:
            yt_ptrs = Y + mt[None, :] * stride_ym + n[:, None]
            tl.store(yt_ptrs, acc_t.to(Y.dtype.element_ty), mask=n_ok[:, None] & (mt < M)[None, :])


@dataclass(frozen=True)
class Config:
    """One launch configuration. `split`: K cut into this many ranges (1: none)."""

    block_n: int = 128
    block_k: int = 64
    split: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __str__(self) -> str:
        return (f"n{self.block_n} k{self.block_k} s{self.split} w{self.num_warps} "
                f"st{self.num_stages}")


def rows_tiling(M: int) -> tuple[int, int]:
    """(BLOCK_M, TAIL) for M rows: 16 up to 16, 64 up to 64, else 64 + a 16-row tail."""
    if M <= 16:
        return 16, 0
    if M <= 64:
        return 64, 0
    return 64, 16


def default_config(M: int, N: int, K: int, sm_count: int) -> Config:
    """Tiles of 64 weight rows, 128 deep, four warps, four stages; K split in two while there
    are programs for fewer than 2/3 of the multiprocessors, each split at least 1024 deep. On the
    H200 (one sweep of 287 configurations at rows 1, 16 and 65 over Qwen3-8B's five weight
    shapes; kernels/NOTES.md, "Skinny linear") this is the best configuration, or within 2 %
    of it, at every shape at 1 and 16 rows; 96 programs on q/k/v beat 192."""
    block_n, block_k = 64, next(b for b in (128, 64, 32, 16) if K % b == 0)
    tiles = triton.cdiv(N, block_n)
    split = 1
    while (3 * tiles * split < 2 * sm_count and K % (2 * split * block_k) == 0
           and K // (2 * split) >= 1024):
        split *= 2
    return Config(block_n=block_n, block_k=block_k, split=split)


class _Workspace:
    """The split-K partials and tile counters of each (device, N, split, rows), made on first
    use and kept: a CUDA graph that captured a call keeps its addresses, so a buffer is never
    replaced. Counters are reset by the kernel itself, so one zeroed allocation serves every
    later call; calls on one stream run one after another, so they share it."""

    def __init__(self):
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, N: int, split: int, rows: int, tiles: int):
        key = (device, N, split, rows, tiles)
        if key not in self._buffers:
            self._buffers[key] = (
                torch.empty(split * rows * N, dtype=torch.float32, device=device),
                torch.zeros(tiles, dtype=torch.int32, device=device))
        return self._buffers[key]


WORKSPACE = _Workspace()


def linear(x: torch.Tensor, weight: torch.Tensor, config: Config | None = None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight) for x [..., K]. More than KERNEL_ROWS rows in all (MAX_ROWS with a
    `config`: sweeps, tests), or a K that is not a multiple of 16 (the MMA's depth), go to
    torch's F.linear (cuBLAS), which computes the same. weight [N, K], K-contiguous; with
    `config`, K a multiple of its block_k * split."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    M, N = x2.shape[0], weight.shape[0]
    if (M > (MAX_ROWS if config else KERNEL_ROWS) or K % 16
            or x.device.type != "cuda" and not _interpreting()):
        return F.linear(x, weight)
    if x2.stride(-1) != 1 or weight.stride(-1) != 1 or weight.shape[1] != K:
        raise ValueError("x and weight need the same, contiguous last dimension")
    if config is None:
        config = default_config(M, N, K, _sm_count(x.device))
    if K % (config.block_k * config.split):
        raise ValueError(f"K {K} is not a multiple of block_k {config.block_k} x split {config.split}")
    y = out if out is not None else torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device)
    y2 = y.view(-1, N)
    block_m, tail = rows_tiling(M)
    tiles = triton.cdiv(N, config.block_n)
    if config.split > 1:
        part, lock = WORKSPACE.get(x.device, N, config.split, block_m + tail, tiles)
    else:
        part, lock = y2, y2                     # never touched without a split
    _skinny_kernel[(tiles, config.split)](
        x2, weight, y2, part, lock, M, N, x2.stride(0), weight.stride(0), y2.stride(0),
        K // config.split, BLOCK_N=config.block_n, BLOCK_K=config.block_k, BLOCK_M=block_m,
        TAIL=tail, SPLIT=config.split > 1, num_warps=config.num_warps,
        num_stages=config.num_stages)
    return y


def _interpreting() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
