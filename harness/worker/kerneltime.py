"""Timing one kernel (or one fixed sequence of kernels) against this host's ceilings.

What the kernel and op workloads share (harness/worker/workloads/kernel.py and op.py):

- `ceilings`: copy bandwidth (bytes read + written per second) and bf16 matmul rate, measured on
  this device once per process (harness.worker.ceilings; a small CPU version on CPU hosts), so
  a roofline is against what this GPU does now, never a datasheet.
- `set_count`: how many input sets to rotate through so that together they are several times
  the L2 cache; a kernel timed on one set would read it from L2 from the second launch on and
  look faster than it runs in the loop, where its inputs are always fresh.
- `time_calls`: one launch per input set, repeated to at least `min_launches`, captured in one
  CUDA graph (launch cost amortised as in the loop's captured step), untimed warm-up replays,
  then `repeats` replays each timed with CUDA events; a sample is the replay's time over its
  launches. A call that cannot be captured is timed as eager launches the same way.
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import torch

from harness.worker.measure import spread

MIN_LAUNCHES = 8            # launches per captured graph at least
L2_MULTIPLE = 3             # input sets together at least this many times the L2 cache
MAX_SETS = 32


def ceilings(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """(copy bytes/s counting read + write, matmul FLOP/s) measured on this host, once."""
    if device.type == "cuda":
        from harness.worker import ceilings as gpu
        index = device.index if device.index is not None else torch.cuda.current_device()
        return gpu.copy_bandwidth(index), gpu.matmul_rate(index)
    return _cpu_ceilings(dtype)


@functools.lru_cache(maxsize=None)
def _cpu_ceilings(dtype: torch.dtype) -> tuple[float, float]:
    src = torch.randn(16 << 20)
    dst = torch.empty_like(src)
    copy_s = _best_of(lambda: dst.copy_(src), 5)
    n = 512
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    mm_s = _best_of(lambda: a @ b, 5)
    return 2 * src.numel() * src.element_size() / copy_s, 2 * n**3 / mm_s


def _best_of(fn, reps: int) -> float:
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def roofline_metrics(samples: list[float], bytes_: int, flops: int, copy_bw: float,
                     mm_rate: float) -> dict:
    """The metrics of a timed kernel: kernel_us (median of the per-call samples) and its spread,
    the bandwidth and FLOP rate it achieved, roofline_us = max(bytes / copy bandwidth, FLOPs /
    matmul rate), pct_roofline, and the two ceilings it was held against."""
    us = statistics.median(samples)
    roofline_us = max(bytes_ / copy_bw, flops / mm_rate) * 1e6
    return {
        "kernel_us": us,
        "kernel_us_spread": spread(samples),
        "achieved_tbps": bytes_ / (us * 1e-6) / 1e12,
        "achieved_tflops": flops / (us * 1e-6) / 1e12,
        "roofline_us": roofline_us,
        "pct_roofline": 100.0 * roofline_us / us,
        "copy_tbps": copy_bw / 1e12,
        "matmul_tflops": mm_rate / 1e12,
    }


def set_count(bytes_per_set: int, device: torch.device) -> int:
    """Input sets to rotate through: together at least L2_MULTIPLE times the L2 cache (at least
    two, at most MAX_SETS); two on a CPU host, whose timings are for the tests only."""
    if device.type != "cuda":
        return 2
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return min(MAX_SETS, max(2, math.ceil(L2_MULTIPLE * l2 / max(1, bytes_per_set))))


def launch_count(n_calls: int, min_launches: int = MIN_LAUNCHES) -> int:
    """Launches a captured graph of `n_calls` input sets holds: whole rounds of them, at least
    `min_launches`."""
    return math.ceil(max(min_launches, n_calls) / n_calls) * n_calls


def time_calls(calls: list, repeats: int, warmup: int, device: torch.device, *,
               min_launches: int = MIN_LAUNCHES) -> tuple[list[float], bool]:
    """Per-launch µs samples, one per timed replay, and whether a CUDA graph was replayed.
    `calls`: one zero-argument callable per input set, everything allocated beforehand."""
    launches = launch_count(len(calls), min_launches)

    def eager():
        for i in range(launches):
            calls[i % len(calls)]()

    for c in calls:                  # first calls compile and allocate, outside everything
        c()
    if device.type != "cuda":
        for _ in range(warmup):
            eager()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            eager()
            samples.append((time.perf_counter() - t0) * 1e6 / launches)
        return samples, False

    torch.cuda.synchronize(device)
    replay, graph = eager, False
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            eager()
        replay, graph = g.replay, True
    except Exception:                # not capturable (e.g. a host sync inside): time eagerly
        torch.cuda.synchronize(device)
    for _ in range(warmup):
        replay()
    torch.cuda.synchronize(device)
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / launches)
    return samples, graph
