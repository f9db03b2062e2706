"""`harness compare BASE HEAD`: two journaled runs side by side in the terminal, cell by cell.

Per cell of HEAD: the headline metric of both runs (decode tokens/s, kernel µs: the median of
the repeats), head/base (the gate's Hodges–Lehmann estimate over the repeats), "1.06× faster"
or "slower" in the metric's own sense, the statistical
gate's verdict with its p-value and interval (harness.gate.runs.compare, the verdict `harness
report --compare` shows), and a noise flag when either side's host facts say the host was
loaded, throttled or shared, or when the sides ran different builds of the CUDA kernels or in
different CUDA graph states (the gate's warnings: a difference that is not the code's alone).
Cells of BASE that HEAD does not have are listed after.

`--across KNOB=A:B` compares a knob instead of a change: BASE's cells run with KNOB=A against
HEAD's run with KNOB=B, paired by every other parameter (BASE and HEAD may be the same run, e.g.
a scenario whose matrix sweeps the knob). Cells with different kernels are otherwise never
paired (their ids differ: docs/gate.md); this is the explicit way to ask what a knob buys.

Then the targets (harness.sweep.targets: the head run's scenario's, or `--targets SCENARIO`'s
for runs made before they were written) judged on both runs, each verdict base → head: what a
change moved toward or past a goal.

`--kernels` adds, for each cell profiled on both sides (`profile: true`), what moved inside the
step: its busy and idle time a step, each of the kernels with the most time a step and each
idle gap between two kernels, base against head (harness.sweep.profile_diff). A tile or kernel
that changed name shows as one row leaving and another arriving.

Exit codes: 0 (a comparison, whatever it found; `harness gate` is the command that fails CI),
2 bad input (a run that is not in the journal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from harness.commands.options import console, fail_input, results_option
from harness.commands.report import read_targets, show_targets
from harness.protocol.errors import InputError

VERDICT_STYLE = {"regressed": "red", "improved": "green", "unchanged": "", "inconclusive": "yellow"}


def compare(
    base_id: str = typer.Argument(..., metavar="BASE", help="the run compared against"),
    head_id: str = typer.Argument(..., metavar="HEAD", help="the run whose change is shown"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
    across: str = typer.Option(None, "--across", metavar="KNOB=A:B",
                               help="compare BASE's cells with KNOB=A against HEAD's with KNOB=B, "
                                    "paired by every other parameter (BASE and HEAD may be one run)"),
    kernels: bool = typer.Option(False, "--kernels",
                                 help="also each profiled cell's kernels and idle gaps a step, "
                                      "base against head"),
    targets_file: Optional[Path] = typer.Option(None, "--targets", metavar="SCENARIO",
                                                help="judge both runs against this scenario file's "
                                                     "targets (default: the head run's own)"),
):
    """Compare two runs cell by cell: both medians, the ratio, the gate's verdict, noise."""
    from harness.gate import runs
    from harness.sweep import journal as jr

    try:
        base = jr.RunJournal.open(results_dir / "runs", base_id)
        head = jr.RunJournal.open(results_dir / "runs", head_id)
    except jr.JournalError as e:
        raise fail_input(e)
    if across is not None and targets_file is not None:
        raise fail_input("--targets judges two runs of one scenario, not a knob's two sides (--across)")
    try:
        wanted = read_targets(targets_file) if targets_file is not None else None
    except InputError as e:
        raise fail_input(e)
    head_results, base_results = head.results(), base.results()
    title = f"{head.run_id} ({head.scenario_name}) against {base.run_id} ({base.scenario_name})"
    if across is not None:
        knob, a, b = parse_across(across)
        base_results = runs.pair_across(base_results, knob, a, a)
        head_results = runs.pair_across(head_results, knob, b, a)
        if not base_results or not head_results:
            raise fail_input(f"--across {across}: no cells of {base.run_id if not base_results else head.run_id} "
                             f"ran with {knob}={a if not base_results else b}")
        title += f", {knob}: {a} (base) against {b} (head)"
    verdicts = runs.compare(head_results, base_results)
    console.print(comparison_table(head_results, base_results, verdicts, title))
    gone = [r for cid, r in base_results.items() if cid not in head_results]
    if gone:
        console.print(f"{len(gone)} cell(s) of {escape(base.run_id)} not in {escape(head.run_id)}: "
                      + "; ".join(escape(r.get("label", "?")) for r in gone), highlight=False)
    console.print(runs.VERDICT_NOTE, style="dim", highlight=False)
    if across is None:
        show_targets(head, list(head_results.values()), wanted, base, base_results.values())
    if kernels:
        tables = profile_tables(head_results, base_results)
        for table in tables:
            console.print(table)
        if tables:
            console.print(PROFILE_NOTE, style="dim", highlight=False)
        else:
            console.print("--kernels: no cell has a profile on both sides (a decode cell records "
                          "one with profile: true)", highlight=False)


