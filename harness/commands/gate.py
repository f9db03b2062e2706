"""The gate's commands on the `harness` CLI: gate, history, bisect, baseline (mark, show).

Registered onto the main Typer app by harness/cli.py (`register(app)`); every import that
costs time (mlflow, scipy) happens inside the command that needs it. Bad input is one line on
stderr and exit 2, like every other command.

Exit codes:
    gate      0 every gated metric decided, no regression; 1 regression; 2 error / nothing
              measured / baseline missing / a design that cannot reach significance;
              3 undecided (0 with --allow-undecided)
    history   0 no recent regressing step, 1 a regressing step in the last --recent runs, 2 error
    bisect    0 first bad commit found, 1 bisect could not decide, 2 error
    baseline  0 done, 2 error
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from harness.protocol.errors import InputError

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

RESULTS_DIR = Path("results")


def _fail(e: Exception) -> typer.Exit:
    err.print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _host(name: str, hosts_file: Optional[Path]):
    try:
        from harness.hosts.inventory import load_hosts, select_hosts
    except ImportError:  # an older tree without the hosts inventory: only this machine
        from harness.hosts.local import local_hosts
        inventory = local_hosts()
        if name not in inventory:
            raise InputError(None, None, None, f"unknown host '{name}' (known: local)")
        return inventory[name]
    return select_hosts(load_hosts(hosts_file), [name], "--host")[0]


def _policies(sc, alpha: Optional[float], alpha_eq: Optional[float] = None):
    from harness.gate.policy import resolve_policies
    return resolve_policies(sc.metrics, alpha=alpha, alpha_eq=alpha_eq, where=sc.path)


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
    hosts_file: Optional[Path] = typer.Option(None, "--hosts", metavar="FILE", help="hosts inventory"),
    rounds: int = typer.Option(1, "--rounds", help="rounds per side before the first look, at least "
                                                   "(the plan may need more)"),
    max_rounds: int = typer.Option(15, "--max-rounds", help="rounds per side at most; sets the number of "
                                                            "looks alpha is split among"),
    budget_s: float = typer.Option(600.0, "--budget-s", help="time for rounds after the first ones "
                                                             "(0: no limit); undecided cells exit 3"),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="false-alarm rate of every metric (default 0.01)"),
    alpha_eq: Optional[float] = typer.Option(None, "--alpha-eq", help="risk of calling a change at the "
                                                                      "threshold unchanged (default 0.05)"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="MLflow store (baseline mlflow, --log-mlflow)"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results", help="journal root is RESULTS/runs, reports RESULTS/gates"),
    baselines_dir: Optional[Path] = typer.Option(None, "--baselines", metavar="DIR",
                                                 help="baseline files (default RESULTS/baselines)"),
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
    max_cells: Optional[int] = typer.Option(None, "--max-cells", min=1, metavar="N",
                                            help="allow a scenario of up to N cells (default 10000)"),
):
    """Judge a head against a baseline: exit 0 no regression (every gated metric decided),
    1 regression, 2 error or a design that cannot decide, 3 undecided."""
    from harness.gate import report
    from harness.gate.run import GateOptions, gate_ab, gate_against, parse_baseline
    from harness.hosts.local import HostUnavailable
    from harness.sweep.journal import JournalError
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
        opts = GateOptions(
            scenario=sc, policies=_policies(sc, alpha, alpha_eq), host=_host(host, hosts_file),
            base_ref=base, head_ref=head, baseline=baseline, head_run=run_id, rounds=rounds,
            max_rounds=max_rounds, budget_s=budget_s or None, results_dir=results_dir,
            baselines_dir=baselines_dir, tracking_uri=tracking_uri, allow_missing=allow_missing,
            allow_undecided=allow_undecided, trigger=trigger,
            log=lambda line: console.print(line, highlight=False, markup=False))
        result = gate_ab(opts) if base else gate_against(opts)
    except (InputError, JournalError) as e:
        raise _fail(e)
    except (RuntimeError, HostUnavailable) as e:   # git failing underneath, a host lost
        raise _fail(e)
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


def history(
    scenario: str = typer.Argument(..., help="scenario YAML file, or an experiment name"),
    metric: str = typer.Option("tokens_per_s", "--metric"),
    gpu: Optional[str] = typer.Option(None, "--gpu", metavar="CLASS", help="only this GPU class (e.g. h200)"),
    branch: Optional[str] = typer.Option(None, "--branch", help="only runs of this git branch"),
    include_pr: bool = typer.Option(False, "--include-pr", help="also runs with trigger=pr"),
    cell: Optional[list[str]] = typer.Option(None, "--cell", metavar="ID", help="only this cell (repeatable)"),
    recent: int = typer.Option(10, "--recent", help="exit 1 if a regressing step starts within the last N runs "
                                                     "(a step needs ~5 runs after it to be significant)"),
    min_size: int = typer.Option(3, "--min-size", help="fewest runs on each side of a step"),
    alpha: float = typer.Option(0.01, "--alpha", help="significance level of each split (permutation test)"),
    direction: Optional[str] = typer.Option(None, "--direction", help="higher | lower is better (default: the policy's)"),
    threshold_rel: Optional[float] = typer.Option(None, "--threshold-rel", help="smallest relative step that matters"),
    threshold_abs: Optional[float] = typer.Option(None, "--threshold-abs", help="smallest absolute step that matters"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri"),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="write the series and steps as JSON"),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="DIR", help="one PNG per series with steps"),
):
    """Find steps in each cell's history of a metric, named by commit range."""
    from harness.gate import history as hist
    from harness.gate.policy import DEFAULT_POLICIES, Policy
    from harness.sweep.journal import atomic_write_text

    try:
        name, policies = scenario, {}
        if Path(scenario).is_file() or scenario.endswith((".yaml", ".yml")):
            from harness.sweep.scenario import load_scenario
            sc = load_scenario(scenario)
            name, policies = sc.name, _policies(sc, None)
        policy = policies.get(metric) or DEFAULT_POLICIES.get(metric)
        if direction is not None and direction not in ("higher", "lower"):
            raise InputError(None, None, None, f"--direction must be higher or lower, not '{direction}'")
        if policy is None and direction is None:
            raise InputError(None, None, None, f"no policy for metric '{metric}': give --direction "
                                               f"higher|lower (and --threshold-rel or --threshold-abs)")
        if min_size < 2 or recent < 1 or not 0 < alpha < 1:
            raise InputError(None, None, None, "--min-size must be >= 2, --recent >= 1, --alpha in (0, 1)")
        given = threshold_rel is not None or threshold_abs is not None
        policy = Policy(metric, direction or policy.direction,
                        threshold_rel if given else policy.threshold_rel if policy else None,
                        threshold_abs if given else policy.threshold_abs if policy else None)
        series = hist.fetch_series(tracking_uri, name, metric, gpu=gpu, branch=branch,
                                   include_pr=include_pr, cell_ids=cell)
        if not series:
            raise InputError(None, None, None, f"no ok runs with metric '{metric}' in experiment "
                                               f"'{name}'" + (f" on GPU class {gpu}" if gpu else ""))
    except InputError as e:
        raise _fail(e)

    hist.analyse(series, policy, min_size=min_size, alpha=alpha)
    from rich.table import Table
    from harness.gate.changepoint import is_regression

    table = Table(title=f"{name}: {metric} history ({policy.describe()})", title_justify="left",
                  header_style="bold")
    for col in ("cell", "gpu", "runs", "step at", "before", "after", "change", "p", "commits"):
        table.add_column(col)
    for s in series:
        if not s.steps:
            table.add_row(s.label, s.gpu_class, str(len(s.points)), "no step", "", "", "", "", "")
        for st in s.steps:
            bad = is_regression(st, policy)
            change = f"{(st.ratio - 1) * 100:+.1f} %" if st.ratio else f"{st.after - st.before:+.4g}"
            table.add_row(s.label, s.gpu_class, str(len(s.points)), s.points[st.index].date,
                          f"{st.before:.4g}", f"{st.after:.4g}", change, f"{st.p_value:.3f}",
                          s.commit_range(st), style="red" if bad else "green")
    console.print(table)
    if json_out:
        atomic_write_text(json_out, json.dumps({"scenario": name, "metric": metric,
                                                "series": [s.to_dict(policy) for s in series]},
                                               indent=2) + "\n")
    if plot:
        for path in hist.plot(series, metric, plot):
            console.print(f"Plot: {path}", highlight=False)
    flagged = hist.recent_regressions(series, policy, recent)
    for s, st in flagged:
        good, bad = s.points[st.index - 1].sha, s.points[st.index].sha
        console.print(f"[red]regression[/] {s.label} ({s.gpu_class}): {st.before:.4g} -> "
                      f"{st.after:.4g} between {good[:10]} and {bad[:10]}; find the commit with:\n"
                      f"  harness bisect --good {good} --bad {bad} --cell {s.cell_id}",
                      highlight=False)
    raise typer.Exit(1 if flagged else 0)


