"""The end-of-run table: one row per cell, the numbers a reader looks at first.

Only the parameters that differ between cells get a column (a sweep over context and verify mode
shows `ctx` and `verify`), so the table stays narrow enough for a terminal.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from harness.protocol import params

SHORT = {"context_length": "ctx", "tree_budget": "N", "block_size": "B", "verify_mode": "verify",
         "graph_capture": "graph", "tree_build": "tree", "batch_size": "bs",
         "speculation": "spec", "acceptance": "acceptance"}


def _fmt(value, spec: str, missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def varying_params(results: list[dict]) -> list[str]:
    keys = [k for k in params.DEFAULTS if k not in params.MEASUREMENT_KNOBS]
    cells = [params.canonical(r["cell"]) for r in results]
    return [k for k in keys if len({repr(c[k]) for c in cells}) > 1]


def idle_text(result: dict) -> str:
    idle = (result.get("metrics") or {}).get("idle_fraction")
    if idle is not None:
        return f"{idle:.1%}"
    if result["status"] == "ok" and not (result.get("env") or {}).get("gpu"):
        return "n/a (no GPU)"
    return "n/a"


# (header, metric, format) of the numbers of decode cells and of kernel-timing cells
DECODE_COLUMNS = (("tok/s", "tokens_per_s", ".1f"), ("±", "tokens_per_s_spread", ".1f"),
                  ("accept", "accept_len_mean", ".2f"), ("p50 ms", "step_ms_p50", ".2f"))
KERNEL_COLUMNS = (("kernel µs", "kernel_us", ".1f"), ("±", "kernel_us_spread", ".2f"),
                  ("TB/s", "achieved_tbps", ".2f"), ("% roofline", "pct_roofline", ".1f"))


def summary_table(results: list[dict], title: str) -> Table:
    """Decode cells get tokens/s, acceptance, step time and idle; cells that time one kernel
    (the kernel and op workloads) its time, bandwidth and share of the roofline. A run of
    kernel cells only names each by its label: their parameters differ by workload."""
    # Titles and cells are rich markup: every user-supplied string (the scenario name, labels,
    # an error) is escaped, so `bench[/red]mark` prints as itself.
    table = Table(title=escape(title), title_justify="left", header_style="bold")
    kernel = [params.times_a_kernel(r["cell"]) for r in results]
    decode_columns = DECODE_COLUMNS if not all(kernel) else ()
    kernel_columns = KERNEL_COLUMNS if all(kernel) else KERNEL_COLUMNS[:1] if any(kernel) else ()
    # A decode run names its cells by the parameters that vary; a run that mixes decode cells
    # with cells timing one kernel names every cell by its label, since a kernel cell's decode
    # parameters (graph, tree, acceptance ...) are defaults it never used.
    shown = varying_params(results) if len(results) > 1 and not any(kernel) else []
    for k in shown:
        table.add_column(SHORT.get(k, k), justify="right" if k in ("context_length", "tree_budget") else "left")
    if not shown:
        table.add_column("cell", min_width=24, overflow="fold")   # never squeezed to nothing
    hosts = {r.get("host") for r in results}
    if len(hosts) > 1:
        table.add_column("host")
    columns = decode_columns + kernel_columns
    for name, _, _ in columns:
        table.add_column(name, justify="right", no_wrap=True)
    if decode_columns:
        table.add_column("idle", justify="right", no_wrap=True)
    table.add_column("status")

    def order(r):
        c = params.canonical(r["cell"])
        return tuple(repr(c[k]) if not isinstance(c[k], (int, float)) else f"{c[k]:020.6f}" for k in shown)

    for r in sorted(results, key=order) if shown else results:
        c = params.canonical(r["cell"])
        m = r.get("metrics") or {}
        row = [escape(str(c[k])) for k in shown] or [escape(str(r.get("label", r.get("cell_id", "?"))))]
        if len(hosts) > 1:
            row.append(escape(str(r.get("host"))))
        status = "[green]ok[/]" if r["status"] == "ok" else "[red]failed[/]"
        if r["status"] != "ok" and r.get("error"):
            status += " " + escape(r["error"].strip().splitlines()[0][:50])
        row += [_fmt(m.get(metric), spec) for _, metric, spec in columns]
        if decode_columns:
            row.append(idle_text(r))
        table.add_row(*row, status)
    return table


VERDICT_STYLE = {"met": "green", "not met": "red", "absent": "yellow"}


MEASURED_LISTED = 4     # a target's values listed one by one up to this many; more: their range


def measured_text(outcome) -> str:
    """The numbers a target used: each selected cell's value (a ratio with `per`), or their sum;
    past MEASURED_LISTED values, their range and count (the report's tooltip lists them all)."""
    values = [_fmt(v, ".4g", "?") for _, v in outcome.measured]
    if outcome.value is not None:
        return " + ".join(values) + f" = {outcome.value:.4g}" if len(values) > 1 else values[0]
    present = [v for _, v in outcome.measured if v is not None]
    if len(values) > MEASURED_LISTED and present:
        unmeasured = len(values) - len(present)
        return (f"{min(present):.4g} .. {max(present):.4g} ({len(values)} cells"
                + (f", {unmeasured} unmeasured)" if unmeasured else ")"))
    return " / ".join(values) or "–"


def targets_table(outcomes, title: str = "Targets", before: list | None = None) -> Table:
    """The scenario's targets (harness.sweep.targets), one row each: what was measured against
    the bound, and the verdict with why where it is not met or absent. With `before` (the same
    targets judged on a base run) the numbers of both runs, and the verdict base → head where
    the change moved it."""
    sides = ("measured",) if before is None else ("base", "head")
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("target", overflow="fold")
    for name in sides:
        table.add_column(name, justify="right", overflow="fold")
    table.add_column("bound", no_wrap=True)
    table.add_column("verdict", overflow="fold")
    for b, o in zip(before or [None] * len(outcomes), outcomes):
        verdict = f"[{VERDICT_STYLE[o.verdict]}]{o.verdict}[/]"
        if b is not None and b.verdict != o.verdict:
            verdict = f"[{VERDICT_STYLE[b.verdict]}]{b.verdict}[/] → {verdict}"
        if o.why:
            verdict += f" [dim]({escape(o.why)})[/]"
        measured = [measured_text(o)] if b is None else [measured_text(b), measured_text(o)]
        table.add_row(escape(o.name), *map(escape, measured), escape(o.bound), verdict)
    return table
