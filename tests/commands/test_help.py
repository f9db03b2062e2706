"""Every command's `--help`, from the real CLI in a process of its own: a flag reads as a flag
(`--no-mlflow`, `--mlflow / --no-mlflow`), never as an option taking a `<bool>` value, while an
option that does take a value keeps its metavar; and the command's own text reads as paragraphs,
not as the docstring's source lines wrapped a second time."""

from __future__ import annotations

import inspect
import os

import pytest
import typer

from cli_process import run_cli
from harness.cli import app
from harness.commands.options import keeps_its_lines


# typer builds its commands with a Click of its own (typer._click), not the `click` package, so
# they are told apart by what they have rather than by class.
def _commands(command, path: tuple[str, ...] = ()):
    """(path, command) for the app and every command and group under it, as `harness` has them."""
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _commands(sub, path + (name,))


COMMANDS = list(_commands(typer.main.get_command(app)))


def _flags(command) -> list[str]:
    return [opt for p in command.params if getattr(p, "is_flag", False)
            for opt in p.opts + p.secondary_opts if opt.startswith("--")]


def _prose(help_text: str | None) -> list[str]:
    """The help's prose paragraphs (not lists or indented blocks), each as one line of single
    spaces."""
    return [" ".join(par.split()) for par in inspect.cleandoc(help_text or "").split("\n\n")
            if not keeps_its_lines(par)]


def test_every_command_is_covered():
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "run", "gate", "report", "baseline", "baseline mark", "hosts check"} <= paths
    assert "--no-mlflow" in _flags(dict(COMMANDS)[("report",)])
    # the paragraph check below reads something in every command: not skipped as a list or as
    # too long to fit a line
    assert keeps_its_lines("- one\n- two") and keeps_its_lines("Usage:\n  harness run")
    assert not keeps_its_lines("a sentence\nwrapped in the source")
    assert all(any(len(par) < 180 for par in _prose(command.help)) for _, command in COMMANDS)


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "harness" for p, _ in COMMANDS])
def test_help_shows_flags_as_flags(tmp_path, path, command):
    # wide, so that no option's line is wrapped and every name is on the line it describes
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(COLUMNS="200", TERM="dumb", NO_COLOR="1")
    proc = run_cli([*path, "--help"], cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "<bool>" not in out, out
    for flag in _flags(command):
        assert flag in out, (flag, out)
    # 200 columns hold each paragraph on one line, unless the source's line breaks survive
    lines = {" ".join(line.split()) for line in out.splitlines()}
    for paragraph in _prose(command.help):
        if len(paragraph) < 180:
            assert paragraph in lines, (paragraph, out)


def test_options_with_values_keep_their_metavar(tmp_path):
    env = dict(os.environ, COLUMNS="200", TERM="dumb", NO_COLOR="1")
    out = run_cli(["run", "--help"], cwd=tmp_path, env=env, timeout=120).stdout
    line = next(line for line in out.splitlines() if "--max-cells" in line)
    assert " N " in line, line
    line = next(line for line in out.splitlines() if "--fresh-workers" in line)
    assert "<" not in line, line
