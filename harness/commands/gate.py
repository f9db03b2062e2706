"""`harness gate SCENARIO`: judge a head against a baseline (a stored one, or A/B: both sides
measured now, interleaved) and write the reports; optionally log to MLflow and post the PR comment.

Exit codes: 0 every gated metric decided, no regression; 1 regression; 2 error / nothing
measured / baseline missing / a design that cannot reach significance; 3 undecided (0 with
--allow-undecided); 130 interrupted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from harness.commands.options import (baselines_option, cell_filter_option, console, err,
                                      fail_input, hosts_file_option, max_cells_option,
                                      results_option, tracking_uri_option)
from harness.protocol.errors import InputError


def _host(name: str, hosts_file: Optional[Path]):
    """The one host that measures (A/B: both sides), from the inventory."""
    try:
        from harness.hosts.inventory import load_hosts, select_hosts
    except ImportError:  # an older tree without the hosts inventory: only this machine
        from harness.hosts.local import local_hosts
        inventory = local_hosts()
        if name not in inventory:
            raise InputError(None, None, None, f"unknown host '{name}' (known: local)")
        return inventory[name]
    return select_hosts(load_hosts(hosts_file), [name], "--host")[0]


def gate(
    scenario: Path = typer.Argument(..., help="scenario YAML file"),
    base: Optional[str] = typer.Option(None, "--base", metavar="REF",
                                       help="A/B: measure this commit (a git worktree) and the head here, interleaved"),
    head: Optional[str] = typer.Option(None, "--head", metavar="REF",
                                       help="A/B: measure this commit as the head instead of the working tree"),
    baseline: Optional[str] = typer.Option(None, "--baseline", metavar="SOURCE",
                                           help="compare with a stored baseline: mlflow | file | run:RUN_ID"),
    run_id: Optional[str] = typer.Option(None, "--run", metavar="RUN_ID",
                                         help="with --baseline: the head is this journaled run (not measured now)"),
    host: str = typer.Option("local", "--host", help="host that measures (A/B: both sides)"),
    hosts_file: Optional[Path] = hosts_file_option("hosts inventory"),
    rounds: int = typer.Option(1, "--rounds", help="rounds per side before the first look, at least "
                                                   "(the plan may need more)"),
    max_rounds: int = typer.Option(15, "--max-rounds", help="rounds per side at most; sets the number of "
                                                            "looks alpha is split among"),
    budget_s: float = typer.Option(600.0, "--budget-s", help="time for rounds after the first ones "
                                                             "(0: no limit); undecided cells exit 3"),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="false-alarm rate of every metric (default 0.01)"),
    alpha_eq: Optional[float] = typer.Option(None, "--alpha-eq", help="risk of calling a change at the "
                                                                      "threshold unchanged (default 0.05)"),
    tracking_uri: Optional[str] = tracking_uri_option("MLflow store (baseline mlflow, --log-mlflow)"),
    results_dir: Path = results_option("journal root is RESULTS/runs, reports RESULTS/gates"),
    baselines_dir: Optional[Path] = baselines_option("baseline files (default RESULTS/baselines)"),
    markdown: Optional[Path] = typer.Option(None, "--markdown", metavar="FILE", help="also write the markdown report here"),
    junit: Optional[Path] = typer.Option(None, "--junit", metavar="FILE", help="also write JUnit XML here"),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="also write the JSON report here"),
    comment: bool = typer.Option(False, "--comment", help="post or update the PR comment (GITHUB_TOKEN)"),
    repo: Optional[str] = typer.Option(None, "--repo", metavar="OWNER/NAME", help="default $GITHUB_REPOSITORY"),
    pr: Optional[int] = typer.Option(None, "--pr", help="PR number (default: from the Actions event)"),
    details_url: Optional[str] = typer.Option(None, "--details-url", help="link at the end of the comment (e.g. the CI job)"),
    allow_missing: bool = typer.Option(False, "--allow-missing", help="cells without a baseline are reported, not an error"),
    allow_undecided: bool = typer.Option(False, "--allow-undecided", help="exit 0 instead of 3 when cells "
                                                                          "stay undecided (a warning)"),
    log_mlflow: bool = typer.Option(False, "--log-mlflow", help="log what the gate measured to MLflow"),
    trigger: str = typer.Option("pr", "--trigger", help="trigger tag of the runs the gate journals"),
    max_cells: Optional[int] = max_cells_option("allow a scenario of up to N cells (default 10000)"),
    cell_filter: Optional[str] = cell_filter_option(),
):
    """Judge a head against a baseline: exit 0 pass, 1 regression, 2 error, 3 undecided.

    0: every gated metric decided, none regressed; 1: a regression; 2: an error, or a design that
    cannot reach significance; 3: undecided."""
    from harness.gate import report
    from harness.gate.policy import resolve_policies
    from harness.gate.run import GateOptions, gate_ab, gate_against, parse_baseline
    from harness.hosts.interface import HostUnavailable
    from harness.sweep.journal import JournalError
    from harness.sweep.cellfilter import select
    from harness.sweep.scenario import TRIGGERS, load_scenario

    try:
        if (base is None) == (baseline is None):
            raise InputError(None, None, None, "give either --base REF (A/B on this host) or "
                                               "--baseline mlflow|file|run:RUN_ID")
        if head and not base:
            raise InputError(None, None, None, "--head REF needs --base REF")
        if run_id and not baseline:
            raise InputError(None, None, None, "--run RUN_ID needs --baseline (an A/B gate "
                                               "measures both sides itself)")
        if baseline:
            parse_baseline(baseline)
        if trigger not in TRIGGERS:
            raise InputError(None, None, None, f"--trigger must be one of {', '.join(TRIGGERS)}")
        if rounds < 1 or max_rounds < rounds:
            raise InputError(None, None, None, f"--rounds must be >= 1 and --max-rounds >= --rounds "
                                               f"(got {rounds} and {max_rounds})")
        if budget_s < 0:
            raise InputError(None, None, None, f"--budget-s must be >= 0, got {budget_s:g}")
        sc = load_scenario(scenario, max_cells=max_cells)
        cells = select(sc.cells(), cell_filter)
        policies = resolve_policies(sc.metrics, alpha=alpha, alpha_eq=alpha_eq, where=sc.path)
        opts = GateOptions(
            scenario=sc, policies=policies, host=_host(host, hosts_file),
            base_ref=base, head_ref=head, baseline=baseline, head_run=run_id, rounds=rounds,
            max_rounds=max_rounds, budget_s=budget_s or None, results_dir=results_dir,
            baselines_dir=baselines_dir, tracking_uri=tracking_uri, allow_missing=allow_missing,
            allow_undecided=allow_undecided, trigger=trigger, cells=cells,
            log=lambda line: console.print(line, highlight=False, markup=False))
        result = gate_ab(opts) if base else gate_against(opts)
    except (InputError, JournalError) as e:
        raise fail_input(e)
    except (RuntimeError, HostUnavailable) as e:   # git failing underneath, a host lost
        raise fail_input(e)
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(130)

    written = report.write_reports(result, opts.gate_dir, markdown=markdown, junit=junit,
                                   json_path=json_out, details_url=details_url)
    # CI logs are not terminals: print the table wide rather than folded into 80 columns.
    wide = console if console.is_terminal else Console(soft_wrap=True, width=220)
    wide.print(report.console_table(result))
    if report.noise_rows(result):
        wide.print(report.console_noise(result))
    if result.targets and result.targets_base:
        from harness.sweep.summary import targets_table
        wide.print(targets_table(result.targets, "Targets, base → head (they do not decide the gate)",
                                 result.targets_base))
    elif result.targets:
        from harness.sweep.summary import targets_table
        wide.print(targets_table(result.targets, "Targets: the head's numbers against the "
                                                  "scenario's goals (they do not decide the gate)"))
    for line in report.undecided_lines(result):
        console.print("undecided: " + line, highlight=False, markup=False)
    for line in report.warning_lines(result):
        console.print("noise warning: " + line, highlight=False, markup=False)
    for note in result.notes:
        console.print("note: " + note, highlight=False, markup=False)
    code = result.exit_code()
    if result.undecided and result.allow_undecided:
        err.print(f"warning: {len(result.undecided)} cell(s) undecided; --allow-undecided "
                  f"turns exit 3 into 0", highlight=False, markup=False)
    colour = {0: "green", 1: "red", 2: "yellow", 3: "yellow"}[code]
    console.print(f"[{colour}]{report.TITLE[code]}[/]: ", end="", highlight=False)
    console.print(result.headline(), highlight=False, markup=False)
    console.print("Reports: " + ", ".join(str(p) for p in written.values()), highlight=False)

    if log_mlflow:
        _log_gate_runs(result, results_dir, tracking_uri)
    if comment:
        _post_comment(written["markdown"], repo, pr)
    raise typer.Exit(code)


def _log_gate_runs(result, results_dir: Path, tracking_uri: Optional[str]) -> None:
    from harness.sweep import tracking
    from harness.sweep.journal import RunJournal

    for key in ("base_run", "head_run"):
        run = result.extra.get(key)
        if not run:
            continue
        try:
            rep = tracking.log_run(RunJournal.open(results_dir / "runs", run), tracking_uri)
            console.print(f"{run}: {rep}", highlight=False)
        except tracking.TrackingUnavailable as e:
            err.print(f"[yellow]MLflow logging of {run} failed:[/] {e}", highlight=False)


def _post_comment(body_file: Path, repo: Optional[str], pr: Optional[int]) -> None:
    """Post the report; a failure is a warning (the gate's verdict stands either way)."""
    import os

    from harness.gate import github
    try:
        number = pr or github.pr_from_event()
        if number is None:
            raise github.GitHubError("no PR number: give --pr N (or run in a pull_request event)")
        posted = github.post_or_update(repo or os.environ.get("GITHUB_REPOSITORY", ""), number,
                                       body_file.read_text(encoding="utf-8"))
        console.print(f"PR comment {posted.action}: {posted.url or posted.comment_id}",
                      highlight=False)
    except github.GitHubError as e:
        err.print(f"[yellow]PR comment not posted:[/] {e}", highlight=False)
