"""The HTML report: content from the journal, escaping, comparison verdicts, the CLI, the MLflow
upload, and — in headless Chromium — no console errors, every image loaded, not blank."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import markupsafe
import pytest

import cli_process
from PIL import Image

from dashboard_fixtures import (
    CPU_ENV, GPU_BASE, META, cpu_result, failed_result, gpu_result, gpu_sweep, kernel_sweep,
    write_journal,
)
from harness.dashboards import headless
from harness.dashboards.report import build_report
from harness.gate.runs import VERDICT_NOTE
from harness.gate.runs import compare as compare_runs

# mlflow 3.17's sqlalchemy store uses a loader strategy SQLAlchemy 2.1 deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
HEAD_ID, BASE_ID = "20260501-020000-aaaaaa", "20260430-020000-bbbbbb"
NEVER_RAN = {**GPU_BASE, "context_length": 131072, "verify_mode": "custom",
             "graph_capture": "full", "tree_build": "gpu"}

needs_chromium = pytest.mark.skipif(headless.find_chromium() is None,
                                    reason="Chromium not installed (apt-get install chromium)")


@pytest.fixture
def runs(tmp_path):
    """A head run (decode sweep with a failed cell, kernel cells, one cell that never ran)
    and a base run of the same sweep, 10 % faster."""
    root = tmp_path / "results" / "runs"
    head = write_journal(root, HEAD_ID, gpu_sweep() + kernel_sweep(), [NEVER_RAN])
    base = write_journal(root, BASE_ID, gpu_sweep(speed=1.1),
                         meta={**META, "git_sha": "1111111222222233333334444444555555566666"})
    return head, base


def images_in(page: str) -> list[bytes]:
    return [base64.b64decode(m)
            for m in re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_and_says_what_ran_where(runs):
    head, _ = runs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = build_report(head)
    assert report.path == head.path / "report" / "index.html"
    page = report.path.read_text()

    # Summary: host, GPU, driver, torch, commit, scenario, trigger, date.
    for text in ("gpu-a", "NVIDIA H200 (× 8)", "580.65.06", "2.11.0+cu130",
                 META["git_sha"], "nightly", head.run["created_at"]):
        assert text in page, text
    # Every figure is inlined, drawn, and also written beside index.html for MLflow.
    assert not [f for f in report.figures if f.error], [f.error for f in report.figures]
    names = {f.name for f in report.figures}
    assert {"tokens_vs_context.png", "speedup_heatmap.png", "idle_by_phase.png",
            "kernel_roofline.png"} <= names
    assert any(n.startswith("timeline-") for n in names)
    pngs = images_in(page)
    assert len(pngs) == len(report.figures)
    for f in report.figures:
        assert (report.path.parent / f.name).read_bytes() in pngs
    # Nothing to fetch: no scripts, no external URLs, a CSP that forbids any.
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "default-src 'none'" in page


def test_report_shows_a_history_when_given_one(runs):
    head, _ = runs
    points = [(f"{i:07x}", f"2026-04-{i + 1:02d} 02:00", 500.0 - 40 * (i >= 6)) for i in range(10)]
    report = build_report(head, history=[{"points": points, "change_points": [6],
                                          "cell": "ctx=4096 verify=custom", "gpu": "h200"}])
    assert [f.name for f in report.figures if f.name.startswith("history")] == ["history-0.png"]
    assert "History of tokens_per_s for ctx=4096 verify=custom" in report.path.read_text()


def test_report_lists_failed_and_missing_cells_escaped(runs):
    head, _ = runs
    page = build_report(head).path.read_text()
    failed = page.split("<h2>Failed cells</h2>", 1)[1]
    # The error text is shown escaped, never as markup.
    assert "torch.OutOfMemoryError: CUDA out of memory" in failed
    assert str(markupsafe.escape('<& "quoted" >')) in failed and '<& "quoted" >' not in page
    assert "CompilationError" in failed                         # failed kernel cells too
    assert "ctx=131072" in failed and "never produced a result" in failed
    cells = page.split("<h2>Cells</h2>", 1)[1].split("<h2>Failed cells</h2>", 1)[0]
    assert "Decode cells" in cells and "Kernel cells" in cells
    assert cells.count('badge failed') == 1 + 3 and cells.count("badge missing") == 1
    assert "n/a" not in cells.split("Kernel cells")[1]           # GPU host: no "no GPU" text


def test_cpu_run_says_idle_is_not_available(tmp_path):
    results = [cpu_result(256, "greedy", 40.0), cpu_result(1024, "greedy", 30.0),
               failed_result({"model": "tiny", "device": "cpu", "context_length": 4096},
                             env=CPU_ENV, host="local")]
    journal = write_journal(tmp_path / "runs", HEAD_ID, results, scenario="quickstart",
                            meta={"git_sha": "abc", "trigger": "manual", "git_dirty": True})
    report = build_report(journal)
    page = report.path.read_text()
    assert "n/a (no GPU)" in page and "none (CPU)" in page
    assert "uncommitted changes" in page
    # One verify mode: nothing to compare, said in one line instead of a picture of nothing.
    assert "speedup_heatmap.png" not in {f.name for f in report.figures if f.png}
    assert ('<p class="figure-note">Speedup heatmap: <span class="muted">only verify=sdpa was '
            'measured: nothing to compare</span></p>') in page
    assert len(images_in(page)) == 2 and not (report.path.parent / "speedup_heatmap.png").exists()


def test_a_figure_that_fails_is_a_visible_card_not_a_lost_report(runs, monkeypatch):
    from harness.dashboards import figures

    def broken(*args, **kwargs):
        raise ValueError("no <good> data")

    monkeypatch.setattr(figures, "tokens_vs_context", broken)
    head, _ = runs
    report = build_report(head)
    page = report.path.read_text()
    assert "Figure tokens_vs_context.png could not be drawn" in page
    assert "ValueError: no &lt;good&gt; data" in page
    assert len(images_in(page)) == len(report.figures) - 1  # the others are still there


def test_compare_verdicts_ratio_per_cell(runs):
    head, base = runs
    verdicts = compare_runs(head.results(), base.results())
    report = build_report(head, base=base, verdicts=verdicts, verdict_note=VERDICT_NOTE)
    page = report.path.read_text()
    assert BASE_ID in page and "head/base" in page and VERDICT_NOTE in page
    assert report.verdicts is verdicts and verdicts.keys() == head.results().keys()
    ok = [v for v in verdicts.values() if v.ratio is not None]
    assert ok and all(v.ratio == pytest.approx(1 / 1.1) for v in ok)
    by_verdict = {v.verdict for v in verdicts.values()}
    assert {"no base", "base failed"} <= by_verdict  # kernel cells; the cell failed in both
    # The statistical gate decides: 3 vs 3 repeats cannot be significant at alpha 1 %.
    assert {v.verdict for v in ok} == {"inconclusive"}
    assert all("p=" in v.detail for v in ok)


def test_compare_draws_the_base_in_every_figure(runs, tmp_path):
    head, _ = runs
    base = write_journal(tmp_path / "base-runs", BASE_ID, gpu_sweep(speed=1.1) + kernel_sweep())
    plain = {f.name: f.png for f in build_report(head, tmp_path / "plain").figures}
    compared = build_report(head, tmp_path / "compared", base=base,
                            verdicts=compare_runs(head.results(), base.results()))
    assert plain.keys() == {f.name for f in compared.figures}
    for f in compared.figures:
        assert f.png is not None and f.png != plain[f.name], f.name   # every one has more on it
    page = compared.path.read_text()
    assert "Every figure draws the base run faded behind this one." in page
    assert page.count("the base run.") >= 3       # captions: faded lines, thin bars, small print


def test_report_k_shows_the_cells_it_selects_and_clears_the_rest(runs, tmp_path):
    head, base = runs
    report_dir = head.path / "report"
    build_report(head)
    before = {p.name for p in report_dir.glob("timeline-*.png")}
    out = run_cli("report", HEAD_ID, "--compare", BASE_ID, "-k", "verify_mode=custom and graph=full",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "Report not attached to MLflow: narrowed with -k" in out.stdout
    page = (report_dir / "index.html").read_text()
    cells = page.split("<h2>Cells</h2>", 1)[1].split("<h2>Failed cells</h2>", 1)[0]
    rows = re.findall(r'<td title="([^"]+)"', cells)
    assert rows and all("verify=custom graph=full" in r for r in rows), rows
    # Three measured contexts and the 128k cell that never ran, of every planned cell.
    assert len(rows) == 4 and (f"-k verify_mode=custom and graph=full</code> selects: 4 of "
                               f"{len(head.cells)}.") in page
    # The timelines of cells now left out are gone from the folder MLflow would get.
    after = {p.name for p in report_dir.glob("timeline-*.png")}
    assert after and after < before
    assert len(images_in(page)) == len(list(report_dir.glob("*.png")))

    for expr, why in (("verify_mode=nosuch", "selects none of the"), ("(custom", "never closed")):
        bad = run_cli("report", HEAD_ID, "-k", expr, cwd=tmp_path)
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert why in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_run_verdicts_read_the_metric_of_each_workload():
    fast = gpu_result(4096, "custom", tps=1000.0)
    k_base = kernel_sweep()[0]
    k_head = dict(k_base, metrics={**k_base["metrics"], "kernel_us": k_base["metrics"]["kernel_us"] / 2})
    failed = failed_result(fast["cell"])
    cid, kid = fast["cell_id"], k_base["cell_id"]

    def verdict(head, base, key):
        return compare_runs({key: head}, {key: base} if base else {})[key]

    assert verdict(k_head, k_base, kid).metric == "kernel_us"
    op = dict(k_base, cell={"workload": "op", "op": "topk"})      # an op cell times a kernel too
    assert verdict(op, op, kid).metric == "kernel_us" and verdict(op, op, kid).verdict != "base failed"
    assert verdict(fast, fast, cid).metric == "tokens_per_s"
    assert verdict(failed, fast, cid).verdict == "head failed"
    assert verdict(fast, failed, cid).verdict == "base failed"
    assert verdict(fast, None, cid).verdict == "no base"


def run_cli(*args, cwd):
    env = dict(os.environ, COLUMNS="160")
    env.pop("MLFLOW_TRACKING_URI", None)
    return cli_process.run_cli(args, cwd=cwd, env=env, timeout=240)


def test_report_command_writes_and_prints_the_path(runs, tmp_path):
    out = run_cli("report", HEAD_ID, "--compare", BASE_ID, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    path = tmp_path / "results" / "runs" / HEAD_ID / "report" / "index.html"
    assert f"Report: {path.relative_to(tmp_path)}" in out.stdout
    assert path.is_file() and BASE_ID in path.read_text()
    assert f"Compared with {BASE_ID}:" in out.stdout
    # No MLflow store was ever made here: said so, and no sqlite file created just for this.
    assert "not attached to MLflow" in out.stdout
    assert not (tmp_path / "results" / "mlflow.db").exists()

    bad = run_cli("report", HEAD_ID, "--compare", "20990101-000000-ffffff", cwd=tmp_path)
    assert bad.returncode == 2 and "20990101-000000-ffffff" in bad.stderr


@pytest.mark.slow
def test_report_is_attached_to_the_parent_mlflow_run(runs, tmp_path):
    from mlflow import MlflowClient

    from harness.sweep.tracking import TrackingUnavailable, log_report, log_run

    head, _ = runs
    uri = f"sqlite:///{tmp_path}/mlflow.db"      # no store yet: the report says so
    report = build_report(head)
    with pytest.raises(TrackingUnavailable, match="no MLflow store"):
        log_report(head, report.path.parent, uri)
    logged = log_run(head, uri)
    assert log_report(head, report.path.parent) == logged.parent_run_id  # uri from tracking.json
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(logged.parent_run_id, "report")}
    assert {"report/index.html", "report/tokens_vs_context.png"} <= artifacts


@pytest.mark.slow
def test_harness_run_makes_the_report_at_the_end(fresh_store, tmp_path):
    scenario = tmp_path / "one.yaml"
    scenario.write_text(textwrap.dedent("""\
        name: one
        defaults: {model: tiny, device: cpu, warmup_steps: 1, steps: 2, repeats: 2,
                   profile_steps: 0, timeout_s: 120}
        matrix:
          context_length: [32]
        """))
    uri = fresh_store(tmp_path)
    out = run_cli("run", str(scenario), "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    index = next((tmp_path / "results" / "runs").glob("*/report/index.html"))
    assert f"Report: {index.relative_to(tmp_path)}" in out.stdout
    assert "Report attached to the MLflow run" in out.stdout
    state = json.loads((index.parent.parent / "tracking.json").read_text())
    from mlflow import MlflowClient

    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(state["parent_run_id"], "report")}
    assert "report/index.html" in artifacts


# -- in a real browser -----------------------------------------------------------------------


def distinct_colors(png: bytes) -> int:
    with Image.open(io.BytesIO(png)) as image:
        return len(image.convert("RGB").getcolors(1 << 24))


@needs_chromium
def test_report_opens_in_headless_chromium(runs):
    head, base = runs
    report = build_report(head, base=base)
    check = headless.check_page(report.path)
    assert check.console_errors == []
    assert len(check.images) == sum(f.png is not None for f in report.figures) > 4
    assert check.broken_images == []
    assert all(i["width"] > 300 for i in check.images)
    assert check.title == f"nightly — run {HEAD_ID}"
    # Nothing but the file itself and its inline images was loaded.
    assert {u.split(":", 1)[0] for u in check.requests} <= {"file", "data"}
    # The screenshot shows a page, not a blank canvas: text, tables and figures in colour.
    assert check.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    assert distinct_colors(check.screenshot) > 500


@needs_chromium
def test_a_cpu_run_report_reads_right_in_headless_chromium(tmp_path):
    """What a reader of the quickstart's report sees: the cells named greedy and synthetic,
    one line where a figure has nothing to show, the -k selection stated, no errors."""
    results = [cpu_result(ctx, acc, tps) for ctx in (256, 1024)
               for acc, tps in (("greedy", 40.0), ("synthetic", 90.0))]
    journal = write_journal(tmp_path / "runs", HEAD_ID, results, scenario="quickstart")
    ids = {r["cell_id"] for r in results if r["cell"]["context_length"] == 256}
    report = build_report(journal, only=ids, only_expr="context_length=256")
    check = headless.check_page(report.path, screenshot=False)
    assert check.console_errors == [] and check.broken_images == []
    assert len(check.images) == 2                      # throughput and host time
    text = check.text
    assert "Speedup heatmap: only verify=sdpa was measured: nothing to compare" in text
    assert "Only the cells -k context_length=256 selects: 2 of 4." in text
    assert "ctx=1024" not in text.split("Cells", 1)[1]
    for name in ("greedy", "synthetic τ=4"):
        assert name in text


@needs_chromium
def test_headless_check_catches_console_errors_and_broken_images(tmp_path):
    """The checker itself can fail: a page with a script error and a broken image."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head><title>broken</title></head><body>"
                    "<img src='data:image/png;base64,AAAA'><img src='missing.png'>"
                    "<script>console.error('boom'); undefinedFunction();</script></body></html>")
    check = headless.check_page(page, screenshot=False)
    assert not check.ok
    assert any("boom" in e for e in check.console_errors)
    assert any("undefinedFunction" in e for e in check.console_errors)
    assert len(check.broken_images) == 2


