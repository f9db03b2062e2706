"""The forward's weight GEMMs as a cell knob (linear_impl): a variant since removed is refused as
any unknown name, while the results journaled with it still read as they were recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep import journal
from harness.sweep.scenario import parse_scenario

# The stream-K GEMM's cluster kernel, measured 1.6-2.6x cuBLAS's time and removed (kernels/NOTES.md,
# sessions 25-27); the stream-K kernel for the large weights only, whose loop made 1.8-2.4 % fewer
# tokens/s than cuBLAS's (session 46).
REMOVED_IMPLS = ("wgmma_cluster", "wgmma_large")
# The linear-ab runs that ran them: session 27's on an H200 (the op cells and the loop cells),
# session 46's on an H100 (one op cell, three loop cells).
RESULTS = Path(__file__).resolve().parents[2] / "results"
REMOVED_RUNS = {("h200", "20261205-024302-304877"): 6, ("h200", "20261205-024310-9d5e36"): 3,
                ("h100", "20261206-214858-b0f959"): 4}


@pytest.mark.parametrize("impl", REMOVED_IMPLS)
@pytest.mark.parametrize("where", ["matrix:\n  linear_impl: [{}]\n",
                                   "  linear_impl: {}\nmatrix:\n  context_length: [4096]\n",
                                   "matrix:\n  context_length: [4096]\n"
                                   "include:\n  - {{workload: op, op: linear, linear_impl: {}}}\n"],
                         ids=["matrix", "defaults", "include"])
def test_a_removed_variant_is_refused_as_any_unknown_name(impl, where):
    """A removed variant is no longer a name: a scenario that asks for one, in its matrix, its
    defaults or an included op cell, is refused with the line and column of the value, as a
    misspelt name is, before anything runs."""
    text = "name: c\ndefaults:\n  workload: decode\n  device: cuda\n" + where.format(impl)
    with pytest.raises(InputError, match=rf"unknown linear_impl '{impl}' \(allowed: auto, torch, triton, wgmma(; did you mean 'wgmma'\?)?\)$") \
            as err:
        parse_scenario(text, "c.yaml")
    assert str(err.value).startswith("c.yaml:") and "\n" not in str(err.value)


def test_the_remaining_variants_are_cells():
    text = ("name: c\ndefaults:\n  workload: op\n  op: linear\n  device: cuda\n"
            "matrix:\n  linear_impl: [torch, triton, wgmma]\n  batch_size: [1]\n  tree_budget: [8]\n")
    cells = parse_scenario(text, "c.yaml").cells()
    assert sorted(c["linear_impl"] for c in cells) == ["torch", "triton", "wgmma"]


@pytest.mark.parametrize("run, count", REMOVED_RUNS.items(), ids=lambda v: str(v))
def test_results_journaled_with_a_removed_variant_still_read(run, count):
    """The journal keeps what ran: a result of a removed variant keeps its id, its label and the
    kernels it ran, which the report, compare and the gate read (no check of the knob's values
    on reading)."""
    gpu, run_id = run
    results = journal.RunJournal.open(RESULTS / gpu / "runs", run_id).results()
    removed = [r for r in results.values() if r["cell"]["linear_impl"] in REMOVED_IMPLS]
    assert len(removed) == count
    for r in removed:
        assert params.cell_id(r["cell"]) == r["cell_id"]
        assert params.cell_label(r["cell"]) == r["label"] and r["cell"]["linear_impl"] in r["label"]
        assert params.kernels_ran(r)["linear_impl"] == r["cell"]["linear_impl"]
