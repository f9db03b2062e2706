"""History: one metric of one cell over nightly runs, its baseline band and change points.

Input (the gate helper builds it from MLflow, `harness history`):

    points         [(sha, date, value), ...] oldest first; date an ISO string, a date or a
                   datetime; value None for a night without a measurement (failed, missing)
    change_points  indices i into points: a new level starts at points[i] (the change happened
                   between the commits of points[i-1] and points[i])
    unit           axis unit; default from the metric name (tokens_per_s: tokens/s, *_ms: ms, ...)
    baseline       (low, high) of the accepted baseline, if the caller has one; otherwise the
                   band is median ± 2·1.4826·MAD of the segment before the last change point
                   (the level the latest values are judged against), or of the whole series

Nights are spaced evenly (x = run index) so a gap in the calendar does not hide a step.
"""

from __future__ import annotations

import math
import statistics
from datetime import date, datetime
from pathlib import Path

from . import style

MAX_TICKS = 12


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _day(d) -> str:
    if isinstance(d, (date, datetime)):
        return d.strftime("%m-%d")
    text = str(d or "")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).strftime("%m-%d")
    except ValueError:
        return text[:10]


def _band(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    half = max(2 * 1.4826 * mad, 1e-3 * abs(med))
    return med - half, med + half


def history(points: list[tuple], out_path, *, metric: str = "tokens_per_s",
            unit: str | None = None, change_points=(), baseline: tuple[float, float] | None = None,
            cell: str | None = None, gpu: str | None = None, title: str | None = None) -> Path:
    """Plot `metric` over runs with the baseline band and change points; returns the PNG."""
    points = list(points or [])
    what = f"{metric} over nightly runs" + (f" — {cell}" if cell else "")
    heading = title or (f"{what}\n{gpu}" if gpu else what)
    values = [_num(p[2]) if len(p) > 2 else None for p in points]
    if not any(v is not None for v in values):
        why = "no runs recorded" if not points else "no run measured this metric"
        return style.save(style.empty_figure(why, heading), out_path)

    n = len(points)
    changes = sorted({int(i) for i in change_points or () if 0 < int(i) < n})
    bounds = [0] + changes + [n]
    segments = [(a, b) for a, b in zip(bounds, bounds[1:])]
    if baseline is None:
        a, b = segments[-2] if len(segments) > 1 else segments[0]
        baseline = _band([v for v in values[a:b] if v is not None])

    fig = style.new_figure(10, 4.5)
    ax = fig.add_subplot()
    ys = [v for v in values if v is not None]
    if baseline is not None:
        ax.axhspan(baseline[0], baseline[1], color="#0072B2", alpha=0.12, linewidth=0,
                   label="baseline band")
    # NaN breaks the line: a night without a measurement is a gap, not an interpolation.
    ax.plot(range(n), [math.nan if v is None else v for v in values], color="0.25", marker="o",
            markersize=4, linewidth=1.2, label=metric)
    for k, (a, b) in enumerate(segments):  # the level of each segment, between change points
        seg = [v for v in values[a:b] if v is not None]
        if seg:
            ax.hlines(statistics.median(seg), a - 0.4, b - 0.6, color="#0072B2", linewidth=2,
                      alpha=0.8, label="level (median)" if k == 0 else None)
    low = min(ys + ([baseline[0]] if baseline else []))
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        ax.scatter(missing, [low] * len(missing), marker="x", color=style.FAILED_COLOR, zorder=3,
                   label="no measurement")
    for k, i in enumerate(changes):
        before = [v for v in values[bounds[k]:i] if v is not None]
        after = [v for v in values[i:bounds[k + 2]] if v is not None]
        ax.axvline(i - 0.5, color=style.FAILED_COLOR, linestyle="--", linewidth=1.2,
                   label="change point" if k == 0 else None)
        text = f"{_sha(points[i - 1])}..{_sha(points[i])}"
        if before and after and statistics.median(before):
            rel = statistics.median(after) / statistics.median(before) - 1
            text = f"{rel:+.1%}\n{text}"
        ax.annotate(text, (i - 0.5, 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", ha="left", va="top", fontsize=8,
                    color=style.FAILED_COLOR)
    step = max(1, math.ceil(n / MAX_TICKS))
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [f"{_day(points[i][1] if len(points[i]) > 1 else '')}\n{_sha(points[i])}"
                          for i in ticks], fontsize=7)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_xlabel("nightly run (date, commit)")
    ax.set_ylabel(f"{metric} ({unit or style.metric_unit(metric)})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(heading, fontsize=11)
    return style.save(fig, out_path)


def _sha(point) -> str:
    return str(point[0] or "?")[:7] if point else "?"
