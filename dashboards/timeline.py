"""The GPU timeline of a few steady steps: where the GPU is busy, by phase, and where it waits.

The picture the motivating team read off a DRAM trace, drawn from the idle meter's `timeline`
(harness.measure.build_timeline): a host lane with the phase ranges the loop opened, a GPU
lane with busy intervals coloured by the phase that launched them, idle time as the red
background that shows through between them, step boundaries as dashed lines, times in ms.

Timeline entries: {"phase", "kind": "host" | "gpu", "start_ms", "end_ms"}; host entries of
phase `step` mark step boundaries. A dict {"intervals": [...]} is accepted too; malformed
entries are skipped. matplotlib only (Figure + Agg, no pyplot): no display, no global state.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from harness.dashboards.style import PHASE_COLORS as DECODE_PHASE_COLORS

# Phase -> colour. The decode phases take the one palette of dashboards/style.py; the
# calibration workload's phases and device work that no phase launched get their own. Unknown
# phases take SPARE_COLORS in order of first appearance.
PHASE_COLORS = {
    **DECODE_PHASE_COLORS,
    "work": "#332288",     # calibrate: the launch of the known GPU work
    "gap": "#999933",      # calibrate: the host's busy-wait
    "other": "#BBBBBB",    # GPU work launched outside every phase range
}
SPARE_COLORS = ("#44AA99", "#882255", "#6699CC", "#661100", "#888888")
IDLE_COLOR = "#F4C7C3"     # the GPU lane's background: visible where the GPU waits
STEP_PHASE = "step"
_ORDER = ("draft", "tree", "verify", "accept", "commit", "work", "gap", "other")


def _intervals(timeline) -> list[dict]:
    raw = timeline.get("intervals", []) if isinstance(timeline, dict) else (timeline or [])
    out = []
    for e in raw:
        try:
            s, t = float(e["start_ms"]), float(e["end_ms"])
        except (KeyError, TypeError, ValueError):
            continue
        if math.isfinite(s) and math.isfinite(t) and t >= s and e.get("kind") in ("host", "gpu"):
            out.append({"phase": str(e.get("phase", "other")), "kind": e["kind"],
                        "start_ms": s, "end_ms": t})
    return out


def _colors(phases) -> dict[str, str]:
    colors, spare = {}, list(SPARE_COLORS)
    for p in phases:
        colors[p] = PHASE_COLORS.get(p) or (spare.pop(0) if spare else "#777777")
    return colors


def _union(spans) -> float:
    total, end = 0.0, -math.inf
    for s, t in sorted(spans):
        if t > end:
            total += t - max(s, end)
            end = t
    return total


def timeline_png(timeline, out_path, title: str | None = None) -> Path:
    """Draw `timeline` to the PNG `out_path`; returns its path. An empty timeline gives a
    figure that says so rather than empty axes."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    items = _intervals(timeline)
    fig = Figure(figsize=(11, 3.4), layout="constrained")
    ax = fig.add_subplot()
    if not items:
        ax.text(0.5, 0.5, "no timeline recorded (no GPU, or profiling off)", ha="center",
                va="center", transform=ax.transAxes, fontsize=12, color="0.45")
        ax.set_axis_off()
        ax.set_title(title or "GPU timeline")
        fig.savefig(out_path, dpi=110)
        return out_path

    t0 = min(e["start_ms"] for e in items)
    t1 = max(e["end_ms"] for e in items)
    steps = [e for e in items if e["kind"] == "host" and e["phase"] == STEP_PHASE]
    host = [e for e in items if e["kind"] == "host" and e["phase"] != STEP_PHASE]
    gpu = [e for e in items if e["kind"] == "gpu"]
    present = sorted({e["phase"] for e in host + gpu},
                     key=lambda p: (_ORDER.index(p) if p in _ORDER else len(_ORDER), p))
    colors = _colors(present)

    gpu_y, host_y, h = 0.0, 1.0, 0.7
    ax.broken_barh([(0.0, t1 - t0)], (gpu_y - h / 2, h), facecolors=IDLE_COLOR)
    for phase in present:
        for lane, y in ((host, host_y), (gpu, gpu_y)):
            spans = [(e["start_ms"] - t0, e["end_ms"] - e["start_ms"])
                     for e in lane if e["phase"] == phase]
            if spans:
                ax.broken_barh(spans, (y - h / 2, h), facecolors=colors[phase], linewidth=0)
    for e in steps:
        for x in (e["start_ms"] - t0, e["end_ms"] - t0):
            ax.axvline(x, color="0.3", linestyle="--", linewidth=0.8)

    # Idle over the shown span: what the GPU lane's red background adds up to.
    busy = _union([(e["start_ms"], e["end_ms"]) for e in gpu])
    span = (max(e["end_ms"] for e in steps) - min(e["start_ms"] for e in steps)) if steps \
        else (t1 - t0)
    idle = max(0.0, 1.0 - busy / span) if span > 0 else 0.0
    ax.set_yticks([gpu_y, host_y], ["GPU", "host"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0.0, t1 - t0)
    ax.set_xlabel("time (ms)")
    heading = title or "GPU timeline"
    ax.set_title(f"{heading}\n{len(steps) or '?'} steps shown, GPU idle {idle:.0%} of them",
                 fontsize=10)
    handles = [Patch(facecolor=colors[p], label=p) for p in present]
    handles.append(Patch(facecolor=IDLE_COLOR, label="GPU idle"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28),
              ncol=len(handles), frameon=False, fontsize=8)
    fig.savefig(out_path, dpi=110)
    return out_path
