"""`harness baseline mark RUN` and `harness baseline show SCENARIO`: the accepted baselines a
gate compares with (MLflow runs tagged baseline=true, or baseline files). Exit 0 done, 2 error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.commands.options import (Command, Group, baselines_option, console, err, fail_input,
                                      results_option, tracking_uri_option)
from harness.protocol.errors import InputError

app = typer.Typer(help="Accepted baselines: mark a run as one, show the current ones.",
                  no_args_is_help=True, cls=Group)


@app.command("mark", cls=Command)
def mark(
    run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs, or a run in MLflow)"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="tag the run's MLflow runs baseline=true"),
    file: bool = typer.Option(False, "--file/--no-file", help="write results/baselines/<gpu>/<scenario>.json"),
    replace: bool = typer.Option(False, "--replace", help="with --file: drop cells this run does not have"),
    results_dir: Path = results_option(),
    baselines_dir: Optional[Path] = baselines_option(),
    tracking_uri: Optional[str] = tracking_uri_option(),
):
    """Make a run the baseline its scenario's next gates compare with."""
    from harness.sweep import tracking
    from harness.gate import baselines as bl
    from harness.sweep.journal import JournalError, RunJournal

    try:
        if not (mlflow or file):
            raise InputError(None, None, None, "nothing to do: --no-mlflow without --file")
        journal = None
        try:
            journal = RunJournal.open(results_dir / "runs", run_id)
        except JournalError as e:
            if file:
                raise InputError(None, None, None, f"--file needs the run's journal: {e}") from None
        if journal is not None:
            failed = [cid for cid, r in journal.results().items() if r.get("status") != "ok"]
            if journal.meta.get("git_dirty"):
                err.print(f"[yellow]warning:[/] run {run_id} measured a tree with uncommitted changes")
            if failed:
                err.print(f"[yellow]warning:[/] {len(failed)} failed cell(s) are not marked")
            journal.update_meta(baseline=True)
        if file:
            root = baselines_dir or results_dir / "baselines"
            for path, n, kept in bl.write_file(root, journal, replace=replace):
                console.print(f"Baseline file {path}: {n} cell(s) from {run_id}"
                              + (f", {kept} kept from earlier runs" if kept else ""), highlight=False)
        if mlflow:
            if journal is not None:   # make sure every result is uploaded before tagging it
                try:
                    tracking.log_run(journal, tracking_uri)
                except tracking.TrackingUnavailable as e:
                    raise InputError(None, None, None, f"MLflow: {e}") from None
            tagged, skipped = bl.mark_mlflow(tracking_uri, run_id,
                                             journal.scenario_name if journal else None)
            console.print(f"MLflow: {tagged} cell run(s) of {run_id} tagged baseline=true"
                          + (f" ({skipped} failed cell(s) left untagged)" if skipped else ""),
                          highlight=False)
    except InputError as e:
        raise fail_input(e)


@app.command("show", cls=Command)
def show(
    scenario: str = typer.Argument(..., help="scenario YAML file, or its name"),
    gpu: Optional[str] = typer.Option(None, "--gpu", metavar="CLASS",
                                      help="GPU class, e.g. h200 (default: the only class that "
                                           "has baselines of this scenario)"),
    source: str = typer.Option("mlflow", "--source", help="mlflow | file"),
    results_dir: Path = results_option(),
    baselines_dir: Optional[Path] = baselines_option(),
    tracking_uri: Optional[str] = tracking_uri_option(),
):
    """List the baseline each cell of a scenario would be compared with."""
    from statistics import median

    from harness.gate import baselines as bl

    try:
        name = scenario
        if Path(scenario).is_file():
            from harness.sweep.scenario import load_scenario
            name = load_scenario(scenario).name
        if source == "file":
            sides = bl.from_file(baselines_dir or results_dir / "baselines", name, gpu)
        elif source == "mlflow":
            sides = bl.from_mlflow(tracking_uri, name, gpu)
        else:
            raise InputError(None, None, None, f"--source must be mlflow or file, not '{source}'")
    except InputError as e:
        raise fail_input(e)
    from rich.markup import escape

    classes = sorted({side.gpu_class for side in sides.values() if side.gpu_class})
    console.print(f"Baselines of {escape(name)} on GPU class {', '.join(classes) or '?'}:",
                  highlight=False)
    rows = []
    for cid, side in sides.items():
        metric = "kernel_us" if "kernel_us" in side.samples else "tokens_per_s"
        values = side.samples.get(metric)
        what = (f"{median(values):.2f} µs" if metric == "kernel_us" else
                f"{median(values):.1f} tok/s") + f" (n={len(values)})" if values else f"no {metric}"
        rows.append((cid, side.label, what, f"from {side.source}"))
    # Columns padded to their widest entry; plain lines, so a narrow terminal never folds them.
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        console.print("  " + "  ".join(escape(v.ljust(w)) for v, w in zip(row, widths))
                      + "  " + escape(row[3]), highlight=False)
