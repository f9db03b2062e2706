from harness.protocol import params
from harness.sweep.derived import add_speedup_vs_ar


def result(status="ok", tps=100.0, **cell):
    c = params.canonical(cell)
    return {"cell": c, "cell_id": params.cell_id(c), "status": status,
            "metrics": {"tokens_per_s": tps} if status == "ok" else {}}


def test_speedup_against_the_fastest_matching_ar_cell():
    ar_eager = result(tps=20.0, speculation="none", context_length=4096)
    ar_graph = result(tps=40.0, speculation="none", context_length=4096, graph_capture="full")
    spec = result(tps=100.0, context_length=4096)
    other_ctx = result(tps=100.0, context_length=8192)
    failed = result(status="failed", context_length=4096, tree_budget=64)
    changed = add_speedup_vs_ar([ar_eager, ar_graph, spec, other_ctx, failed])
    assert changed == [spec]
    assert spec["metrics"]["speedup_vs_ar"] == 2.5
    assert spec["derived"]["speedup_vs_ar"]["reference_cell"] == ar_graph["cell_id"]
    assert "speedup_vs_ar" not in other_ctx["metrics"]          # no reference: absent
    assert add_speedup_vs_ar([ar_eager, ar_graph, spec]) == []  # idempotent
