"""`harness import DIR`: a batch's results (python -m harness.worker --cells FILE --out DIR, on
a host the controller never reached) become a normal run: journal, MLflow, report, gate.

The batch's header (batch.json, from `harness run --export-cells`) carries the scenario text,
which is validated again here: its cells are the run's cells. Each result file must be a worker
result for one of them (its file name, its cell id and its echoed cell agree); anything else
is set aside with a one-line warning and its cell counts as missing. The run records the commit
the batch was exported at (the code it ran), not this checkout's, and the batch host's
environment; results keep their own `env` and host facts as the worker wrote them.

Exit codes as `harness run`: 0 every cell ok and logged, 1 some failed or missing (or the
upload failed), 2 a DIR that is not a batch.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import (console, err, fail_input, results_option,
                                      tracking_uri_option)
from harness.protocol.errors import InputError


def import_(
    batch_dir: Path = typer.Argument(..., metavar="DIR", help="the --out DIR of a worker batch"),
    tracking_uri: Optional[str] = tracking_uri_option(
        "MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
):
    """Make a worker batch's results a run: journal, MLflow, report (as `harness run` ends)."""
    from harness.commands.run import finish
    from harness.protocol import params
    from harness.sweep import journal as jr, tracking
    from harness.sweep.runner import SweepOutcome
    from harness.sweep.scenario import parse_scenario, validate_tracking_uri

    try:
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        batch = _read_batch(batch_dir)
        sc = parse_scenario(batch["scenario_text"], f"{batch_dir}/batch.json (scenario)")
    except InputError as e:
        raise fail_input(e)
    cells = sc.cells()
    ran = batch.get("cell_ids")
    if isinstance(ran, list) and ran:    # the batch of a selection (harness run -k ... --export-cells)
        cells = [c for c in cells if params.cell_id(c) in set(ran)]
    wanted = {params.cell_id(c): c for c in cells}

    results = []
    for path in sorted((batch_dir / "cells").glob("*.json")):
        result, why = _read_result(path, wanted)
        if why:
            err.print(f"[yellow]warning:[/] {escape(str(path))}: {escape(why)}; its cell counts "
                      f"as missing", highlight=False)
        else:
            results.append(result)

    env = batch.get("env") if isinstance(batch.get("env"), dict) else {}
    host = str(env.get("hostname") or "batch")
    meta = {"git_sha": batch.get("git_sha"), "git_branch": batch.get("git_branch"),
            "git_dirty": batch.get("git_dirty"), "trigger": batch.get("trigger") or sc.trigger,
            "hosts": [host], "tracking_uri": uri,
            "imported_from": {"dir": str(batch_dir), "started_at": batch.get("started_at"),
                              "finished_at": batch.get("finished_at"),
                              "imported_on": socket.gethostname()}}
    try:
        journal = jr.RunJournal.create(results_dir / "runs", jr.new_run_id(), sc.name, None,
                                       sc.text, cells, meta)
        for r in results:
            r.setdefault("host", host)
            journal.write_cell(r)
    except jr.JournalError as e:
        raise fail_input(e)
    console.print(f"Imported run [bold]{journal.run_id}[/]: scenario [bold]{escape(sc.name)}[/], "
                  f"{len(results)} of {len(cells)} cell(s) from {escape(str(batch_dir))} "
                  f"(measured on {escape(host)})", highlight=False)
    finish(journal, uri, SweepOutcome(results=results),
           f"harness import {batch_dir} (a new run), or harness run "
           f"{journal.path / jr.SCENARIO_FILE} --resume {journal.run_id}")


def _read_batch(batch_dir: Path) -> dict:
    path = batch_dir / "batch.json"
    try:
        batch = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), None, None, "no such file: not the --out DIR of a worker "
                                                "batch (python -m harness.worker --cells FILE "
                                                "--out DIR)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(str(path), None, None, f"damaged ({e})") from None
    if not isinstance(batch, dict) or not isinstance(batch.get("scenario_text"), str):
        raise InputError(str(path), None, None, "has no scenario: export the cells with "
                                                "`harness run SCENARIO --export-cells FILE`")
    return batch


def _read_result(path: Path, wanted: dict[str, dict]) -> tuple[dict | None, str | None]:
    """(the result in the file at `path`, None), or (None, why it is not the result of one of
    the `wanted` cells)."""
    from harness.protocol import params

    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"damaged ({e})"
    if not isinstance(result, dict) or not isinstance(result.get("cell"), dict) \
            or result.get("status") not in ("ok", "failed"):
        return None, "not a worker result"
    if path.stem not in wanted:
        return None, "not a cell of the batch's scenario"
    try:
        echoed = params.cell_id(params.canonical(result["cell"]))
    except (TypeError, ValueError):
        echoed = None
    if result.get("cell_id") != path.stem or echoed != path.stem:
        return None, f"names cell {str(result.get('cell_id'))[:40]!r}, not the file's {path.stem}"
    return result, None
