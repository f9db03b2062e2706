"""`harness counters RUN`: a run's kernel cells' Nsight Compute counters, one row a kernel, from a
journal made here whose counters are the H200 fixture's (tests/worker/data) read by the real
parser; a cell without counters says why; a run without any says how to get them."""

from __future__ import annotations

import os
from pathlib import Path

from cli_process import run_cli

from harness.protocol import params
from harness.sweep.journal import RunJournal
from harness.worker import counters

DATA = Path(__file__).resolve().parents[1] / "worker" / "data"
DETAILS = (DATA / "ncu_details_h200.csv").read_text()
SOURCE = (DATA / "ncu_source_h100.csv").read_text()
RAW = ('"ID","Kernel Name","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
       '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",'
       '"smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",'
       '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio","smsp__inst_executed.sum"\n'
       '"0","k","1.42","1.39","0.44","1.00","13600000"\n')


def harness_cli(*args: str):
    out = run_cli(list(args), cwd=Path.cwd(), env=dict(os.environ, COLUMNS="330"))
    return out.returncode, out.stdout + out.stderr


def kernel_cell(impl: str) -> dict:
    return params.canonical({"workload": "kernel", "verify_mode": "custom", "compare_modes": "triton",
                             "context_length": 65536, "tree_tokens": 65, "custom_impl": impl,
                             "ncu": True})


def journal(tmp_path: Path) -> Path:
    pages = counters.parse(DETAILS, RAW)
    counters.add_source(pages, counters.parse_source(SOURCE))
    own = counters.flatten(pages)
    triton = {"triton." + k.replace("gqa_tail_kernel", "_verify_kernel"): v
              for k, v in own.items() if "gqa_tail_kernel" in k}
    cells = [kernel_cell("wgmma_pv"), kernel_cell("wgmma_sumcheck")]
    j = RunJournal.create(tmp_path / "runs", "20261205-000000-cccccc", "counters", None,
                          "name: counters\n", cells, {"git_sha": "abc"})
    for cell, metrics, errors in ((cells[0], {"kernel_us": 184.0, **own, **triton}, {}),
                                  (cells[1], {"kernel_us": 160.0},
                                   {"custom": "ERR_NVGPUCTRPERM - The user does not have permission"})):
        j.write_cell({"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
                      "status": "ok", "metrics": metrics, "kernel": {"ncu_errors": errors},
                      "host": "h200", "env": {"gpu": "NVIDIA H200"}})
    return tmp_path


def test_each_kernel_of_each_mode_is_a_row(tmp_path):
    code, out = harness_cli("counters", "20261205-000000-cccccc", "--results", str(journal(tmp_path)))
    assert code == 0, out
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    pv = next(r for r in rows if "gqa_pipelined_kernel" in r)
    assert "custom_impl=wgmma_pv" in pv and "custom" in pv
    cols = [c.strip() for c in pv.split("│")[1:-1]]
    # µs, M instructions, SM %, DRAM %, L2 %, regs, occupancy, warps and eligible a scheduler,
    # cycles an issue
    assert cols[3:13] == ["235.4", "13.60", "51", "25", "46", "228", "12.3", "1.97", "0.50", "5.07"]
    assert cols[-2] == "barrier 1.42, wait 1.39, selected 1.00"        # the three largest
    assert cols[-1] == "MUFU 21, IMAD 12, FADD 7"      # where the warps' samples were, by opcode
    tail = next(r for r in rows if "gqa_tail_kernel" in r)
    assert "244" in tail and "–" in tail                        # no stall columns for launch 2
    triton = next(r for r in rows if "_verify_kernel" in r)
    assert "│ triton " in triton
    assert "no counters kernel custom ctx=65536 T=65" in out and "custom_impl=wgmma_sumcheck: custom: " \
        "ERR_NVGPUCTRPERM" in out


def test_a_filter_and_a_run_without_counters(tmp_path):
    root = journal(tmp_path)
    code, out = harness_cli("counters", "20261205-000000-cccccc", "--results", str(root),
                            "-k", "wgmma_sumcheck")
    assert code == 0 and "No cell of 20261205-000000-cccccc has hardware counters: set `ncu: true`" in out
    assert "gqa_pipelined_kernel" not in out and "ERR_NVGPUCTRPERM" in out


def test_an_unknown_run_is_an_input_error(tmp_path):
    code, out = harness_cli("counters", "20990101-000000-abcdef", "--results", str(tmp_path))
    assert code == 2 and out.startswith("error:") and "Traceback" not in out
