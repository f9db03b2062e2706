"""`harness run SCENARIO`: run a scenario's cells on host slots, journal every result, upload
the journal to MLflow and write the report.

Exit codes: 0 every cell ok and logged; 1 some cells failed (the rest still ran and were
logged), or the run is unfinished (the MLflow upload failed, the disk refused a result:
`--resume` finishes it); 2 bad input; 130 interrupted.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import (cell_filter_option, console, err, fail_input,
                                      hosts_file_option, max_cells_option, results_option,
                                      tracking_uri_option)
from harness.commands.report import show_targets, write_report
from harness.protocol.errors import InputError


def run(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    host: Optional[list[str]] = typer.Option(None, "--host", help="run on this host (repeatable)"),
    hosts_file: Optional[Path] = hosts_file_option(
        "hosts inventory (default ./hosts.yaml if present; `local` always exists)"),
    tracking_uri: Optional[str] = tracking_uri_option(
        "MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID",
                                         help="finish a run: run only its missing or failed cells, log what was not logged"),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="manual | nightly | pr (default: the scenario's)"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
    fresh_workers: bool = typer.Option(False, "--fresh-workers",
                                       help="local host: a new worker process per cell instead of one per GPU "
                                            "for the whole run (if you suspect state leaking between cells)"),
    max_cells: Optional[int] = max_cells_option(),
    export_cells: Optional[Path] = typer.Option(
        None, "--export-cells", metavar="FILE",
        help="write the cells to FILE (JSON lines) for `python -m harness.worker --cells FILE "
             "--out DIR` on a host with nothing but torch, then `harness import DIR`; runs nothing"),
    cell_filter: Optional[str] = cell_filter_option(),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="say which cells would run on which hosts; run nothing"),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                            help="also write the run's outcome as JSON (run id, "
                                                 "journal, logged, each cell's status and metrics)"),
):
    """Run a scenario's cells, journal every result, log the run to MLflow."""
    from harness.sweep import gitinfo, journal as jr, runner, tracking
    from harness.hosts.inventory import load_hosts, select_hosts
    from harness.hosts.service import check_cells as check_service_cells
    from harness.sweep.cellfilter import select
    from harness.sweep.scenario import TRIGGERS, load_scenario, validate_tracking_uri

    try:
        sc = load_scenario(scenario, max_cells=max_cells)
        selected = select(sc.cells(), cell_filter)
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        if trigger is not None and trigger not in TRIGGERS:
            raise InputError(None, None, None, f"--trigger must be one of {', '.join(TRIGGERS)}, not '{trigger}'")
        inventory = load_hosts(hosts_file)
        if host:
            chosen = select_hosts(inventory, host, "--host")
        else:
            chosen = select_hosts(inventory, sc.hosts or ["local"], f"{scenario}: hosts")
        # Each service cell against each host's own engine (hosts.yaml service:), now: a
        # conflict is one line before any engine is started or restarted.
        check_service_cells(selected, chosen, str(scenario), sc.given)
        if sc.gpu_busy:                        # the scenario's policy beats the hosts file's
            for h in chosen:
                if hasattr(h, "gpu_busy"):
                    h.gpu_busy = sc.gpu_busy
        if fresh_workers:                      # the flag beats the hosts file's `persistent`
            for h in chosen:
                if hasattr(h, "persistent"):
                    h.persistent = False
        wanted = [h.name for h in chosen]
    except InputError as e:
        raise fail_input(e)
    if dry_run:
        print_plan(sc, selected, wanted, resume)
        return
    if export_cells is not None:
        write_cells_file(export_cells, sc, selected, trigger or sc.trigger)
        return

    root = results_dir / "runs"
    if resume:
        try:
            journal = jr.RunJournal.open(root, resume)
        except jr.JournalError as e:
            raise fail_input(e)
        if journal.scenario_name != sc.name:
            raise fail_input(InputError(str(scenario), None, None,
                                        f"run {resume} is of scenario '{journal.scenario_name}', not '{sc.name}'"))
        try:   # on to the store the run was logged to, unless told otherwise
            uri = validate_tracking_uri(tracking.tracking_uri_for(journal, tracking_uri))
        except InputError as e:
            raise fail_input(e)
        cells = journal.missing()
        if cell_filter and cells:        # nothing missing: a resume that only logs, as without -k
            try:
                cells = select(cells, cell_filter)
            except InputError as e:
                raise fail_input(e)
        console.print(f"Resuming run [bold]{resume}[/]: {len(cells)} of {len(journal.cells)} cell(s) to run")
    else:
        git = gitinfo.git_info()
        meta = {"git_sha": git["sha"], "git_branch": git["branch"], "git_dirty": git["dirty"],
                "trigger": trigger or sc.trigger, "hosts": wanted, "tracking_uri": uri,
                "argv": sys.argv, "controller": {"python": platform.python_version(),
                                                 "platform": platform.platform()}}
        try:   # a full disk here leaves no run folder behind
            journal = jr.RunJournal.create(root, jr.new_run_id(), sc.name, scenario, sc.text, selected, meta)
        except jr.JournalError as e:
            raise fail_input(e)
        cells = [c["cell"] for c in journal.cells]
        console.print(f"Run [bold]{journal.run_id}[/]: scenario [bold]{escape(sc.name)}[/], "
                      f"{len(cells)} cell(s) on {escape(', '.join(wanted))}")

    outcome = runner.run_cells(cells, chosen, journal, console)
    finish(journal, uri, outcome, resume_command(scenario, journal.run_id, tracking_uri), json_out)


