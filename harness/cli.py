"""The `harness` command line.

Exit codes (docs/ARCHITECTURE.md): 0 every cell ok; 1 some cells failed (the rest still ran and were
logged), or the run is unfinished (the MLflow upload failed, the disk refused a result:
`--resume` finishes it); 2 bad input or usage, reported as one line naming file:line:column
(or the host, or the run), never as a traceback.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from harness.protocol.errors import InputError

app = typer.Typer(help="Benchmark and regression harness for speculative decoding with draft trees.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
hosts_app = typer.Typer(help="Inspect the hosts inventory.", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")

console = Console(soft_wrap=True)   # never wrap a command the user will copy
err = Console(stderr=True, soft_wrap=True)

RESULTS_DIR = Path("results")


def max_cells_option():
    """`--max-cells N`: the cap on a scenario's cells, raised on purpose for a huge sweep."""
    return typer.Option(None, "--max-cells", min=1, metavar="N",
                        help="allow a scenario of up to N cells (default 10000: more is "
                             "usually a typo in the matrix)")


def fail_input(e: Exception) -> "typer.Exit":
    err.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


@app.command()
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


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    host: Optional[list[str]] = typer.Option(None, "--host", help="run on this host (repeatable)"),
    hosts_file: Optional[Path] = typer.Option(None, "--hosts", metavar="FILE",
                                              help="hosts inventory (default ./hosts.yaml if present; `local` always exists)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                               help="MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID",
                                         help="finish a run: run only its missing or failed cells, log what was not logged"),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="manual | nightly | pr (default: the scenario's)"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results", help="journal root is RESULTS/runs"),
    fresh_workers: bool = typer.Option(False, "--fresh-workers",
                                       help="local host: a new worker process per cell instead of one per GPU "
                                            "for the whole run (if you suspect state leaking between cells)"),
    max_cells: Optional[int] = max_cells_option(),
):
    """Run a scenario's cells, journal every result, log the run to MLflow."""
    from harness.sweep import gitinfo, journal as jr, runner, tracking
    from harness.hosts.inventory import load_hosts, select_hosts
    from harness.sweep.scenario import TRIGGERS, load_scenario, validate_tracking_uri
    from harness.sweep.summary import summary_table

    try:
        sc = load_scenario(scenario, max_cells=max_cells)
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        if trigger is not None and trigger not in TRIGGERS:
            raise InputError(None, None, None, f"--trigger must be one of {', '.join(TRIGGERS)}, not '{trigger}'")
        inventory = load_hosts(hosts_file)
        if host:
            chosen = select_hosts(inventory, host, "--host")
        else:
            chosen = select_hosts(inventory, sc.hosts or ["local"], f"{scenario}: hosts")
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
        console.print(f"Resuming run [bold]{resume}[/]: {len(cells)} of {len(journal.cells)} cell(s) to run")
    else:
        git = gitinfo.git_info()
        meta = {"git_sha": git["sha"], "git_branch": git["branch"], "git_dirty": git["dirty"],
                "trigger": trigger or sc.trigger, "hosts": wanted, "tracking_uri": uri,
                "argv": sys.argv, "controller": {"python": platform.python_version(),
                                                 "platform": platform.platform()}}
        try:   # a full disk here leaves no run folder behind
            journal = jr.RunJournal.create(root, jr.new_run_id(), sc.name, scenario, sc.text, sc.cells(), meta)
        except jr.JournalError as e:
            raise fail_input(e)
        cells = [c["cell"] for c in journal.cells]
        console.print(f"Run [bold]{journal.run_id}[/]: scenario [bold]{escape(sc.name)}[/], "
                      f"{len(cells)} cell(s) on {escape(', '.join(wanted))}")

    outcome = runner.run_cells(cells, chosen, journal, console)
    from harness.sweep.derived import add_speedup_vs_ar
    try:
        for r in add_speedup_vs_ar(list(journal.results().values())):
            journal.write_cell(r)              # derived metrics join the journal record
    except jr.JournalFull as e:
        outcome.journal_full = outcome.journal_full or str(e)
    if outcome.journal_full:                   # no upload or report: they write there too
        err.print(f"[red]error:[/] {escape(outcome.journal_full)}; the results written before "
                  f"are kept; once there is space, finish with: harness run "
                  f"{escape(str(scenario))} --resume {journal.run_id}", highlight=False)
        raise typer.Exit(1)
    results = list(journal.results().values())
    console.print(summary_table(results, f"{sc.name} — run {journal.run_id}"))

    # MLflow after the journal: a dead server costs a re-upload, never a measurement.
    logged = False
    try:
        report = tracking.log_run(journal, uri)
        console.print(str(report), highlight=False)
        logged = True
    except tracking.TrackingUnavailable as e:
        err.print(f"[yellow]MLflow logging failed:[/] {escape(str(e))}\n"
                  f"The results are safe in the journal; log them later with: "
                  f"harness run {escape(str(scenario))} --resume {journal.run_id}", highlight=False)
    write_report(journal, uri if logged else None)

    console.print(f"Journal: {escape(str(journal.path))}", highlight=False)
    if outcome.interrupted:
        err.print(f"Interrupted. Finish with: harness run {escape(str(scenario))} --resume "
                  f"{journal.run_id}")
        raise typer.Exit(130)
    failed = [r for r in results if r["status"] != "ok"]
    missing = journal.missing()
    if failed or missing:
        err.print(f"{len(missing)} cell(s) failed or missing; rerun them with: "
                  f"harness run {escape(str(scenario))} --resume {journal.run_id}")
    if failed or missing or not logged:        # an upload that failed is unfinished work too
        raise typer.Exit(1)


