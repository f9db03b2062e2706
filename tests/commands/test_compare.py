"""`harness compare BASE HEAD` on two real H200 runs committed under results/h200 (the CUDA tree
build before and after a change that made it ~5 % faster, with the top-k and two decode cells
that did not change), and its input errors."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from cli_process import run_cli

from harness.commands.compare import change

RESULTS = Path(__file__).resolve().parents[2] / "results" / "h200"
BASE, HEAD = "20261201-205334-dfe5a3", "20261201-205343-755b9a"


def harness(*args: str, cwd: Path | None = None):
    """The CLI in a child process of its own (tests/cli_process.py): a terminal 200 wide."""
    out = run_cli(list(args), cwd=cwd or Path.cwd(), env=dict(os.environ, COLUMNS="200"))
    return out.returncode, out.stdout + out.stderr


def rows(output: str) -> dict[str, str]:
    """The table's first line of each cell, by the start of its label."""
    return {line.split("│")[1].strip(): line for line in output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}


def test_two_h200_runs_cell_by_cell():
    code, out = harness("compare", BASE, HEAD, "--results", str(RESULTS))
    assert code == 0, out
    assert f"{HEAD} (tree-build) against {BASE} (tree-build)" in out
    by_cell = rows(out)
    tree = next(v for k, v in by_cell.items() if k.startswith("op tree_build cuda") and "bs=4" not in k)
    assert "kernel_us" in tree and "63.99" in tree and "60.84" in tree
    assert "faster" in tree and "improved" in tree and "p=0.0001" in tree
    decode = next(v for k, v in by_cell.items() if k.startswith("qwen3-8b ctx=4096"))
    # 5 repeats, 0.2 % apart: with each repeat's acceptance draw divided out (the same draws on
    # both sides) the interval is tight enough to call it unchanged (raw: inconclusive).
    assert "tokens_per_s" in decode and "unchanged" in decode and "0.998–1.001" in decode
    assert "Mann–Whitney" in out


def test_the_other_way_round_the_same_cells_are_slower():
    code, out = harness("compare", HEAD, BASE, "--results", str(RESULTS))
    assert code == 0
    tree = next(v for k, v in rows(out).items() if k.startswith("op tree_build cuda"))
    assert "slower" in tree and "regressed" in tree


def test_sides_of_different_kernel_builds_are_flagged():
    """The default build against HARNESS_KERNEL_WS's (session 21's verify-ab A/B): every cell
    says the sides ran different builds; two runs of one build say nothing of it."""
    default, ws, default_again = "20261204-143629-7ce87d", "20261204-143626-3f8eb2", "20261204-143613-878452"
    code, out = harness("compare", default, ws, "--results", str(RESULTS))
    assert code == 0, out
    kernel_rows = [v for k, v in rows(out).items() if k.startswith("kernel custom")]
    assert len(kernel_rows) == 8
    noise = " ".join(line.split("│")[-2].strip() for line in out.splitlines() if line.startswith("│"))
    assert noise.count("different builds of the CUDA kernels") == 8
    code, out = harness("compare", default_again, default, "--results", str(RESULTS))
    assert code == 0 and "different builds" not in out


def test_an_unknown_run_is_one_line_and_exit_2(tmp_path):
    code, out = harness("compare", "20990101-000000-abcdef", HEAD, "--results", str(RESULTS))
    assert code == 2
    assert "no run '20990101-000000-abcdef'" in out and "Traceback" not in out
    code, out = harness("compare", BASE, HEAD, "--results", str(tmp_path))
    assert code == 2 and "Traceback" not in out


@pytest.mark.parametrize("metric,ratio,said", [
    ("tokens_per_s", 1.06, "1.060× faster"), ("tokens_per_s", 0.5, "2.00× slower"),
    ("kernel_us", 0.5, "2.00× faster"), ("kernel_us", 1.2, "1.20× slower"),
    ("kernel_us", 1.0, "same"), ("tokens_per_s", None, "–"),
])
def test_change_reads_each_metric_in_its_own_sense(metric, ratio, said):
    assert change(metric, ratio) == said


# -- an A/B of a knob: --across KNOB=A:B ---------------------------------------------------------
LINEAR_A, LINEAR_B = "20261204-203547-d7798b", "20261204-203552-fd5c63"   # session 24's linear-ab


