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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.lines import Line2D

from harness.protocol.numbers import is_finite_number
from harness.protocol.params import (
    DEFAULTS,
    GRAPH_CAPTURES,
    MEASUREMENT_KNOBS,
    VERIFY_MODES,
)

from . import style

# What separates one line from another on the tokens/s-vs-context plot.
GROUP_KEYS = ("verify_mode", "graph_capture", "tree_build")
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
               if is_finite_number(s)]
    if samples:
        med = statistics.median(samples)
        return med, med - min(samples), max(samples) - med
    value = metrics.get("tokens_per_s")
    if not is_finite_number(value):
        return None
    spread = metrics.get("tokens_per_s_spread")
    spread = float(spread) if is_finite_number(spread) else 0.0
    return float(value), spread / 2, spread / 2


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


@dataclass
class _Line:
    """One configuration across contexts: its points, head and base, and how it is drawn."""
    cell: dict                                   # a representative cell (context aside)
    head: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    base: dict[int, tuple[float, float, float]] = field(default_factory=dict)
    name: str = ""
    color: tuple = (0, 0, 0)
    fill: str = "full"

    @property
    def graph(self) -> str:
        return str(self.cell.get("graph_capture"))

    def style(self) -> dict:
        return dict(linestyle=style.GRAPH_LINESTYLES.get(self.graph, "-."),
                    marker=style.TREE_MARKERS.get(str(self.cell.get("tree_build")), "^"),
                    fillstyle=self.fill, markerfacecoloralt="white")


def _lines(plotted, base_plotted) -> dict[tuple, _Line]:
    """Head and base points grouped into lines: a line is everything that tells cells apart
    but the context, so a base cell lands on the line of the head cell it is compared with."""
    cells = [r["cell"] for r, _ in plotted + base_plotted]
    keys = _varying(cells, ("context_length",))
    lines: dict[tuple, _Line] = {}
    for side, points in (("head", plotted), ("base", base_plotted)):
        for r, point in points:
            key = tuple(repr(r["cell"].get(k)) for k in keys)
            line = lines.setdefault(key, _Line(r["cell"]))
            getattr(line, side)[int(r["cell"]["context_length"])] = point
    order = sorted(lines, key=lambda k: (_mode_rank(lines[k].cell.get("verify_mode")),
                                         tuple(map(str, k))))
    lines = {k: lines[k] for k in order}
    for line, name in zip(lines.values(), style.names_of([ln.cell for ln in lines.values()],
                                                         ("context_length",))):
        line.name = name or "all cells"
    # Colour = verify mode; lines that would look alike (mode, graph, tree) get its shades.
    alike: dict[tuple, list[_Line]] = defaultdict(list)
    for line in lines.values():
        alike[tuple(str(line.cell.get(k)) for k in GROUP_KEYS)].append(line)
    for group in alike.values():
        for k, line in enumerate(group):
            line.color = style.shade(style.mode_color(line.cell.get("verify_mode")), k, len(group))
            line.fill = _FILLS[k % len(_FILLS)]
    return lines


def _mode_rank(mode) -> int:
    return VERIFY_MODES.index(mode) if mode in VERIFY_MODES else len(VERIFY_MODES)


def _y_top(lines: list[_Line]) -> float:
    """The top of the y axis: room above every median, and for the error bars that stay
    within 1.3x of the highest median. A longer bar is cut at the top and marked there with
    its maximum, so one noisy repeat never squashes every line to the bottom of the plot."""
    medians = [p[0] for ln in lines for pts in (ln.head, ln.base) for p in pts.values()]
    highest = max(medians)
    tops = [p[0] + p[2] for ln in lines for p in ln.head.values()]
    kept = [t for t in tops if t <= 1.3 * highest]
    return max([highest * 1.12] + [t * 1.03 for t in kept]) or 1.0


