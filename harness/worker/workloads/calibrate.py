"""The calibration workload: known GPU work and known host gaps, to check the idle meter.

One step launches one spin kernel of `work_us` (harness.kernels.calibrate.spin: it runs for that long by
the GPU's own nanosecond timer and records its [start, end] on that timer), eagerly or as one
CUDA graph replay (`replay`), then busy-waits the host until the step's deadline. Deadlines come
every T = D / (1 - idle_target) (HostPacer), so the GPU runs D and waits for the next launch;
for idle_target 0 the host runs at T = D / 2, ahead of the GPU, which then never waits.

The truth is measured, not assumed. The kernels' own timestamps say when the GPU was busy
(independently of the profiler and of CUDA events); the host window is the same steps' host
time. Host and GPU clocks differ by an unknown offset: every kernel starts after its launch,
so the smallest (kernel start - host launch time) of the cell, taken on a launch that found
the GPU idle, is that offset plus a bare launch latency: it places the host window on the GPU
clock to within that latency (µs, over a window of >= 50 ms). `gpu_truth` does the arithmetic.
The first calibration run computed the truth as 1 - D / T from a D of matmuls measured back
to back beforehand; but a matmul's D depends on how it is paced (on the H200 10 ms of matmuls
took 11.3 ms back to back and 9.7 ms with 50 % idle gaps: power and clocks), which made that
"truth" wrong by up to 9 points while the meter and the estimate agreed with each other.

Per repeat: warm-up steps, a drain (the window starts with an empty queue), then a window of
steps timed by `EventStepClock` (no profiler) -> `idle_fraction_est` against that window's
truth; in the last repeat a profiled window (`idle.profile_window`) -> the meter's
`idle_fraction` against the profiled window's own truth (the profiler slows the host, so the
two windows' truths differ). Windows are at least `steps` (or `profile_steps`) steps and at
least MIN_WINDOW_S long. Phases `work` (the launch) and `gap` (the wait) exercise the per-phase
attribution: `phase.gap.idle_ms` should be ~ (T - D) per step.

What the host can do bounds what is reachable: an eager launch costs the host tens of µs, so
50 µs steps at idle 0 are out of reach; the achieved idle is the truth of the window, reported
next to the target (`idle_target_missed`), and the meter is checked against the truth.

On a CPU the "work" is a host busy-wait of work_us and the pacing runs as on a GPU, but idle
is not defined: every idle metric is absent.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from harness.worker import graphstate, idle, measure
from harness.worker.measure import PHASE_PREFIX
from harness.worker.workloads.decode import resolve_device

MIN_WINDOW_S = 0.05
TARGET_SLACK = 0.02   # achieved idle this far from the target: the host could not keep the pace


# -- the schedule (pure) -------------------------------------------------------------------------
def step_period_s(work_s: float, idle_target: float) -> float:
    """Host period that leaves the GPU idle `idle_target` of each step (D / 2 for 0: ahead)."""
    if not 0.0 <= idle_target < 1.0:
        raise ValueError(f"idle_target {idle_target} must lie in [0, 1)")
    return work_s / 2 if idle_target == 0 else work_s / (1.0 - idle_target)


def window_steps(period_s: float, min_steps: int, min_window_s: float = MIN_WINDOW_S) -> int:
    """Steps in a window: at least `min_steps`, and enough to last `min_window_s`."""
    return max(min_steps, math.ceil(min_window_s / period_s))


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


# -- the truth (pure) ------------------------------------------------------------------------------
def gpu_truth(stamps, launch_ns, first: int, n: int, host_lo_ns: int,
              host_hi_ns: int) -> dict | None:
    """The GPU's idle fraction over a host window, from the kernels' own clock.

    stamps[k]: (start, end) of launch k on the GPU clock in ns (None: unknown); launch_ns[k]:
    host time of launch k (perf_counter_ns). The window's launches are first .. first+n-1 and
    the window is [host_lo_ns, host_hi_ns] on the host clock. The window is placed on the GPU
    clock by the smallest (start - launch) over all the launches: a kernel never starts before
    its launch, and some launches find the GPU idle (the first one, the first after each
    drain), so that is the clock offset plus a bare launch latency. Every kernel counts (a
    backlog launched before the window keeps the GPU busy inside it); busy time is clipped to
    the window. Returns {idle, kernel_us (median duration of the window's kernels), latency_us
    (median start - launch in the window, beyond the bare latency: how far the GPU ran
    behind)}, or None without stamps in the window.
    """
    own = [(stamps[k], launch_ns[k]) for k in range(first, first + n) if stamps[k] is not None]
    if not own or host_hi_ns <= host_lo_ns:
        return None
    offset = min(s[0] - h for s, h in zip(stamps, launch_ns) if s is not None)
    lo, hi = host_lo_ns + offset, host_hi_ns + offset
    busy = measure.covered_length(measure.merge_intervals(s for s in stamps if s is not None),
                                  lo, hi)
    return {"idle": max(0.0, 1.0 - busy / (hi - lo)),
            "kernel_us": statistics.median(e - s for (s, e), _ in own) / 1e3,
            "latency_us": (statistics.median(s[0] - h for s, h in own) - offset) / 1e3}


# -- the work --------------------------------------------------------------------------------------
def host_spin(work_s: float):
    """The CPU stand-in for the GPU work: the host busy for `work_s`."""
    def work():
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:
            pass
    return work


class Windows:
    """Host time of every step, so a window's host span and its launches can be looked up."""

    def __init__(self):
        self.spans: list[tuple[int, int]] = []

    def timed(self, step):
        def timed_step():
            t0 = time.perf_counter_ns()
            step()
            self.spans.append((t0, time.perf_counter_ns()))
        return timed_step


# -- the cell --------------------------------------------------------------------------------------
def run(cell: dict, progress) -> dict:
    device = resolve_device(cell)
    on_gpu = device.type == "cuda"
    if cell["replay"] == "graph" and not on_gpu:
        raise RuntimeError("replay: graph needs a CUDA device")
    work_s = cell["work_us"] / 1e6
    period_s = step_period_s(work_s, cell["idle_target"])
    steps = window_steps(period_s, cell["steps"])
    pacer = HostPacer(period_s)

    progress(stage="prepare", device=str(device), work_us=cell["work_us"])
    graphstate.settle(device)                   # the state the cells it calibrates time in
    if on_gpu:
        from harness.kernels.calibrate.spin import SpinWork
        spin = SpinWork(cell["work_us"], device)
        launch = spin.graphed() if cell["replay"] == "graph" else spin.launch
        sync = torch.cuda.synchronize
    else:
        spin, launch, sync = None, host_spin(work_s), (lambda: None)

    def step():
        with torch.profiler.record_function(PHASE_PREFIX + "work"):
            launch()
        with torch.profiler.record_function(PHASE_PREFIX + "gap"):
            pacer.wait()

    if on_gpu:              # the kernel's compile and first launch, before any window
        launch()
        sync()

    host = Windows()
    timed_step = host.timed(step)
    event_ms, windows = [], []            # windows: (first launch, first span index)
    for rep in range(cell["repeats"]):
        progress(stage="measure", repeat=rep + 1, repeats=cell["repeats"], steps=steps)
        clock = idle.EventStepClock(steps, enabled=on_gpu)
        pacer.start()
        for _ in range(cell["warmup_steps"]):
            step()
        sync()                            # drain: the window starts with an empty queue
        pacer.start()
        windows.append((spin.launches() if spin else 0, len(host.spans)))
        for _ in range(steps):
            clock.mark()
            timed_step()
        clock.mark()
        sync()
        event_ms.append(clock.window_ms())

    stats, prof_window = {}, None
    if on_gpu and cell["profile_steps"] > 0:
        prof_steps = window_steps(period_s, cell["profile_steps"])
        warm = max(1, cell["warmup_steps"])
        progress(stage="profile", steps=prof_steps)
        first_launch, first_span = spin.launches() + warm, len(host.spans) + warm
        pacer.start()
        stats = idle.profile_window(timed_step, prof_steps, warmup=warm)
        prof_window = (first_launch, first_span, prof_steps)

    meter, meter_samples, extra = idle.meter_outputs(stats, event_ms, steps)
    periods = [(host.spans[i + steps - 1][1] - host.spans[i][0]) / steps / 1e9
               for _, i in windows]
    metrics = {
        **meter,
        "work_us": cell["work_us"],
        "step_us": statistics.median(periods) * 1e6,
        "step_us_target": period_s * 1e6,
        "idle_target": cell["idle_target"],
        "idle_true": None, "idle_true_est": None, "idle_error_pp": None,
        "idle_est_error_pp": None, "idle_target_missed": None,
    }
    samples = {**meter_samples, "step_us": [p * 1e6 for p in periods]}
    if on_gpu:
        stamps = spin.stamps()
        truths = [gpu_truth(stamps, spin.launch_ns, first, steps, host.spans[i][0],
                            host.spans[i + steps - 1][1]) for first, i in windows]
        if None not in truths:
            samples["idle_true_est"] = [t["idle"] for t in truths]
            metrics["idle_true_est"] = statistics.median(samples["idle_true_est"])
            metrics["kernel_us"] = statistics.median(t["kernel_us"] for t in truths)
            ests = meter_samples.get("idle_fraction_est")
            if ests:
                metrics["idle_est_error_pp"] = statistics.median(
                    (e - t) * 100 for e, t in zip(ests, samples["idle_true_est"]))
        if prof_window:
            first, i, n = prof_window
            truth = gpu_truth(stamps, spin.launch_ns, first, n, host.spans[i][0],
                              host.spans[i + n - 1][1])
            if truth and stats.get("idle_fraction") is not None:
                metrics["idle_true"] = truth["idle"]
                metrics["idle_error_pp"] = (stats["idle_fraction"] - truth["idle"]) * 100
                span_ns = host.spans[i + n - 1][1] - host.spans[i][0]
                metrics["step_us_profiled"] = span_ns / n / 1e3
                # A kernel as CUPTI saw it (its whole run, one kernel per step) against its own
                # timed body: the start-up and drain around the body that only the profiler
                # sees, i.e. the resolution of this truth, per kernel.
                metrics["kernel_edge_us"] = stats["step_busy_ms"] * 1e3 - truth["kernel_us"]
                metrics["latency_us"] = truth["latency_us"]
        reached = metrics["idle_true"]
        reached = metrics["idle_true_est"] if reached is None else reached
        if reached is not None:
            metrics["idle_target_missed"] = abs(reached - cell["idle_target"]) > TARGET_SLACK
    extra["calibration"] = {"steps": steps, "launches": spin.launches() if spin else None,
                            "work": "spin kernel" if on_gpu else "host busy-wait"}
    return {"metrics": metrics, "samples": samples, **extra}
