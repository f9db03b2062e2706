"""Figures of a run's results (matplotlib, rendered with Agg: no display needed on CI or SSH).

Imports only matplotlib, numpy and the standard library, so it works from any controller
install and can be imported without pulling in the rest of the harness.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
# Figure() directly rather than pyplot: no global figure registry, no GUI backend chosen or
# switched behind the caller's back; savefig renders through Agg.
from matplotlib.figure import Figure

# What separates one line from another on the tokens/s-vs-context plot.
GROUP_KEYS = ("verify_mode", "graph_capture", "tree_build")
# Legend names, matching harness.params.cell_label.
_SHORT = {"verify_mode": "verify", "graph_capture": "graph", "tree_build": "tree",
          "speculation": "spec", "batch_size": "bs"}


def _median_and_error(result: dict) -> tuple[float, float, float] | None:
    """(median tokens/s, lower error, upper error) of one ok result, or None if unmeasured.

    The per-repeat samples give an honest min..max bar; without them fall back to the
    worker's `tokens_per_s_spread` as a symmetric bar.
    """
    metrics = result.get("metrics") or {}
    samples = [s for s in (result.get("samples") or {}).get("tokens_per_s") or [] if s is not None]
    if samples:
        med = statistics.median(samples)
        return med, med - min(samples), max(samples) - med
    value = metrics.get("tokens_per_s")
    if value is None:
        return None
    spread = metrics.get("tokens_per_s_spread") or 0.0
    return float(value), float(spread) / 2, float(spread) / 2


def _where(results: list[dict]) -> str:
    """`on NVIDIA H200 (gpu-a)`-style suffix naming the hardware the results came from."""
    gpus, hosts = set(), set()
    for r in results:
        env = r.get("env") or {}
        gpus.add(env.get("gpu") or env.get("device") or "cpu")
        hosts.add(r.get("host") or env.get("hostname") or "?")
    return f"on {', '.join(sorted(map(str, gpus)))} ({', '.join(sorted(map(str, hosts)))})"


def tokens_vs_context(results: list[dict], out_path, title: str | None = None) -> Path:
    """Plot decode tokens/s against context length, one line per verify/graph/tree group.

    Failed cells and cells without a tokens/s measurement are skipped; with none left the
    figure says so instead of being empty. Returns the written PNG's path.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    plotted = []  # (result, point) for ok cells with a context length and a tokens/s
    for r in results:
        point = _median_and_error(r) if r.get("status") == "ok" else None
        if point is not None and (r.get("cell") or {}).get("context_length") is not None:
            plotted.append((r, point))

    # Lines are told apart by verify/graph/tree, plus any other parameter that varies in this
    # run (batch size, speculation on/off, ...), so two different cells never share a point.
    varying = sorted(
        k for k in {k for r, _ in plotted for k in r["cell"]}
        if k != "context_length" and k not in GROUP_KEYS
        and len({repr(r["cell"].get(k)) for r, _ in plotted}) > 1
    )
    keys = GROUP_KEYS + tuple(varying)

    # group -> context -> (median, err_lo, err_hi)
    lines: dict[tuple, dict[int, tuple[float, float, float]]] = defaultdict(dict)
    for r, point in plotted:
        lines[tuple(r["cell"].get(k) for k in keys)][int(r["cell"]["context_length"])] = point

    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.add_subplot()
    if not lines:
        ax.text(0.5, 0.5, "no successful cells", ha="center", va="center",
                transform=ax.transAxes, fontsize=14, color="0.4")
        ax.set_axis_off()
        ax.set_title(title or "decode tokens/s vs context")
    else:
        for group in sorted(lines, key=lambda g: tuple(map(str, g))):
            pts = lines[group]
            xs = np.array(sorted(pts))
            ys = np.array([pts[x][0] for x in xs])
            err = np.array([[pts[x][1] for x in xs], [pts[x][2] for x in xs]])
            label = " ".join(f"{_SHORT.get(k, k)}={v}" for k, v in zip(keys, group))
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax.set_xscale("log", base=2)
        all_x = sorted({x for pts in lines.values() for x in pts})
        ax.set_xticks(all_x, [_fmt_tokens(x) for x in all_x])
        ax.minorticks_off()  # log2 minor ticks would carry unreadable labels
        ax.set_xlabel("context length (tokens, log2 scale)")
        ax.set_ylabel("decode throughput (tokens/s)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(title or f"decode tokens/s vs context {_where([r for r, _ in plotted])}")
    skipped = len(results) - len(plotted)
    if lines and skipped:
        # Say so, so a missing point reads as "failed" rather than "not in the sweep".
        ax.annotate(f"{skipped} failed or unmeasured cell(s) not shown", (1, 0),
                    xycoords="axes fraction", xytext=(-4, 4), textcoords="offset points",
                    ha="right", va="bottom", fontsize=8, color="0.4")
    fig.savefig(out_path, dpi=120)
    return out_path


def _fmt_tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
