"""Decode throughput figures: tokens/s against context length, and the speedup heatmap.

Rendered with Agg (no display needed on CI or over SSH). Every function takes the run's cell
results as the journal stores them (harness.sweep.journal: `cell`, `status`, `metrics`, `samples`,
`env`, `host`), writes one PNG and returns its path. Failed cells, cells without a
measurement and cells of other workloads are left out and counted in a note on the figure;
with nothing left the figure says so instead of being empty.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm

from harness.protocol.params import (
    DEFAULTS,
    GRAPH_CAPTURES,
    MEASUREMENT_KNOBS,
    VERIFY_MODES,
)

from . import style

# What separates one line from another on the tokens/s-vs-context plot.
GROUP_KEYS = ("verify_mode", "graph_capture", "tree_build")
# Legend names, matching harness.protocol.params.cell_label.
_SHORT = style.SHORT_NAMES
_FILLS = ("full", "none", "left", "bottom", "right", "top")
MAX_LINES = 12  # lines on one axes before tokens_vs_context splits into graph-capture panels
# Preferred reference modes for the speedup heatmap: the motivating baseline first.
REFERENCE_ORDER = ("triton", "sdpa", "flex", "custom")


def _median_and_error(result: dict) -> tuple[float, float, float] | None:
    """(median tokens/s, lower error, upper error) of one ok result, or None if unmeasured.

    The per-repeat samples give an honest min..max bar; without them fall back to the
    worker's `tokens_per_s_spread` as a symmetric bar.
    """
    metrics = result.get("metrics") or {}
    samples = [s for s in (result.get("samples") or {}).get("tokens_per_s") or []
               if _finite(s)]
    if samples:
        med = statistics.median(samples)
        return med, med - min(samples), max(samples) - med
    value = metrics.get("tokens_per_s")
    if not _finite(value):
        return None
    spread = metrics.get("tokens_per_s_spread")
    spread = float(spread) if _finite(spread) else 0.0
    return float(value), spread / 2, spread / 2


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_decode(result: dict) -> bool:
    """A cell whose throughput belongs on these figures: the decode workload, or any other
    workload that reports tokens/s (a serving endpoint)."""
    return ((result.get("cell") or {}).get("workload", "decode") == "decode"
            or "tokens_per_s" in (result.get("metrics") or {}))


def _measured(results: list[dict]) -> list[tuple[dict, tuple[float, float, float]]]:
    """(result, point) of the ok decode cells that have a context length and a tokens/s."""
    out = []
    for r in results:
        if not is_decode(r) or r.get("status") != "ok":
            continue
        point = _median_and_error(r)
        if point is not None and (r.get("cell") or {}).get("context_length") is not None:
            out.append((r, point))
    return out


def _varying(cells: list[dict], exclude: tuple[str, ...]) -> list[str]:
    """Parameters (other than `exclude` and measurement knobs) that differ between cells."""
    keys = {k for c in cells for k in c}
    order = list(DEFAULTS)  # the parameters' natural order: graph, tree, accept, ...
    return sorted((k for k in keys
                   if k not in exclude and k not in MEASUREMENT_KNOBS
                   and len({repr(c.get(k)) for c in cells}) > 1),
                  key=lambda k: (order.index(k) if k in order else len(order), k))


def _label(keys, values) -> str:
    return " ".join(f"{_SHORT.get(k, k)}={v}" for k, v in zip(keys, values))


def tokens_vs_context(results: list[dict], out_path, title: str | None = None, *,
                      commit: str | None = None) -> Path:
    """Decode tokens/s against context length (log2 axis), one line per verify mode × graph
    capture × tree build (plus any other parameter that varies in the run).

    Colour = verify mode, line style = graph capture, marker = tree build (harness.dashboards
    .style); error bars span the repeats (min..max). More than MAX_LINES lines (a nightly
    sweep) are split into one panel per graph capture mode. Returns the written PNG's path.
    """
    decode = [r for r in results if is_decode(r)]
    plotted = _measured(decode)
    what = "Decode throughput vs context length"
    if not plotted:
        fig = style.empty_figure(_nothing_text(decode), title or style.title(what, results, commit))
        return style.save(fig, out_path)

    # Two different cells never share a point: anything else that varies splits lines too.
    extra = tuple(_varying([r["cell"] for r, _ in plotted], GROUP_KEYS + ("context_length",)))
    keys = GROUP_KEYS + extra
    lines: dict[tuple, dict[int, tuple[float, float, float]]] = defaultdict(dict)
    for r, point in plotted:
        lines[tuple(r["cell"].get(k) for k in keys)][int(r["cell"]["context_length"])] = point

    # A nightly sweep has ~30 lines: past MAX_LINES, one panel per graph-capture mode.
    graphs = sorted({str(g[1]) for g in lines},
                    key=lambda g: (GRAPH_CAPTURES.index(g) if g in GRAPH_CAPTURES else 99, g))
    facets = graphs if len(lines) > MAX_LINES and len(graphs) > 1 else [None]
    fig = style.new_figure(9 if len(facets) == 1 else min(6.5 * len(facets), 20), 5.5)
    axes = fig.subplots(1, len(facets), sharey=True, squeeze=False)[0]
    all_x = sorted({x for pts in lines.values() for x in pts})
    twins: dict[tuple, int] = defaultdict(int)  # lines that differ only in `extra` keys
    for group in sorted(lines, key=lambda g: tuple(map(str, g))):
        mode, graph, tree = group[:3]
        ax = axes[facets.index(str(graph))] if facets != [None] else axes[0]
        # Same colour, line and marker: tell them apart by how the marker is filled.
        fill = _FILLS[twins[group[:3]] % len(_FILLS)]
        twins[group[:3]] += 1
        pts = lines[group]
        xs = np.array(sorted(pts))
        ys = np.array([pts[x][0] for x in xs])
        err = np.array([[pts[x][1] for x in xs], [pts[x][2] for x in xs]])
        label = _label([k for k in keys if facets == [None] or k != "graph_capture"],
                       [v for k, v in zip(keys, group) if facets == [None] or k != "graph_capture"])
        ax.errorbar(xs, ys, yerr=err, color=style.mode_color(mode),
                    linestyle=style.GRAPH_LINESTYLES.get(str(graph), "-."),
                    marker=style.TREE_MARKERS.get(str(tree), "^"), markersize=6,
                    fillstyle=fill, markerfacecoloralt="white",
                    capsize=3, linewidth=1.6, label=label)
    for ax, facet in zip(axes, facets):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_x, [style.fmt_tokens(x) for x in all_x])
        ax.minorticks_off()  # log2 minor ticks would carry unreadable labels
        if len(all_x) == 1:  # one context: give the single point some room
            ax.set_xlim(all_x[0] / 1.5, all_x[0] * 1.5)
        ax.set_xlabel("context length (tokens, log2 scale)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8 if facet is None else 7, loc="best",
                      title="error bars: min–max over repeats", title_fontsize=7)
        if facet is not None:
            ax.set_title(f"graph={facet}", fontsize=10)
    axes[0].set_ylabel("decode throughput (tokens/s)")
    heading = title or style.title(what, [r for r, _ in plotted], commit)
    if facets == [None]:
        axes[0].set_title(heading, fontsize=11)
    else:
        fig.suptitle(heading, fontsize=11)
    skipped = len(decode) - len(plotted)
    if skipped:
        # Say so, so a missing point reads as "failed" rather than "not in the sweep".
        style.note(axes[-1], f"{skipped} failed or unmeasured cell(s) not shown")
    return style.save(fig, out_path)


def _nothing_text(decode: list[dict]) -> str:
    if not decode:
        return "no decode cells in this run"
    failed = sum(r.get("status") != "ok" for r in decode)
    return f"no measured decode cells ({failed} of {len(decode)} failed)"


def pick_reference(results: list[dict], reference: str | None = None) -> str | None:
    """The verify mode the heatmap divides by: `reference` if given, else the first of
    triton, sdpa, flex, custom that the run measured."""
    modes = {r["cell"].get("verify_mode") for r, _ in _measured(results)}
    if reference is not None:
        return reference
    return next((m for m in REFERENCE_ORDER if m in modes), min(map(str, modes), default=None))


@dataclass
class SpeedupTable:
    row_keys: tuple[str, ...]        # verify_mode, then every other parameter that varies
    rows: list[tuple]                # one configuration (without context) per row
    contexts: list[int]
    grid: np.ndarray                 # rows x contexts: head tokens/s / reference tokens/s, NaN if none
    text: list[list[str]]            # "3.60×", "failed", "no ref" or "–"


def speedup_table(results: list[dict], reference: str) -> SpeedupTable:
    """The numbers of the speedup heatmap: every non-reference configuration's tokens/s
    divided by the reference mode's at the same context with every other parameter equal."""
    decode = [r for r in results if is_decode(r)]
    measured = _measured(decode)
    # Rows: a configuration without its context; key the reference by the same identity.
    cells = [r["cell"] for r, _ in measured] + [r.get("cell") or {} for r in decode]
    extra = tuple(_varying(cells, ("verify_mode", "context_length")))
    row_keys = ("verify_mode",) + extra

    def ident(cell: dict, mode=None) -> tuple:
        return tuple((mode if (k == "verify_mode" and mode) else cell.get(k)) for k in row_keys)

    tps = {(ident(r["cell"]), int(r["cell"]["context_length"])): p[0] for r, p in measured}
    failed = {(ident(r.get("cell") or {}), (r.get("cell") or {}).get("context_length"))
              for r in decode if r.get("status") != "ok"}
    contexts = sorted({int((r.get("cell") or {})["context_length"]) for r in decode
                       if (r.get("cell") or {}).get("context_length") is not None})
    rows = sorted({ident(r.get("cell") or {}) for r in decode
                   if (r.get("cell") or {}).get("verify_mode") != reference},
                  key=lambda row: (VERIFY_MODES.index(row[0]) if row[0] in VERIFY_MODES
                                   else len(VERIFY_MODES), tuple(map(str, row))))

    grid = np.full((len(rows), len(contexts)), np.nan)
    text = [["" for _ in contexts] for _ in rows]
    for i, row in enumerate(rows):
        ref_row = ident(dict(zip(row_keys, row)), reference)
        for j, ctx in enumerate(contexts):
            head, base = tps.get((row, ctx)), tps.get((ref_row, ctx))
            if head is not None and base:
                grid[i, j] = head / base
                text[i][j] = f"{head / base:.2f}×"
            elif (row, ctx) in failed:
                text[i][j] = "failed"
            elif head is not None:
                text[i][j] = "no ref"
            else:
                text[i][j] = "–"

    return SpeedupTable(row_keys, rows, contexts, grid, text)


