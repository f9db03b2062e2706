"""The calibration workload: known GPU work and known host gaps, to check the idle meter.

One step launches `work` - r matmuls of n x n, sized on this GPU so that together they take
about `work_us` (measured with CUDA events back to back, where the GPU never waits: D) - eagerly
or as one CUDA graph replay (`replay`), then busy-waits the host until the step's deadline.
Deadlines come every T (HostPacer), so the GPU runs D and then waits for the next launch:
its true idle fraction is 1 - D / T, and T = D / (1 - idle_target). For idle_target 0
the host runs at T = D / 2, ahead of the GPU, which then never waits.

The truth of a window uses its own measured host period (host window / steps), so a host that
fell behind schedule does not make the truth wrong, only different from the target.

Per repeat: warm-up steps, then a window of steps timed by `EventStepClock` (no profiler) ->
`idle_fraction_est`; in the last repeat a profiled window (`idle.profile_window`) -> the
meter's `idle_fraction` and the busy time per step that calibrates the estimate. Windows are
at least `steps` (or `profile_steps`) steps and at least MIN_WINDOW_S long, so start-up and
pacing jitter stay far below the 1-point target. Phases `work` (the launch) and `gap` (the
wait) exercise the per-phase attribution: `phase.gap.idle_ms` should be ~ (T - D) per step.

On a CPU the work is a CPU matmul and the pacing runs as on a GPU, but idle is not defined:
every idle metric is absent.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from harness import idle
from harness.measure import PHASE_PREFIX

MIN_WINDOW_S = 0.05
GPU_SIZES = (1024, 2048, 4096, 8192)   # each matmul >= ~25 us at 2048: longer than a launch
CPU_SIZES = (16, 32, 64, 128)


# -- the schedule (pure) -------------------------------------------------------------------------
def step_period_s(work_s: float, idle_target: float) -> float:
    """Host period that leaves the GPU idle `idle_target` of each step (D / 2 for 0: ahead)."""
    if not 0.0 <= idle_target < 1.0:
        raise ValueError(f"idle_target {idle_target} must lie in [0, 1)")
    return work_s / 2 if idle_target == 0 else work_s / (1.0 - idle_target)


def window_steps(period_s: float, min_steps: int, min_window_s: float = MIN_WINDOW_S) -> int:
    """Steps in a window: at least `min_steps`, and enough to last `min_window_s`."""
    return max(min_steps, math.ceil(min_window_s / period_s))


def true_idle(work_s: float, period_s: float) -> float:
    """Idle fraction of a GPU that runs `work_s` per host period (never below 0: a GPU behind
    the host is busy all the time)."""
    return max(0.0, 1.0 - work_s / period_s)


def choose_size(target_s: float, timings: dict[int, float]) -> tuple[int, int]:
    """(n, r): the largest measured matmul size that fits in `target_s`, repeated r times to
    fill it (the smallest size if none fits)."""
    fitting = [n for n, t in timings.items() if t <= target_s]
    n = max(fitting) if fitting else min(timings)
    return n, max(1, round(target_s / timings[n]))


class HostPacer:
    """Busy-waits the host until one period after the previous step's deadline. A late step
    (a hiccup of the host, the profiler's start-up) is not caught up with a burst of
    back-to-back steps, which would leave the GPU running behind at a window's edge: the
    schedule restarts from the late moment. Busy-wait rather than sleep: a sleep overshoots by
    tens of µs."""

    def __init__(self, period_s: float, clock=time.perf_counter):
        self.period_s = period_s
        self.clock = clock
        self.deadline = None

    def start(self) -> None:
        self.deadline = self.clock() + self.period_s

    def wait(self) -> None:
        now = self.clock()
        while now < self.deadline:
            now = self.clock()
        self.deadline = max(self.deadline, now) + self.period_s


# -- the work --------------------------------------------------------------------------------------
def _device(cell: dict) -> torch.device:
    want = cell["device"]
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cell asks for device cuda but this host has no CUDA device")
    return torch.device(want)


def _dtype(cell: dict, device: torch.device) -> torch.dtype:
    if cell["dtype"] == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cell["dtype"])


def matmul_work(n: int, r: int, device, dtype, seed: int = 0):
    """A closure that launches r matmuls of n x n into a preallocated output."""
    gen = torch.Generator(device=device).manual_seed(seed)  # on the device: 8192^2 is quick
    a = torch.randn(n, n, generator=gen, device=device).div_(math.sqrt(n)).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).div_(math.sqrt(n)).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def work():
        for _ in range(r):
            torch.mm(a, b, out=out)
    return work


def graphed(work):
    """`work` captured once in a CUDA graph; returns the replay call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm up outside the capture (cuBLAS workspaces)
        work()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return graph.replay


def busy_time_s(fn, device: torch.device, min_total_s: float = 0.02) -> float:
    """Time of one call of `fn` with the device never waiting: CUDA events around calls
    queued back to back (a few already in flight when the first event is recorded)."""
    if device.type != "cuda":
        fn()
        t0 = time.perf_counter()
        fn()
        once = time.perf_counter() - t0
        reps = max(3, math.ceil(min_total_s / max(once, 1e-7)))
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1e3
    reps = max(5, math.ceil(min_total_s / max(once, 1e-7)))
    for _ in range(3):
        fn()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def size_work(target_s: float, device: torch.device, dtype, seed: int):
    """(n, r, timings): measure matmul sizes up to the first one longer than the target."""
    timings = {}
    for n in (GPU_SIZES if device.type == "cuda" else CPU_SIZES):
        timings[n] = busy_time_s(matmul_work(n, 1, device, dtype, seed), device, 0.005)
        if timings[n] > target_s:
            break
    n, r = choose_size(target_s, timings)
    return n, r, timings


# -- the cell --------------------------------------------------------------------------------------
def run(cell: dict, progress) -> dict:
    device = _device(cell)
    dtype = _dtype(cell, device)
    on_gpu = device.type == "cuda"
    if cell["replay"] == "graph" and not on_gpu:
        raise RuntimeError("replay: graph needs a CUDA device")
    torch.manual_seed(cell["seed"])

    progress(stage="size", device=str(device), work_us=cell["work_us"])
    n, r, timings = size_work(cell["work_us"] * 1e-6, device, dtype, cell["seed"])
    work = matmul_work(n, r, device, dtype, cell["seed"])
    if cell["replay"] == "graph":
        work = graphed(work)
    work_s = busy_time_s(work, device)
    period_s = step_period_s(work_s, cell["idle_target"])
    steps = window_steps(period_s, cell["steps"])
    pacer = HostPacer(period_s)

    def step():
        with torch.profiler.record_function(PHASE_PREFIX + "work"):
            work()
        with torch.profiler.record_function(PHASE_PREFIX + "gap"):
            pacer.wait()

    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    event_ms, host_s = [], []
    for rep in range(cell["repeats"]):
        progress(stage="measure", repeat=rep + 1, repeats=cell["repeats"], steps=steps)
        clock = idle.EventStepClock(steps, enabled=on_gpu)
        pacer.start()
        for _ in range(cell["warmup_steps"]):
            step()
        t0 = time.perf_counter()
        for _ in range(steps):
            clock.mark()
            step()
        clock.mark()
        host_s.append(time.perf_counter() - t0)
        sync()
        event_ms.append(clock.window_ms())

    stats = {}
    if on_gpu and cell["profile_steps"] > 0:
        prof_steps = window_steps(period_s, cell["profile_steps"])
        progress(stage="profile", steps=prof_steps)
        pacer.start()
        stats = idle.profile_window(step, prof_steps, warmup=max(1, cell["warmup_steps"]))

    meter, meter_samples, extra = idle.meter_outputs(stats, event_ms, steps)
    ests = meter_samples.get("idle_fraction_est")
    periods = [h / steps for h in host_s]
    truths = [true_idle(work_s, p) for p in periods] if on_gpu else None
    metrics = {
        **meter,
        "work_us": work_s * 1e6,
        "step_us": statistics.median(periods) * 1e6,
        "step_us_target": period_s * 1e6,
        "idle_target": cell["idle_target"],
        "idle_true": statistics.median(truths) if truths else None,
        "idle_est_error_pp": (statistics.median((e - t) * 100 for e, t in zip(ests, truths))
                              if ests and truths else None),
        "idle_error_pp": None,
    }
    if stats:
        # The profiled window's truth, from its own host period on the profiler's clock.
        prof_truth = true_idle(work_s, stats["window_ms"] / 1e3 / stats["steps"])
        metrics["idle_true_profiled"] = prof_truth
        metrics["idle_error_pp"] = (stats["idle_fraction"] - prof_truth) * 100
        # The GPU time per step the profiler saw, against work_us (measured back to back): a
        # difference means the work itself ran differently when paced (clocks), not a
        # mistake in the meter's window arithmetic.
        metrics["work_us_profiled"] = stats["step_busy_ms"] * 1e3
    extra["calibration"] = {"matmul_n": n, "matmuls_per_step": r, "steps": steps,
                            "matmul_s": {str(k): v for k, v in timings.items()}}
    samples = {**meter_samples, "step_us": [p * 1e6 for p in periods]}
    if truths:
        samples["idle_true"] = truths
    return {"metrics": metrics, "samples": samples, **extra}
