"""`harness runs`: the journaled runs, newest first: scenario, cells ok / failed / not run, the
scenario's targets met (harness.sweep.targets), hosts, GPU, commit, trigger, date. Read only: a
damaged file is counted and named, never moved (that is for the commands that resume or report
a run).

Exit codes: 0 (also when there is no run yet: it says so), 2 bad input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.commands.options import console, fail_input, results_option
from harness.protocol.errors import InputError


def runs(
    results_dir: Path = results_option("journal root is RESULTS/runs"),
    scenario: Optional[str] = typer.Option(None, "--scenario", help="only runs of this scenario"),
    last: int = typer.Option(20, "--last", min=1, help="at most this many runs (the newest)"),
):
    """List the journaled runs, newest first."""
    root = results_dir / "runs"
    if root.exists() and not root.is_dir():
        raise fail_input(InputError(str(root), None, None, "is not a folder"))
    rows = [summarize(p) for p in sorted(root.glob("*"), reverse=True) if (p / "run.json").exists()]
    if scenario is not None:
        rows = [r for r in rows if r["scenario"] == scenario]
    if not rows:
        console.print(f"No runs in {escape(str(root))}"
                      + (f" of scenario {escape(scenario)}" if scenario else "")
                      + " yet: `harness run SCENARIO` makes one.", highlight=False)
        return
    table = Table(title=f"Runs in {escape(str(root))} (newest first)", title_justify="left",
                  header_style="bold")
    for name in ("run", "scenario", "cells", "targets", "hosts", "GPU", "commit", "trigger", "created"):
        table.add_column(name, justify="right" if name in ("cells", "targets") else "left")
    for r in rows[:last]:
        table.add_row(*(escape(str(r[k])) if k not in ("cells", "targets") else r[k] for k in
                        ("run", "scenario", "cells", "targets", "hosts", "gpu", "commit", "trigger", "created")))
    console.print(table)
    if len(rows) > last:
        console.print(f"{len(rows) - last} older run(s) not shown (--last N)", style="dim")


def summarize(path: Path) -> dict:
    """One run folder as a row; what cannot be read says so."""
    row = {"run": path.name, "scenario": "?", "cells": "?", "targets": "", "hosts": "", "gpu": "",
           "commit": "", "trigger": "", "created": ""}
    try:
        run = json.loads((path / "run.json").read_text(encoding="utf-8"))
        meta = run.get("meta") or {}
        expected = len(run.get("cells") or [])
    except (OSError, ValueError, AttributeError):
        row.update(scenario="[red]run.json damaged[/]")
        return row
    ok = failed = damaged = 0
    hosts, gpus = set(), set()
    results = []
    for cell_file in sorted((path / "cells").glob("*.json")):
        try:
            result = json.loads(cell_file.read_text(encoding="utf-8"))
            status = result["status"]
        except (OSError, ValueError, KeyError, TypeError):
            damaged += 1
            continue
        results.append(result)
        ok += status == "ok"
        failed += status != "ok"
        hosts.add(str(result.get("host") or "?"))
        env = result.get("env") or {}
        gpus.add(str(env.get("gpu") or "cpu") if isinstance(env, dict) else "?")
    missing = max(expected - ok - failed - damaged, 0)
    cells = f"[green]{ok} ok[/]" + (f", [red]{failed} failed[/]" if failed else "") + \
        (f", [yellow]{missing} not run[/]" if missing else "") + \
        (f", [red]{damaged} damaged[/]" if damaged else "")
    sha = str(meta.get("git_sha") or "")
    row.update(scenario=str(run.get("scenario", "?")), cells=cells, targets=targets_met(path, results),
               hosts=", ".join(sorted(hosts)) or ", ".join(meta.get("hosts") or []),
               gpu=", ".join(sorted(gpus)), commit=sha[:10] + (" (dirty)" if meta.get("git_dirty") else ""),
               trigger=str(meta.get("trigger") or ""), created=str(run.get("created_at") or ""))
    return row


def targets_met(path: Path, results: list[dict]) -> str:
    """How many of the run's scenario's targets its results meet ("3 / 7 met"; "" where it has
    none, "?" where they do not read)."""
    stored = path / "scenario.yaml"
    try:
        text = stored.read_text(encoding="utf-8") if stored.is_file() else ""
        if "targets" not in text:      # most runs: no YAML parsed, no pydantic imported
            return ""
        from harness.sweep import targets
        from harness.sweep.scenario import parse_targets
        judged = targets.judge_all(parse_targets(text, stored),
                                   [r for r in results if isinstance(r.get("cell"), dict)])
    except (OSError, ValueError, InputError):
        return "[red]?[/]"
    if not judged:
        return ""
    met = targets.counts(judged)[targets.MET]
    return f"[{'green' if met == len(judged) else 'yellow'}]{met} / {len(judged)} met[/]"