def speedup_heatmap(results: list[dict], out_path, reference: str | None = None, *,
                    title: str | None = None, commit: str | None = None) -> Path:
    """Speedup of each verify mode over `reference`, per context length: a heatmap with rows
    = mode (× graph capture × tree build and anything else that varies), columns = context.

    Each cell divides the median tokens/s of a configuration by that of the reference mode's
    cell with every other parameter equal, so graph capture or tree placement never leak into
    a kernel comparison. Grey squares: the cell or its reference failed or is missing.
    """
    decode = [r for r in results if is_decode(r)]
    measured = _measured(decode)
    reference = pick_reference(decode, reference)
    what = f"Decode speedup over verify={reference}" if reference else "Decode speedup"
    heading = title or style.title(what, [r for r, _ in measured] or results, commit)
    modes = sorted({str(r["cell"].get("verify_mode")) for r, _ in measured})
    if not measured:
        return style.save(style.empty_figure(_nothing_text(decode), heading), out_path)
    if reference not in modes or len(modes) < 2:
        why = (f"only verify={modes[0]} was measured: nothing to compare" if len(modes) < 2
               else f"reference verify={reference} has no measured cell")
        return style.save(style.empty_figure(why, heading), out_path)

    table = speedup_table(decode, reference)
    if not table.rows:
        return style.save(style.empty_figure("no cell besides the reference mode", heading),
                          out_path)
    rows, contexts, grid, text, row_keys = (table.rows, table.contexts, table.grid, table.text,
                                            table.row_keys)

    finite = grid[np.isfinite(grid)]
    # Diverging around 1×: red slower, blue faster, symmetric in log terms.
    span = float(np.max(np.abs(np.log2(finite)))) if finite.size else 1.0
    span = max(span, 0.1)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=2 ** -span, vmax=2 ** span)
    import matplotlib as mpl

    cmap = mpl.colormaps["RdBu"].with_extremes(bad="#E6E6E6")
    labels = [_label(row_keys, row) for row in rows]
    label_in = 0.075 * max(map(len, labels))  # ~ width of 8-pt text, so the grid never collapses
    fig = style.new_figure(max(6.0, 1.0 * len(contexts) + label_in + 2.5),
                           max(2.8, 0.42 * len(rows) + 1.8))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(contexts)):
            value = grid[i, j]
            dark = np.isfinite(value) and abs(math.log2(value)) > 0.6 * span
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8,
                    color="white" if dark else ("0.15" if np.isfinite(value) else style.MUTED))
    ax.set_xticks(range(len(contexts)), [style.fmt_tokens(c) for c in contexts])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), rows):
        tick.set_color(style.mode_color(row[0]))  # the mode palette, as in every figure
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("configuration")
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    bar.set_label(f"speedup (× tokens/s of verify={reference})")
    ax.set_title(heading, fontsize=11)
    return style.save(fig, out_path)