def parse_across(text: str) -> tuple[str, object, object]:
    """KNOB=A:B -> (knob, a, b), the values as a scenario would read them (true, 4096, ...); a
    knob no cell has is an input error."""
    import yaml

    from harness.protocol import params

    knob, eq, values = text.partition("=")
    a, colon, b = values.partition(":")
    if not (eq and colon and knob.strip() and a.strip() and b.strip()):
        raise fail_input(f"--across {text!r}: expected KNOB=A:B, e.g. linear_impl=triton:wgmma")
    knob = knob.strip()
    if knob not in params.PARAMS:
        raise fail_input(f"--across: unknown parameter {knob!r}")
    return knob, yaml.safe_load(a.strip()), yaml.safe_load(b.strip())


def comparison_table(head: dict[str, dict], base: dict[str, dict], verdicts: dict,
                     title: str) -> Table:
    from harness.gate.noise import graph_state_notes, host_notes, kernel_build_notes

    table = Table(title=escape(title), title_justify="left", header_style="bold")
    table.add_column("cell", min_width=24, overflow="fold")
    for name in ("metric", "base", "head", "head/base", "change", "verdict", "detail", "noise"):
        table.add_column(name, justify="right" if name in ("base", "head", "head/base") else "left")
    for cid, h in sorted(head.items(), key=lambda kv: kv[1].get("label", kv[0])):
        v = verdicts[cid]
        notes = host_notes([r for r in (h, base.get(cid)) if r])
        per_side = {"base": [base[cid]] if cid in base else [], "head": [h]}
        notes += kernel_build_notes(per_side) + graph_state_notes(per_side)
        noisy = any(r.get("noisy") for r in (h, base.get(cid)) if r)
        style = VERDICT_STYLE.get(v.verdict, "")
        table.add_row(escape(h.get("label", cid)), v.metric, _num(v.base), _num(v.head),
                      f"{v.ratio:.3f}" if v.ratio is not None else "–", change(v.metric, v.ratio),
                      f"[{style}]{v.verdict}[/]" if style else v.verdict, escape(v.detail),
                      "[yellow]noisy[/] " + escape("; ".join(notes)) if notes or noisy else "")
    return table


PROFILE_NOTE = ("Kernels and idle gaps: µs a step in the profiled window; '–': not among that "
                "side's 12 largest (or not run there).")


def profile_tables(head: dict[str, dict], base: dict[str, dict]) -> list[Table]:
    """One table a cell profiled on both sides: busy and idle a step, then each kernel, then
    each idle gap, base against head, the largest difference first."""
    from harness.sweep import profile_diff as pd

    tables = []
    for cid, h in sorted(head.items(), key=lambda kv: kv[1].get("label", kv[0])):
        b = base.get(cid)
        if not (pd.has_profile(h) and pd.has_profile(b)):
            continue
        table = Table(title=escape(h.get("label", cid)), title_justify="left", header_style="bold")
        table.add_column("µs a step", overflow="fold")
        for name in ("base", "head", "head-base", "a step (base, head)"):
            table.add_column(name, justify="right")
        previous = ""
        for kind, r in pd.sections(b, h):
            if kind != previous:
                table.add_section()
                previous = kind
            table.add_row(escape(r.title(kind)), *r.cells())
        tables.append(table)
    return tables


def change(metric: str, ratio: float | None) -> str:
    """'1.06× faster' / '1.10× slower' / 'same', in the metric's own sense of better."""
    if ratio is None or ratio <= 0:
        return "–"
    from harness.gate.policy import DEFAULT_POLICIES

    better = ratio < 1 if DEFAULT_POLICIES[metric].direction == "lower" else ratio > 1
    factor = max(ratio, 1 / ratio)
    if factor < 1.0005:
        return "same"
    return f"{factor:.3f}× {'faster' if better else 'slower'}" if factor < 1.1 else \
        f"{factor:.2f}× {'faster' if better else 'slower'}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"
