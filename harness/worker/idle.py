"""The GPU idle meter (worker side): a profiled window, and the always-on estimate.

Precise meter, `profile_window`: K steps under torch.profiler (CPU + CUDA activity), each
wrapped in a `harness.step` range, exported as a Chrome trace and analysed by
`harness.worker.measure` (busy = union of kernel/memcpy/memset intervals; window = host step
boundaries on the profiler's clock; per-phase host/GPU/idle time; gaps between phases;
kernels per step). The phase ranges are the `record_function("phase.<name>")` ranges the decode
loop opens around each phase; under CUDA graphs they sit around the *replay* calls, so graph
kernels are attributed to the phase that replayed them (each kernel of a replay carries the
correlation id of its cudaGraphLaunch). Never run two profilers at once: CUPTI allows one
subscriber per process, so the sync audit and any other profiler use other windows.

Always-on estimate, `EventStepClock` + `idle_fraction_est`: a CUDA event recorded at every
step boundary gives the GPU-side length of any window for a few µs of host time per step, no
profiler. The busy time per step comes from a short calibration profile (`step_busy_ms` of a
profiled window), so

    idle_fraction_est = 1 - busy_per_step * steps / event_window

The profiler's own host overhead inflates the profiled window's idle time; the estimate's
window is unprofiled, so the two disagreeing by more than the calibration error (see
`harness.worker.workloads.calibrate`) says the profiler distorted the loop.

The profiler runs at the lowest overhead that still gives what the analysis reads:
  - CPU activity, but the RecordFunction callbacks only for USER_SCOPE ranges (our
    `harness.step` / `phase.*` record_function ranges), not for every aten op. With all scopes
    each op costs the host a few µs more under the profiler (2x on a CPU loop of small ops here;
    ~2.5x on an eager 8B decode step on the H200), which inflated the profiled idle of eager
    loops (0.79 vs an estimate of 0.35). torch.profiler.profile has no argument for it; the
    scopes are an argument of torch's `_enable_profiler`, passed here for the one call that
    starts the trace (`_user_scope_callbacks`). Kernel, memcpy, memset and CUDA runtime/driver
    records come from CUPTI and are unaffected, so launch correlation still works.
  - TEARDOWN_CUPTI=1 (unless set): by default Kineto leaves CUPTI subscribed when the profile
    ends (pytorch/pytorch#144455) and later launches pay for it: -39 % steps/s on a
    launch-bound loop on the H200 *after* a profiled window, for the rest of the process (a
    script running many cells in one process measured every cell after the first profile
    that way; a calibration run with the default, results/h200/final/calibration.md of commit
    33621cf, reproduced it). Teardown
    with CUDA graphs crashed before CUDA 12.6 (torch's own comment in
    torch/profiler/profiler.py), so older CUDA keeps the default.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import statistics
import tempfile
import time

import torch

from harness.worker import measure


def profile_window(step_fn, steps: int, *, warmup: int = 1) -> dict:
    """Run `steps` calls of `step_fn` under the CUDA-activity profiler and analyse them.

    `warmup` unrecorded steps run first inside the profiler, so the window starts in steady
    state rather than at the profiler's start-up. Returns `measure.analyze_trace`'s dict
    (idle_fraction, window_ms, busy_ms, idle_ms, step_busy_ms, steps, kernels_per_step,
    records_dropped, phases{name: host_ms/gpu_ms/idle_ms}, gaps{a_to_b: host_ms/idle_ms})
    plus `timeline` (a few steady steps, see `measure.build_timeline`), `timeline_merge_us`
    and `profiler` (the settings `lean_profile` applied). Needs CUDA. Set HARNESS_TRACE_DIR
    to keep the raw trace (gzipped).
    """
    from torch.profiler import ProfilerActivity, record_function

    if not torch.cuda.is_available():
        raise RuntimeError("profile_window needs a CUDA device")
    torch.cuda.synchronize()
    with lean_profile([ProfilerActivity.CPU, ProfilerActivity.CUDA]) as (prof, config):
        for _ in range(warmup):
            step_fn()
        for _ in range(steps):
            with record_function(measure.STEP_RANGE):
                step_fn()
        torch.cuda.synchronize()  # inside: the last steps' kernels must reach the trace
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        keep = os.environ.get("HARNESS_TRACE_DIR")
        if keep:  # debugging aid: keep the raw trace
            os.makedirs(keep, exist_ok=True)
            dst = os.path.join(keep, f"trace-{os.getpid()}-{id(prof):x}.json.gz")
            with open(path, "rb") as src, gzip.open(dst, "wb") as out:
                shutil.copyfileobj(src, out)
        events = measure.load_trace(path)
    stats = measure.analyze_trace(events)
    stats["timeline"], stats["timeline_merge_us"] = measure.build_timeline(events)
    stats["profiler"] = config
    return stats


@contextlib.contextmanager
def lean_profile(activities):
    """A running torch.profiler.profile with the lowest-overhead settings (module docstring):
    yields (profiler, config), config saying what was applied ({"scopes": "user" | "all",
    "teardown_cupti": "1" | "0" | None}). Works on a CPU too (activities [CPU]), which is
    how the tests check the scopes."""
    from torch.profiler import profile

    teardown = _release_cupti_after_profiling()
    prof = profile(activities=activities)
    with _user_scope_callbacks() as scopes:
        prof.__enter__()              # the trace starts here: the only _enable_profiler call
    try:
        yield prof, {"scopes": scopes, "teardown_cupti": teardown}
    finally:
        prof.__exit__(None, None, None)


@contextlib.contextmanager
def _user_scope_callbacks():
    """While active, torch's profiler registers its RecordFunction callbacks for USER_SCOPE
    ranges only. Yields "user", or "all" where this torch lacks the hook (then nothing
    changes)."""
    try:
        import torch.autograd.profiler as autograd_profiler
        from torch._C._profiler import RecordScope
        enable = autograd_profiler._enable_profiler
    except (ImportError, AttributeError):
        yield "all"
        return

    def enable_user_scopes(config, activities, scopes=None):
        return enable(config, activities, {RecordScope.USER_SCOPE})

    autograd_profiler._enable_profiler = enable_user_scopes
    try:
        yield "user"
    finally:
        autograd_profiler._enable_profiler = enable


def _release_cupti_after_profiling() -> str | None:
    """Ask Kineto to tear CUPTI down when the profile stops (read when it stops). An explicit
    TEARDOWN_CUPTI in the environment wins. Returns the value in effect."""
    cuda = torch.version.cuda
    if cuda and tuple(int(x) for x in cuda.split(".")[:2]) >= (12, 6):
        os.environ.setdefault("TEARDOWN_CUPTI", "1")
    return os.environ.get("TEARDOWN_CUPTI")


class EventStepClock:
    """CUDA events at step boundaries: the GPU-side length of a window, without a profiler.

    Call `mark()` before each step and once after the last; read `window_ms()` / `step_ms()`
    after the window's final synchronize. The events sit on the current stream, so a step's
    end event completes when the work it queued there has run. Disabled (every call a no-op,
    every reading None) when `enabled` is false or there is no CUDA device, so a loop can use
    it unconditionally. Events are created up front: nothing is allocated inside the window.
    """

    def __init__(self, steps: int, enabled: bool = True):
        self.enabled = enabled and torch.cuda.is_available()
        self.events = ([torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
                       if self.enabled else [])
        self.marked = 0

    def mark(self) -> None:
        if not self.enabled:
            return
        if self.marked == len(self.events):
            raise RuntimeError(f"EventStepClock: more than {len(self.events)} marks "
                               f"(one per step plus one at the end)")
        self.events[self.marked].record()
        self.marked += 1

    def steps(self) -> int:
        return max(self.marked - 1, 0)

    def step_ms(self) -> list[float] | None:
        if not self.enabled or self.marked < 2:
            return None
        ev = self.events[:self.marked]
        return [a.elapsed_time(b) for a, b in zip(ev, ev[1:])]

    def window_ms(self) -> float | None:
        if not self.enabled or self.marked < 2:
            return None
        return self.events[0].elapsed_time(self.events[self.marked - 1])


def idle_fraction_est(window_ms: float | None, steps: int,
                      busy_per_step_ms: float | None) -> float | None:
    """1 - busy / window, with the busy time per step from a calibration profile.

    None when either input is missing (no GPU, profiling off); clamped to [0, 1], since a
    busy time calibrated on another window can exceed a short window by a little.
    """
    if window_ms is None or busy_per_step_ms is None or steps <= 0 or window_ms <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - busy_per_step_ms * steps / window_ms))


def profile_metrics(stats: dict) -> dict:
    """The flat metrics of a profiled window (docs/ARCHITECTURE.md names): `idle_fraction`,
    `phase.<name>.gpu_ms` / `.idle_ms`, `gap.<a>_to_<b>.idle_ms`. Host time per phase is left
    to the always-on phase clock, which the profiler does not slow down. {} without stats."""
    if not stats:
        return {}
    out = {"idle_fraction": stats.get("idle_fraction")}
    for name, p in stats.get("phases", {}).items():
        out[f"phase.{name}.gpu_ms"] = p["gpu_ms"]
        out[f"phase.{name}.idle_ms"] = p["idle_ms"]
    for name, g in stats.get("gaps", {}).items():
        out[f"gap.{name}.idle_ms"] = g["idle_ms"]
    return out


def meter_outputs(stats: dict, event_windows_ms: list, steps: int,
                  audit: dict | None = None) -> tuple[dict, dict, dict]:
    """(metrics, samples, extra) of a cell, from its profiled window's `stats` (or {}), the
    EventStepClock window of each repeat (`steps` steps each) and a sync audit (or None).

    metrics: idle_fraction, idle_fraction_est (median over repeats), phase.<name>.gpu_ms /
    .idle_ms, gap.<a>_to_<b>.idle_ms, syncs_per_step; None or absent where not measured.
    samples: idle_fraction_est per repeat. extra (top-level keys of the cell result):
    timeline (for the figure), profile (window, busy, kernels per step, records_dropped,
    gaps), sync_sites."""
    metrics = {"idle_fraction": None, "idle_fraction_est": None, **profile_metrics(stats)}
    busy = stats.get("step_busy_ms") if stats else None
    ests = [idle_fraction_est(w, steps, busy) for w in event_windows_ms]
    samples, extra = {}, {}
    if ests and None not in ests:
        metrics["idle_fraction_est"] = statistics.median(ests)
        samples["idle_fraction_est"] = ests
    if stats:
        extra["timeline"] = stats.get("timeline")
        extra["profile"] = {k: v for k, v in stats.items() if k not in ("timeline", "phases")}
    if audit:
        metrics["syncs_per_step"] = audit["syncs_per_step"]
        extra["sync_sites"] = audit["sync_sites"]
    return metrics, samples, extra


def plain_window(step_fn, steps: int, *, warmup: int = 1, clock=time.perf_counter) -> float:
    """Host milliseconds per step of `steps` calls of `step_fn` after `warmup` unrecorded ones,
    measured as `profile_window` measures its window (from the first recorded call's start to
    the last one's end, the queue kept full by the warm-up), without the profiler: the
    unprofiled side of `profiler_overhead`. `clock` is seconds, for tests."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    for _ in range(warmup):
        step_fn()
    t0 = clock()
    for _ in range(steps):
        step_fn()
    ms = (clock() - t0) * 1e3 / steps
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return ms


def profiler_overhead(stats: dict, unprofiled_step_ms: list[float]) -> dict:
    """How much the profiler slows the steps it records: the profiled window's host time per
    step against the mean of unprofiled windows' (same cell, same process).

    The decode workload passes the two `plain_window`s run just before and just after the
    profiled one, of its length and warm-up: a loop's steps slow down steadily over a repeat
    (0.16-0.52 % a step on an H100, 0.27-0.92 % on an H200, every decode cell of loop-limit;
    kernels/NOTES.md, Session 41), so a
    window measured earlier (the timed ones) would charge that drift to the profiler, and the
    mean of one window either side cancels it where it is linear.

    {"profiled_step_ms", "profiler_overhead_pct"}, or {} without a profiled window. This is the
    cost the meter keeps out of tokens/s by profiling only after the timed windows, and the
    bias in the profiled window's idle fraction (the profiler's host time is idle GPU time
    wherever the host leads)."""
    if not stats or not stats.get("steps") or not unprofiled_step_ms:
        return {}
    profiled = stats["window_ms"] / stats["steps"]
    plain = statistics.mean(unprofiled_step_ms)
    return {"profiled_step_ms": profiled, "profiler_overhead_pct": 100.0 * (profiled / plain - 1.0)}
