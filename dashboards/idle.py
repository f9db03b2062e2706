"""Where the GPU waits: idle fraction by phase per cell, and the GPU timeline of a few steps.

Inputs are the decode cell results of the journal. Metrics read (docs/ARCHITECTURE.md), each may be
absent or null:

    idle_fraction            0..1, precise meter (CUDA-activity profile); null without a GPU
    idle_fraction_est        0..1, always-on estimate (issue 5), drawn as a marker
    step_ms_p50              step time, the denominator of the per-phase shares
    phase.<name>.host_ms     host time per step inside phase <name>
    phase.<name>.gpu_ms      GPU busy time per step inside phase <name>
    phase.<name>.idle_ms     GPU idle time per step inside phase <name>

Timeline format (written by the idle meter into the cell result, key `timeline`): a list of
intervals covering a few steady steps, times in milliseconds on one clock, relative to any
origin (the figure shifts the first interval to 0):

    "timeline": [
      {"phase": "draft",  "start_ms": 0.00, "end_ms": 0.42, "kind": "host"},
      {"phase": "draft",  "start_ms": 0.05, "end_ms": 0.31, "kind": "gpu"},
      {"phase": "tree",   "start_ms": 0.42, "end_ms": 1.73, "kind": "host"},
      {"phase": "verify", "start_ms": 1.73, "end_ms": 1.80, "kind": "host"},
      {"phase": "verify", "start_ms": 1.78, "end_ms": 2.95, "kind": "gpu"},
      {"phase": "step",   "start_ms": 0.00, "end_ms": 3.40, "kind": "host"},
      ...
    ]

`kind: host` = a host-side range (the phase's record_function span); `kind: gpu` = GPU busy
time (already the union of kernel/memcpy/memset intervals, attributed to the phase that
launched them). Phase `step` (kind host) marks step boundaries and is drawn as ticks, not bars.
Anything on the GPU row that no gpu interval covers is idle. The list may also be wrapped as
`{"intervals": [...]}`; unknown phases get the gap colour, malformed entries are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.patches import Patch

from harness.protocol.params import times_a_kernel

from . import style

def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _decode(results: list[dict]) -> list[dict]:
    return [r for r in results if not times_a_kernel(r.get("cell") or {})]


def _has_gpu(result: dict) -> bool:
    return bool((result.get("env") or {}).get("gpu"))


def cell_name(result: dict) -> str:
    """The shortest readable name of a cell: its label without the model preset."""
    label = result.get("label") or result.get("cell_id") or "?"
    model = (result.get("cell") or {}).get("model")
    if model and label.startswith(f"{model} "):
        label = label[len(model) + 1:]
    return label


def idle_shares(result: dict) -> dict[str, float] | None:
    """Idle fraction split by phase: {phase: share, ..., "between phases": rest}.

    The phase shares are `phase.<p>.idle_ms / step_ms_p50`; what `idle_fraction` has beyond
    their sum is idle between phases. If the shares add up to more than `idle_fraction` (the
    two come from different windows) they are scaled down to it. With no per-phase idle the
    whole idle fraction is "unattributed". None when there is no idle measurement at all.
    """
    m = result.get("metrics") or {}
    total = _num(m.get("idle_fraction"))
    step = _num(m.get("step_ms_p50"))
    per_phase = {}
    for key, v in m.items():
        if key.startswith("phase.") and key.endswith(".idle_ms") and _num(v) is not None:
            per_phase[key[len("phase."):-len(".idle_ms")]] = max(0.0, float(v))
    if per_phase and step and step > 0:
        shares = {p: v / step for p, v in per_phase.items()}
        summed = sum(shares.values())
        if total is None:
            return shares
        if summed > total > 0:
            return {p: s * total / summed for p, s in shares.items()}
        if summed > total:  # total is 0: nothing idle, whatever the phases say
            return {p: 0.0 for p in shares}
        return {**shares, "between phases": total - summed}
    if total is None:
        return None
    return {"unattributed": total}


def _ordered(keys) -> list[str]:
    known = [p for p in style.PHASES if p in keys]
    return known + sorted(k for k in keys if k not in style.PHASES)


def idle_by_phase(results: list[dict], out_path, *, title: str | None = None,
                  commit: str | None = None) -> Path:
    """Two panels, one bar per decode cell: GPU idle fraction stacked by phase (left) and
    host time per step stacked by phase (right, measured everywhere, CPU included).

    Cells without an idle measurement say why in place of their bar: "n/a (no GPU)" on a CPU
    host, "not measured" with a GPU (profiler off), "failed" for failed cells.
    """
    decode = _decode(results)
    what = "GPU idle fraction and host time per step, by phase"
    heading = title or style.title(what, decode or results, commit)
    if not decode:
        return style.save(style.empty_figure("no decode cells in this run", heading), out_path)

    rows = list(reversed(decode))  # barh draws bottom-up: keep the run's order top-down
    names = style.short_names(decode)
    fig = style.new_figure(12, max(3.0, 0.34 * len(rows) + 1.9))
    ax_idle, ax_host = fig.subplots(1, 2, sharey=True, width_ratios=(1, 1))
    y = list(range(len(rows)))

    shares = [idle_shares(r) if r.get("status") == "ok" else None for r in rows]
    idle_keys = _ordered({k for s in shares if s for k in s})
    left = [0.0] * len(rows)
    for key in idle_keys:
        widths = [(s or {}).get(key, 0.0) for s in shares]
        color = {"between phases": style.GAP_COLOR,
                 "unattributed": style.UNATTRIBUTED_COLOR}.get(key) or style.phase_color(key)
        ax_idle.barh(y, widths, left=left, color=color, edgecolor="white", linewidth=0.5,
                     label=key, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    estimate = [(i, _num((r.get("metrics") or {}).get("idle_fraction_est")))
                for i, r in enumerate(rows) if r.get("status") == "ok"]
    estimate = [(i, v) for i, v in estimate if v is not None]
    if estimate:
        ax_idle.scatter([v for _, v in estimate], [i for i, _ in estimate], marker="D", s=22,
                        color="black", zorder=3, label="always-on estimate")
    for i, (r, s) in enumerate(zip(rows, shares)):
        if s is None:
            ax_idle.text(0.01, i, _why_no_idle(r), va="center", ha="left", fontsize=8,
                         color=style.FAILED_COLOR if r.get("status") != "ok" else style.MUTED)
    ax_idle.set_xlim(0, 1)
    ax_idle.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax_idle.set_xlabel("GPU idle fraction of a step (%)")
    ax_idle.set_yticks(y, [names.get(r.get("cell_id"), cell_name(r)) for r in rows],
                       fontsize=8)
    ax_idle.set_ylim(-0.6, len(rows) - 0.4)
    ax_idle.grid(True, axis="x", alpha=0.3)
    ax_idle.set_title("GPU idle, by phase", fontsize=10)
    if idle_keys or estimate:
        ax_idle.legend(fontsize=7, loc="lower right")

    host_keys = _ordered({k[len("phase."):-len(".host_ms")] for r in rows
                          if r.get("status") == "ok" for k, v in (r.get("metrics") or {}).items()
                          if k.startswith("phase.") and k.endswith(".host_ms")
                          and _num(v) is not None})
    left = [0.0] * len(rows)
    for phase in host_keys:
        widths = [(_num((r.get("metrics") or {}).get(f"phase.{phase}.host_ms")) or 0.0)
                  if r.get("status") == "ok" else 0.0 for r in rows]
        ax_host.barh(y, widths, left=left, color=style.phase_color(phase), edgecolor="white",
                     linewidth=0.5, label=phase, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    for i, r in enumerate(rows):
        if r.get("status") != "ok":
            ax_host.text(0, i, " failed", va="center", ha="left", fontsize=8,
                         color=style.FAILED_COLOR)
        elif left[i] == 0:
            ax_host.text(0, i, " no phase times", va="center", ha="left", fontsize=8,
                         color=style.MUTED)
    ax_host.set_xlabel("host time per step (ms)")
    ax_host.set_xlim(0, max(left + [0.0]) * 1.05 or 1.0)
    ax_host.grid(True, axis="x", alpha=0.3)
    ax_host.set_title("host time, by phase", fontsize=10)
    if host_keys:
        ax_host.legend(fontsize=7, loc="lower right")
    fig.suptitle(heading, fontsize=11)
    return style.save(fig, out_path)


def _why_no_idle(result: dict) -> str:
    if result.get("status") != "ok":
        return "failed"
    return "not measured (profiler off)" if _has_gpu(result) else "n/a (no GPU)"


def timeline_intervals(result: dict) -> list[dict]:
    """The well-formed intervals of a result's `timeline` (see the module docstring)."""
    raw = result.get("timeline")
    if isinstance(raw, dict):
        raw = raw.get("intervals")
    out = []
    for iv in raw if isinstance(raw, list) else []:
        if not isinstance(iv, dict):
            continue
        s, e = _num(iv.get("start_ms")), _num(iv.get("end_ms"))
        if s is None or e is None or e < s or iv.get("kind") not in ("gpu", "host"):
            continue
        out.append({"phase": str(iv.get("phase") or "?"), "start_ms": s, "end_ms": e,
                    "kind": iv["kind"]})
    return out