@needs_chromium
def test_screenshot_script_writes_the_top_of_the_report(runs, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, RESULTS=str(tmp_path / "results"), HEIGHT="1800",
               PYTHON=sys.executable, HARNESS=str(bin_dir / "harness"))
    env.pop("MLFLOW_TRACKING_URI", None)
    shot = tmp_path / "shot.png"
    out = subprocess.run(["bash", str(REPO / "ci" / "screenshot_report.sh"), HEAD_ID, str(shot)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr + out.stdout
    assert '"console_errors": []' in out.stdout and '"broken_images": []' in out.stdout
    with Image.open(shot) as image:
        assert image.size == (1400, 1800)
    assert distinct_colors(shot.read_bytes()) > 500


COUNTERS_RUN = REPO / "results" / "h200" / "runs" / "20261205-100646-b05a1a"


def test_the_counters_of_a_real_h200_run_are_a_table_of_the_report(tmp_path):
    """Session 30's counters run (ncu: true on the H200): one row a kernel of each mode, a
    cell's label on its first row, the three largest stalls; a cell that could not be
    profiled says why in its row."""
    import shutil
    from harness.sweep.journal import RunJournal
    root = tmp_path / "runs"
    shutil.copytree(COUNTERS_RUN, root / COUNTERS_RUN.name, ignore=shutil.ignore_patterns("report"))
    cell = next((root / COUNTERS_RUN.name / "cells").glob("*.json"))
    result = json.loads(cell.read_text())
    result["kernel"]["ncu_errors"] = {"topk": "ERR_NVGPUCTRPERM - <no permission>"}
    cell.write_text(json.dumps(result))
    page = build_report(RunJournal.open(root, COUNTERS_RUN.name)).path.read_text()
    table = page.split("Hardware counters (Nsight Compute", 1)[1].split("</table>", 1)[0]
    rows = [r for r in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td" in r]
    kernels = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)[2] for r in rows]
    # the two custom kernels the run profiled (wgmma_pv's and the variant it ran beside, a kernel
    # since removed: the report shows what the run recorded), a row at each of its two contexts
    profiled = {k.split(".")[1] for c in (root / COUNTERS_RUN.name / "cells").glob("*.json")
                for k in json.loads(c.read_text())["metrics"] if k.startswith("ncu.gqa_")}
    assert len(profiled) == 2 and "gqa_pipelined_kernel" in profiled
    assert all(kernels.count(k) == 2 for k in profiled)
    assert {"_split_kernel", "_stats_kernel", "tree_build_kernel"} <= set(kernels)
    pv = next(r for r in rows if "gqa_pipelined_kernel" in r and "65536" in r)
    assert ">228<" in pv and "wait 2.03, selected 1.00, dispatch_stall 0.57" in pv
    assert "no counters" in table and "ERR_NVGPUCTRPERM - &lt;no permission&gt;" in table


@needs_chromium
def test_the_counters_table_reads_right_in_headless_chromium(tmp_path):
    import shutil
    from harness.sweep.journal import RunJournal
    shutil.copytree(COUNTERS_RUN, tmp_path / "runs" / COUNTERS_RUN.name, ignore=shutil.ignore_patterns("report"))
    report = build_report(RunJournal.open(tmp_path / "runs", COUNTERS_RUN.name))
    check = headless.check_page(report.path, screenshot=False)
    assert check.console_errors == [] and check.broken_images == []
    assert "Hardware counters (Nsight Compute, ncu: true)" in check.text
    assert "gqa_pipelined_kernel" in check.text and "tree_build_kernel" in check.text


PDL_BASE = REPO / "results" / "h100" / "runs" / "20261205-220030-5908a3"
PDL_HEAD = REPO / "results" / "h100" / "runs" / "20261205-220035-6ee98d"


def copied_runs(tmp_path, *runs):
    import shutil
    from harness.sweep.journal import RunJournal
    for run in runs:
        shutil.copytree(run, tmp_path / "runs" / run.name, ignore=shutil.ignore_patterns("report"))
    return [RunJournal.open(tmp_path / "runs", run.name) for run in runs]


def step_rows(page: str) -> list[list[str]]:
    table = page.split("Inside the step, base against head", 1)[1].split("</table>", 1)[0]
    return [[markupsafe.Markup(c).unescape().strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td" in r]


def test_a_compared_report_says_what_moved_inside_the_step(tmp_path):
    """Session 37's H100 A/B (the verify launched under the q/k norm), profiled cells: the
    step's busy and idle, then the kernels and gaps that moved most, each cell's label once."""
    head, base = copied_runs(tmp_path, PDL_HEAD, PDL_BASE)
    verdicts = compare_runs(head.results(), base.results())
    page = build_report(head, base=base, verdicts=verdicts, verdict_note=VERDICT_NOTE).path.read_text()
    rows = step_rows(page)
    labelled = [r for r in rows if r[0]]
    assert len(labelled) == 4 and all(r[1] == "busy (all kernels)" for r in labelled)
    custom_4k = rows[rows.index(next(r for r in labelled if "ctx=4096" in r[0] and "verify=custom" in r[0])):][:12]
    assert custom_4k[1][1:5] == ["idle", "158.1", "140.6", "-17.5"]
    assert ["kernel _qk_norm_rope_store_kernel", "260.5", "302.6", "+42.1", "46.25, 46"] in [r[1:] for r in custom_4k]
    gap = next(r for r in custom_4k if r[1].startswith("idle gap _qk_norm_rope_store_kernel -> tva::gqa"))
    assert gap[2:] == ["16.0", "–", "–", "36, –"]


def test_an_uncompared_report_has_no_step_table(tmp_path):
    (head,) = copied_runs(tmp_path, PDL_HEAD)
    assert "Inside the step" not in build_report(head).path.read_text()


@needs_chromium
def test_the_step_table_reads_right_in_headless_chromium(tmp_path):
    head, base = copied_runs(tmp_path, PDL_HEAD, PDL_BASE)
    report = build_report(head, base=base, verdicts=compare_runs(head.results(), base.results()))
    check = headless.check_page(report.path, screenshot=False)
    assert check.console_errors == [] and check.broken_images == []
    assert "Inside the step, base against head" in check.text
    assert "idle gap _qk_norm_rope_store_kernel -> tva::gqa_pipelined_kernel<128, 4" in check.text


# -- the scenario's targets ------------------------------------------------------------------

LOOP_LIMIT_H100 = REPO / "results" / "h100" / "runs" / "20261206-152428-8ea380"


def target_rows(page: str) -> list[list[str]]:
    table = page.split("Targets (the scenario", 1)[1].split("</table>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", markupsafe.Markup(c).unescape()).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td" in r]


def test_loop_limits_targets_are_judged_on_a_real_h100_run(tmp_path):
    """Session 44's loop-limit on an H100, judged against the scenario's issue targets (the run
    was made before they were written: `harness report --targets`): each verdict as the numbers
    say, the numbers it used beside it."""
    from harness.sweep.scenario import parse_targets
    (head,) = copied_runs(tmp_path, LOOP_LIMIT_H100)
    wanted = parse_targets((REPO / "scenarios" / "loop-limit.yaml").read_text(), "loop-limit.yaml")
    rows = target_rows(build_report(head, targets=wanted).path.read_text())
    verdicts = {r[0]: r[3] for r in rows}
    assert len(rows) == 7
    assert verdicts["gpu/full idle <= 1 % (custom verify, 4k / 16k / 64k)"] == "not met (2 of 3 outside)"
    assert verdicts["gpu/full >= 90 % of the step roofline (custom verify)"] == "met"
    assert verdicts["graph-captured AR >= 88 % of the step roofline"] == "met"
    topk = next(r for r in rows if r[0].startswith("top-k + tree build"))
    assert topk[1:] == ["15.63 + 16.98 = 32.61", "sum of kernel_us <= 20", "not met"]
    ratio = next(r for r in rows if r[0].startswith("gpu/full at 64k"))
    assert ratio[1:] == ["1.134", "tokens_per_s / per >= 1.2", "not met (1 of 1 outside)"]
    assert verdicts["lossless for >= 128 tokens in every speculative cell"] == "met"


def test_the_stored_scenarios_targets_are_the_default_and_a_bad_one_is_a_row(tmp_path):
    (head,) = copied_runs(tmp_path, LOOP_LIMIT_H100)
    stored = head.scenario_file
    stored.write_text(stored.read_text() + "targets:\n  - {cells: workload=peer, metric: idle_fraction, max: 0.5}\n")
    [row] = target_rows(build_report(head).path.read_text())
    assert row[1:] == ["? / ? / ?", "idle_fraction <= 0.5", "absent (not measured: 3 of 3)"]
    stored.write_text(stored.read_text().replace("max: 0.5", "maks: 0.5"))
    [row] = target_rows(build_report(head).path.read_text())
    assert row[0].startswith("not judged") and "unknown key 'maks'" in row[0]
    assert "scenario.yaml:" in row[0]


def test_with_a_base_run_each_target_reads_base_then_head(tmp_path):
    """verify-ab twice on one H100 (session 44), the second against the first: each target's
    numbers on both runs, and a verdict the second run moved says from what."""
    from harness.sweep.scenario import parse_targets
    h100 = REPO / "results" / "h100" / "runs"
    base, head = copied_runs(tmp_path, h100 / "20261206-152438-ce4299", h100 / "20261206-152443-5217e0")
    text = (REPO / "scenarios" / "verify-ab.yaml").read_text()
    wanted = parse_targets(text, "verify-ab.yaml")
    page = build_report(head, base=base, verdicts=compare_runs(head.results(), base.results()),
                        targets=wanted).path.read_text()
    rows = {r[0]: r[1:] for r in target_rows(page)}
    assert rows["MLA latent >= 70 % of the roofline"] == [
        "20.16 / 40.78 / 52.01", "20.04 / 40.73 / 51.95", "pct_roofline >= 70", "not met (3 of 3 outside)"]
    # A bound between the two runs' paged ratios (1.145 and 1.168): met on the base, not on the head.
    moved = [dict(t, max=1.15) for t in wanted if t["name"].startswith("paged page 16 within 10 % of contiguous (65")]
    [row] = target_rows(build_report(head, base=base, targets=moved).path.read_text())
    assert row[1:] == ["1.145", "1.168", "kernel_us / per <= 1.15", "met → not met (1 of 1 outside)"]


@needs_chromium
def test_the_targets_table_reads_right_in_headless_chromium(tmp_path):
    from harness.sweep.scenario import parse_targets
    (head,) = copied_runs(tmp_path, LOOP_LIMIT_H100)
    wanted = parse_targets((REPO / "scenarios" / "loop-limit.yaml").read_text())
    check = headless.check_page(build_report(head, targets=wanted).path, screenshot=False)
    assert check.console_errors == [] and check.broken_images == []
    text = check.text
    assert text.index("Targets") < text.index("Decode cells")
    assert "top-k + tree build <= 20 µs a step (N 64, B 16, b 1)" in text and "15.63 + 16.98 = 32.61" in text
