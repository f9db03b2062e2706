"""`harness validate SCENARIO`: exit 0 valid (the cells listed), 2 invalid (one line)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import cell_filter_option, console, fail_input, max_cells_option
from harness.protocol.errors import InputError


def validate(scenario: Path = typer.Argument(..., help="scenario YAML file"),
             max_cells: Optional[int] = max_cells_option(),
             cell_filter: Optional[str] = cell_filter_option()):
    """Check a scenario and list the cells it expands to (exit 0 valid, 2 invalid)."""
    from harness.sweep.cellfilter import select
    from harness.sweep.scenario import load_scenario
    try:
        sc = load_scenario(scenario, max_cells=max_cells)
        every = sc.cells()
        cells = select(every, cell_filter)
    except InputError as e:
        raise fail_input(e)
    picked = f" ({len(cells)} of {len(every)} selected by -k)" if cell_filter else ""
    console.print(f"{escape(str(scenario))}: valid — scenario [bold]{escape(sc.name)}[/], "
                  f"{len(every)} cell(s){escape(picked)}")
    from harness.protocol import params
    for c in cells:
        console.print(f"  {params.cell_id(c)}  {escape(params.cell_label(c))}", highlight=False)
    if sc.targets:
        from harness.sweep.targets import bound_text
        console.print(f"{len(sc.targets)} target(s), judged after a run:")
        for t in sc.targets:
            console.print(f"  {escape(t['name'] or t['cells'])}: {escape(bound_text(t))}",
                          highlight=False)