def bisect(
    good: str = typer.Option(..., "--good", metavar="REF", help="a commit where the cell was fine"),
    bad: str = typer.Option(..., "--bad", metavar="REF", help="a later commit where it regressed"),
    cell: str = typer.Option(..., "--cell", metavar="ID", help="cell id (harness validate lists them)"),
    scenario: Optional[Path] = typer.Option(None, "--scenario", metavar="FILE",
                                            help="where the cell is defined (default: journals, then MLflow)"),
    metric: str = typer.Option("tokens_per_s", "--metric"),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="repeats per measurement (default: the cell's)"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri"),
):
    """Find the commit that moved one cell's metric (git bisect run, in a temporary worktree)."""
    from harness.gate import bisect as bis
    from harness.gate.policy import DEFAULT_POLICIES

    try:
        sc = None
        if scenario is not None:
            from harness.sweep.scenario import load_scenario
            sc = load_scenario(scenario)
        policies = _policies(sc, None) if sc else DEFAULT_POLICIES
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
        raise _fail(e)
    for s in found.steps:
        value = "skip" if s["value"] is None else f"{s['value']:.4g}"
        console.print(f"  {s['sha'][:10]}  {value:>10}  {s['verdict']}", highlight=False)
    if found.first_bad is None:
        err.print("git bisect could not decide (too many commits skipped?)")
        raise typer.Exit(1)
    console.print(f"[red]first bad commit[/]: {found.first_bad} {found.subject}", highlight=False)


