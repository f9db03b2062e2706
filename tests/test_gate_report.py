"""Judging a whole gate (exit codes) and its outputs: markdown, JUnit XML, JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from harness.errors import InputError
from harness.gate import report
from harness.gate.baselines import Side
from harness.gate.judge import GateResult, judge_cell
from harness.gate.policy import DEFAULT_POLICIES
from harness.gate.report import to_json, to_junit, to_markdown, write_reports

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
ACCEPT = [6.4, 6.5, 6.6, 6.5, 6.45]


def side(cid, tps, accept=ACCEPT, gpu="h200", error=None, **extra) -> Side:
    samples = {"tokens_per_s": list(tps), "accept_len_mean": list(accept), **extra}
    return Side(cid, f"qwen3-8b ctx={cid}", gpu, samples if not error else {}, f"src-{cid}",
                "abc", error)


def gate(cells, **kw) -> GateResult:
    return GateResult("pr", "file", "results/baselines/h200/pr.json", "working tree @ 1234",
                      cells, DEFAULT_POLICIES, **kw)


def test_cell_verdicts_and_exit_codes():
    ok = judge_cell(side("a", BASE), side("a", BASE), DEFAULT_POLICIES)
    slow = judge_cell(side("b", [v * 0.9 for v in BASE]), side("b", BASE), DEFAULT_POLICIES)
    # acceptance gated separately: tokens/s unchanged, acceptance down 10 %.
    fewer = judge_cell(side("c", BASE, [v * 0.9 for v in ACCEPT]), side("c", BASE), DEFAULT_POLICIES)
    assert ok.verdict == "unchanged" and slow.verdict == "regressed"
    assert {c.metric: c.verdict for c in fewer.comparisons} == {
        "tokens_per_s": "unchanged", "accept_len_mean": "regressed"}
    assert gate([ok]).exit_code() == 0
    assert gate([ok, slow]).exit_code() == 1
    assert gate([ok, fewer]).exit_code() == 1


def test_nothing_measured_or_missing_baseline_exits_2():
    assert gate([]).exit_code() == 2                                     # no cells at all
    failed = judge_cell(side("a", [], error="CUDA out of memory"), side("a", BASE), DEFAULT_POLICIES)
    assert failed.verdict == "error" and "out of memory" in failed.message
    assert gate([failed]).exit_code() == 2
    no_base = judge_cell(side("a", BASE), None, DEFAULT_POLICIES)
    assert no_base.verdict == "missing"
    ok = judge_cell(side("b", BASE), side("b", BASE), DEFAULT_POLICIES)
    assert gate([ok, no_base]).exit_code() == 2
    assert gate([ok, no_base], allow_missing=True).exit_code() == 0
    # ...but allowing missing baselines never lets a gate pass on nothing.
    assert gate([no_base], allow_missing=True).exit_code() == 2
    # A head error outranks a regression: the gate's answer is incomplete.
    slow = judge_cell(side("c", [v * 0.9 for v in BASE]), side("c", BASE), DEFAULT_POLICIES)
    assert gate([slow, failed]).exit_code() == 2


def test_lost_and_new_metrics():
    head = side("a", BASE)
    base = side("a", BASE, idle_fraction=[0.1] * 5)
    cv = judge_cell(head, base, DEFAULT_POLICIES)
    assert cv.lost_metrics == ["idle_fraction"] and cv.verdict == "missing"
    cv = judge_cell(side("a", BASE, idle_fraction=[0.1] * 5), side("a", BASE), DEFAULT_POLICIES)
    assert cv.new_metrics == ["idle_fraction"] and cv.verdict == "unchanged"


def test_cross_gpu_class_is_refused():
    with pytest.raises(InputError, match="never compared"):
        judge_cell(side("a", BASE, gpu="h200"), side("a", BASE, gpu="h100-80gb-hbm3"),
                   DEFAULT_POLICIES)


def test_inconclusive_passes_unless_asked():
    wide = [100, 90, 110, 95, 105]
    cv = judge_cell(side("a", [95, 85, 104, 91, 99.75]), side("a", wide), DEFAULT_POLICIES)
    assert cv.verdict == "inconclusive"
    assert gate([cv]).exit_code() == 0
    assert gate([cv], fail_on_inconclusive=True).exit_code() == 1


def _result():
    ok = judge_cell(side("4096", BASE), side("4096", BASE), DEFAULT_POLICIES)
    slow = judge_cell(side("32768", [v * 0.9 for v in BASE]), side("32768", BASE), DEFAULT_POLICIES)
    slow.remeasured = True
    missing = judge_cell(side("65536", BASE), None, DEFAULT_POLICIES)
    return gate([ok, slow, missing], allow_missing=True)


def test_markdown_puts_regressions_first_and_folds_unchanged_rows():
    md = to_markdown(_result(), details_url="https://ci.example/job/1")
    assert md.startswith("### ❌ Performance gate: regression")
    header = "| cell | metric | baseline | head | ratio | CI | p | verdict |"
    assert md.count(header) == 2                         # attention table + folded table
    first_table = md.split(header)[1].split("<details>")[0]
    assert "qwen3-8b ctx=32768 | tokens_per_s | 100 | 90 | 0.900 (-10.0 %)" in first_table
    assert "❌ regressed (re-measured)" in first_table
    assert "no baseline for this cell" in first_table
    assert "ctx=4096" not in first_table                 # unchanged rows are folded away
    assert "<details><summary>3 unchanged row(s)</summary>" in md
    assert "p < 0.01" in md and "[Details](https://ci.example/job/1)" in md
    assert "0.004" in md                                 # 1/252


def test_junit_xml():
    root = ET.fromstring(to_junit(_result()))
    suite = root.find("testsuite")
    assert suite.get("tests") == "5" and suite.get("failures") == "1"
    assert suite.get("skipped") == "1" and suite.get("errors") == "0"
    failures = suite.findall("testcase/failure")
    assert len(failures) == 1 and "tokens_per_s regressed" in failures[0].get("message")
    names = [tc.get("name") for tc in suite.findall("testcase")]
    assert "qwen3-8b ctx=32768 :: tokens_per_s" in names
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["exit_code"] == "1"
    # Without allow_missing a missing baseline is an error, not a skip.
    strict = _result()
    strict.allow_missing = False
    assert ET.fromstring(to_junit(strict)).find("testsuite").get("errors") == "1"


def test_json_report(tmp_path):
    data = json.loads(to_json(_result()))
    assert data["exit_code"] == 1 and data["counts"]["regressed"] == 1
    cell = next(c for c in data["cells"] if c["label"].endswith("32768"))
    tps = next(m for m in cell["metrics"] if m["metric"] == "tokens_per_s")
    assert tps["verdict"] == "regressed" and tps["ratio"] == pytest.approx(0.9)
    assert tps["p_worse"] == pytest.approx(1 / 252) and len(tps["ci_ratio"]) == 2
    assert cell["remeasured"] is True
    written = write_reports(_result(), tmp_path / "gate", markdown=tmp_path / "comment.md")
    assert (tmp_path / "gate" / "report.md").is_file() and (tmp_path / "gate" / "junit.xml").is_file()
    assert written["markdown"] == tmp_path / "comment.md"
    assert json.loads((tmp_path / "gate" / "gate.json").read_text())["scenario"] == "pr"


def test_huge_comment_is_truncated():
    long = "x" * 400   # long labels: few cells make a big table
    cells = [judge_cell(side(f"{i}{long}", [v * 0.9 for v in BASE], [1.0, 2, 3, 4, 5]),
                        side(f"{i}{long}", BASE, [1.0, 2, 3, 4, 5]), DEFAULT_POLICIES, with_ci=False)
             for i in range(80)]
    md = to_markdown(gate(cells))
    assert len(md) <= report.MAX_COMMENT_CHARS + 200 and "truncated" in md
