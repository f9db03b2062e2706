"""The `harness` command line.

Exit codes (DESIGN.md): 0 every cell ok; 1 some cells failed (the rest still ran and were
logged); 2 bad input or usage, reported as one line naming file:line:column (or the host, or
the run), never as a traceback.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from harness.errors import InputError

app = typer.Typer(help="Benchmark and regression harness for speculative decoding with draft trees.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
hosts_app = typer.Typer(help="Inspect the hosts inventory.", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")

console = Console(soft_wrap=True)   # never wrap a command the user will copy
err = Console(stderr=True, soft_wrap=True)

RESULTS_DIR = Path("results")


def fail_input(e: Exception) -> "typer.Exit":
    err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


@app.command()
def validate(scenario: Path = typer.Argument(..., help="scenario YAML file")):
    """Check a scenario and list the cells it expands to (exit 0 valid, 2 invalid)."""
    from harness.scenario import load_scenario
    try:
        sc = load_scenario(scenario)
    except InputError as e:
        raise fail_input(e)
    cells = sc.cells()
    console.print(f"{scenario}: valid — scenario [bold]{sc.name}[/], {len(cells)} cell(s)")
    from harness import params
    for c in cells:
        console.print(f"  {params.cell_id(c)}  {params.cell_label(c)}", highlight=False)


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    host: Optional[list[str]] = typer.Option(None, "--host", help="run on this host (repeatable)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri",
                                               help="MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    resume: Optional[str] = typer.Option(None, "--resume", metavar="RUN_ID",
                                         help="finish a run: run only its missing or failed cells, log what was not logged"),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="manual | nightly | pr (default: the scenario's)"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results", help="journal root is RESULTS/runs"),
):
    """Run a scenario's cells, journal every result, log the run to MLflow."""
    from harness import gitinfo, hosts as hostmod, journal as jr, params, runner, tracking
    from harness.scenario import TRIGGERS, load_scenario, validate_tracking_uri
    from harness.summary import summary_table

    try:
        sc = load_scenario(scenario)
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        if trigger is not None and trigger not in TRIGGERS:
            raise InputError(None, None, None, f"--trigger must be one of {', '.join(TRIGGERS)}, not '{trigger}'")
        inventory = hostmod.local_hosts()
        wanted = host or sc.hosts or ["local"]
        unknown = [h for h in wanted if h not in inventory]
        if unknown:
            raise InputError(None, None, None,
                             f"unknown host '{unknown[0]}' (known: {', '.join(sorted(inventory))})")
        chosen = [inventory[h] for h in wanted]
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
        cells = journal.missing()
        console.print(f"Resuming run [bold]{resume}[/]: {len(cells)} of {len(journal.cells)} cell(s) to run")
    else:
        git = gitinfo.git_info()
        meta = {"git_sha": git["sha"], "git_branch": git["branch"], "git_dirty": git["dirty"],
                "trigger": trigger or sc.trigger, "hosts": wanted, "tracking_uri": uri,
                "argv": sys.argv, "controller": {"python": platform.python_version(),
                                                 "platform": platform.platform()}}
        journal = jr.RunJournal.create(root, jr.new_run_id(), sc.name, scenario, sc.text, sc.cells(), meta)
        cells = [c["cell"] for c in journal.cells]
        console.print(f"Run [bold]{journal.run_id}[/]: scenario [bold]{sc.name}[/], "
                      f"{len(cells)} cell(s) on {', '.join(wanted)}")

    outcome = runner.run_cells(cells, chosen, journal, console)
    from harness.derived import add_speedup_vs_ar
    for r in add_speedup_vs_ar(list(journal.results().values())):
        journal.write_cell(r)                  # derived metrics join the journal record
    results = list(journal.results().values())
    console.print(summary_table(results, f"{sc.name} — run {journal.run_id}"))

    # MLflow after the journal: a dead server costs a re-upload, never a measurement.
    try:
        report = tracking.log_run(journal, uri)
        console.print(str(report), highlight=False)
    except tracking.TrackingUnavailable as e:
        err.print(f"[yellow]MLflow logging failed:[/] {e}\n"
                  f"The results are safe in the journal; log them later with: "
                  f"harness run {scenario} --resume {journal.run_id}", highlight=False)

    console.print(f"Journal: {journal.path}", highlight=False)
    if outcome.interrupted:
        err.print(f"Interrupted. Finish with: harness run {scenario} --resume {journal.run_id}")
        raise typer.Exit(130)
    failed = [r for r in results if r["status"] != "ok"]
    missing = journal.missing()
    if failed or missing:
        err.print(f"{len(missing)} cell(s) failed or missing; rerun them with: "
                  f"harness run {scenario} --resume {journal.run_id}")
        raise typer.Exit(1)


@app.command()
def report(run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs)"),
           results_dir: Path = typer.Option(RESULTS_DIR, "--results")):
    """Print a finished run's summary table from its journal."""
    from harness import journal as jr
    from harness.summary import summary_table
    try:
        journal = jr.RunJournal.open(results_dir / "runs", run_id)
    except jr.JournalError as e:
        raise fail_input(e)
    results = list(journal.results().values())
    console.print(summary_table(results, f"{journal.scenario_name} — run {run_id}"))
    missing = journal.missing()
    if missing:
        console.print(f"{len(missing)} of {len(journal.cells)} cell(s) have no ok result")


@app.command()
def ui(port: int = typer.Option(5000, help="port of the MLflow UI"),
       host: str = typer.Option("127.0.0.1", help="address to listen on"),
       tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri")):
    """Open the MLflow UI on the local store (results/mlflow.db)."""
    from harness import tracking
    uri = tracking.resolve_tracking_uri(tracking_uri)
    if uri.startswith(("http://", "https://")):
        console.print(f"The tracking server has its own UI: {uri}")
        return
    console.print(f"MLflow UI on http://{host}:{port} (store {uri}); Ctrl-C to stop")
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                              "--host", host, "--port", str(port)])


@hosts_app.command("check")
def hosts_check():
    """One line per host: reachable, python/torch versions, GPUs."""
    import json
    import subprocess
    from harness.hosts import local_hosts
    for name, h in local_hosts().items():
        code = "import json; from harness.worker import environment; print(json.dumps(environment()))"
        out = subprocess.run([h.python, "-c", code], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            console.print(f"{name}: [red]broken[/] {out.stderr.strip().splitlines()[-1:]}")
            continue
        env = json.loads(out.stdout)
        gpu = f"{env['gpu_count']}× {env['gpu']} (driver {env['driver']})" if env.get("gpu") else "no GPU"
        console.print(f"{name}: reachable, python {env['python']}, torch {env['torch']}, {gpu}",
                      highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