baseline_app = typer.Typer(help="Accepted baselines: mark a run as one, show the current ones.",
                           no_args_is_help=True)


@baseline_app.command("mark")
def baseline_mark(
    run_id: str = typer.Argument(..., metavar="RUN", help="run id (a folder of results/runs, or a run in MLflow)"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="tag the run's MLflow runs baseline=true"),
    file: bool = typer.Option(False, "--file/--no-file", help="write results/baselines/<gpu>/<scenario>.json"),
    replace: bool = typer.Option(False, "--replace", help="with --file: drop cells this run does not have"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results"),
    baselines_dir: Optional[Path] = typer.Option(None, "--baselines", metavar="DIR"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri"),
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
        raise _fail(e)


@baseline_app.command("show")
def baseline_show(
    scenario: str = typer.Argument(..., help="scenario YAML file, or its name"),
    gpu: str = typer.Option(..., "--gpu", metavar="CLASS", help="GPU class, e.g. h200 (cpu without a GPU)"),
    source: str = typer.Option("mlflow", "--source", help="mlflow | file"),
    results_dir: Path = typer.Option(RESULTS_DIR, "--results"),
    baselines_dir: Optional[Path] = typer.Option(None, "--baselines", metavar="DIR"),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri"),
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
        raise _fail(e)
    for cid, side in sides.items():
        tps = side.samples.get("tokens_per_s")
        what = f"{median(tps):.1f} tok/s (n={len(tps)})" if tps else "no tokens_per_s"
        console.print(f"{cid}  {side.label}  {what}  from {side.source}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add gate, history, bisect and baseline to the `harness` app."""
    app.command()(gate)
    app.command()(history)
    app.command()(bisect)
    app.add_typer(baseline_app, name="baseline")
