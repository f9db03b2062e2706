"""`harness validate SCENARIO`: exit 0 valid (the cells listed), 2 invalid (one line)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import console, fail_input, max_cells_option
from harness.protocol.errors import InputError


def validate(scenario: Path = typer.Argument(..., help="scenario YAML file"),
             max_cells: Optional[int] = max_cells_option()):
    """Check a scenario and list the cells it expands to (exit 0 valid, 2 invalid)."""
    from harness.sweep.scenario import load_scenario
    try:
        sc = load_scenario(scenario, max_cells=max_cells)
    except InputError as e:
        raise fail_input(e)
    cells = sc.cells()
    console.print(f"{escape(str(scenario))}: valid — scenario [bold]{escape(sc.name)}[/], "
                  f"{len(cells)} cell(s)")
    from harness.protocol import params
    for c in cells:
        console.print(f"  {params.cell_id(c)}  {escape(params.cell_label(c))}", highlight=False)