def resume_command(scenario: Path, run_id: str, tracking_uri: str | None) -> str:
    """The command that finishes a run, as printed: with the --tracking-uri it was given (a
    resume goes to the journal's store anyway; spelled out, a reader knows where), its
    credentials left for the reader to fill in since the journal never keeps them."""
    import shlex

    from harness.protocol.redact import redact_uri

    command = f"harness run {shlex.quote(str(scenario))} --resume {run_id}"
    if tracking_uri:
        shown = redact_uri(tracking_uri)
        command += " --tracking-uri " + (shlex.quote(shown) if shown == tracking_uri else
                                         "URI-WITH-ITS-CREDENTIALS")
    return command


def finish(journal, uri: str, outcome, resume: str, json_out: Path | None = None) -> None:
    """The end of a run (or an import): derived metrics into the journal, the summary table, the
    MLflow upload, the report, the --json outcome and the exit code. `resume` is the command
    that finishes it."""
    from harness.sweep import journal as jr, tracking
    from harness.sweep.derived import add_speedups
    from harness.sweep.summary import summary_table

    try:
        for r in add_speedups(list(journal.results().values())):
            journal.write_cell(r)              # derived metrics join the journal record
    except jr.JournalFull as e:
        outcome.journal_full = outcome.journal_full or str(e)
    if outcome.journal_full:                   # no upload or report: they write there too
        err.print(f"[red]error:[/] {escape(outcome.journal_full)}; the results written before "
                  f"are kept; once there is space, finish with: {escape(resume)}", highlight=False)
        raise typer.Exit(1)
    results = list(journal.results().values())
    console.print(summary_table(results, f"{journal.scenario_name} — run {journal.run_id}"))
    judged = show_targets(journal, results)

    # MLflow after the journal: a dead server costs a re-upload, never a measurement.
    logged = False
    try:
        report = tracking.log_run(journal, uri)
        console.print(str(report), highlight=False)
        logged = True
    except tracking.TrackingUnavailable as e:
        err.print(f"[yellow]MLflow logging failed:[/] {escape(str(e))}\n"
                  f"The results are safe in the journal; log them later with: "
                  f"{escape(resume)}", highlight=False)
    write_report(journal, uri if logged else None)

    console.print(f"Journal: {escape(str(journal.path))}", highlight=False)
    if json_out is not None:
        write_outcome(json_out, journal, results, logged, outcome.interrupted, resume, judged)
    if outcome.interrupted:
        err.print(f"Interrupted. Finish with: {escape(resume)}")
        raise typer.Exit(130)
    failed = [r for r in results if r["status"] != "ok"]
    missing = journal.missing()
    if failed or missing:
        err.print(f"{len(missing)} cell(s) failed or missing; rerun them with: {escape(resume)}")
    if failed or missing or not logged:        # an upload that failed is unfinished work too
        raise typer.Exit(1)


def write_outcome(path: Path, journal, results: list[dict], logged: bool, interrupted: bool,
                  resume: str, judged: list = ()) -> None:
    """--json FILE: what a script needs after a run, without parsing the console; `judged`:
    the scenario's targets (harness.sweep.targets.Outcome)."""
    from harness.sweep.journal import atomic_write_json

    ran = {r.get("cell_id") for r in results}
    outcome = {"run_id": journal.run_id, "scenario": journal.scenario_name,
               "journal": str(journal.path), "logged": logged, "interrupted": interrupted,
               "resume": resume,
               "not_run": [c["cell_id"] for c in journal.cells if c["cell_id"] not in ran],
               "cells": [
                   {"cell_id": r.get("cell_id"), "label": r.get("label"), "status": r["status"],
                    "error": ((r.get("error") or "").strip().splitlines() or [None])[0],
                    "host": r.get("host"), "metrics": r.get("metrics") or {}}
                   for r in results],
               "targets": [o.to_dict() for o in judged]}
    try:
        atomic_write_json(path, outcome)
    except OSError as e:
        err.print(f"[red]error:[/] {escape(str(path))}: {escape(e.strerror or str(e))}",
                  highlight=False)
        raise typer.Exit(2)


def print_plan(sc, cells: list[dict], hosts: list[str], resume: str | None) -> None:
    """--dry-run: the cells a run would start with and where, and nothing else done."""
    from harness.protocol import params

    what = f"resume {resume}: the missing cells among" if resume else "would run"
    console.print(f"Dry run: scenario [bold]{escape(sc.name)}[/] {what} {len(cells)} cell(s) on "
                  f"{escape(', '.join(hosts))}; nothing was run or written")
    for c in cells:
        console.print(f"  {params.cell_id(c)}  {escape(params.cell_label(c))}", highlight=False)


def write_cells_file(path: Path, sc, cells: list[dict], trigger: str) -> None:
    """The cells as a batch file: a header (what import needs to make a run of it), then one
    canonical cell per line."""
    import json

    from harness.sweep import gitinfo
    git = gitinfo.git_info()
    header = {"harness_batch": {"scenario": sc.name, "scenario_text": sc.text,
                                "git_sha": git["sha"], "git_branch": git["branch"],
                                "git_dirty": git["dirty"], "trigger": trigger,
                                "cells": len(cells)}}
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for cell in cells:
                f.write(json.dumps(cell) + "\n")
    except OSError as e:
        raise fail_input(InputError(str(path), None, None, e.strerror or str(e)))
    console.print(f"{escape(str(path))}: {len(cells)} cell(s) of scenario "
                  f"[bold]{escape(sc.name)}[/]; run them with `python -m harness.worker --cells "
                  f"{escape(path.name)} --out DIR`, then `harness import DIR`", highlight=False)
