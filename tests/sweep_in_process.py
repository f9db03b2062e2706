"""A sweep through the real runner in the test's own process (the host tests' common start)."""

from __future__ import annotations

import io
import threading
import time

from rich.console import Console

from harness.sweep import runner
from harness.sweep.journal import RunJournal


def sweep(cells, hosts, tmp_path, scenario: str, background: bool = False):
    """Run `cells` on `hosts` into a journal under tmp_path. In the foreground: (outcome,
    journal, console text). In the background: (thread, box, journal, console buffer); the
    outcome is box["outcome"] once the thread ends."""
    journal = RunJournal.create(tmp_path / "runs", f"run-{time.monotonic_ns()}", scenario,
                                None, "", cells, {})
    out = io.StringIO()
    console = Console(file=out, width=200)
    box = {}

    def go():
        box["outcome"] = runner.run_cells(cells, hosts, journal, console)

    if not background:
        go()
        return box["outcome"], journal, out.getvalue()
    thread = threading.Thread(target=go)
    thread.start()
    return thread, box, journal, out
