"""Run a sweep: cells onto host slots, results into the journal, progress onto the screen.

Each host slot pulls the next cell from a shared queue, so a sweep spreads over every eligible
host and GPU at once. A result is written to the journal the moment it arrives, before anything
else looks at it; MLflow logging happens afterwards from the journal (tracking.py), so a dead
tracking server never loses a measurement.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from harness.hosts import Host
from harness.journal import RunJournal


@dataclass
class SweepOutcome:
    results: list[dict] = field(default_factory=list)
    interrupted: bool = False

    @property
    def n_failed(self) -> int:
        return sum(r["status"] != "ok" for r in self.results)


def run_cells(cells: list[dict], hosts: list[Host], journal: RunJournal, console: Console) -> SweepOutcome:
    """Run `cells` on `hosts`, journaling each result. Ctrl-C stops the sweep and keeps what
    finished; the caller reports how to resume."""
    outcome = SweepOutcome()
    columns = [SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("•"), TimeElapsedColumn(), TextColumn("ETA"),
               TimeRemainingColumn(), TextColumn("{task.fields[status]}")]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("cells", total=len(cells), status="")
        try:
            asyncio.run(_sweep(cells, hosts, journal, bar, task, outcome))
        except KeyboardInterrupt:
            outcome.interrupted = True
    return outcome


async def _sweep(cells, hosts, journal, bar, task, outcome) -> None:
    queue: asyncio.Queue = asyncio.Queue()
    for i, cell in enumerate(cells, start=1):
        queue.put_nowait((i, cell))
    n = len(cells)
    running: dict[str, str] = {}

    def show():
        bar.update(task, status=" | ".join(f"{k}: {v}" for k, v in sorted(running.items())))

    async def slot_loop(host: Host, slot: int):
        key = host.name if host.slots == 1 else f"{host.name}[{slot}]"
        while True:
            try:
                i, cell = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            label = cell_label(cell)
            running[key] = f"cell {i}/{n} {label}"
            show()

            def on_progress(p: dict, key=key, i=i, label=label):
                stage = p.get("stage", "")
                rep = f" {p['repeat']}/{p['repeats']}" if "repeat" in p else ""
                running[key] = f"cell {i}/{n} {label} [{stage}{rep}]"
                show()

            t0 = time.perf_counter()
            result = await host.run_cell(cell, slot, on_progress)
            result.setdefault("wall_s", round(time.perf_counter() - t0, 3))
            journal.write_cell(result)                       # the journal first, always
            outcome.results.append(result)
            running.pop(key, None)
            mark = "[green]ok[/]" if result["status"] == "ok" else "[red]failed[/]"
            bar.console.print(f"  {mark} cell {i}/{n} {label} on {host.name}"
                              + _headline(result))
            bar.advance(task)
            show()

    await asyncio.gather(*(slot_loop(h, s) for h in hosts for s in range(h.slots)))


def cell_label(cell: dict) -> str:
    from harness import params
    return params.cell_label(cell)


def _headline(result: dict) -> str:
    m = result.get("metrics") or {}
    if result["status"] != "ok":
        first = (result.get("error") or "").strip().splitlines()
        return f": {first[0][:160]}" if first else ""
    if m.get("tokens_per_s") is None:
        return ""
    return f": {m['tokens_per_s']:.1f} tok/s, accept {m.get('accept_len_mean', 0):.2f}"
