"""The end-of-run table (harness/sweep/summary.py): decode numbers for decode cells, kernel
numbers for cells that time one kernel."""

from __future__ import annotations

from rich.console import Console

from harness.protocol import params
from harness.sweep.summary import summary_table


def render(results: list[dict]) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(summary_table(results, "t"))
    return console.export_text()


def result(cell: dict, **metrics) -> dict:
    cell = params.canonical(cell)
    return {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
            "status": "ok", "metrics": metrics, "host": "local"}


def test_a_kernel_run_shows_kernel_time_bandwidth_and_roofline_by_label():
    out = render([result({"workload": "op", "op": "topk", "topk_impl": "torch"}, kernel_us=25.74, kernel_us_spread=0.18,
                         achieved_tbps=0.35, pct_roofline=8.4),
                  result({"workload": "kernel", "verify_mode": "sdpa"}, kernel_us=113.5,
                         kernel_us_spread=0.2, achieved_tbps=0.16, pct_roofline=5.0)])
    assert "kernel µs" in out and "% roofline" in out and "tok/s" not in out and "idle" not in out
    assert "op topk torch tiny D=7 k=16" in out and "25.7" in out and "8.4" in out
    assert "kernel sdpa ctx=256 T=16" in out and "113.5" in out


def test_a_decode_run_keeps_its_columns_and_a_mixed_one_adds_kernel_time():
    decode = [result({"context_length": 256}, tokens_per_s=300.0, accept_len_mean=3.5),
              result({"context_length": 1024}, tokens_per_s=200.0, accept_len_mean=3.5)]
    out = render(decode)
    assert "tok/s" in out and "idle" in out and "kernel µs" not in out and "ctx" in out
    mixed = render(decode + [result({"workload": "op", "op": "topk"}, kernel_us=25.74)])
    assert "tok/s" in mixed and "kernel µs" in mixed and "25.7" in mixed and "TB/s" not in mixed


def test_a_mixed_run_names_every_cell_by_its_label_even_on_a_narrow_terminal():
    decode = [result({"context_length": 256}, tokens_per_s=300.0, accept_len_mean=3.5),
              result({"context_length": 1024}, tokens_per_s=200.0, accept_len_mean=3.5)]
    kernel = result({"workload": "kernel", "verify_mode": "triton", "tree_tokens": 65},
                    kernel_us=34.7)
    console = Console(width=80, record=True, color_system=None)
    console.print(summary_table(decode + [kernel], "t"))
    out = console.export_text()
    # No decode parameter columns that a kernel cell would fill with defaults it never used.
    # (`greedy` is in each decode cell's label, once: no acceptance column repeats it)
    assert "acceptance" not in out and out.count("greedy") == len(decode), out
    for start in ("tiny ctx=256 N=16", "tiny ctx=1024 N=16", "kernel triton ctx=256"):
        assert start in out, out
