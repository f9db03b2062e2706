"""Measurement math: robust summaries and the GPU idle fraction from a CUDA-activity trace.

Standard library only, so it runs in the worker and in tests without torch. The idle fraction
follows docs/ARCHITECTURE.md: busy = the *union* of kernel / memcpy / memset intervals (never their sum:
kernels on several streams overlap), window = host step boundaries on the profiler's clock,
idle = 1 - busy / window. Kernels are attributed to phases through the launch that issued them
(the CUDA runtime call carries the same correlation id as the device activity; every kernel of
a CUDA graph replay carries the id of its `cudaGraphLaunch`).

Where the idle time goes (per step, in ms):
  phase.<name>.idle_ms   GPU idle while the host was inside phase <name>'s range
  gaps[<a>_to_<b>]       host time between two phase ranges (and the GPU idle in it), e.g.
                         `commit_to_draft` is the loop overhead between steps
With phases that do not overlap, the phases' and the gaps' idle add up to the window's idle.
Inside one CUDA graph replay the host is in one range for the whole step, so `idle_gaps` says
which kernel boundaries the idle sits at: each idle interval of the window goes to the pair of
device activities around it (the one that ended last before it, the one that starts it), the
pairs ranked by their idle per step.
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import defaultdict
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Host calls that launch device work: the runtime API (cudaLaunchKernel, cudaMemcpyAsync,
# cudaGraphLaunch) and the driver API (cuLaunchKernel: Triton's launches).
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
STEP_RANGE = "harness.step"
PHASE_PREFIX = "phase."
STEP_PHASE = "step"          # timeline entries marking step boundaries (kind "host")
UNCLAIMED_PHASE = "other"    # device work launched outside every phase range


# -- summaries ---------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("percentile of nothing")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(values: list[float]) -> float:
    """Median absolute deviation: meaningful from three repeats on, and one outlier repeat
    does not dominate it (a standard deviation of three samples would)."""
    if len(values) < 2:
        return 0.0
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


def drift_pct(step_ms: list[float]) -> float | None:
    """How much a window's steps slowed from its first half to its second: the median of the
    second half over the first's, less one, in %. Near 0 for a steady window; positive where
    the GPU slowed while it ran (a clock falling to a power cap). None under four steps."""
    if len(step_ms) < 4:
        return None
    half = len(step_ms) // 2
    first = statistics.median(step_ms[:half])
    if first <= 0:
        return None
    return (statistics.median(step_ms[-half:]) / first - 1) * 100


# -- interval arithmetic -----------------------------------------------------------------------
def merge_intervals(intervals) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as sorted, disjoint intervals (touching ones merge)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def covered_length(merged: list[tuple[float, float]], lo: float, hi: float) -> float:
    """How much of [lo, hi) the sorted, disjoint intervals `merged` cover (bisect: cheap to
    ask for many small ranges, e.g. every phase range of a long window)."""
    i = max(bisect.bisect_right(merged, (lo, float("inf"))) - 1, 0)
    total = 0.0
    while i < len(merged) and merged[i][0] < hi:
        s, e = merged[i]
        total += max(0.0, min(e, hi) - max(s, lo))
        i += 1
    return total


def union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the union of [start, end) intervals, clipped to [lo, hi)."""
    return covered_length(merge_intervals(intervals), lo, hi)


class _RangeIndex:
    """Which of some labelled [start, end) ranges contains a time: the innermost if nested."""

    def __init__(self, ranges):
        self.ranges = sorted(ranges, key=lambda r: (r[0], r[1]))
        self.starts = [r[0] for r in self.ranges]
        self.max_end, end = [], float("-inf")
        for _, e, _ in self.ranges:
            end = max(end, e)
            self.max_end.append(end)

    def find(self, ts: float):
        # Walk back from the last range starting at or before ts; stop once no earlier range
        # reaches ts. The first hit is the latest-starting one, i.e. the innermost.
        i = bisect.bisect_right(self.starts, ts) - 1
        while i >= 0 and self.max_end[i] > ts:
            s, e, label = self.ranges[i]
            if ts < e:
                return label
            i -= 1
        return None


# -- traces ------------------------------------------------------------------------------------
def load_trace(path: str | Path) -> list[dict]:
    """Events of a Chrome trace written by torch.profiler's export_chrome_trace."""
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def _span(e: dict) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


