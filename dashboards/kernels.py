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

from harness.protocol.params import VERIFY_MODES

from . import style
from .figures import _SHORT, _varying

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


def roofline_vs_context(results: list[dict], out_path, *, title: str | None = None,
                        commit: str | None = None) -> Path:
    """% of roofline (y, 0..100) against context length (x, log2), colour = verify mode,
    line style = tree size. Failed and unmeasured kernel cells are counted in a note."""
    kernel = [r for r in results if (r.get("cell") or {}).get("workload") == "kernel"]
    what = "Verify-attention kernel: % of roofline vs context length"
    measured = [r for r in kernel if r.get("status") == "ok"
                and _num((r.get("metrics") or {}).get("pct_roofline")) is not None
                and (r.get("cell") or {}).get("context_length") is not None]
    heading = title or style.title(what, measured or kernel or results, commit)
    if not measured:
        why = ("no kernel cells in this run" if not kernel else
               f"no measured kernel cells ({sum(r.get('status') != 'ok' for r in kernel)} "
               f"of {len(kernel)} failed)")
        return style.save(style.empty_figure(why, heading), out_path)

    cells = [r["cell"] for r in measured]
    tree = _tree_key(cells)
    fixed = ("verify_mode", "context_length") + ((tree,) if tree else ())
    keys = ("verify_mode",) + ((tree,) if tree else ()) + tuple(_varying(cells, fixed))
    lines: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in measured:
        group = tuple(r["cell"].get(k) for k in keys)
        lines[group][int(r["cell"]["context_length"])] = float(r["metrics"]["pct_roofline"])
    trees = sorted({r["cell"].get(tree) for r in measured}, key=str) if tree else [None]

    fig = style.new_figure(9, 5.5)
    ax = fig.add_subplot()
    for group in sorted(lines, key=lambda g: (_mode_rank(g[0]), tuple(map(str, g)))):
        pts = lines[group]
        xs = sorted(pts)
        size = group[1] if tree else None
        ax.plot(xs, [pts[x] for x in xs], color=style.mode_color(group[0]), marker="o",
                markersize=4, linewidth=1.6,
                linestyle=_TREE_LINESTYLES[trees.index(size) % len(_TREE_LINESTYLES)],
                label=" ".join(f"{_SHORT.get(k, k)}={v}" for k, v in zip(keys, group)))
    ax.set_xscale("log", base=2)
    all_x = sorted({x for pts in lines.values() for x in pts})
    ax.set_xticks(all_x, [style.fmt_tokens(x) for x in all_x])
    ax.minorticks_off()
    if len(all_x) == 1:
        ax.set_xlim(all_x[0] / 1.5, all_x[0] * 1.5)
    top = max(max(p.values()) for p in lines.values())
    ax.set_ylim(0, max(100.0, top * 1.05))
    ax.axhline(100, color="0.3", linewidth=0.8, linestyle="--")
    ax.set_xlabel("context length (tokens, log2 scale)")
    ax.set_ylabel("kernel time vs roofline (% of roofline)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(heading, fontsize=11)
    skipped = len(kernel) - len(measured)
    if skipped:
        style.note(ax, f"{skipped} failed or unmeasured kernel cell(s) not shown")
    return style.save(fig, out_path)
