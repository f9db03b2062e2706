"""The `harness` command line (the console script), assembled from harness/commands/, one
module per verb, registered in the order `harness --help` lists them (commands, then groups).
Each command module states its exit codes; docs/ARCHITECTURE.md holds the contracts.
"""

from __future__ import annotations

import typer

from harness.commands import (baseline, bisect, compare, counters, gate, history, hosts, import_,
                              ingest, report, run, runs, ui, validate)
from harness.commands.options import Command, Group

app = typer.Typer(help="Benchmark and regression harness for speculative decoding with draft trees.",
                  no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  cls=Group)


def _version(value: bool) -> None:
    if value:
        import harness
        typer.echo(f"specdec-harness {harness.__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help="print the version and exit")) -> None:
    """Benchmark and regression harness for speculative decoding with draft trees."""


app.command(cls=Command)(validate.validate)
app.command(cls=Command)(run.run)
app.command(cls=Command)(runs.runs)
app.command(name="import", cls=Command)(import_.import_)
app.command(cls=Command)(ingest.ingest)
app.command(cls=Command)(report.report)
app.command(cls=Command)(compare.compare)
app.command(cls=Command)(counters.counters)
app.command(cls=Command)(ui.ui)
app.command(cls=Command)(gate.gate)
app.command(cls=Command)(history.history)
app.command(cls=Command)(bisect.bisect)
app.add_typer(hosts.app, name="hosts")
app.add_typer(baseline.app, name="baseline")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
