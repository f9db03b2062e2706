"""Hardware ceilings measured on the host itself (worker side), for roofline figures.

Datasheet numbers are leads; a roofline is only honest against what this GPU, with this
driver and these clocks, actually does. Each ceiling is measured once per worker process
(a fraction of a second) and cached.

A ceiling is the fastest the GPU went, not a typical run: whatever disturbs a timing (clocks
still rising from idle, a power cap biting, an unlucky placement of one buffer) only slows it,
so the best of several is the estimate that does not move with them. Taken as the median of
one memcpy of one buffer pair after a single warm-up copy, the copy ceiling read 2.56-2.60 TB/s
in 7 of 15 decode worker processes on a power-capped H100 (none of 20 kernel-workload ones)
where the others read 2.95-3.01 (and now and then 3.69-3.80 against 4.07-4.26 on an H200),
enough to put a decode step at 108 % of its "roofline", while the steps themselves ran no
slower. The low readings cluster too tightly for a clock effect; how the driver moved that
process's memcpy may be the cause as well. So each ceiling runs its operation for WARM_MS
first, then times it on ROUNDS separately allocated operands (the copy both as a memcpy and as
an elementwise kernel) and keeps the fastest call.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

WARM_MS = 30.0      # the operation runs this long (GPU time) before any timing counts
ROUNDS = 3          # operand sets, allocated together so that each is other memory
REPS = 10           # timed calls a set


def measured_once(fn):
    """fn cached per process by its arguments as bound, so that copy_rates(), copy_rates(0) and
    copy_rates(0, nbytes=1 << 30) are one measurement: functools.lru_cache alone keys each
    spelling of a call apart, and a second measurement of the same ceiling both costs its time
    again and may differ from the first (a decode result's ceiling and its two ways would then
    come from two measurements)."""
    signature = inspect.signature(fn)
    cached = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return cached(*bound.args, **bound.kwargs)
    call.cache_clear = cached.cache_clear
    return call


def _fastest_ms(fn, reps: int = REPS, warm_ms: float = WARM_MS) -> float:
    """The fastest of `reps` CUDA-event timings of fn(), after fn has run for `warm_ms` (and
    at least twice: a first call's time may be the host loading its kernel)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    warmed, calls = 0.0, 0
    while warmed < warm_ms or calls < 2:
        calls += 1
        start.record()
        fn()
        end.record()
        end.synchronize()
        warmed += start.elapsed_time(end)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)


def copy_ops(src: torch.Tensor, dst: torch.Tensor) -> dict:
    """The two ways a copy runs, by name: the driver's device-to-device memcpy (`copy_` of
    contiguous tensors; the driver picks how it moves the bytes) and an elementwise kernel on
    the multiprocessors (x 1 exactly: bf16 times one is itself), which reads and writes as the
    decode step's kernels do. Each reads `src` and writes `dst` once."""
    return {"memcpy": lambda: dst.copy_(src), "elementwise": lambda: torch.mul(src, 1, out=dst)}


def _operand_sets(make, rounds: int) -> list:
    """Up to `rounds` results of make(), all alive at once (so each is other memory); fewer
    where the GPU's memory runs out after the first (a worker measures its ceilings beside the
    model it has loaded), never none: the first allocation's error is the caller's."""
    sets = [make()]
    for _ in range(rounds - 1):
        try:
            sets.append(make())
        except torch.cuda.OutOfMemoryError:
            break
    return sets


@measured_once
def copy_rates(device: int = 0, nbytes: int = 1 << 30, rounds: int = ROUNDS) -> dict[str, float]:
    """Device-to-device copy rate in bytes/s (bytes read plus bytes written) of each way of
    `copy_ops`, the best over `rounds` pairs of `nbytes` buffers. A decode result keeps both
    (`ceilings.copy_tbps`), so a way that runs slow in some process shows as such."""
    def pair():
        return (torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_(),
                torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"))
    with torch.cuda.device(device):
        pairs = _operand_sets(pair, rounds)
        ms: dict[str, float] = {}
        for src, dst in pairs:
            for way, op in copy_ops(src, dst).items():
                ms[way] = min(ms.get(way, math.inf), _fastest_ms(op))
        del pairs
    return {way: 2 * nbytes / (t / 1e3) for way, t in ms.items()}


def copy_bandwidth(device: int = 0, nbytes: int = 1 << 30, rounds: int = ROUNDS) -> float:
    """The copy ceiling in bytes/s: the faster way of `copy_rates` (module docstring)."""
    return max(copy_rates(device, nbytes, rounds).values())


@measured_once
def matmul_rate(device: int = 0, n: int = 8192, rounds: int = ROUNDS) -> float:
    """bf16 matrix-multiply rate in FLOP/s on random data (zeros run faster): the best over
    `rounds` pairs of n x n operands."""
    def pair():
        return (torch.randn(n, n, dtype=torch.bfloat16, device="cuda"),
                torch.randn(n, n, dtype=torch.bfloat16, device="cuda"))
    with torch.cuda.device(device):
        pairs = _operand_sets(pair, rounds)
        ms = min(_fastest_ms(lambda a=a, b=b: a @ b) for a, b in pairs)
        del pairs
    return 2 * n**3 / (ms / 1e3)