def test_across_a_knob_pairs_the_cells_that_differ_only_in_it():
    """linear-ab's side A (linear_impl triton) against side B (wgmma): without --across no cell
    lines up (different kernels, different ids); with it the three decode cells do."""
    code, out = harness("compare", LINEAR_A, LINEAR_B, "--results", str(RESULTS))
    assert code == 0 and out.count("no base") == 4
    code, out = harness("compare", LINEAR_A, LINEAR_B, "--across", "linear_impl=triton:wgmma",
                        "--results", str(RESULTS))
    assert code == 0, out
    assert "linear_impl: triton (base) against wgmma (head)" in out
    decode = {k: v for k, v in rows(out).items() if k.startswith("qwen3-8b")}
    assert len(decode) == 3 and all("tokens_per_s" in v and "slower" in v and "regressed" in v
                                    for v in decode.values())
    at_4k = next(v for k, v in decode.items() if "ctx=4096" in k)
    assert "0.888" in at_4k and "0.887–0.890" in at_4k


def test_across_the_op_cells_torch_against_wgmma():
    code, out = harness("compare", LINEAR_A, LINEAR_B, "--across", "linear_impl=torch:wgmma",
                        "--results", str(RESULTS))
    assert code == 0, out
    op = next(v for k, v in rows(out).items() if k.startswith("op linear"))
    assert "kernel_us" in op and "111.3" in op and "135.7" in op and "slower" in op and "regressed" in op


def test_across_a_variant_since_removed_still_compares():
    """Session 27's linear-ab op cells (each order a run) with the stream-K GEMM's cluster kernel,
    a linear_impl value since removed (a scenario naming it is refused): the journal's cells
    still pair and compare against cuBLAS's, as they were recorded."""
    code, out = harness("compare", "20261205-024302-304877", "20261205-024306-f5c0b3",
                        "--across", "linear_impl=torch:wgmma_cluster", "--results", str(RESULTS))
    assert code == 0, out
    assert "linear_impl: torch (base) against wgmma_cluster (head)" in out
    op = {k: v for k, v in rows(out).items() if k.startswith("op linear wgmma_cluster")}
    assert len(op) == 6 and all("kernel_us" in v and "regressed" in v for v in op.values())
    layer = next(v for k, v in op.items() if k.endswith("qwen3-8b rows=65"))
    assert "113.7" in layer and "261.2" in layer


@pytest.mark.parametrize("spec, message", [
    ("linear_impl", "expected KNOB=A:B"), ("linear_impl=triton", "expected KNOB=A:B"),
    ("linear_kernel=a:b", "unknown parameter 'linear_kernel'"),
    ("linear_impl=cuda:wgmma", f"no cells of {LINEAR_A} ran with linear_impl=cuda"),
])
def test_across_input_errors(spec, message):
    code, out = harness("compare", LINEAR_A, LINEAR_B, "--across", spec, "--results", str(RESULTS))
    assert code == 2 and message in out, out


def test_pairing_across_a_knob_within_one_run():
    """One run that swept the knob: its A cells key the same as its B cells."""
    from harness.gate.runs import pair_across
    cell = {"workload": "decode", "model": "tiny", "context_length": 256, "verify_mode": "sdpa"}
    run = {"a": {"cell": {**cell, "linear_impl": "torch"}}, "b": {"cell": {**cell, "linear_impl": "triton"}},
           "c": {"cell": {**cell, "linear_impl": "triton", "context_length": 512}}}
    base, head = pair_across(run, "linear_impl", "torch", "torch"), pair_across(run, "linear_impl", "triton", "torch")
    assert len(base) == 1 and len(head) == 2
    (key,) = base
    assert head[key] is run["b"]


H100 = RESULTS.parent / "h100"


def cell_table(output: str, title_start: str) -> dict[str, list[str]]:
    """`--kernels`' table of one cell: each row's cells by its first column."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title_start))
    table = {}
    for line in lines[start + 1:]:
        if line and line[0] not in "┏┃┡│├└":
            break
        if line.startswith("│") and line.split("│")[1].strip():
            cells = [c.strip() for c in line.split("│")[1:-1]]
            table[cells[0]] = cells[1:]
    return table


def test_kernels_say_what_moved_inside_the_step():
    """Session 37's H100 A/B of the verify launched under the q/k norm: the gap between them
    leaves the profile, the idle a step falls, and the norm's own span grows by about as much."""
    code, out = harness("compare", "20261205-220030-5908a3", "20261205-220035-6ee98d",
                        "--results", str(H100), "--kernels")
    assert code == 0, out
    table = cell_table(out, "qwen3-8b ctx=4096 N=64 verify=custom")
    gap = next(v for k, v in table.items() if k.startswith("idle gap _qk_norm_rope_store_kernel -> tva::gqa"))
    assert gap[:3] == ["16.0", "–", "–"] and gap[3] == "36, –"
    assert table["idle"][:3] == ["158.1", "140.6", "-17.5"]
    assert table["kernel _qk_norm_rope_store_kernel"][2] == "+42.1"
    assert "not among that side's 12 largest" in out