def timeline(result: dict, out_path, *, title: str | None = None,
             commit: str | None = None) -> Path:
    """The GPU timeline of a few steady steps of one decode cell: host phases on one row,
    GPU busy time (coloured by the phase that launched it) on the other, idle left blank over
    a grey band, step boundaries as ticks."""
    intervals = timeline_intervals(result)
    what = f"GPU timeline — {cell_name(result)}"
    heading = title or style.title(what, [result], commit)
    if not intervals:
        if result.get("status") != "ok":
            why = "cell failed: no timeline"
        elif not _has_gpu(result):
            why = "n/a (no GPU): no timeline"
        else:
            why = "no timeline recorded (profiler off)"
        return style.save(style.empty_figure(why, heading, height=2.4), out_path)

    origin = min(iv["start_ms"] for iv in intervals)
    end = max(iv["end_ms"] for iv in intervals) - origin
    fig = style.new_figure(12, 3.2)
    ax = fig.add_subplot()
    lanes = {"gpu": 0, "host": 1}
    ax.broken_barh([(0, end)], (lanes["gpu"] - 0.35, 0.7), facecolors="#F2F2F2",
                   edgecolors="none", zorder=0)
    # One collection per (lane, phase) and one for the step ticks: a timeline has hundreds of
    # intervals, and an artist each made the report's timelines most of its drawing time.
    seen, bars, ticks = [], {}, []
    for iv in intervals:
        s, e = iv["start_ms"] - origin, iv["end_ms"] - origin
        if iv["phase"] == "step":
            ticks += [s, e]
            continue
        bars.setdefault((iv["kind"], iv["phase"]), []).append((s, max(e - s, end * 1e-4)))
        if iv["phase"] not in seen:
            seen.append(iv["phase"])
    if ticks:
        ax.vlines(ticks, 0, 1, transform=ax.get_xaxis_transform(), colors="0.3", linewidth=0.8,
                  linestyles=":", zorder=1)
    for (kind, phase), ranges in bars.items():
        height = 0.7 if kind == "gpu" else 0.5
        ax.broken_barh(ranges, (lanes[kind] - height / 2, height),
                       facecolors=style.phase_color(phase), edgecolors="none", zorder=2)
    busy = _union([(iv["start_ms"], iv["end_ms"]) for iv in intervals if iv["kind"] == "gpu"])
    idle = 1 - busy / end if end > 0 else None
    ax.set_yticks([0, 1], ["GPU busy", "host phase"])
    ax.set_ylim(-0.6, 1.6)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [Patch(color=style.phase_color(p), label=p) for p in _ordered(seen)]
    handles.append(Patch(facecolor="#F2F2F2", edgecolor="0.7", label="GPU idle"))
    ax.legend(handles=handles, fontsize=7, ncols=len(handles), loc="upper center",
              bbox_to_anchor=(0.5, -0.32), frameon=False)
    idle_text = f"idle {idle:.0%} of the span shown" if idle is not None else ""
    ax.set_title(f"{heading}\n{idle_text}" if idle_text else heading, fontsize=10)
    return style.save(fig, out_path)


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping GPU work counted once)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
