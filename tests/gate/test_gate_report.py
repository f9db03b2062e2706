"""Judging a whole gate (exit codes) and its outputs: markdown, JUnit XML, JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from harness.gate import report
from harness.gate.baselines import Side
from harness.gate.judge import GateResult, judge_cell, settled, wants_more
from harness.gate.noise import side_noise
from harness.gate.policy import DEFAULT_POLICIES
from harness.gate.report import to_json, to_junit, to_markdown, write_reports
from harness.gate.sequential import Design
from harness.protocol.errors import InputError

BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
ACCEPT = [6.4, 6.5, 6.6, 6.5, 6.45]
ONE = Design(1, 1)      # one look: the policies' own levels


def side(cid, tps, accept=ACCEPT, gpu="h200", error=None, **extra) -> Side:
    samples = {"tokens_per_s": list(tps), "accept_len_mean": list(accept), **extra}
    return Side(cid, f"qwen3-8b ctx={cid}", gpu, samples if not error else {}, f"src-{cid}",
                "abc", error)


def judge(head, base, design=ONE, round_no=1, decided=None):
    return judge_cell(head, base, DEFAULT_POLICIES, design, round_no, decided)


def gate(cells, **kw) -> GateResult:
    return GateResult("pr", "file", "results/baselines/h200/pr.json", "working tree @ 1234",
                      cells, DEFAULT_POLICIES, ONE, **kw)


def test_cell_verdicts_and_exit_codes():
    ok = judge(side("a", BASE), side("a", BASE))
    slow = judge(side("b", [v * 0.9 for v in BASE]), side("b", BASE))
    # acceptance gated separately: tokens/s unchanged, acceptance down 10 %.
    fewer = judge(side("c", BASE, [v * 0.9 for v in ACCEPT]), side("c", BASE))
    assert ok.verdict == "unchanged" and slow.verdict == "regressed"
    assert {c.metric: c.verdict for c in fewer.comparisons} == {
        "tokens_per_s": "unchanged", "accept_len_mean": "regressed"}
    assert gate([ok]).exit_code() == 0
    assert gate([ok, slow]).exit_code() == 1
    assert gate([ok, fewer]).exit_code() == 1


def test_undecided_exits_3_unless_allowed():
    wide = [100, 90, 110, 95, 105]
    cv = judge(side("a", [95, 85, 104, 91, 99.75]), side("a", wide))
    assert cv.verdict == "inconclusive" and wants_more(cv)
    ok = judge(side("b", BASE), side("b", BASE))
    assert gate([ok, cv]).exit_code() == 3
    allowed = gate([ok, cv], allow_undecided=True)
    assert allowed.exit_code() == 0 and "--allow-undecided" in allowed.headline()
    # A regression outranks undecided cells.
    slow = judge(side("c", [v * 0.9 for v in BASE]), side("c", BASE))
    assert gate([cv, slow], allow_undecided=True).exit_code() == 1


def test_half_speed_head_with_three_repeats_never_passes():
    # The case: 3 vs 3 cannot reach alpha 0.01 (min p 1/20): at one look the gate
    # is undecided (exit 3), never "passed" -- and the planners refuse such a design up front.
    three = [100.0, 101.0, 99.0]
    cv = judge(side("a", [v * 0.5 for v in three], ACCEPT[:3]), side("a", three, ACCEPT[:3]))
    assert cv.verdict == "inconclusive"
    assert gate([cv]).exit_code() == 3


def test_nothing_measured_or_missing_baseline_exits_2():
    assert gate([]).exit_code() == 2                                     # no cells at all
    failed = judge(side("a", [], error="CUDA out of memory"), side("a", BASE))
    assert failed.verdict == "error" and "out of memory" in failed.message
    assert gate([failed]).exit_code() == 2
    no_base = judge(side("a", BASE), None)
    assert no_base.verdict == "missing"
    ok = judge(side("b", BASE), side("b", BASE))
    assert gate([ok, no_base]).exit_code() == 2
    assert gate([ok, no_base], allow_missing=True).exit_code() == 0
    # ...but allowing missing baselines never lets a gate pass on nothing.
    assert gate([no_base], allow_missing=True).exit_code() == 2
    # A head error outranks a regression: the gate's answer is incomplete.
    slow = judge(side("c", [v * 0.9 for v in BASE]), side("c", BASE))
    assert gate([slow, failed]).exit_code() == 2


def test_reported_metrics_never_decide():
    # idle_fraction is reported, not gated, by default: a big rise shows but does not fail,
    # and a cell with only reported metrics compared is "nothing compared".
    head = side("a", BASE, idle_fraction=[0.5] * 5)
    cv = judge(head, side("a", BASE, idle_fraction=[0.1] * 5))
    idle = next(c for c in cv.comparisons if c.metric == "idle_fraction")
    assert idle.verdict == "regressed" and cv.verdict == "unchanged"
    assert gate([cv]).exit_code() == 0
    only_idle = Side("x", "x", "h200", {"idle_fraction": [0.5] * 5}, "s")
    cv = judge(only_idle, Side("x", "x", "h200", {"idle_fraction": [0.1] * 5}, "s"))
    assert cv.verdict == "missing" and gate([cv]).exit_code() == 2


def test_lost_and_new_metrics():
    head = side("a", BASE)
    base = side("a", BASE, step_ms_p50=[10.0] * 5)
    cv = judge(head, base)
    assert cv.lost_metrics == ["step_ms_p50"] and cv.verdict == "missing"
    cv = judge(side("a", BASE, step_ms_p50=[10.0] * 5), side("a", BASE))
    assert cv.new_metrics == ["step_ms_p50"] and cv.verdict == "unchanged"


def test_a_decided_metric_keeps_its_verdict():
    design = Design(1, 3)
    first = judge(side("a", BASE), side("a", BASE), design, 1)
    kept = settled(first)
    assert set(kept) == {"tokens_per_s", "accept_len_mean"}
    # Later samples that would look worse do not reopen it.
    later = judge(side("a", [v * 0.9 for v in BASE]), side("a", BASE), design, 2, kept)
    assert later.verdict == "unchanged" and later.comparisons[0].look == 1


def test_cross_gpu_class_is_refused():
    with pytest.raises(InputError, match="never compared"):
        judge(side("a", BASE, gpu="h200"), side("a", BASE, gpu="h100-80gb-hbm3"))


def _result():
    ok = judge(side("4096", BASE), side("4096", BASE))
    slow = judge(side("32768", [v * 0.9 for v in BASE]), side("32768", BASE))
    missing = judge(side("65536", BASE), None)
    runs = [{"status": "ok", "samples": {"tokens_per_s": BASE}, "metrics": {}},
            {"status": "ok", "samples": {"tokens_per_s": [v * 1.2 for v in BASE]}, "metrics": {}}]
    slow.noise = [side_noise(runs, DEFAULT_POLICIES["tokens_per_s"], "head")]
    slow.warnings = ["qwen3-8b ctx=32768 (head): `tokens_per_s` varies 10.0 % between rounds"]
    return gate([ok, slow, missing], allow_missing=True)


def test_markdown_puts_regressions_first_and_folds_unchanged_rows():
    md = to_markdown(_result(), details_url="https://ci.example/job/1")
    assert md.startswith("### ❌ Performance gate: regression")
    header = "| cell | metric | n | base | head | change | HL [CI] | p | verdict |"
    assert md.count(header) == 2                         # attention table + folded table
    first_table = md.split(header)[1].split("<details>")[0]
    assert "qwen3-8b ctx=32768 | tokens_per_s | 5/5 | 100 | 90 | -10.0 % | -10.0 % [" in first_table
    assert "❌ regressed (round 1)" in first_table
    assert "no baseline for this cell" in first_table
    assert "ctx=4096" not in first_table                 # unchanged rows are folded away
    assert "<details><summary>3 unchanged or reported-only row(s)</summary>" in md
    assert "α/K = 0.01/1" in md and "[Details](https://ci.example/job/1)" in md
    assert "0.004" in md                                 # 1/252
    assert "varies 10.0 % between rounds" in md and "| head | tokens_per_s | 2 |" in md


def test_one_sample_shows_no_interval():
    cv = judge(side("a", BASE, step_ms_p50=[10.0]), side("a", BASE, step_ms_p50=[10.2]))
    md = to_markdown(gate([cv]))
    assert "| step_ms_p50 | 1/1 |" in md and "1 sample" in md


def test_undecided_report_names_cells_noise_and_rounds():
    wide = [100, 90, 110, 95, 105]
    cv = judge(side("a", [99, 89, 109, 94, 104], ACCEPT), side("a", wide, ACCEPT))
    cv.rounds = {"base": 1, "head": 1}
    cv.to_decide = {"tokens_per_s": 7}
    cv.budget_out = True
    md = to_markdown(gate([cv]))
    assert md.startswith("### ❔ Performance gate undecided")
    assert "**Undecided**" in md and "about 7 round(s) per side" in md and "budget ran out" in md


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
    # An undecided gated metric is an error too (it is not a pass).
    wide = [100, 90, 110, 95, 105]
    undecided = gate([judge(side("a", [95, 85, 104, 91, 99.75]), side("a", wide))])
    assert ET.fromstring(to_junit(undecided)).find("testsuite").get("errors") == "1"


def test_json_report(tmp_path):
    data = json.loads(to_json(_result()))
    assert data["exit_code"] == 1 and data["counts"]["regressed"] == 1
    assert data["design"] == {"first_look": 1, "max_rounds": 1, "looks": 1, "correction": "bonferroni"}
    cell = next(c for c in data["cells"] if c["label"].endswith("32768"))
    tps = next(m for m in cell["metrics"] if m["metric"] == "tokens_per_s")
    assert tps["verdict"] == "regressed" and tps["hl_ratio"] == pytest.approx(0.9)
    assert tps["median_ratio"] == pytest.approx(0.9)
    assert tps["p_worse"] == pytest.approx(1 / 252) and len(tps["ci_ratio"]) == 2
    assert cell["noise"][0]["between_runs"] is not None
    written = write_reports(_result(), tmp_path / "gate", markdown=tmp_path / "comment.md")
    assert (tmp_path / "gate" / "report.md").is_file() and (tmp_path / "gate" / "junit.xml").is_file()
    assert written["markdown"] == tmp_path / "comment.md"
    assert json.loads((tmp_path / "gate" / "gate.json").read_text())["scenario"] == "pr"


def test_huge_comment_is_truncated():
    long = "x" * 400   # long labels: few cells make a big table
    cells = [judge(side(f"{i}{long}", [v * 0.9 for v in BASE], [1.0, 2, 3, 4, 5]),
                   side(f"{i}{long}", BASE, [1.0, 2, 3, 4, 5]))
             for i in range(80)]
    md = to_markdown(gate(cells))
    assert len(md) <= report.MAX_COMMENT_CHARS + 200 and "truncated" in md