@app.command()
def report(run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs)"),
           compare: Optional[str] = typer.Option(None, "--compare", metavar="RUN",
                                                 help="base run to compare with: head/base ratio and verdict per cell"),
           reference: Optional[str] = typer.Option(None, "--reference", metavar="MODE",
                                                   help="verify mode the speedup heatmap divides by (default: triton, else sdpa, ...)"),
           tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                                      help="MLflow store to attach the report to (default: where the run was logged)"),
           no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not upload the report to MLflow"),
           results_dir: Path = typer.Option(RESULTS_DIR, "--results")):
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
    try:
        built = build_report(journal, base=base, reference=reference)
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


@app.command()
def ui(port: int = typer.Option(5000, help="port of the MLflow UI"),
       host: str = typer.Option("127.0.0.1", help="address to listen on"),
       tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri")):
    """Open the MLflow UI on the local store (results/mlflow.db)."""
    from harness.sweep import tracking
    from harness.protocol.redact import redact_uri
    uri = tracking.resolve_tracking_uri(tracking_uri)
    shown = escape(redact_uri(uri))            # the real one goes to mlflow, never the screen
    if uri.startswith(("http://", "https://")):
        console.print(f"The tracking server has its own UI: {shown}")
        return
    console.print(f"MLflow UI on http://{host}:{port} (store {shown}); Ctrl-C to stop")
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                              "--host", host, "--port", str(port)])


@hosts_app.command("check")
def hosts_check(
    names: Optional[list[str]] = typer.Argument(None, metavar="[HOST]...", help="hosts to check (default: all)"),
    hosts_file: Optional[Path] = typer.Option(None, "--hosts", metavar="FILE",
                                              help="hosts inventory (default ./hosts.yaml if present)"),
):
    """One line per host, checked in parallel: reachable, host key known, python/torch
    versions, GPUs, driver, busy GPUs. Exit 0 when every host is usable, 1 otherwise."""
    import asyncio
    from harness.hosts import check as hostcheck
    from harness.hosts.inventory import load_hosts, select_hosts
    try:
        inventory = load_hosts(hosts_file)
        chosen = select_hosts(inventory, names, "hosts check") if names else list(inventory.values())
    except InputError as e:
        raise fail_input(e)
    usable = True
    for facts in asyncio.run(hostcheck.check_all(chosen)):
        ok, line = hostcheck.describe(facts)
        usable = usable and ok
        console.print(line, highlight=False)
    if not usable:
        raise typer.Exit(1)


# Regression gating: gate, history, bisect, baseline (harness/commands/gate.py).
from harness.commands.gate import register as _register_gate_commands  # noqa: E402

_register_gate_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
