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


def test_speedup_against_the_peer_for_every_decode_cell():
    from harness.sweep.derived import add_speedups
    peer = result(tps=50.0, workload="peer", context_length=4096)
    dynamic = result(tps=20.0, workload="peer", context_length=4096, peer_cache="dynamic")
    ar = result(tps=40.0, speculation="none", context_length=4096, graph_capture="full")
    spec = result(tps=150.0, context_length=4096)
    other_ctx = result(tps=100.0, context_length=8192)
    changed = add_speedups([peer, dynamic, ar, spec, other_ctx])
    assert {id(r) for r in changed} == {id(ar), id(spec)}
    assert spec["metrics"]["speedup_vs_peer"] == 3.0 and spec["metrics"]["speedup_vs_ar"] == 3.75
    assert ar["metrics"]["speedup_vs_peer"] == 0.8                 # plain decoding too
    assert spec["derived"]["speedup_vs_peer"]["reference_cell"] == peer["cell_id"]
    assert "speedup_vs_peer" not in other_ctx["metrics"] and "speedup_vs_peer" not in peer["metrics"]
