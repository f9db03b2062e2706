"""A gate's result as a PR comment (markdown), JUnit XML for CI systems, JSON, and a terminal table.

One row per (cell, metric): baseline and head medians, the ratio head/base with its bootstrap
CI, the Mann-Whitney p and the verdict. The markdown puts what needs attention (regressions,
errors, inconclusive rows) first and folds the unchanged rows away, so a 140-cell nightly
still reads as a comment.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.gate.judge import ERROR, MISSING, GateResult
from harness.gate.stats import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Comparison
from harness.journal import atomic_write_text

ICON = {REGRESSED: "❌", IMPROVED: "🚀", INCONCLUSIVE: "❔", UNCHANGED: "✅",
        ERROR: "⚠️", MISSING: "⚠️"}
TITLE = {0: "✅ Performance gate passed", 1: "❌ Performance gate: regression",
         2: "⚠️ Performance gate could not decide"}
COLUMNS = ("cell", "metric", "baseline", "head", "ratio", "CI", "p", "verdict")
MAX_COMMENT_CHARS = 60000    # GitHub refuses comments over 65536 characters


# -- formatting of one row ---------------------------------------------------------------------


def fmt_num(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.4g}" if abs(v) < 1000 else f"{v:.1f}"


def _absolute_only(c: Comparison) -> bool:
    return c.policy.threshold_abs is not None and c.policy.threshold_rel is None


def fmt_change(c: Comparison) -> str:
    """`0.949 (-5.1 %)`, or `Δ +0.021` for metrics judged on an absolute scale."""
    if _absolute_only(c) or c.ratio is None:
        return f"Δ {c.diff:+.4g}"
    return f"{c.ratio:.3f} ({(c.ratio - 1) * 100:+.1f} %)"


def fmt_ci(c: Comparison) -> str:
    if (_absolute_only(c) or c.ratio is None) and c.ci_diff:
        return f"{c.ci_diff[0]:+.4g} … {c.ci_diff[1]:+.4g}"
    if c.ci_ratio:
        return f"{c.ci_ratio[0]:.3f} … {c.ci_ratio[1]:.3f}"
    return "–"


def fmt_p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_verdict(verdict: str, remeasured: bool = False) -> str:
    return f"{ICON.get(verdict, '')} {verdict}" + (" (re-measured)" if remeasured else "")


def rows(result: GateResult) -> list[tuple[str, list[str]]]:
    """(verdict, cells of the row) for every cell x metric, plus one row per cell that could
    not be compared; worst first, then in scenario order."""
    out = []
    for order, cv in enumerate(result.cells):
        if cv.status != "ok" or cv.lost_metrics:
            out.append((cv.verdict, order, [cv.label, ", ".join(cv.lost_metrics) or "–", "–", "–",
                                            "–", "–", "–", fmt_verdict(cv.verdict) + f": {cv.message}"]))
        for c in cv.comparisons:
            out.append((c.verdict, order, [cv.label, c.metric, fmt_num(c.base), fmt_num(c.head),
                                           fmt_change(c), fmt_ci(c), fmt_p(c.p),
                                           fmt_verdict(c.verdict, cv.remeasured)]))
    rank = (ERROR, MISSING, REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED)
    out.sort(key=lambda r: (rank.index(r[0]), r[1]))
    return [(verdict, cells) for verdict, _, cells in out]


def method_note(result: GateResult) -> str:
    used = {c.metric for cv in result.cells for c in cv.comparisons}
    shown = [p for p in result.policies.values() if p.metric in used] or list(result.policies.values())
    pol = "; ".join(f"`{p.metric}` {p.describe()}" for p in shown)
    alphas = sorted({p.alpha for p in shown})
    return (f"baseline/head: medians of the repeats. ratio: Hodges–Lehmann estimate of head/base "
            f"(median over all pairs of repeats). CI: {_confidence(result):.0%} bootstrap. "
            f"p: one-sided Mann–Whitney toward the change shown. A regression must exceed the "
            f"policy threshold and have p < {', '.join(f'{a:g}' for a in alphas)}. "
            f"Policies: {pol}.")


def _confidence(result: GateResult) -> float:
    for cv in result.cells:
        for c in cv.comparisons:
            return c.confidence
    return 0.95


# -- markdown ----------------------------------------------------------------------------------


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(table_rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|---|---|---:|---:|---:|---|---:|---|"]
    lines += ["| " + " | ".join(_md_escape(x) for x in r) + " |" for r in table_rows]
    return lines


def to_markdown(result: GateResult, *, details_url: str | None = None) -> str:
    code = result.exit_code()
    lines = [f"### {TITLE[code]} — {result.headline()}", ""]
    extra = result.extra
    how = {"ab": f"A/B on `{extra.get('host', '?')}`, interleaved, {extra.get('rounds', '?')} "
                 f"round(s) per side + up to {extra.get('remeasure', '?')} re-measure round(s)",
           "mlflow": "against the latest MLflow baseline", "file": "against the baseline file",
           "run": "against a journaled run"}.get(result.mode, result.mode)
    lines.append(f"Scenario **{result.scenario}** · base `{result.base}` · head `{result.head}` "
                 f"· {how}")
    lines.append("")
    all_rows = rows(result)
    attention = [r for v, r in all_rows if v != UNCHANGED]
    quiet = [r for v, r in all_rows if v == UNCHANGED]
    if attention:
        lines += _md_table(attention)
        lines.append("")
    if quiet:
        if attention:
            lines += [f"<details><summary>{len(quiet)} unchanged row(s)</summary>", ""]
        lines += _md_table(quiet)
        if attention:
            lines += ["", "</details>"]
        lines.append("")
    for note in result.notes:
        lines.append(f"> {note}")
    if result.notes:
        lines.append("")
    lines.append(f"<sub>{method_note(result)}"
                 + (f" [Details]({details_url})" if details_url else "") + "</sub>")
    text = "\n".join(lines) + "\n"
    if len(text) > MAX_COMMENT_CHARS:   # a huge sweep: keep what needs attention
        cut = text[:MAX_COMMENT_CHARS].rsplit("\n", 1)[0]
        text = cut + "\n\n*(truncated: the full table is in the job's gate report)*\n"
    return text


# -- JUnit XML ---------------------------------------------------------------------------------


def to_junit(result: GateResult) -> str:
    """One testsuite, one testcase per (cell, metric) and per cell that could not be compared:
    regressions are failures, errors and missing baselines are errors (skipped when missing
    baselines are allowed), inconclusive rows pass with a note (fail with fail_on_inconclusive)."""
    suite = ET.Element("testsuite", name=f"harness gate {result.scenario}")
    props = ET.SubElement(suite, "properties")
    for k, v in (("base", result.base), ("head", result.head), ("mode", result.mode),
                 ("exit_code", str(result.exit_code()))):
        ET.SubElement(props, "property", name=k, value=v)
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
            summary = (f"{c.metric} {c.verdict}: baseline {fmt_num(c.base)}, head {fmt_num(c.head)}, "
                       f"ratio {fmt_change(c)}, CI {fmt_ci(c)}, p {fmt_p(c.p)}")
            failed = c.verdict == REGRESSED or (c.verdict == INCONCLUSIVE and result.fail_on_inconclusive)
            if failed:
                node = ET.SubElement(case, "failure", message=summary, type=c.verdict)
                node.text = f"{summary}\nbaseline: {cv.base_source}\nhead: {cv.head_source}"
                counts["failures"] += 1
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
    from rich.table import Table

    style = {REGRESSED: "red", ERROR: "red", MISSING: "yellow", INCONCLUSIVE: "yellow",
             IMPROVED: "green", UNCHANGED: ""}
    table = Table(title=f"gate {result.scenario}: base {result.base} vs head {result.head}",
                  title_justify="left", header_style="bold")
    for name in COLUMNS:
        table.add_column(name, justify="right" if name in ("baseline", "head", "ratio", "p") else "left")
    for verdict, r in rows(result):
        table.add_row(*r, style=style.get(verdict, ""))
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
