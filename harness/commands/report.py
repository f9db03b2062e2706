"""`harness report RUN`, and `write_report`, which `harness run` calls at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import (cell_filter_option, console, err, fail_input,
                                      results_option, tracking_uri_option)


def report(run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs)"),
           compare: Optional[str] = typer.Option(None, "--compare", metavar="RUN",
                                                 help="base run to compare with: head/base ratio and verdict per cell, "
                                                      "the base drawn faded in every figure"),
           reference: Optional[str] = typer.Option(None, "--reference", metavar="MODE",
                                                   help="verify mode the speedup heatmap divides by (default: triton, else sdpa, ...)"),
           tracking_uri: Optional[str] = tracking_uri_option(
               "MLflow store to attach the report to (default: where the run was logged)"),
           no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not upload the report to MLflow"),
           cell_filter: Optional[str] = cell_filter_option(),
           targets_from: Optional[Path] = typer.Option(None, "--targets", metavar="SCENARIO",
                                                       help="judge the run against this scenario file's targets "
                                                            "instead of its own (e.g. a run made before they were written)"),
           results_dir: Path = results_option()):
    """Write a run's HTML report, print its path and attach it to the run in MLflow.

    The report is results/runs/RUN/report/index.html. A report narrowed with -k is not attached:
    the run's report in MLflow stays whole."""
    from harness.protocol.errors import InputError
    from harness.sweep import journal as jr
    from harness.sweep.summary import summary_table
    try:
        journal = jr.RunJournal.open(results_dir / "runs", run_id)
        base = jr.RunJournal.open(results_dir / "runs", compare) if compare else None
        only = selected(journal, cell_filter) if cell_filter is not None else None
        wanted = read_targets(targets_from) if targets_from is not None else None
    except (jr.JournalError, InputError) as e:
        raise fail_input(e)
    stored = journal.results()
    results = [r for cid, r in stored.items() if only is None or cid in only]
    console.print(summary_table(results, f"{journal.scenario_name} — run {run_id}"))
    show_targets(journal, results, wanted, base,
                 [r for cid, r in base.results().items() if only is None or cid in only] if base else ())
    planned = [c for c in journal.cells if only is None or c["cell_id"] in only]
    missing = [c for c in planned if (stored.get(c["cell_id"]) or {}).get("status") != "ok"]
    if missing:
        console.print(f"{len(missing)} of {len(planned)} cell(s) have no ok result")
    if only is not None and not no_mlflow:
        console.print(f"[dim]Report not attached to MLflow: narrowed with -k {cell_filter!r}[/]",
                      highlight=False)
    uri = None if no_mlflow or only is not None else (tracking_uri or "auto")
    path = write_report(journal, uri, base, reference, only=only, only_expr=cell_filter or "", targets=wanted)
    if path is None:
        raise typer.Exit(1)


def read_targets(path: Path) -> list[dict]:
    """The targets of the scenario file at `path` (an InputError where it has none or they do
    not read): a run judged against targets other than its own."""
    from harness.protocol.errors import InputError
    from harness.sweep.scenario import parse_targets
    from harness.sweep.yamldoc import read_text
    wanted = parse_targets(read_text(path, "scenario"), path)
    if not wanted:
        raise InputError(str(path), None, None, "--targets: this scenario has no targets")
    return wanted


def show_targets(journal, results: list[dict], wanted: Optional[list[dict]] = None,
                 base=None, base_results: list[dict] = ()) -> list:
    """The run's targets (or `wanted`) judged on `results` (harness.sweep.targets), as a table
    after the summary, and returned; with a `base` run, judged on its results too and shown
    base → head. Nothing where there are none; targets that do not read are one line."""
    from harness.protocol.errors import InputError
    from harness.sweep import targets
    from harness.sweep.summary import targets_table
    try:
        wanted = targets.of_run(journal) if wanted is None else wanted
        outcomes = targets.judge_run(journal, results, wanted)
        before = targets.judge_run(base, list(base_results), wanted) if base is not None else None
    except InputError as e:
        err.print(f"[yellow]targets not judged:[/] {escape(str(e))}", highlight=False)
        return []
    if outcomes:
        console.print(targets_table(outcomes, "Targets" if before is None else "Targets, base → head",
                                    before))
    return outcomes


def selected(journal, expr: str) -> set[str]:
    """The ids of the run's cells (planned, or only in its results) that `-k expr` selects;
    an InputError when it is malformed or selects none."""
    from harness.sweep.cellfilter import select

    entries = [(c["cell_id"], c["cell"]) for c in journal.cells]
    planned = {cid for cid, _ in entries}
    entries += [(cid, r.get("cell") or {}) for cid, r in journal.results().items()
                if cid not in planned]
    chosen = {id(cell) for cell in select([cell for _, cell in entries], expr)}
    return {cid for cid, cell in entries if id(cell) in chosen}


def write_report(journal, tracking_uri: Optional[str], base=None, reference: Optional[str] = None,
                 *, only: Optional[set[str]] = None, only_expr: str = "", targets: Optional[list[dict]] = None):
    """Write the run's HTML report and print its path; attach it to the run's parent in MLflow
    unless `tracking_uri` is None ("auto": the store the run was logged to). A report that
    cannot be written or uploaded is a warning, never a lost run: returns the path or None.
    `only`: the cell ids to report on (`-k only_expr`); `targets`: judged instead of the run's own."""
    from harness.sweep import tracking
    from harness.dashboards.report import build_report
    from harness.gate import runs
    verdicts = runs.compare(journal.results(), base.results()) if base is not None else None
    try:
        built = build_report(journal, base=base, verdicts=verdicts, verdict_note=runs.VERDICT_NOTE,
                             reference=reference, only=only, only_expr=only_expr, targets=targets)
    except Exception as e:  # noqa: BLE001 - the journal and MLflow run are intact either way
        err.print(f"[yellow]report failed:[/] {type(e).__name__}: {e}", highlight=False)
        return None
    console.print(f"Report: {built.path}", highlight=False)
    if built.verdicts is not None:
        from collections import Counter
        tally = Counter(v.verdict for v in built.verdicts.values())
        console.print(f"Compared with {base.run_id}: "
                      + ", ".join(f"{n} {word}" for word, n in tally.most_common()), highlight=False)
    if tracking_uri is not None:
        try:
            tracking.log_report(journal, built.path.parent,
                                None if tracking_uri == "auto" else tracking_uri)
            console.print("Report attached to the MLflow run (artifacts: report/index.html)")
        except tracking.TrackingUnavailable as e:
            console.print(f"[dim]Report not attached to MLflow: {e}[/]", highlight=False)
    return built.path
