"""`harness history SCENARIO`: steps in each cell's history of one or more metrics in MLflow,
named by commit range. Exit 0 no recent regressing step, 1 a regressing step in the last --recent
runs, 2 error (a metric without history among them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from harness.commands.options import console, fail_input, tracking_uri_option
from harness.protocol.errors import InputError

if TYPE_CHECKING:
    from harness.gate.history import Series
    from harness.gate.policy import Policy


def history(
    scenario: str = typer.Argument(..., help="scenario YAML file, or an experiment name"),
    metrics: list[str] = typer.Option(["tokens_per_s"], "--metric",
                                      help="the metric (repeatable: one MLflow search for all of them)"),
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
    tracking_uri: Optional[str] = tracking_uri_option(),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE",
                                           help="write the series and steps as JSON (several --metric: "
                                                "FILE names {metric}, e.g. history-{metric}.json)"),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="DIR", help="one PNG per series with steps"),
):
    """Find steps in each cell's history of a metric, named by commit range.

    Several --metric are read in one search and each reported in turn; a metric with no history
    is one error line and exit 2, after the others are reported (their files written)."""
    from harness.gate import history as hist
    from harness.gate.policy import DEFAULT_POLICIES, Policy, resolve_policies

    try:
        name, policies = scenario, {}
        if Path(scenario).is_file() or scenario.endswith((".yaml", ".yml")):
            from harness.sweep.scenario import load_scenario
            sc = load_scenario(scenario)
            name, policies = sc.name, resolve_policies(sc.metrics, where=sc.path)
        metrics = list(dict.fromkeys(metrics))
        given = threshold_rel is not None or threshold_abs is not None
        if len(metrics) > 1 and (direction is not None or given):
            raise InputError(None, None, None, "--direction and --threshold-* describe one metric: give "
                                               "one --metric with them")
        if len(metrics) > 1 and json_out is not None and "{metric}" not in json_out:
            raise InputError(None, None, None, f"--json {json_out} would hold {len(metrics)} metrics: name "
                                               "each file with {metric}, e.g. history-{metric}.json")
        if direction is not None and direction not in ("higher", "lower"):
            raise InputError(None, None, None, f"--direction must be higher or lower, not '{direction}'")
        if min_size < 2 or recent < 1 or not 0 < alpha < 1:
            raise InputError(None, None, None, "--min-size must be >= 2, --recent >= 1, --alpha in (0, 1)")
        chosen = {}
        for metric in metrics:
            policy = policies.get(metric) or DEFAULT_POLICIES.get(metric)
            if policy is None and direction is None:
                raise InputError(None, None, None, f"no policy for metric '{metric}': give --direction "
                                                   f"higher|lower (and --threshold-rel or --threshold-abs)")
            chosen[metric] = Policy(metric, direction or policy.direction,
                                    threshold_rel if given else policy.threshold_rel if policy else None,
                                    threshold_abs if given else policy.threshold_abs if policy else None)
        found = hist.fetch_metrics(tracking_uri, name, metrics, gpu=gpu, branch=branch,
                                   include_pr=include_pr, cell_ids=cell)
    except InputError as e:
        raise fail_input(e)

    missing = flagged = 0
    for metric in metrics:
        if not found[metric]:      # its one error line now; the exit waits for the others
            fail_input(InputError(None, None, None, f"no ok runs with metric '{metric}' in experiment "
                                                    f"'{name}'" + (f" on GPU class {gpu}" if gpu else "")))
            missing += 1
            continue
        out = Path(json_out.replace("{metric}", metric)) if json_out else None
        flagged += report_metric(name, metric, found[metric], chosen[metric], recent=recent,
                                 min_size=min_size, alpha=alpha, json_out=out, plot=plot)
    raise typer.Exit(2 if missing else 1 if flagged else 0)


def report_metric(name: str, metric: str, series: list[Series], policy: Policy, *, recent: int, min_size: int,
                  alpha: float, json_out: Optional[Path], plot: Optional[Path]) -> int:
    """One metric's steps: its table, JSON and plots, and a bisect line per recent regressing
    step. Returns how many such steps it printed."""
    from rich.table import Table
    from harness.gate import history as hist
    from harness.gate.changepoint import is_regression
    from harness.sweep.journal import atomic_write_text

    hist.analyse(series, policy, min_size=min_size, alpha=alpha)
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
        console.print(f"[red]regression[/] {s.label} ({s.gpu_class}) {metric}: {st.before:.4g} -> "
                      f"{st.after:.4g} between {good[:10]} and {bad[:10]}; find the commit with:\n"
                      f"  harness bisect --good {good} --bad {bad} --cell {s.cell_id}",
                      highlight=False)
    return len(flagged)
