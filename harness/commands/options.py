"""What the verbs share: the consoles, the results root, the one-line input error and the
options several verbs take. Help texts stay per verb (each says what the option means there),
so the factories take `help`; a verb that documents nothing passes nothing."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup
from rich.markup import escape

console = Console(soft_wrap=True)   # never wrap a command the user will copy
err = Console(stderr=True, soft_wrap=True)

RESULTS_DIR = Path("results")


class _PlainFlags:
    """Help that shows a flag as a flag: typer's rich help prints every option's type, so
    `--no-mlflow <bool>` reads as if it took a value. A flag takes none, so it gets an empty
    metavar (what typer shows instead of the type); options that take values keep theirs."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


def keeps_its_lines(paragraph: str) -> bool:
    """A list, an indented block or click's no-rewrap mark (\\b): printed line by line."""
    return any(line.startswith(("-", "*", " ", "\b")) for line in paragraph.splitlines())


def reflow(help_text: Optional[str]) -> Optional[str]:
    """A docstring's paragraphs as one line each: typer's rich help keeps the source's line
    breaks after the first paragraph and then wraps again, so a wrapped docstring printed as
    ragged lines. Paragraphs that keep their lines (`keeps_its_lines`) are left as they are."""
    if not help_text:
        return help_text
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(par if keeps_its_lines(par) else " ".join(par.split("\n"))
                       for par in paragraphs)


class _Reflowed:
    """Every command's and group's help, reflowed (`reflow`) once it is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.help = reflow(self.help)


class Command(_Reflowed, _PlainFlags, TyperCommand):
    """Every verb's click command (`app.command(cls=Command)`)."""


class Group(_Reflowed, _PlainFlags, TyperGroup):
    """Every command group's (`typer.Typer(cls=Group)`): its own options, --help included."""


def fail_input(e: Exception) -> typer.Exit:
    """Bad input: one line on stderr (escaped: a path may hold `[...]`), exit 2."""
    err.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def max_cells_option(help: str = "allow a scenario of up to N cells (default 10000: more is "
                                 "usually a typo in the matrix)"):
    """`--max-cells N`: the cap on a scenario's cells, raised on purpose for a huge sweep."""
    return typer.Option(None, "--max-cells", min=1, metavar="N", help=help)


def hosts_file_option(help: str):
    """`--hosts FILE`: the hosts inventory (None: ./hosts.yaml if present)."""
    return typer.Option(None, "--hosts", metavar="FILE", help=help)


def tracking_uri_option(help: Optional[str] = None):
    """`--tracking-uri URI`: the MLflow store (None: each verb's default store)."""
    return typer.Option(None, "--tracking-uri", help=help)


def cell_filter_option():
    """`-k EXPR`: only the cells it selects (harness/sweep/cellfilter.py)."""
    return typer.Option(None, "-k", metavar="EXPR",
                        help="only the cells this selects: words in the label or key=value, "
                             "with and / or / not, e.g. -k 'triton and not context_length=65536'")


def results_option(help: Optional[str] = None):
    """`--results DIR`: the root of the journal (RESULTS/runs) and what is written beside it."""
    return typer.Option(RESULTS_DIR, "--results", help=help)


def baselines_option(help: Optional[str] = None):
    """`--baselines DIR`: baseline files (None: RESULTS/baselines)."""
    return typer.Option(None, "--baselines", metavar="DIR", help=help)
