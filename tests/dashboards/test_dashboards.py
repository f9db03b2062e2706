"""Every figure renders from recorded results — ok, failed, unmeasured, missing, CPU and GPU —
without a single warning, and the numbers behind the figures are right."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from PIL import Image

from dashboard_fixtures import (
    CPU_ENV, GPU_BASE, cpu_result, failed_result, gpu_result, gpu_sweep, kernel_result,
    kernel_sweep, write_journal,
)
from harness.dashboards import figures, history, idle, kernels, style

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def recorded(tmp_path) -> list[dict]:
    """A mixed run as the journal hands it back (JSON round trip): an H200-like decode sweep
    with a failed cell, kernel cells with failures, CPU cells without an idle fraction, a
    failed CPU cell, and an ok cell that measured nothing."""
    unmeasured = cpu_result(2048, "greedy", 1.0)
    unmeasured["metrics"], unmeasured["samples"] = {}, {}
    results = (gpu_sweep() + kernel_sweep() + [cpu_result(256, "greedy", 40.0),
               cpu_result(1024, "synthetic", 55.0), unmeasured,
               failed_result({"model": "tiny", "device": "cpu", "context_length": 4096},
                             env=CPU_ENV, host="local")])
    never_ran = {**GPU_BASE, "context_length": 131072, "verify_mode": "custom"}
    journal = write_journal(tmp_path / "runs", "20260501-020000-abcdef", results, [never_ran])
    return list(journal.results().values())


def rendered(path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == PNG_MAGIC
    with Image.open(path) as image:
        assert image.width > 300 and image.height > 150
        assert len(image.convert("RGB").getcolors(1 << 20)) > 20  # drawn, not a blank canvas
        return image.size


@pytest.fixture(autouse=True)
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- every figure, every kind of input -----------------------------------------------------------


def test_tokens_vs_context_renders_mixed_and_degenerate_inputs(recorded, tmp_path):
    rendered(figures.tokens_vs_context(recorded, tmp_path / "tvc.png", commit="3b9887d0c1"))
    # The signature harness.sweep.tracking uses: (results, out_path) and an optional title.
    rendered(figures.tokens_vs_context(recorded, tmp_path / "titled.png", "my title"))
    failed_only = [r for r in recorded if r["status"] != "ok"]
    rendered(figures.tokens_vs_context(failed_only, tmp_path / "failed.png"))
    rendered(figures.tokens_vs_context([], tmp_path / "empty.png"))
    one = [r for r in recorded if r["status"] == "ok"][:1]  # one point: one context on the axis
    rendered(figures.tokens_vs_context(one, tmp_path / "one.png"))


def test_speedup_heatmap_renders_and_explains_what_it_cannot_compare(recorded, tmp_path):
    rendered(figures.speedup_heatmap(recorded, tmp_path / "heat.png", commit="3b9887d0c1"))
    rendered(figures.speedup_heatmap(recorded, tmp_path / "vs-sdpa.png", reference="sdpa"))
    rendered(figures.speedup_heatmap(recorded, tmp_path / "vs-none.png", reference="flex"))
    cpu_only = [r for r in recorded if r["host"] == "local"]
    rendered(figures.speedup_heatmap(cpu_only, tmp_path / "one-mode.png"))
    rendered(figures.speedup_heatmap([], tmp_path / "empty.png"))


def test_idle_by_phase_renders_gpu_cpu_failed_and_unprofiled_cells(recorded, tmp_path):
    rendered(idle.idle_by_phase(recorded, tmp_path / "idle.png", commit="3b9887d0c1"))
    rendered(idle.idle_by_phase([r for r in recorded if r["host"] == "local"],
                                tmp_path / "cpu.png"))
    rendered(idle.idle_by_phase([], tmp_path / "empty.png"))


def test_timeline_renders_recorded_trace_and_says_why_when_there_is_none(recorded, tmp_path):
    with_trace = [r for r in recorded if r.get("timeline")]
    assert with_trace
    rendered(idle.timeline(with_trace[0], tmp_path / "tl.png", commit="3b9887d0c1"))
    failed = next(r for r in recorded if r["status"] != "ok")
    cpu = next(r for r in recorded if r["host"] == "local" and r["status"] == "ok")
    unprofiled = next(r for r in recorded if r["host"] == "gpu-a" and r["status"] == "ok"
                      and r["metrics"].get("idle_fraction") is None)
    for i, r in enumerate((failed, cpu, unprofiled)):
        rendered(idle.timeline(r, tmp_path / f"none-{i}.png"))


def test_kernel_roofline_renders_with_failed_cells_and_without_kernels(recorded, tmp_path):
    rendered(kernels.roofline_vs_context(recorded, tmp_path / "roof.png", commit="3b9887d0c1"))
    failed = [kernel_result(4096, "flex", 64, None, status="failed")]
    rendered(kernels.roofline_vs_context(failed, tmp_path / "failed.png"))
    rendered(kernels.roofline_vs_context([r for r in recorded if r["host"] == "local"],
                                         tmp_path / "none.png"))


def test_history_renders_gaps_change_points_and_empty_series(tmp_path):
    points = [(f"{i:040x}", f"2026-04-{i + 1:02d}T02:00:00+00:00",
               None if i == 4 else (500.0 if i < 9 else 455.0) + (i % 3)) for i in range(16)]
    rendered(history.history(points, tmp_path / "h.png", change_points=[9],
                             cell="ctx=32768 verify=custom", gpu="NVIDIA H200"))
    rendered(history.history(points, tmp_path / "band.png", baseline=(495.0, 505.0),
                             change_points=[0, 9, 99]))  # out-of-range indices are ignored
    rendered(history.history(points[:1], tmp_path / "one.png"))
    rendered(history.history([], tmp_path / "empty.png"))
    rendered(history.history([("abc", "2026-04-01", None)], tmp_path / "none.png"))
    # As harness.gate.history.plot calls it: no unit (taken from the metric), "date HH:MM".
    gate_points = [(sha, f"2026-05-{i + 1:02d} 02:00", v / 1000) for i, (sha, _, v)
                   in enumerate(points) if v is not None]
    rendered(history.history(gate_points, tmp_path / "gate.png", metric="step_ms_p50", unit="",
                             change_points=[8], cell="ctx=4096", gpu="h200"))
    assert style.metric_unit("step_ms_p50") == "ms"
    assert style.metric_unit("phase.verify.gpu_ms") == "ms"
    assert style.metric_unit("tokens_per_s") == "tokens/s"


# -- the numbers behind the pictures ---------------------------------------------------------


def test_speedup_table_divides_by_the_reference_with_other_parameters_equal():
    results = [gpu_result(4096, "custom", "full", "gpu", 900.0),
               gpu_result(4096, "triton", "full", "gpu", 300.0),
               gpu_result(4096, "custom", "none", "cpu", 400.0),
               gpu_result(4096, "triton", "none", "cpu", 200.0),
               gpu_result(65536, "custom", "full", "gpu", 500.0),
               failed_result({**GPU_BASE, "context_length": 65536, "verify_mode": "triton",
                              "graph_capture": "full", "tree_build": "gpu"}),
               failed_result({**GPU_BASE, "context_length": 65536, "verify_mode": "custom",
                              "graph_capture": "none", "tree_build": "cpu"})]
    assert figures.pick_reference(results) == "triton"
    table = figures.speedup_table(results, "triton")
    assert table.row_keys == ("verify_mode", "graph_capture", "tree_build")
    assert table.contexts == [4096, 65536]
    cells = {(row[1], ctx): (table.grid[i, j], table.text[i][j])
             for i, row in enumerate(table.rows) for j, ctx in enumerate(table.contexts)}
    assert cells[("full", 4096)][0] == pytest.approx(3.0)     # never 900 / 200
    assert cells[("none", 4096)][0] == pytest.approx(2.0)
    assert cells[("full", 65536)][1] == "no ref"               # the reference failed
    assert cells[("none", 65536)][1] == "failed"
    assert all(row[0] == "custom" for row in table.rows)       # the reference has no row


def test_idle_shares_split_the_idle_fraction_by_phase():
    r = gpu_result(4096, "custom", idle=0.30)
    shares = idle.idle_shares(r)
    step = r["metrics"]["step_ms_p50"]
    assert shares["verify"] == pytest.approx(r["metrics"]["phase.verify.idle_ms"] / step)
    assert sum(shares.values()) == pytest.approx(0.30)
    assert shares["between phases"] == pytest.approx(0.30 * 0.2)  # fixtures attribute 80 %

    # Phase idle adding up to more than the total (different windows): scaled down to it.
    r["metrics"]["idle_fraction"] = 0.10
    assert sum(idle.idle_shares(r).values()) == pytest.approx(0.10)
    assert "between phases" not in idle.idle_shares(r)

    no_split = gpu_result(4096, "sdpa", idle=0.25, phases_idle=False)
    assert idle.idle_shares(no_split) == {"unattributed": 0.25}
    assert idle.idle_shares(cpu_result(256, "greedy", 10.0)) is None
    assert idle._why_no_idle(cpu_result(256, "greedy", 10.0)) == "n/a (no GPU)"
    assert idle._why_no_idle(gpu_result(4096, "sdpa", idle=None)) == "not measured (profiler off)"


def test_timeline_intervals_keep_well_formed_entries_only():
    good = [{"phase": "verify", "start_ms": 1.0, "end_ms": 2.5, "kind": "gpu"},
            {"phase": "step", "start_ms": 0.0, "end_ms": 3.0, "kind": "host"}]
    bad = [{"phase": "x", "start_ms": 2.0, "end_ms": 1.0, "kind": "gpu"},       # ends first
           {"phase": "x", "start_ms": 0.0, "end_ms": 1.0, "kind": "cpu"},       # unknown kind
           {"phase": "x", "start_ms": "0", "end_ms": 1.0, "kind": "gpu"},       # not a number
           {"phase": "x", "start_ms": 0.0, "end_ms": math.inf, "kind": "gpu"},  # not finite
           "garbage"]
    assert idle.timeline_intervals({"timeline": good + bad}) == good
    assert idle.timeline_intervals({"timeline": {"intervals": good}}) == good
    assert idle.timeline_intervals({"timeline": None}) == []
    # Overlapping GPU work on two streams counts once.
    assert idle._union([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)


def test_one_palette_per_verify_mode_everywhere(monkeypatch):
    monkeypatch.setattr(style, "MODE_COLORS", dict(style.MODE_COLORS))
    assert style.mode_color("custom") == style.MODE_COLORS["custom"]
    known = [style.mode_color(m) for m in ("custom", "triton", "sdpa", "flex")]
    assert len(set(known)) == 4
    new = style.mode_color("a-new-kernel")
    assert new not in known and style.mode_color("a-new-kernel") == new  # stable once picked
    assert set(style.PHASE_COLORS.values()).isdisjoint(known)  # phases never look like modes


def test_short_names_keep_only_what_varies():
    results = [gpu_result(4096, "custom"), gpu_result(65536, "triton", "none", "cpu")]
    names = style.short_names(results)
    assert names[results[0]["cell_id"]] == "ctx=4096 verify=custom graph=full tree=gpu"
    assert "qwen3-8b" not in " ".join(names.values())


def test_where_names_gpu_host_and_commit():
    text = style.where([gpu_result(4096, "custom")], "3b9887d0c1")
    assert text == "NVIDIA H200 · gpu-a · commit 3b9887d0c1"
    assert "CPU (no GPU)" in style.where([cpu_result(256, "greedy", 1.0)])


def test_figures_read_results_written_by_the_journal(tmp_path):
    """The JSON round trip through RunJournal (what the report reads) keeps the figures whole."""
    results = gpu_sweep()
    journal = write_journal(tmp_path / "runs", "20260501-020000-000000", results)
    stored = list(journal.results().values())
    assert json.loads(json.dumps(results)) == [r for r in stored]
    assert stored[0]["timeline"][0]["kind"] in ("gpu", "host")


def test_idle_boundaries_name_the_kernels_the_gpu_waits_between():
    result = {"profile": {"idle_gaps": [
        {"before": "nvjet_sm90_tst_64x72_64x12_2x1_v_bz_splitK_TNT_and_a_long_tail", "after": "_add_rmsnorm_kernel",
         "us_per_step": 41.25, "gaps_per_step": 36, "median_us": 1.1},
        {"before": "b", "after": None, "us_per_step": 5.0, "gaps_per_step": 1, "median_us": 5.0},
        {"before": "c", "after": "d", "us_per_step": 1.0, "gaps_per_step": 2, "median_us": 0.5},
        {"before": "e", "after": "f", "us_per_step": 0.5, "gaps_per_step": 1, "median_us": 0.5}]}}
    text = idle.idle_boundaries(result)
    assert text == ("most idle between: nvjet_sm90_tst_64x72_64x12_2x1_v_bz_spl… → _add_rmsnorm_kernel "
                    "41.2 µs a step (36 gaps); b → (window edge) 5.0 µs a step (1 gaps); "
                    "c → d 1.0 µs a step (2 gaps)")
    assert idle.idle_boundaries({}) == "" and idle.idle_boundaries({"profile": {"idle_gaps": "x"}}) == ""
