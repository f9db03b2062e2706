"""Hardware ceilings measured on the host itself (worker side), for roofline figures.

Datasheet numbers are leads; a roofline is only honest against what this GPU, with this
driver and these clocks, actually does. Each ceiling is measured once per worker process
(about 0.1 s) and cached.
"""

from __future__ import annotations

import functools

import torch


def _time_ms(fn, reps: int) -> float:
    """Median of `reps` CUDA-event timings of fn(), after a warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@functools.lru_cache(maxsize=None)
def copy_bandwidth(device: int = 0, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    with torch.cuda.device(device):
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        dst = torch.empty_like(src)
        ms = _time_ms(lambda: dst.copy_(src), reps=10)
        del src, dst
    return 2 * nbytes / (ms / 1e3)


@functools.lru_cache(maxsize=None)
def matmul_rate(device: int = 0, n: int = 8192) -> float:
    """bf16 matrix-multiply rate in FLOP/s on random data (zeros run faster)."""
    with torch.cuda.device(device):
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        ms = _time_ms(lambda: a @ b, reps=10)
        del a, b
    return 2 * n**3 / (ms / 1e3)
