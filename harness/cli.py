"""The `harness` command line (the console script), assembled from harness/commands/, one
module per verb, registered in the order `harness --help` lists them (commands, then groups).
Each command module states its exit codes; docs/ARCHITECTURE.md holds the contracts.
"""

from __future__ import annotations

import typer

from harness.commands import (baseline, bisect, compare, gate, history, hosts, import_, ingest,
                              report, run, runs, ui, validate)

app = typer.Typer(help="Benchmark and regression harness for speculative decoding with draft trees.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False)


def _version(value: bool) -> None:
    if value:
        import harness
        typer.echo(f"specdec-harness {harness.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help="print the version and exit")) -> None:
    """Benchmark and regression harness for speculative decoding with draft trees."""


app.command()(validate.validate)
app.command()(run.run)
app.command()(runs.runs)
app.command(name="import")(import_.import_)
app.command()(ingest.ingest)
app.command()(report.report)
app.command()(compare.compare)
app.command()(ui.ui)
app.command()(gate.gate)
app.command()(history.history)
app.command()(bisect.bisect)
app.add_typer(hosts.app, name="hosts")
app.add_typer(baseline.app, name="baseline")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
