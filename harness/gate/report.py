"""A gate's result as a PR comment (markdown), JUnit XML for CI systems, JSON, and a terminal table.

One row per (cell, metric), one quantity per column:

    n          samples per side (base/head): repeats x rounds, or rounds for a per-run metric
    base, head the medians of those samples
    change     head/base of those two medians (a difference for an absolute-threshold metric)
    HL [CI]    the test's own estimate of the change (Hodges-Lehmann) with its
               distribution-free interval -- the interval "unchanged" needs inside the threshold
    p          one-sided Mann-Whitney p toward the change shown
    verdict    and the round at which it was reached

A metric with one sample on a side has no interval ("1 sample"). The markdown puts what needs
attention (regressions, errors, undecided rows) first and folds the unchanged rows away, then
the noise per cell and side, and for an undecided gate the cells, the noise seen and about how
many rounds would decide them.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.gate.judge import (ERROR, EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, EXIT_UNDECIDED,
                                MISSING, SEVERITY, GateResult)
from harness.gate.noise import fmt_spread
from harness.gate.stats import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Comparison
from harness.sweep.journal import atomic_write_text
from harness.sweep.summary import measured_text
from harness.sweep.targets import ABSENT, MET, NOT_MET
from harness.sweep.targets import counts as target_counts

ICON = {REGRESSED: "❌", IMPROVED: "🚀", INCONCLUSIVE: "❔", UNCHANGED: "✅",
        ERROR: "⚠️", MISSING: "⚠️"}
TITLE = {EXIT_OK: "✅ Performance gate passed", EXIT_REGRESSION: "❌ Performance gate: regression",
         EXIT_ERROR: "⚠️ Performance gate could not run",
         EXIT_UNDECIDED: "❔ Performance gate undecided"}
COLUMNS = ("cell", "metric", "n", "base", "head", "change", "HL [CI]", "p", "verdict")
NOISE_COLUMNS = ("cell", "side", "metric", "runs", "within a run", "between rounds", "min – max")
MAX_COMMENT_CHARS = 60000    # GitHub refuses comments over 65536 characters


# -- formatting of one row ---------------------------------------------------------------------


def fmt_num(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.1f}"


def _absolute(c: Comparison) -> bool:
    return (c.policy.threshold_rel is None and c.policy.threshold_abs is not None) or c.ratio is None


def fmt_change(c: Comparison) -> str:
    """The change of the medians: `-5.1 %`, or `Δ +0.021` on an absolute scale."""
    if _absolute(c) or c.median_ratio is None:
        return f"Δ {c.head - c.base:+.4g}"
    return f"{(c.median_ratio - 1) * 100:+.1f} %"


def fmt_hl(c: Comparison) -> str:
    """The Hodges-Lehmann change with its interval: `-5.0 % [-6.1, -3.9]`."""
    if min(c.n_base, c.n_head) < 2:
        return "1 sample"
    if _absolute(c):
        ci = f" [{c.ci_diff[0]:+.3g}, {c.ci_diff[1]:+.3g}]" if c.ci_diff else " [no interval yet]"
        return f"{c.diff:+.4g}{ci}"
    ci = (f" [{(c.ci_ratio[0] - 1) * 100:+.1f}, {(c.ci_ratio[1] - 1) * 100:+.1f}]"
          if c.ci_ratio else " [no interval yet]")
    return f"{(c.ratio - 1) * 100:+.1f} %{ci}"


def fmt_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_verdict(c: Comparison) -> str:
    text = f"{ICON.get(c.verdict, '')} {c.verdict}"
    if not c.policy.gate:
        return text + " (not gated)"
    return text + (f" (round {c.look})" if c.look and c.decided else "")


def rows(result: GateResult) -> list[tuple[str, list[str]]]:
    """(verdict, cells of the row) for every cell x metric, plus one row per cell that could
    not be compared; worst first, then in scenario order. Reported-only metrics sort last."""
    out = []
    for order, cv in enumerate(result.cells):
        if cv.status != "ok" or cv.lost_metrics:
            out.append((cv.verdict, order, [cv.label, ", ".join(cv.lost_metrics) or "–", "–", "–",
                                            "–", "–", "–", "–",
                                            f"{ICON.get(cv.verdict, '')} {cv.verdict}: {cv.message}"]))
        for c in cv.comparisons:
            verdict = c.verdict if c.policy.gate else UNCHANGED
            out.append((verdict, order, [cv.label, c.metric, f"{c.n_base}/{c.n_head}",
                                         fmt_num(c.base), fmt_num(c.head), fmt_change(c),
                                         fmt_hl(c), fmt_p(c.p), fmt_verdict(c)]))
    out.sort(key=lambda r: (SEVERITY.index(r[0]), r[1]))
    return [(verdict, cells) for verdict, _, cells in out]


def legend(result: GateResult) -> str:
    """The one line under every table that says what its columns are."""
    d = result.design
    shown = [p for p in result.policies.values() if p.gate] or list(result.policies.values())
    alphas = sorted({p.alpha for p in shown})
    eqs = sorted({p.alpha_eq for p in shown})
    looks = d.looks if d else 1
    level = ", ".join(f"{a:g}" for a in alphas)
    unit = ("rounds base/head, each the median of its repeats (runs differ more than repeats "
            "do)" if result.mode == "ab" else "samples base/head (the runs' repeats)")
    return (f"n: {unit}. base, head: their medians; change: "
            f"head/base of the medians. HL [CI]: Hodges–Lehmann change with its "
            f"distribution-free {1 - 2 * eqs[0] / looks:.1%} interval (unchanged = the interval "
            f"inside ±threshold). p: one-sided Mann–Whitney; significant below α/K = "
            f"{level}/{looks} (K = {looks} look(s), Bonferroni). Round: the look that decided.")


def method_note(result: GateResult) -> str:
    used = {c.metric for cv in result.cells for c in cv.comparisons}
    shown = [p for p in result.policies.values() if p.metric in used] or list(result.policies.values())
    pol = "; ".join(f"`{p.metric}` {p.describe()}" for p in shown)
    return legend(result) + f" Policies: {pol}."


# -- noise and undecided cells -----------------------------------------------------------------


def noise_rows(result: GateResult) -> list[list[str]]:
    out = []
    for cv in result.cells:
        for n in cv.noise:
            out.append([cv.label, n.side, n.metric, str(n.runs), fmt_spread(n.within, n.relative),
                        fmt_spread(n.between, n.relative), f"{fmt_num(n.lo)} – {fmt_num(n.hi)}"])
    return out


def warning_lines(result: GateResult) -> list[str]:
    return [w for cv in result.cells for w in cv.warnings + [f"{cv.label}: {h}" for h in cv.host_notes]]


def undecided_lines(result: GateResult) -> list[str]:
    """One line per undecided gated metric: the change seen, the noise, what would decide it."""
    out = []
    # An estimate far past any budget is a statement about the noise, not a plan.
    cap = 10 * max(result.design.max_rounds if result.design else 1, 10)
    for cv in result.undecided:
        for c in cv.undecided:
            spread = [n for n in cv.noise if n.metric == c.metric]
            seen = ", ".join(f"{n.side} {fmt_spread(n.between if n.between is not None else n.within, n.relative)}"
                             for n in spread)
            need = cv.to_decide.get(c.metric)
            if need and need > cap:
                more = f"more than {cap} rounds per side: too noisy to gate at this threshold"
            elif need:
                more = f"about {need} round(s) per side would likely decide it"
            else:
                more = "no number of rounds is likely to decide it (the change sits at the threshold)"
            why = " (time budget ran out)" if cv.budget_out else ""
            out.append(f"{cv.label} — `{c.metric}`: HL {fmt_hl(c)} after "
                       f"{cv.rounds.get('head', '?')} round(s){why}; noise {seen or '–'}; {more}")
    return out


# -- markdown ----------------------------------------------------------------------------------


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(columns, table_rows: list[list[str]], align: str) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", align]
    lines += ["| " + " | ".join(_md_escape(x) for x in r) + " |" for r in table_rows]
    return lines


def _how(result: GateResult) -> str:
    extra, d = result.extra, result.design
    plan = (f"{d.first_look} round(s) per side, then one more while undecided, up to "
            f"{d.max_rounds}" if d and d.max_rounds > 1 else "one look")
    budget = extra.get("budget_s")
    spent = extra.get("elapsed_s")
    cost = (f", {spent:g} s of a {budget:g} s budget" if spent is not None and budget
            else f", {spent:g} s" if spent is not None else "")
    over = (extra.get("round_overhead_s") or {}).get("median")
    if over is not None:
        cost += (f"; beyond the timed windows a later round costs {over:.2f} s a worker run "
                 f"(median; max {extra['round_overhead_s']['max']:.2f} s)")
    return {"ab": f"A/B on `{extra.get('host', '?')}`, interleaved, {plan}{cost}",
            "mlflow": f"against the latest MLflow baseline, {plan}{cost}",
            "file": f"against the baseline file, {plan}{cost}",
            "run": f"against a journaled run, {plan}{cost}"}.get(result.mode, result.mode)


TARGET_ICON = {MET: "✅", NOT_MET: "❌", ABSENT: "➖"}


def targets_headline(outcomes) -> str:
    return ", ".join(f"{n} {verdict}" for verdict, n in target_counts(outcomes).items() if n)


def _md_targets(outcomes, before=None) -> list[str]:
    """The scenario's targets on the head's numbers (and the base's, where it is a journaled
    run: a verdict the change moved reads base → head): absolute goals, beside the verdict."""
    rows = []
    for b, o in zip(before or [None] * len(outcomes), outcomes):
        verdict = f"{TARGET_ICON[o.verdict]} {o.verdict}"
        if b is not None and b.verdict != o.verdict:
            verdict = f"{b.verdict} → {verdict}"
        rows.append([o.name] + ([measured_text(b)] if before else []) + [measured_text(o), o.bound,
                    verdict + (f" ({o.why})" if o.why else "")])
    columns = ("target", "base", "head", "bound", "verdict") if before else ("target", "measured", "bound", "verdict")
    align = "|---|---:|---:|---|---|" if before else "|---|---:|---|---|"
    return ([f"**Targets** — the head's numbers against the scenario's goals ({targets_headline(outcomes)}); "
             f"they do not decide the gate:", ""] + _md_table(columns, rows, align) + [""])


def to_markdown(result: GateResult, *, details_url: str | None = None) -> str:
    code = result.exit_code()
    lines = [f"### {TITLE[code]} — {result.headline()}", ""]
    lines.append(f"Scenario **{result.scenario}** · base `{result.base}` · head `{result.head}` "
                 f"· {_how(result)}")
    lines.append("")
    align = "|---|---|---:|---:|---:|---:|---|---:|---|"
    all_rows = rows(result)
    attention = [r for v, r in all_rows if v != UNCHANGED]
    quiet = [r for v, r in all_rows if v == UNCHANGED]
    if attention:
        lines += _md_table(COLUMNS, attention, align)
        lines.append("")
    if quiet:
        if attention:
            lines += [f"<details><summary>{len(quiet)} unchanged or reported-only row(s)</summary>", ""]
        lines += _md_table(COLUMNS, quiet, align)
        if attention:
            lines += ["", "</details>"]
        lines.append("")
    lines.append(f"<sub>{legend(result)}</sub>")
    lines.append("")
    if result.targets:
        lines += _md_targets(result.targets, result.targets_base)
    undecided = undecided_lines(result)
    if undecided:
        lines += ["**Undecided** — still inconclusive when the rounds or the budget ran out:", ""]
        lines += [f"- {u}" for u in undecided]
        lines.append("")
    warns = warning_lines(result)
    if warns:
        lines += [f"> ⚠️ {w}" for w in warns]
        lines.append("")
    noise = noise_rows(result)
    if noise:
        lines += [f"<details><summary>Noise: spread of the samples per cell and side "
                  f"(MAD/median){' — ' + str(len(warns)) + ' warning(s)' if warns else ''}"
                  f"</summary>", ""]
        lines += _md_table(NOISE_COLUMNS, noise, "|---|---|---|---:|---:|---:|---|")
        lines += ["", "</details>", ""]
    for note in result.notes:
        lines.append(f"> {note}")
    if result.notes:
        lines.append("")
    pol = "; ".join(f"`{p.metric}` {p.describe()}" for p in result.policies.values())
    lines.append(f"<sub>Policies: {pol}." + (f" [Details]({details_url})" if details_url else "")
                 + "</sub>")
    text = "\n".join(lines) + "\n"
    if len(text) > MAX_COMMENT_CHARS:   # a huge sweep: keep what needs attention
        cut = text[:MAX_COMMENT_CHARS].rsplit("\n", 1)[0]
        text = cut + "\n\n*(truncated: the full table is in the job's gate report)*\n"
    return text


# -- JUnit XML ---------------------------------------------------------------------------------


def to_junit(result: GateResult) -> str:
    """One testsuite, one testcase per (cell, metric) and per cell that could not be compared:
    regressions are failures; errors, missing baselines and undecided gated metrics are errors
    (skipped when allowed); reported-only metrics pass with their numbers."""
    suite = ET.Element("testsuite", name=f"harness gate {result.scenario}")
    props = ET.SubElement(suite, "properties")
    for k, v in (("base", result.base), ("head", result.head), ("mode", result.mode),
                 ("exit_code", str(result.exit_code()))):
        ET.SubElement(props, "property", name=k, value=v)
    if result.targets:    # reported, never a test: a target does not decide the gate
        for verdict, n in target_counts(result.targets).items():
            ET.SubElement(props, "property", name=f"targets_{verdict.replace(' ', '_')}", value=str(n))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for cv in result.cells:
        classname = f"gate.{result.scenario}.{cv.cell_id}"
        if cv.status != "ok" or cv.lost_metrics:
            case = ET.SubElement(suite, "testcase", classname=classname, name=cv.label, time="0")
            counts["tests"] += 1
            if cv.status == MISSING and result.allow_missing:
                ET.SubElement(case, "skipped", message=cv.message or "no baseline")
                counts["skipped"] += 1
            else:
                ET.SubElement(case, "error", message=cv.message or cv.status, type=cv.verdict)
                counts["errors"] += 1
        for c in cv.comparisons:
            case = ET.SubElement(suite, "testcase", classname=classname,
                                 name=f"{cv.label} :: {c.metric}", time="0")
            counts["tests"] += 1
            summary = (f"{c.metric} {c.verdict}: n {c.n_base}/{c.n_head}, base {fmt_num(c.base)}, "
                       f"head {fmt_num(c.head)}, change {fmt_change(c)}, HL {fmt_hl(c)}, "
                       f"p {fmt_p(c.p)}")
            if c.policy.gate and c.verdict == REGRESSED:
                node = ET.SubElement(case, "failure", message=summary, type=c.verdict)
                node.text = f"{summary}\nbaseline: {cv.base_source}\nhead: {cv.head_source}"
                counts["failures"] += 1
            elif c.policy.gate and c.verdict == INCONCLUSIVE and not result.allow_undecided:
                ET.SubElement(case, "error", message="undecided: " + summary, type=c.verdict)
                counts["errors"] += 1
            else:
                ET.SubElement(case, "system-out").text = summary
    for k, v in counts.items():
        suite.set(k, str(v))
    root = ET.Element("testsuites", name="harness gate", **{k: str(v) for k, v in counts.items()})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- JSON --------------------------------------------------------------------------------------


def to_json(result: GateResult) -> str:
    return json.dumps(result.to_dict(), indent=2, default=_jsonable) + "\n"


def _jsonable(v):
    return float(v) if hasattr(v, "__float__") else str(v)


# -- terminal ----------------------------------------------------------------------------------


def console_table(result: GateResult):
    from rich.markup import escape
    from rich.table import Table

    style = {REGRESSED: "red", ERROR: "red", MISSING: "yellow", INCONCLUSIVE: "yellow",
             IMPROVED: "green", UNCHANGED: ""}
    # Labels, refs and messages are user text: escaped, never read as rich markup.
    table = Table(title=escape(f"gate {result.scenario}: base {result.base} vs head {result.head}"),
                  title_justify="left", header_style="bold", caption=escape(legend(result)),
                  caption_justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="right" if name in ("n", "base", "head", "change", "p")
                         else "left")
    for verdict, r in rows(result):
        table.add_row(*map(escape, r), style=style.get(verdict, ""))
    return table


def console_noise(result: GateResult):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="noise: spread of the samples (MAD/median)", title_justify="left",
                  header_style="bold")
    for name in NOISE_COLUMNS:
        table.add_column(name, justify="right" if name in ("runs", "within a run", "between rounds")
                         else "left")
    for r in noise_rows(result):
        table.add_row(*map(escape, r))
    return table


def write_reports(result: GateResult, out_dir: str | Path, *, markdown: str | Path | None = None,
                  junit: str | Path | None = None, json_path: str | Path | None = None,
                  details_url: str | None = None) -> dict[str, Path]:
    """report.md, junit.xml and gate.json into `out_dir`, plus copies wherever asked."""
    out_dir = Path(out_dir)
    texts = {"markdown": to_markdown(result, details_url=details_url), "junit": to_junit(result),
             "json": to_json(result)}
    names = {"markdown": "report.md", "junit": "junit.xml", "json": "gate.json"}
    extra = {"markdown": markdown, "junit": junit, "json": json_path}
    written = {}
    for kind, text in texts.items():
        path = out_dir / names[kind]
        atomic_write_text(path, text)
        written[kind] = path
        if extra[kind]:
            atomic_write_text(Path(extra[kind]), text)
            written[kind] = Path(extra[kind])
    return written