class _Trace:
    """The parts of a Chrome trace the analysis needs, looked up once."""

    def __init__(self, events: list[dict]):
        x = [e for e in events if e.get("ph") == "X"]
        self.steps = sorted(_span(e) for e in x
                            if e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation")
        self.phase_ranges = [(*_span(e), e["name"][len(PHASE_PREFIX):]) for e in x
                             if e.get("cat") == "user_annotation"
                             and e.get("name", "").startswith(PHASE_PREFIX)]
        self.device = [e for e in x if e.get("cat") in DEVICE_CATEGORIES]
        self.busy = merge_intervals(_span(e) for e in self.device)
        # Host time of the call that issued each device activity, by correlation id.
        self.launch_ts = {e["args"]["correlation"]: float(e["ts"]) for e in x
                          if e.get("cat") in LAUNCH_CATEGORIES
                          and "correlation" in e.get("args", {})}
        phases = _RangeIndex(self.phase_ranges)
        self.owner = {corr: phases.find(ts) for corr, ts in self.launch_ts.items()}

    def launched_at(self, e: dict) -> float:
        """When the host issued device activity `e` (its own start if the launch is missing)."""
        return self.launch_ts.get(e.get("args", {}).get("correlation"), float(e["ts"]))

    def phase_of(self, e: dict) -> str | None:
        return self.owner.get(e.get("args", {}).get("correlation"))


def analyze_trace(events: list[dict]) -> dict:
    """Idle fraction and per-phase attribution over the profiled steps.

    Returns {} when the trace has no step ranges. Times are in microseconds as in the trace;
    the `_ms` numbers of phases and gaps are per step, in milliseconds.
    """
    tr = _Trace(events)
    if not tr.steps:
        return {}
    n = len(tr.steps)
    lo, hi = tr.steps[0][0], tr.steps[-1][1]
    window = hi - lo
    busy = covered_length(tr.busy, lo, hi)

    # Device activity per step, by the step whose host range issued it: a GPU running behind
    # the host executes step k's kernels during step k+1, but they still belong to step k.
    steps = _RangeIndex([(s, t, i) for i, (s, t) in enumerate(tr.steps)])
    per_step, launched = [0] * n, []
    for e in tr.device:
        i = steps.find(tr.launched_at(e))
        if i is None:
            continue
        launched.append(_span(e))
        if e.get("cat") == "kernel":
            per_step[i] += 1
    # Kernels per step: a constant count says no activity records were dropped (Kineto can
    # drop them in long processes).
    consistent = len(set(per_step)) <= 1

    return {
        "idle_fraction": max(0.0, 1.0 - busy / window) if window > 0 else None,
        "window_ms": window / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (window - busy) / 1e3 / n,
        # GPU busy time of the work the steps launched, unclipped (it may finish after the
        # window): the calibration of the always-on estimate (harness.worker.idle).
        "step_busy_ms": union_length(launched, float("-inf"), float("inf")) / 1e3 / n,
        "steps": n,
        "kernels_per_step": per_step,
        "records_consistent": consistent,
        "records_dropped": not consistent,
        "phases": _phase_attribution(tr, lo, hi, n),
        "gaps": _gaps(tr, lo, hi, n),
        "top_kernels": top_kernels(events, lo, hi, n),
        "idle_gaps": idle_gaps(tr, lo, hi, n),
    }


def top_kernels(events: list[dict], lo: float, hi: float, n_steps: int, k: int = 12) -> list[dict]:
    """The device activities that take the most time per step inside [lo, hi): where the busy
    time goes (names shortened; durations summed per name, which is fine for a ranking)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES:
            s, t = _span(e)
            if t > lo and s < hi:
                name = e.get("name", "?")[:90]
                total[name] += min(t, hi) - max(s, lo)
                count[name] += 1
    ranked = sorted(total, key=total.get, reverse=True)[:k]
    return [{"name": n, "us_per_step": total[n] / n_steps, "calls_per_step": count[n] / n_steps}
            for n in ranked]


def idle_gaps(tr: _Trace, lo: float, hi: float, n_steps: int, k: int = 12) -> list[dict]:
    """The window's idle intervals grouped by the device activities around them: `before` (the
    one that ended last before the gap), `after` (the one that starts at its end), the idle per
    step (`us_per_step`), the gaps per step and the median gap, the `k` pairs with the most idle
    first. A gap at the window's edge has `before` or `after` None."""
    # A busy interval's ends are some activity's end and start (the union's edges): name them.
    ended: dict[float, str] = {}
    started: dict[float, str] = {}
    for e in tr.device:
        s, t = _span(e)
        name = e.get("name", "?")[:90]
        ended.setdefault(t, name)
        started.setdefault(s, name)
    edges = [(max(s, lo), min(t, hi)) for s, t in tr.busy if t > lo and s < hi]
    bounds = [lo] + [x for s, t in edges for x in (s, t)] + [hi]
    gaps: dict[tuple, list[float]] = defaultdict(list)
    for a, b in zip(bounds[0::2], bounds[1::2]):
        if b > a:
            gaps[(ended.get(a), started.get(b))].append(b - a)
    ranked = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:k]
    return [{"before": before, "after": after, "us_per_step": sum(v) / n_steps,
             "gaps_per_step": len(v) / n_steps, "median_us": statistics.median(v)}
            for (before, after), v in ranked]


