"""`harness counters RUN`: the Nsight Compute counters of a run's kernel and op cells, one row a
kernel.

Kernel and op cells with `ncu: true` carry `ncu.<kernel>.<counter>` metrics for their own call
(a kernel cell's verify mode, an op cell's op) and `<mode>.ncu.<kernel>.<counter>` for each mode
a kernel cell compares (harness/worker/ncu.py). This lays them side by side: cell, mode,
kernel, duration, warp instructions, SM / DRAM / L2 throughput, registers, occupancy, active and
eligible warps a scheduler, cycles a warp waits per issued instruction and the three stall
reasons that take most of them, for every variant of a sweep in one table. Cells whose counters
could not be read say why (`ncu_errors`). The rows are harness/dashboards/counters.py's, as
the HTML report's counters table.

Exit codes: 0 (also when no cell has counters: it says how to get them), 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.commands.options import console, fail_input, results_option


def counters(
    run_id: str = typer.Argument(..., metavar="RUN", help="a journaled run"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
    match: Optional[str] = typer.Option(None, "-k", metavar="TEXT",
                                        help="only cells whose label contains TEXT"),
):
    """Show the hardware counters (Nsight Compute) of a run's kernel and op cells."""
    from harness.dashboards import counters as view
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
    for name in ("cell", "mode", "kernel", *(c[0] for c in view.COLUMNS), *view.TEXT_COLUMNS):
        table.add_column(name, overflow="fold", min_width=24 if name == "cell" else None,
                         justify="left" if name in ("cell", "mode", "kernel", *view.TEXT_COLUMNS)
                         else "right")
    shown = 0
    missing: list[str] = []
    for r in results:
        label = escape(str(r.get("label", "")))
        for row in view.rows(r):
            table.add_row(label, escape(row.mode), escape(row.kernel), *map(escape, row.cells()))
            label = ""              # a cell's label once, on its first kernel
            shown += 1
        missing += [f"{r.get('label', '?')}: {mode}: {why}" for mode, why in view.errors(r).items()]
    if shown:
        console.print(table)
    else:
        console.print(f"No cell of {escape(run.run_id)} has hardware counters: set `ncu: true` on "
                      "its kernel or op cells (a GPU host with Nsight Compute's `ncu`).", highlight=False)
    for line in missing:
        console.print(f"[yellow]no counters[/] {escape(line)}", highlight=False)
