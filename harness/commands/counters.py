"""`harness counters RUN`: the Nsight Compute counters of a run's kernel and op cells, one row a
kernel.

Kernel and op cells with `ncu: true` carry `ncu.<kernel>.<counter>` metrics for their own call
(a kernel cell's verify mode, an op cell's op) and `<mode>.ncu.<kernel>.<counter>` for each mode
a kernel cell compares (harness/worker/ncu.py). This lays them side by side: cell, mode,
kernel, duration, warp instructions, SM / DRAM / L2 throughput, registers, occupancy, active and
eligible warps a scheduler, cycles a warp waits per issued instruction and the three stall
reasons that take most of them, for every variant of a sweep in one table. Cells whose counters
could not be read say why (`ncu_errors`).

Exit codes: 0 (also when no cell has counters: it says how to get them), 2 bad input.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.commands.options import console, fail_input, results_option

# (column, counter, format, scale)
COLUMNS = (
    ("µs", "duration_us", "{:.1f}", 1),
    ("M instr", "instructions", "{:.2f}", 1e-6),     # warp instructions executed
    ("SM %", "sm_pct", "{:.0f}", 1),
    ("DRAM %", "dram_pct", "{:.0f}", 1),
    ("L2 %", "l2_pct", "{:.0f}", 1),
    ("regs", "registers", "{:.0f}", 1),
    ("occ %", "occupancy_pct", "{:.1f}", 1),
    ("warps/sch", "warps_per_scheduler", "{:.2f}", 1),
    ("eligible", "eligible_per_scheduler", "{:.2f}", 1),
    ("cyc/issue", "cycles_per_issue", "{:.2f}", 1),
    ("GHz", "sm_ghz", "{:.2f}", 1),
)
TOP_STALLS = 3


def counters(
    run_id: str = typer.Argument(..., metavar="RUN", help="a journaled run"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
    match: Optional[str] = typer.Option(None, "-k", metavar="TEXT",
                                        help="only cells whose label contains TEXT"),
):
    """Show the hardware counters (Nsight Compute) of a run's kernel and op cells."""
    from harness.sweep import journal as jr

    try:
        run = jr.RunJournal.open(results_dir / "runs", run_id)
    except jr.JournalError as e:
        raise fail_input(e)
    results = sorted(run.results().values(), key=lambda r: str(r.get("label", "")))
    if match:
        results = [r for r in results if match in str(r.get("label", ""))]
    table = Table(title=f"Hardware counters of {escape(run.run_id)} ({escape(run.scenario_name)})",
                  title_justify="left", header_style="bold")
    for name in ("cell", "mode", "kernel", *(c[0] for c in COLUMNS), "top stalls (cycles/issue)"):
        table.add_column(name, overflow="fold", min_width=24 if name == "cell" else None,
                         justify="left" if name in ("cell", "mode", "kernel") or name.startswith("top")
                         else "right")
    rows = 0
    errors: list[str] = []
    for r in results:
        cell = r.get("cell") or {}
        own = cell.get("op", "") if cell.get("workload") == "op" else cell.get("verify_mode", "")
        label = escape(str(r.get("label", "")))
        for mode, kernels in by_mode(r.get("metrics") or {}, own).items():
            for kernel, values in kernels.items():
                table.add_row(label, escape(mode), escape(kernel),
                              *(_fmt(values.get(key), spec, scale) for _, key, spec, scale in COLUMNS),
                              escape(top_stalls(values)))
                label = ""              # a cell's label once, on its first kernel
                rows += 1
        for mode, why in ((r.get("kernel") or {}).get("ncu_errors") or {}).items():
            errors.append(f"{r.get('label', '?')}: {mode}: {why}")
    if rows:
        console.print(table)
    else:
        console.print(f"No cell of {escape(run.run_id)} has hardware counters: set `ncu: true` on "
                      "its kernel or op cells (a GPU host with Nsight Compute's `ncu`).", highlight=False)
    for line in errors:
        console.print(f"[yellow]no counters[/] {escape(line)}", highlight=False)


# `ncu.K.C` (the cell's own mode) or `M.ncu.K.C` (compared mode M); K may carry its launch
# number (`gqa_kernel.2`), C may be `stall.<reason>`.
_NAME = re.compile(r"^(?:(?P<mode>\w+)\.)?ncu\.(?P<kernel>\w+(?:\.\d+)?)\.(?P<counter>[a-z0-9_.]+)$")


def by_mode(metrics: dict, own_mode: str) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> kernel -> counter -> value, kernels in the order their metrics came."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, value in metrics.items():
        m = _NAME.match(name)
        if m:
            mode = m["mode"] or own_mode
            out.setdefault(mode, {}).setdefault(m["kernel"], {})[m["counter"]] = value
    return out


def top_stalls(values: dict[str, float]) -> str:
    stalls = sorted(((v, k.removeprefix("stall.")) for k, v in values.items() if k.startswith("stall.")),
                    reverse=True)[:TOP_STALLS]
    return ", ".join(f"{name} {v:.2f}" for v, name in stalls) or "–"


def _fmt(value, spec: str, scale: float) -> str:
    return "–" if value is None else spec.format(value * scale)
