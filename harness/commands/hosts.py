"""`harness hosts check`: is every host of the inventory usable (exit 0) or not (exit 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.commands.options import Command, Group, console, fail_input, hosts_file_option
from harness.protocol.errors import InputError

app = typer.Typer(help="Inspect the hosts inventory.", no_args_is_help=True, cls=Group)


@app.command("check", cls=Command)
def check(
    names: Optional[list[str]] = typer.Argument(None, metavar="[HOST]...", help="hosts to check (default: all)"),
    hosts_file: Optional[Path] = hosts_file_option("hosts inventory (default ./hosts.yaml if present)"),
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