def tokens_vs_context(results: list[dict], out_path, title: str | None = None, *,
                      commit: str | None = None, base: list[dict] | None = None,
                      base_name: str = "base run", card: bool = True) -> Path:
    """Decode tokens/s against context length (log2 axis), one line per configuration:
    verify mode x graph capture x tree build, plus anything else that varies in the run.

    Colour = verify mode (shades of it for lines that differ in something else: acceptance,
    a kernel knob ...), line style = graph capture, marker = tree build (harness.dashboards
    .style); error bars span the repeats (min..max), cut at the top where one would squash
    the rest. `base`: the compared-with run's results, drawn faded on the same lines. The
    legend sits below the axes, never over a line. More than MAX_LINES lines (a nightly sweep)
    are split into one panel per graph capture mode. Returns the written PNG's path.
    """
    decode = [r for r in results if is_decode(r)]
    plotted = _measured(decode)
    base_plotted = _measured([r for r in base or [] if is_decode(r)])
    what = "Decode throughput vs context length"
    if not plotted:
        return style.nothing(_nothing_text(decode),
                             title or style.title(what, results, commit), out_path, card=card)

    lines = _lines(plotted, base_plotted)
    graphs = sorted({ln.graph for ln in lines.values()},
                    key=lambda g: (GRAPH_CAPTURES.index(g) if g in GRAPH_CAPTURES else 99, g))
    facets = graphs if len(lines) > MAX_LINES and len(graphs) > 1 else [None]
    per_facet = max(sum(1 for ln in lines.values() if f in (None, ln.graph)) for f in facets)
    longest = max(len(ln.name) for ln in lines.values())
    ncols = 1 if longest > 48 or facets != [None] else 2
    legend_rows = math.ceil((per_facet + bool(base_plotted)) / ncols)
    fig = style.new_figure(9 if len(facets) == 1 else min(6.5 * len(facets), 20),
                           4.6 + 0.2 * legend_rows)
    axes = fig.subplots(1, len(facets), sharey=True, squeeze=False)[0]
    names = {id(ln): ln.name for ln in lines.values()}
    for facet in facets if facets != [None] else []:   # a panel's title says its graph mode
        group = [ln for ln in lines.values() if ln.graph == facet]
        for ln, name in zip(group, style.names_of([ln.cell for ln in group],
                                                  ("context_length", "graph_capture"))):
            names[id(ln)] = name or ln.name
    top = _y_top(list(lines.values()))
    modes = {str(ln.cell.get("verify_mode")) for ln in lines.values()}
    legend_title = ((f"every line verify={modes.pop()}; " if len(modes) == 1 else "")
                    + "bars: min–max over repeats (▲: goes on past the top, to the max written)")
    all_x = sorted({x for ln in lines.values() for pts in (ln.head, ln.base) for x in pts})
    for line in lines.values():
        ax = axes[facets.index(line.graph)] if facets != [None] else axes[0]
        if line.base:   # a shadow behind the head, no bars: where it was, not how noisy
            xs = sorted(line.base)
            ax.plot(xs, [line.base[x][0] for x in xs], color=line.color, alpha=style.BASE_ALPHA,
                    linewidth=4, markersize=9, zorder=1, **{**line.style(), "fillstyle": "full"})
        if not line.head:
            continue
        xs = np.array(sorted(line.head))
        ys = np.array([line.head[x][0] for x in xs])
        err = np.array([[line.head[x][1] for x in xs],
                        [min(line.head[x][2], max(top - line.head[x][0], 0)) for x in xs]])
        ax.errorbar(xs, ys, yerr=err, color=line.color, markersize=6, capsize=3,
                    linewidth=1.6, label=names[id(line)], zorder=3, **line.style())
        for x in xs:
            if line.head[x][0] + line.head[x][2] > top:   # the bar goes on: up to its max
                ax.plot([x], [top], marker="^", markersize=6, color=line.color, clip_on=False,
                        zorder=4)
                ax.annotate(f"{line.head[x][0] + line.head[x][2]:.0f}", (x, top),
                            xytext=(5, -9), textcoords="offset points", ha="left",
                            fontsize=7, color="0.25")
    for ax, facet in zip(axes, facets):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_x, [style.fmt_tokens(x) for x in all_x])
        ax.minorticks_off()  # log2 minor ticks would carry unreadable labels
        if len(all_x) == 1:  # one context: give the single point some room
            ax.set_xlim(all_x[0] / 1.5, all_x[0] * 1.5)
        ax.set_xlabel("context length (tokens, log2 scale)")
        ax.set_ylim(0, top)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if base_plotted:
            handles.append(Line2D([], [], color="0.35", alpha=style.BASE_ALPHA, linewidth=4))
            labels.append(f"faded: {base_name}")
        if handles:
            ax.legend(handles, labels, fontsize=8 if facet is None else 7, ncols=ncols,
                      loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False,
                      title=legend_title, title_fontsize=7)
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


