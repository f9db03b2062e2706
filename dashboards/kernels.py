"""Kernel cells: verify-attention time as a percentage of the roofline, against context length.

Reads the results of `workload: kernel` cells: params `verify_mode`, `context_length` and the
tree size (`tree_tokens`, else `tree_budget`); metrics `pct_roofline` (0..100, of max(bytes /
measured copy bandwidth, FLOPs / measured matmul rate)), `kernel_us`, `achieved_tbps`.
One line per verify mode and tree size (plus anything else that varies: heads, layout, ...).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from matplotlib.lines import Line2D

from harness.protocol.params import VERIFY_MODES

from . import style
from .figures import _varying

TREE_KEYS = ("tree_tokens", "tree_budget")
_TREE_LINESTYLES = ["-", "--", ":", "-."]


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _mode_rank(mode) -> int:
    return VERIFY_MODES.index(mode) if mode in VERIFY_MODES else len(VERIFY_MODES)


def _tree_key(cells: list[dict]) -> str | None:
    return next((k for k in TREE_KEYS if any(k in c for c in cells)), None)


def _measured(results: list[dict]) -> list[dict]:
    return [r for r in results if (r.get("cell") or {}).get("workload") == "kernel"
            and r.get("status") == "ok"
            and _num((r.get("metrics") or {}).get("pct_roofline")) is not None
            and (r.get("cell") or {}).get("context_length") is not None]


def roofline_vs_context(results: list[dict], out_path, *, title: str | None = None,
                        commit: str | None = None, base: list[dict] | None = None,
                        base_name: str = "base run", card: bool = True) -> Path:
    """% of roofline (y, 0..100) against context length (x, log2), colour = verify mode,
    line style = tree size. Failed and unmeasured kernel cells are counted in a note.
    `base`: the compared-with run's lines, faded behind the head's."""
    kernel = [r for r in results if (r.get("cell") or {}).get("workload") == "kernel"]
    what = "Verify-attention kernel: % of roofline vs context length"
    measured = _measured(kernel)
    base_measured = _measured(base or [])
    heading = title or style.title(what, measured or kernel or results, commit)
    if not measured:
        why = ("no kernel cells in this run" if not kernel else
               f"no measured kernel cells ({sum(r.get('status') != 'ok' for r in kernel)} "
               f"of {len(kernel)} failed)")
        return style.nothing(why, heading, out_path, card=card)

    cells = [r["cell"] for r in measured + base_measured]
    tree = _tree_key(cells)
    fixed = ("verify_mode", "context_length") + ((tree,) if tree else ())
    keys = ("verify_mode",) + ((tree,) if tree else ()) + tuple(_varying(cells, fixed))
    lines: dict[tuple, dict[int, float]] = defaultdict(dict)
    base_lines: dict[tuple, dict[int, float]] = defaultdict(dict)
    for side, rs in ((lines, measured), (base_lines, base_measured)):
        for r in rs:
            group = tuple(r["cell"].get(k) for k in keys)
            side[group][int(r["cell"]["context_length"])] = float(r["metrics"]["pct_roofline"])
    trees = sorted({r["cell"].get(tree) for r in measured + base_measured}, key=str) \
        if tree else [None]

    groups = sorted(set(lines) | set(base_lines),
                    key=lambda g: (_mode_rank(g[0]), tuple(map(str, g))))
    names = [f"verify={g[0]} {name}".strip() for g, name in
             zip(groups, style.names_of([dict(zip(keys, g)) for g in groups], ("verify_mode",)))]
    ncols = 1 if max(map(len, names)) > 48 else 2
    fig = style.new_figure(9, 4.6 + 0.2 * math.ceil((len(groups) + bool(base_measured)) / ncols))
    ax = fig.add_subplot()
    # Colour = verify mode, line style = tree size; lines alike in both get the mode's shades.
    alike: dict[tuple, list[tuple]] = defaultdict(list)
    for group in groups:
        alike[(group[0], group[1] if tree else None)].append(group)
    for group, name in zip(groups, names):
        size = group[1] if tree else None
        twins = alike[(group[0], size)]
        look = dict(color=style.shade(style.mode_color(group[0]), twins.index(group), len(twins)),
                    marker="o",
                    linestyle=_TREE_LINESTYLES[trees.index(size) % len(_TREE_LINESTYLES)])
        if base_lines.get(group):
            xs = sorted(base_lines[group])
            ax.plot(xs, [base_lines[group][x] for x in xs], alpha=style.BASE_ALPHA,
                    markersize=5, linewidth=2.6, zorder=1, **look)
        if lines.get(group):
            xs = sorted(lines[group])
            ax.plot(xs, [lines[group][x] for x in xs], markersize=4, linewidth=1.6,
                    label=name, zorder=3, **look)
    ax.set_xscale("log", base=2)
    all_x = sorted({x for side in (lines, base_lines) for pts in side.values() for x in pts})
    ax.set_xticks(all_x, [style.fmt_tokens(x) for x in all_x])
    ax.minorticks_off()
    if len(all_x) == 1:
        ax.set_xlim(all_x[0] / 1.5, all_x[0] * 1.5)
    top = max(max(p.values()) for side in (lines, base_lines) for p in side.values() if p)
    ax.set_ylim(0, max(100.0, top * 1.05))
    ax.axhline(100, color="0.3", linewidth=0.8, linestyle="--")
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.set_ylabel("kernel time vs roofline (% of roofline)")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if base_measured:
        handles.append(Line2D([], [], color="0.35", alpha=style.BASE_ALPHA, linewidth=2.6))
        labels.append(f"faded: {base_name}")
    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13),
              ncols=ncols, frameon=False)
    ax.set_title(heading, fontsize=11)
    skipped = len(kernel) - len(measured)
    if skipped:
        style.note(ax, f"{skipped} failed or unmeasured kernel cell(s) not shown")
    return style.save(fig, out_path)