def _phase_attribution(tr: _Trace, lo: float, hi: float, n_steps: int) -> dict:
    """Per phase and step: host time in its ranges, GPU busy time of the work it launched, and
    GPU idle time while the host was inside it (idle of the whole GPU, whoever launched)."""
    if not tr.phase_ranges:
        return {}
    by_phase = defaultdict(list)
    for e in tr.device:
        phase = tr.phase_of(e)
        if phase is not None:
            by_phase[phase].append(_span(e))
    host, idle = defaultdict(float), defaultdict(float)
    for s, t, phase in tr.phase_ranges:
        s, t = max(s, lo), min(t, hi)
        if t > s:
            host[phase] += t - s
            idle[phase] += (t - s) - covered_length(tr.busy, s, t)
    out = {}
    for phase in sorted({p for _, _, p in tr.phase_ranges}):
        out[phase] = {"host_ms": host[phase] / 1e3 / n_steps,
                      "gpu_ms": union_length(by_phase[phase], lo, hi) / 1e3 / n_steps,
                      "idle_ms": idle[phase] / 1e3 / n_steps}
    return out


def _gaps(tr: _Trace, lo: float, hi: float, n_steps: int) -> dict:
    """Host time inside the window that no phase range covers, named by its neighbours
    (`tree_to_verify`; `start_to_X` / `X_to_end` at the window's edges), per step, with the
    GPU idle time inside it."""
    if not tr.phase_ranges:
        return {}
    host, idle = defaultdict(float), defaultdict(float)

    def add(name, s, t):
        if t > s:
            host[name] += t - s
            idle[name] += (t - s) - covered_length(tr.busy, s, t)

    cur_end, cur_phase = lo, "start"
    for s, t, phase in sorted(tr.phase_ranges):
        if t <= lo or s >= hi:
            continue
        if s > cur_end:
            add(f"{cur_phase}_to_{phase}", cur_end, min(s, hi))
        if t > cur_end:
            cur_end, cur_phase = t, phase
    add(f"{cur_phase}_to_end", cur_end, hi)
    return {name: {"host_ms": host[name] / 1e3 / n_steps, "idle_ms": idle[name] / 1e3 / n_steps}
            for name in sorted(host)}


# -- timeline ----------------------------------------------------------------------------------
def build_timeline(events: list[dict], max_steps: int = 3, merge_us: float = 2.0,
                   max_items: int = 800) -> tuple[list[dict], float]:
    """A compact picture of a few steady steps, for the timeline figure.

    Takes up to `max_steps` steps from the middle of the profiled window (never the first: it
    carries the profiler's start-up) and returns (intervals, merge_us): host phase ranges
    (`kind: host`), step boundaries (`phase: step`, `kind: host`) and GPU busy intervals
    coloured by the phase that launched them (`kind: gpu`, `other` when none did), times in
    ms from the first shown step's start. Consecutive GPU intervals of one phase closer than
    `merge_us` are merged; the threshold doubles until at most `max_items` GPU intervals are
    left (a gap narrower than that is below a pixel of the figure anyway).
    """
    tr = _Trace(events)
    n = len(tr.steps)
    if not n:
        return [], merge_us
    k = min(max_steps, n)
    first = min(max(1, (n - k) // 2), n - k)
    shown = tr.steps[first:first + k]
    t0, t1 = shown[0][0], shown[-1][1]

    def ms(t):
        return round((t - t0) / 1e3, 4)

    host = [{"phase": STEP_PHASE, "kind": "host", "start_ms": ms(s), "end_ms": ms(t)}
            for s, t in shown]
    host += [{"phase": p, "kind": "host", "start_ms": ms(max(s, t0)), "end_ms": ms(min(t, t1))}
             for s, t, p in sorted(tr.phase_ranges) if t > t0 and s < t1]
    gpu_spans = sorted((max(s, t0), min(t, t1), tr.phase_of(e) or UNCLAIMED_PHASE)
                       for e in tr.device for s, t in [_span(e)] if t > t0 and s < t1)
    while True:
        merged = []
        for s, t, p in gpu_spans:
            if merged and merged[-1][2] == p and s - merged[-1][1] <= merge_us:
                merged[-1][1] = max(merged[-1][1], t)
            else:
                merged.append([s, t, p])
        if len(merged) <= max_items or merge_us >= t1 - t0:
            break
        merge_us *= 2
    gpu = [{"phase": p, "kind": "gpu", "start_ms": ms(s), "end_ms": ms(t)} for s, t, p in merged]
    return host + gpu, merge_us
