"""`harness report RUN`, and `write_report`, which `harness run` calls at the end of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.commands.options import console, err, fail_input, results_option, tracking_uri_option


def report(run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs)"),
           compare: Optional[str] = typer.Option(None, "--compare", metavar="RUN",
                                                 help="base run to compare with: head/base ratio and verdict per cell"),
           reference: Optional[str] = typer.Option(None, "--reference", metavar="MODE",
                                                   help="verify mode the speedup heatmap divides by (default: triton, else sdpa, ...)"),
           tracking_uri: Optional[str] = tracking_uri_option(
               "MLflow store to attach the report to (default: where the run was logged)"),
           no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not upload the report to MLflow"),
           results_dir: Path = results_option()):
    """Write a run's HTML report (results/runs/RUN/report/index.html), print its path and
    attach it to the run in MLflow."""
    from harness.sweep import journal as jr
    from harness.sweep.summary import summary_table
    try:
        journal = jr.RunJournal.open(results_dir / "runs", run_id)
        base = jr.RunJournal.open(results_dir / "runs", compare) if compare else None
    except jr.JournalError as e:
        raise fail_input(e)
    results = list(journal.results().values())
    console.print(summary_table(results, f"{journal.scenario_name} — run {run_id}"))
    missing = journal.missing()
    if missing:
        console.print(f"{len(missing)} of {len(journal.cells)} cell(s) have no ok result")
    path = write_report(journal, None if no_mlflow else (tracking_uri or "auto"), base, reference)
    if path is None:
        raise typer.Exit(1)


def write_report(journal, tracking_uri: Optional[str], base=None, reference: Optional[str] = None):
    """Write the run's HTML report and print its path; attach it to the run's parent in MLflow
    unless `tracking_uri` is None ("auto": the store the run was logged to). A report that
    cannot be written or uploaded is a warning, never a lost run: returns the path or None."""
    from harness.sweep import tracking
    from harness.dashboards.report import build_report
    from harness.gate import runs
    verdicts = runs.compare(journal.results(), base.results()) if base is not None else None
    try:
        built = build_report(journal, base=base, verdicts=verdicts, verdict_note=runs.VERDICT_NOTE,
                             reference=reference)
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
