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

import numpy as np
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
    """The shortest readable name of a cell: its label (saying greedy or synthetic) without
    the model preset."""
    label = style.full_label(result)
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
                  commit: str | None = None, base: list[dict] | None = None,
                  base_name: str = "base run", card: bool = True) -> Path:
    """One bar per decode cell in two panels: GPU idle fraction stacked by phase (left) and
    host time per step stacked by phase (right, measured everywhere, CPU included).

    Cells without an idle measurement say why in place of their bar: "n/a (no GPU)" on a CPU
    host, "not measured" with a GPU (profiler off), "failed" for failed cells. A panel that
    would hold no bar at all (a CPU run has no GPU idle) is left out and said in one line
    under the title. `base`: the compared-with run's bar of the same cell, thin and faded
    under the head's. The legend (the phase colours, one set for both panels) sits below.
    """
    decode = _decode(results)
    heading_what = "GPU idle fraction and host time per step, by phase"
    if not decode:
        return style.nothing("no decode cells in this run",
                             title or style.title(heading_what, results, commit), out_path,
                             card=card)
    rows = list(reversed(decode))  # barh draws bottom-up: keep the run's order top-down
    base_by_id = {r.get("cell_id"): r for r in base or [] if r.get("status") == "ok"}
    base_rows = [base_by_id.get(r.get("cell_id")) for r in rows]
    shares = [idle_shares(r) if r.get("status") == "ok" else None for r in rows]
    base_shares = [idle_shares(b) if b else None for b in base_rows]
    host = [_host_ms(r) for r in rows]
    base_host = [_host_ms(b) if b else {} for b in base_rows]
    has_idle = any(shares) or any(base_shares)
    has_host = any(host) or any(base_host)
    if not has_idle and not has_host:
        return style.nothing("no idle fraction and no host phase times were measured",
                             title or style.title(heading_what, decode, commit), out_path,
                             card=card)
    left_out = []
    if not has_idle:
        left_out.append("GPU idle: " + _why_no_idle_run(decode))
    if not has_host:
        left_out.append("host time by phase: not recorded by these cells")
    what = (heading_what if has_idle and has_host else
            "GPU idle fraction per step, by phase" if has_idle else
            "Host time per step, by phase")
    heading = title or style.title(what, decode, commit)
    if left_out:
        heading += "\n" + "; ".join(left_out)

    panels = [p for p, keep in (("idle", has_idle), ("host", has_host)) if keep]
    names = style.short_names(decode)
    longest = max(len(names.get(r.get("cell_id"), cell_name(r))) for r in rows)
    label_in = 0.065 * longest        # ~ width of 8-pt labels: the panels keep their room
    width = (8 if len(panels) == 2 else 5.5) + label_in
    fig = style.new_figure(width, max(3.2, 0.34 * len(rows) + 2.4))
    axes = dict(zip(panels, fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]))
    y = np.arange(len(rows), dtype=float)
    head_y, bar_h = (y + 0.12, 0.56) if base else (y, 0.7)
    legend: dict[str, object] = {}
    if "idle" in axes:
        ax = axes["idle"]
        keys = _ordered({k for s in shares + base_shares if s for k in s})
        _stack(ax, [s or {} for s in base_shares], keys, y - 0.3, 0.22, _share_color, faded=True)
        legend.update(_stack(ax, [s or {} for s in shares], keys, head_y, bar_h, _share_color))
        estimate = [(i, _num((r.get("metrics") or {}).get("idle_fraction_est")))
                    for i, r in enumerate(rows) if r.get("status") == "ok"]
        estimate = [(i, v) for i, v in estimate if v is not None]
        if estimate:
            legend["always-on estimate"] = ax.scatter(
                [v for _, v in estimate], [head_y[i] for i, _ in estimate], marker="D", s=22,
                color="black", zorder=3)
        for i, (r, s) in enumerate(zip(rows, shares)):
            if s is None:
                ax.text(0.01, head_y[i], _why_no_idle(r), va="center", ha="left", fontsize=8,
                        color=style.FAILED_COLOR if r.get("status") != "ok" else style.MUTED)
        ax.set_xlim(0, 1)
        ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        ax.set_xlabel("GPU idle fraction of a step (%)")
        ax.grid(True, axis="x", alpha=0.3)
        if len(panels) == 2:
            ax.set_title("GPU idle, by phase", fontsize=10)
    if "host" in axes:
        ax = axes["host"]
        phases = _ordered({p for h in host + base_host for p in h})
        _stack(ax, base_host, phases, y - 0.3, 0.22, style.phase_color, faded=True)
        for key, handle in _stack(ax, host, phases, head_y, bar_h, style.phase_color).items():
            legend.setdefault(key, handle)
        totals = [sum(h.values()) for h in host + base_host]
        for i, r in enumerate(rows):
            if r.get("status") != "ok":
                ax.text(0, head_y[i], " failed", va="center", ha="left", fontsize=8,
                        color=style.FAILED_COLOR)
            elif not host[i]:
                ax.text(0, head_y[i], " no phase times", va="center", ha="left", fontsize=8,
                        color=style.MUTED)
        ax.set_xlabel("host time per step (ms)")
        ax.set_xlim(0, max(totals) * 1.05 or 1.0)
        ax.grid(True, axis="x", alpha=0.3)
        if len(panels) == 2:
            ax.set_title("host time, by phase", fontsize=10)
    first = axes[panels[0]]
    first.set_yticks(y, [names.get(r.get("cell_id"), cell_name(r)) for r in rows], fontsize=8)
    first.set_ylim(-0.6, len(rows) - 0.4)
    ordered = (_ordered([k for k in legend if k not in _SPECIAL])
               + [k for k in _SPECIAL if k in legend])
    if base:
        ordered.append(f"faded, thin: {base_name}")
        legend[ordered[-1]] = Patch(facecolor="0.35", alpha=style.BASE_ALPHA)
    # As many columns as fit the figure's width (~1.5 in an entry); more rows, never cut off.
    fig.legend([legend[k] for k in ordered], ordered, loc="outside lower center",
               ncols=max(1, min(len(ordered), int(width // 1.5), 7)), fontsize=8, frameon=False)
    fig.suptitle(heading, fontsize=11)
    return style.save(fig, out_path)


def _stack(ax, values: list[dict[str, float]], keys: list[str], ys, height: float, color_of,
           faded: bool = False) -> dict[str, object]:
    """One stacked horizontal bar per row (`values[i]`: key -> width), in `keys` order;
    faded: the base run's, thin and pale. Returns key -> a bar to put in the legend."""
    handles = {}
    if not any(values):
        return handles
    left = np.zeros(len(values))
    for key in keys:
        widths = np.array([v.get(key, 0.0) for v in values])
        handles[key] = ax.barh(ys, widths, left=left, color=color_of(key), edgecolor="white",
                               linewidth=0.5, height=height,
                               alpha=style.BASE_ALPHA if faded else 1.0)
        left += widths
    return handles


# Legend entries that are not a phase, in the order they are listed after the phases.
_SPECIAL = ("between phases", "unattributed", "always-on estimate")


def _share_color(key: str) -> str:
    return {"between phases": style.GAP_COLOR,
            "unattributed": style.UNATTRIBUTED_COLOR}.get(key) or style.phase_color(key)


def _host_ms(result: dict) -> dict[str, float]:
    """phase -> host ms per step of an ok result ({} for a failed one or none recorded)."""
    if result.get("status") != "ok":
        return {}
    out = {}
    for key, v in (result.get("metrics") or {}).items():
        if key.startswith("phase.") and key.endswith(".host_ms") and _num(v) is not None:
            out[key[len("phase."):-len(".host_ms")]] = float(v)
    return out


def _why_no_idle_run(decode: list[dict]) -> str:
    """Why no cell of a run has a GPU idle bar, in a few words."""
    if not any(r.get("status") == "ok" for r in decode):
        return "every cell failed"
    if not any(_has_gpu(r) for r in decode):
        return "n/a (no GPU on this host)"
    return "not measured (profiler off)"


def _why_no_idle(result: dict) -> str:
    if result.get("status") != "ok":
        return "failed"
    return "not measured (profiler off)" if _has_gpu(result) else "n/a (no GPU)"


def idle_boundaries(result: dict, k: int = 3, width: int = 40) -> str:
    """The kernel boundaries a cell's GPU idles at most (the idle meter's `profile.idle_gaps`:
    inside a CUDA graph replay the phases cannot say it), as one line for a figure's caption,
    e.g. "most idle between: gemm → norm 41.2 µs a step (36 gaps); ...". Empty when the cell
    has none recorded."""
    def name(v) -> str:
        v = "(window edge)" if v is None else str(v)
        return v if len(v) <= width else v[:width - 1] + "…"

    gaps = (result.get("profile") or {}).get("idle_gaps")
    parts = []
    for g in gaps if isinstance(gaps, list) else []:
        if not isinstance(g, dict) or _num(g.get("us_per_step")) is None:
            continue
        count = _num(g.get("gaps_per_step"))
        parts.append(f"{name(g.get('before'))} → {name(g.get('after'))} {g['us_per_step']:.1f} µs a step"
                     + (f" ({count:g} gaps)" if count is not None else ""))
        if len(parts) == k:
            break
    return "most idle between: " + "; ".join(parts) if parts else ""


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
             commit: str | None = None, base: dict | None = None,
             base_name: str = "base run", card: bool = True) -> Path:
    """The GPU timeline of a few steady steps of one decode cell: host phases on one row,
    GPU busy time (coloured by the phase that launched it) on the other, idle left blank over
    a grey band, step boundaries as ticks. `base`: the compared-with run's result of the same
    cell; its GPU row is drawn faded beneath, on the same time axis."""
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
        return style.nothing(why, heading, out_path, card=card, height=2.4)

    base_intervals = timeline_intervals(base) if base else []
    origin = min(iv["start_ms"] for iv in intervals)
    end = max(iv["end_ms"] for iv in intervals) - origin
    base_origin = min((iv["start_ms"] for iv in base_intervals), default=0.0)
    base_end = max((iv["end_ms"] for iv in base_intervals), default=base_origin) - base_origin
    lanes = {"gpu": 0, "host": 1} if not base_intervals else {"base": 0, "gpu": 1, "host": 2}
    fig = style.new_figure(12, 3.2 + 0.6 * bool(base_intervals))
    ax = fig.add_subplot()
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
    for iv in base_intervals:
        if iv["kind"] == "gpu" and iv["phase"] != "step":
            s, e = iv["start_ms"] - base_origin, iv["end_ms"] - base_origin
            bars.setdefault(("base", iv["phase"]), []).append((s, max(e - s, end * 1e-4)))
    if ticks:
        ax.vlines(ticks, 0, 1, transform=ax.get_xaxis_transform(), colors="0.3", linewidth=0.8,
                  linestyles=":", zorder=1)
    for (kind, phase), ranges in bars.items():
        height = 0.5 if kind == "host" else 0.7
        ax.broken_barh(ranges, (lanes[kind] - height / 2, height),
                       facecolors=style.phase_color(phase), edgecolors="none", zorder=2,
                       alpha=style.BASE_ALPHA if kind == "base" else 1.0)
    idle = _idle_of(intervals, end)
    ticks_y = {"gpu": "GPU busy", "host": "host phase", "base": f"GPU busy, {base_name}"}
    ax.set_yticks(list(lanes.values()), [ticks_y[k] for k in lanes])
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlim(0, max(end, base_end))
    ax.set_xlabel("time (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [Patch(color=style.phase_color(p), label=p) for p in _ordered(seen)]
    handles.append(Patch(facecolor="#F2F2F2", edgecolor="0.7", label="GPU idle"))
    ax.legend(handles=handles, fontsize=7, ncols=len(handles), loc="upper center",
              bbox_to_anchor=(0.5, -0.32), frameon=False)
    idle_text = f"idle {idle:.0%} of the span shown" if idle is not None else ""
    base_idle = _idle_of(base_intervals, base_end) if base_intervals else None
    if base_idle is not None:
        idle_text += f" (base: {base_idle:.0%})"
    ax.set_title(f"{heading}\n{idle_text}" if idle_text else heading, fontsize=10)
    return style.save(fig, out_path)


def _idle_of(intervals: list[dict], end: float) -> float | None:
    busy = _union([(iv["start_ms"], iv["end_ms"]) for iv in intervals if iv["kind"] == "gpu"])
    return 1 - busy / end if end > 0 else None


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
