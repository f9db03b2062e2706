"""The idle meter on a trace a serving engine's own torch profiler wrote (Kineto's Chrome trace,
`.json` or `.json.gz`: SGLang's and vLLM's `/start_profile` … stop routes write them).

The engine's trace has no `harness.step` ranges, so the window is the profiled window itself:
from the first to the last event of the trace (host or device), which is where the profiler was
on. Busy is the union of kernel, memcpy and memset intervals inside it (harness.worker.measure:
never a sum of durations, they overlap), `idle_fraction = 1 - busy/window`. Where the trace has
named ranges (user annotations: an engine's forward passes, `ProfilerStep#N`), the device time
each range launched is attributed to the innermost range open at the launch (by correlation id),
per range name.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

from harness.worker import measure

TRACE_SUFFIXES = (".json", ".json.gz")
MAX_RANGES = 20
_STEP_NUMBER = re.compile(r"#\d+$")


def load(path: str | Path) -> list[dict]:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    return data["traceEvents"] if isinstance(data, dict) else data


def _span(e: dict) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def analyze(events: list[dict]) -> dict:
    """Idle over the profiled window, and device time by range name. {} for a trace without
    device activity (a CPU-only profile: nothing to say about a GPU's idle time)."""
    x = [e for e in events if e.get("ph") == "X" and "ts" in e]
    device = [e for e in x if e.get("cat") in measure.DEVICE_CATEGORIES]
    if not device:
        return {}
    spans = [_span(e) for e in x]
    lo, hi = min(s for s, _ in spans), max(t for _, t in spans)
    window = hi - lo
    busy = measure.covered_length(measure.merge_intervals(_span(e) for e in device), lo, hi)

    # ProfilerStep#17 and ProfilerStep#18 are one range name (the step number is not a phase).
    ranges = [(*_span(e), _STEP_NUMBER.sub("", e["name"])) for e in x
              if e.get("cat") == "user_annotation"]
    index = measure._RangeIndex(ranges)
    launch = {e["args"]["correlation"]: float(e["ts"]) for e in x
              if e.get("cat") in measure.LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    by_range: dict[str, list] = defaultdict(list)
    for e in device:
        ts = launch.get(e.get("args", {}).get("correlation"))
        name = index.find(ts) if ts is not None else None
        if name is not None:
            by_range[name].append(_span(e))
    top = sorted(by_range.items(), key=lambda kv: -measure.union_length(kv[1], lo, hi))
    return {
        "idle_fraction": max(0.0, 1.0 - busy / window) if window > 0 else None,
        "window_ms": window / 1e3,
        "busy_ms": busy / 1e3,
        # the ranges with the most device time (a result stays small whatever the trace)
        "ranges": {name: {"gpu_ms": measure.union_length(s, lo, hi) / 1e3, "records": len(s)}
                   for name, s in sorted(top[:MAX_RANGES])},
    }


def traces_since(folder: Path, since: float) -> list[Path]:
    """The trace files the engine wrote into `folder` (recursively: vLLM and SGLang nest them
    by rank or time) modified at or after `since` (a time.time())."""
    found = [p for p in folder.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
             and p.stat().st_mtime >= since]
    return sorted(found)
