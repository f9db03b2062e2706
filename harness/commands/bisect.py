"""`harness bisect --good REF --bad REF --cell ID`: the commit that moved one cell's metric
(git bisect run in a temporary worktree). Exit 0 first bad commit found, 1 bisect could not
decide, 2 error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from harness.commands.options import console, err, fail_input, results_option, tracking_uri_option
from harness.protocol.errors import InputError


def bisect(
    good: str = typer.Option(..., "--good", metavar="REF", help="a commit where the cell was fine"),
    bad: str = typer.Option(..., "--bad", metavar="REF", help="a later commit where it regressed"),
    cell: str = typer.Option(..., "--cell", metavar="ID", help="cell id (harness validate lists them)"),
    scenario: Optional[Path] = typer.Option(None, "--scenario", metavar="FILE",
                                            help="where the cell is defined (default: journals, then MLflow)"),
    metric: str = typer.Option("tokens_per_s", "--metric"),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="repeats per measurement (default: the cell's)"),
    results_dir: Path = results_option(),
    tracking_uri: Optional[str] = tracking_uri_option(),
):
    """Find the commit that moved one cell's metric (git bisect run, in a temporary worktree)."""
    from harness.gate import bisect as bis
    from harness.gate.policy import DEFAULT_POLICIES, resolve_policies

    try:
        sc = None
        if scenario is not None:
            from harness.sweep.scenario import load_scenario
            sc = load_scenario(scenario)
        policies = resolve_policies(sc.metrics, where=sc.path) if sc else DEFAULT_POLICIES
        policy = policies.get(metric) or DEFAULT_POLICIES.get(metric)
        if policy is None:
            raise InputError(None, None, None, f"no policy for metric '{metric}' (known: "
                                               f"{', '.join(DEFAULT_POLICIES)})")
        if repeats is not None and repeats < 1:
            raise InputError(None, None, None, "--repeats must be at least 1")
        params = bis.find_cell(cell, scenario=sc, runs_root=results_dir / "runs",
                               tracking_uri=tracking_uri)
        if repeats:
            params = {**params, "repeats": repeats}
        console.print(f"Bisecting {metric} of cell {cell} between {good} and {bad}", highlight=False)
        found = bis.bisect(good, bad, params, policy,
                           log=lambda line: console.print(line, highlight=False, markup=False))
    except (InputError, RuntimeError) as e:
        raise fail_input(e)
    for s in found.steps:
        value = "skip" if s["value"] is None else f"{s['value']:.4g}"
        console.print(f"  {s['sha'][:10]}  {value:>10}  {s['verdict']}", highlight=False)
    if found.first_bad is None:
        err.print("git bisect could not decide (too many commits skipped?)")
        raise typer.Exit(1)
    console.print(f"[red]first bad commit[/]: {found.first_bad} {found.subject}", highlight=False)