def test_kernels_across_a_knob_show_a_gemm_tile_leaving_and_another_arriving():
    code, out = harness("compare", "20261205-220035-6ee98d", "20261205-220040-649e19", "--results", str(H100),
                        "--across", "blas_impl=cublaslt:cublaslt_tuned", "--kernels")
    assert code == 0, out
    table = cell_table(out, "qwen3-8b ctx=4096 N=64 verify=custom")
    assert table["kernel nvjet_sm90_tst_192x72_64x6_2x1_v_bz_TNT"][:3] == ["2594.2", "–", "–"]
    assert table["kernel nvjet_sm90_tst_128x72_64x8_4x1_v_bz_TNT"][:3] == ["–", "2637.7", "–"]


def test_kernels_of_cells_without_a_profile_say_so():
    code, out = harness("compare", "20261204-143613-878452", "20261204-143629-7ce87d",
                        "--results", str(RESULTS), "--kernels")
    assert code == 0 and "--kernels: no cell has a profile on both sides" in out


H100 = RESULTS.parent / "h100"
# verify-ab twice on one H100 (session 44), made before the scenario had targets
VAB_1, VAB_2 = "20261206-152438-ce4299", "20261206-152443-5217e0"


def test_targets_are_judged_on_both_runs_base_then_head(tmp_path):
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "verify-ab.yaml"
    code, out = harness("compare", VAB_1, VAB_2, "--results", str(H100), "--targets", str(scenario))
    assert code == 0, out
    assert "Targets, base → head" in out
    paged = next(line for line in out.splitlines() if "paged page 16 within 10 % of contiguous (65" in line)
    assert "1.145" in paged and "1.168" in paged and "not met" in paged and "→" not in paged
    mla = next(line for line in out.splitlines() if line.startswith("│ MLA latent"))
    assert "20.16 / 40.78 / 52.01" in mla and "20.04 / 40.73 / 51.95" in mla

    # A bound between the two runs' numbers: the verdict moved, and says from what.
    moved = tmp_path / "moved.yaml"
    moved.write_text(scenario.read_text().split("\ntargets:")[0] + textwrap.dedent("""
        targets:
          - name: paged 65 within 15 %
            cells: layout=paged and page_size=16 and tree_tokens=65
            per: attention=gqa and layout=contiguous and tree_tokens=65 and context_length=65536
            metric: kernel_us
            max: 1.15
        """))
    code, out = harness("compare", VAB_1, VAB_2, "--results", str(H100), "--targets", str(moved))
    assert code == 0, out
    row = next(line for line in out.splitlines() if "paged 65 within 15 %" in line)
    assert "met → not met" in row
    code, out = harness("compare", VAB_2, VAB_1, "--results", str(H100), "--targets", str(moved))
    assert "not met → met" in next(line for line in out.splitlines() if "paged 65 within 15 %" in line)


def test_runs_without_targets_show_none_and_bad_targets_are_one_line(tmp_path):
    code, out = harness("compare", VAB_1, VAB_2, "--results", str(H100))
    assert code == 0 and "Targets" not in out
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\ndefaults: {model: tiny, device: cpu}\n")
    code, out = harness("compare", VAB_1, VAB_2, "--results", str(H100), "--targets", str(bare))
    assert code == 2 and "this scenario has no targets" in out and "Traceback" not in out
    code, out = harness("compare", VAB_1, VAB_2, "--results", str(H100), "--across",
                        "tree_tokens=16:65", "--targets", str(bare))
    assert code == 2 and "not a knob's two sides" in out and len(out.strip().splitlines()) == 1


def test_report_compare_prints_the_targets_base_then_head(tmp_path):
    import shutil
    for run in (VAB_1, VAB_2):
        shutil.copytree(H100 / "runs" / run, tmp_path / "runs" / run, ignore=shutil.ignore_patterns("report"))
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "verify-ab.yaml"
    code, out = harness("report", VAB_2, "--compare", VAB_1, "--targets", str(scenario), "--no-mlflow",
                        "--results", str(tmp_path))
    assert code == 0, out
    assert "Targets, base → head" in out
    mla = next(line for line in out.splitlines() if line.startswith("│ MLA latent"))
    assert mla.index("20.16 / 40.78 / 52.01") < mla.index("20.04 / 40.73 / 51.95") < mla.index("pct_roofline")
