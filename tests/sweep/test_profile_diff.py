"""harness.sweep.profile_diff: two profiles of one cell, row by row (synthetic profiles)."""

from __future__ import annotations

import pytest

from harness.sweep import profile_diff as pd


def result(kernels, gaps=(), busy_ms=8.0, idle_ms=0.1, steps=4):
    return {"profile": {
        "busy_ms": busy_ms, "idle_ms": idle_ms, "steps": steps,
        "top_kernels": [{"name": n, "us_per_step": us, "calls_per_step": c} for n, us, c in kernels],
        "idle_gaps": [{"before": b, "after": a, "us_per_step": us, "gaps_per_step": g, "median_us": 0.4}
                      for b, a, us, g in gaps]}}


def test_kernels_on_both_sides_differ_and_the_largest_difference_comes_first():
    base = result([("void gemm<1>(Params)", 100.0, 36), ("norm", 50.0, 36), ("tiny", 1.0, 1)])
    head = result([("void gemm<1>(Params)", 101.0, 36), ("norm", 40.0, 36), ("tiny", 1.0, 1)])
    rows = pd.kernel_rows(base, head)
    assert [r.name for r in rows] == ["norm", "gemm<1>", "tiny"]
    assert rows[0].delta_us == pytest.approx(-10.0) and rows[1].delta_us == pytest.approx(1.0)
    assert (rows[1].base_count, rows[1].head_count) == (36, 36)


def test_a_kernel_on_one_side_only_has_no_difference_and_ranks_by_its_time():
    """A GEMM whose tile changed: one name leaves, another arrives; neither is a difference."""
    base = result([("gemm_192x72", 2594.0, 36), ("norm", 300.0, 46)])
    head = result([("gemm_128x72", 2637.0, 36), ("norm", 301.0, 46)])
    rows = {r.name: r for r in pd.kernel_rows(base, head)}
    assert rows["gemm_192x72"].head_us is None and rows["gemm_192x72"].delta_us is None
    assert rows["gemm_128x72"].base_us is None and rows["gemm_128x72"].weight == 2637.0
    assert [r.name for r in pd.kernel_rows(base, head)][:2] == ["gemm_128x72", "gemm_192x72"]


def test_idle_gaps_pair_by_the_kernels_around_them():
    base = result([("a", 1.0, 1)], gaps=[("norm", "void verify<4>(P)", 16.0, 36), ("gemm", "norm", 20.0, 67)])
    head = result([("a", 1.0, 1)], gaps=[("gemm", "norm", 19.5, 67), (None, "gemm", 2.0, 1)])
    rows = {r.name: r for r in pd.gap_rows(base, head)}
    assert rows["norm -> verify<4>"].base_us == 16.0 and rows["norm -> verify<4>"].head_us is None
    assert rows["gemm -> norm"].delta_us == pytest.approx(-0.5)
    assert rows["(window edge) -> gemm"].base_us is None


def test_totals_are_busy_and_idle_a_step_over_every_kernel():
    base, head = result([], busy_ms=34.0, idle_ms=0.158), result([], busy_ms=33.8, idle_ms=0.1406)
    busy, idle = pd.totals(base, head)
    assert busy.base_us == pytest.approx(8500.0) and busy.head_us == pytest.approx(8450.0)
    assert idle.delta_us == pytest.approx(-17.4)


def test_only_results_with_a_kernel_list_have_a_profile():
    assert pd.has_profile(result([]))
    assert not pd.has_profile({}) and not pd.has_profile(None)
    assert not pd.has_profile({"profile": None}) and not pd.has_profile({"profile": {"idle_fraction": 0.1}})


@pytest.mark.parametrize("name,short", [
    ("void tva::combine_kernel<128, 8>(tva::AttnParams)", "tva::combine_kernel<128, 8>"),
    ("Memcpy DtoH (Device -> Pinned)", "Memcpy DtoH"), ("_add_rmsnorm_kernel", "_add_rmsnorm_kernel"),
    (None, "(window edge)"),
])
def test_short_names_keep_template_arguments_and_drop_the_parameters(name, short):
    assert pd.short_name(name) == short


def test_a_row_as_a_table_shows_it():
    assert pd.Row("k", 260.5, 302.61, 46.25, 46).cells() == ("260.5", "302.6", "+42.1", "46.25, 46")
    assert pd.Row("gap", 16.0, None, 36, None).cells() == ("16.0", "–", "–", "36, –")
    assert pd.Row("idle", 158.1, 140.6).cells() == ("158.1", "140.6", "-17.5", "")


def test_sections_are_the_totals_then_the_kernels_then_the_gaps_each_cut_to_the_limit():
    base = result([("a", 3.0, 1), ("b", 2.0, 1), ("c", 1.0, 1)], gaps=[("a", "b", 1.0, 1), ("b", "c", 0.5, 1)])
    head = result([("a", 3.5, 1), ("b", 2.0, 1), ("c", 1.0, 1)], gaps=[("a", "b", 0.2, 1), ("b", "c", 0.5, 1)])
    kinds = [kind for kind, _ in pd.sections(base, head, limit=1)]
    assert kinds == ["", "", "kernel", "idle gap"]
    assert [r.name for _, r in pd.sections(base, head, limit=1)][2:] == ["a", "a -> b"]
    assert len(pd.sections(base, head)) == 2 + 3 + 2