def speedup_table(results: list[dict], reference: str,
                  row_keys: tuple[str, ...] | None = None) -> SpeedupTable:
    """The numbers of the speedup heatmap: every non-reference configuration's tokens/s
    divided by the reference mode's at the same context with every other parameter equal.
    `row_keys`: what makes a row (default: verify_mode and whatever else varies), given to
    key another run's table by the rows of this one."""
    decode = [r for r in results if is_decode(r)]
    measured = _measured(decode)
    # Rows: a configuration without its context; key the reference by the same identity.
    if row_keys is None:
        cells = [r["cell"] for r, _ in measured] + [r.get("cell") or {} for r in decode]
        row_keys = ("verify_mode",) + tuple(_varying(cells, ("verify_mode", "context_length")))

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
                    title: str | None = None, commit: str | None = None,
                    base: list[dict] | None = None, base_name: str = "base run",
                    card: bool = True) -> Path:
    """Speedup of each verify mode over `reference`, per context length: a heatmap with rows
    = mode (× graph capture × tree build and anything else that varies), columns = context.

    Each cell divides the median tokens/s of a configuration by that of the reference mode's
    cell with every other parameter equal, so graph capture or tree placement never leak into
    a kernel comparison. Grey squares: the cell or its reference failed or is missing.
    `base`: the compared-with run; its speedup for the same square is written faded under
    the head's.
    """
    decode = [r for r in results if is_decode(r)]
    measured = _measured(decode)
    reference = pick_reference(decode, reference)
    what = f"Decode speedup over verify={reference}" if reference else "Decode speedup"
    heading = title or style.title(what, [r for r, _ in measured] or results, commit)
    modes = sorted({str(r["cell"].get("verify_mode")) for r, _ in measured})
    if not measured:
        return style.nothing(_nothing_text(decode), heading, out_path, card=card)
    if reference not in modes or len(modes) < 2:
        why = (f"only verify={modes[0]} was measured: nothing to compare" if len(modes) < 2
               else f"reference verify={reference} has no measured cell")
        return style.nothing(why, heading, out_path, card=card)

    table = speedup_table(decode, reference)
    if not table.rows:
        return style.nothing("no cell besides the reference mode", heading, out_path, card=card)
    rows, contexts, grid, text, row_keys = (table.rows, table.contexts, table.grid, table.text,
                                            table.row_keys)
    base_table = speedup_table(base, reference, row_keys) if base else None
    base_at = ({(row, ctx): base_table.grid[i, j] for i, row in enumerate(base_table.rows)
                for j, ctx in enumerate(base_table.contexts)} if base_table else {})

    finite = grid[np.isfinite(grid)]
    # Diverging around 1×: red slower, blue faster, symmetric in log terms.
    span = float(np.max(np.abs(np.log2(finite)))) if finite.size else 1.0
    span = max(span, 0.1)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=2 ** -span, vmax=2 ** span)
    import matplotlib as mpl

    cmap = mpl.colormaps["RdBu"].with_extremes(bad="#E6E6E6")
    names = style.names_of([dict(zip(row_keys, row)) for row in rows], ("verify_mode",))
    labels = [f"verify={row[0]} {name}".strip() for row, name in zip(rows, names)]
    label_in = 0.075 * max(map(len, labels))  # ~ width of 8-pt text, so the grid never collapses
    fig = style.new_figure(max(6.0, 1.0 * len(contexts) + label_in + 2.5),
                           max(2.8, (0.55 if base else 0.42) * len(rows) + 1.8))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto")
    for i, row in enumerate(rows):
        for j, ctx in enumerate(contexts):
            value = grid[i, j]
            dark = np.isfinite(value) and abs(math.log2(value)) > 0.6 * span
            color = "white" if dark else ("0.15" if np.isfinite(value) else style.MUTED)
            before = base_at.get((row, ctx))
            ax.text(j, i - (0.12 if base else 0), text[i][j], ha="center", va="center",
                    fontsize=8, color=color)
            if base:
                ax.text(j, i + 0.22, f"base {before:.2f}×" if is_finite_number(before) else "base –",
                        ha="center", va="center", fontsize=6.5, color=color,
                        alpha=0.75 if np.isfinite(value) else 0.6)
    ax.set_xticks(range(len(contexts)), [style.fmt_tokens(c) for c in contexts])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), rows):
        tick.set_color(style.mode_color(row[0]))  # the mode palette, as in every figure
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("configuration")
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    bar.set_label(f"speedup (× tokens/s of verify={reference})")
    ax.set_title(heading + (f"\nsmall print: {base_name}" if base else ""), fontsize=11)
    return style.save(fig, out_path)
