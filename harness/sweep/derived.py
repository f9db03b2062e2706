"""Metrics computed across cells of one run, after the sweep (controller side).

`speedup_vs_ar`: a speculative cell's tokens/s over the tokens/s of plain autoregressive
decoding (`speculation: none`) of the same target at the same context, batch, device and dtype
in the same run — the number speculative speedups are quoted as. Cells without such a
reference get no value (absent, never guessed).
"""

from __future__ import annotations

from harness.protocol import params

# What must match for an AR cell to be the reference of a speculative cell.
_SAME = ("workload", "model", "checkpoint", "context_length", "batch_size", "device", "dtype", "seed")


def _key(cell: dict) -> tuple:
    c = params.canonical(cell)
    return tuple(repr(c[k]) for k in _SAME)


def add_speedup_vs_ar(results: list[dict]) -> list[dict]:
    """Set metrics.speedup_vs_ar on speculative cells that have an AR reference; returns the
    results that changed. Among several references the fastest one counts: a speedup is only
    honest against the best plain decoding the run measured."""
    refs: dict[tuple, list[dict]] = {}
    for r in results:
        c = params.canonical(r["cell"])
        if r["status"] == "ok" and c["speculation"] == "none" and r["metrics"].get("tokens_per_s"):
            refs.setdefault(_key(c), []).append(r)
    changed = []
    for r in results:
        c = params.canonical(r["cell"])
        if r["status"] != "ok" or c["speculation"] == "none" or not r["metrics"].get("tokens_per_s"):
            continue
        candidates = refs.get(_key(c))
        if not candidates:
            continue
        best = max(candidates, key=lambda a: a["metrics"]["tokens_per_s"])
        value = r["metrics"]["tokens_per_s"] / best["metrics"]["tokens_per_s"]
        if r["metrics"].get("speedup_vs_ar") != value:
            r["metrics"]["speedup_vs_ar"] = value
            r.setdefault("derived", {})["speedup_vs_ar"] = {"reference_cell": best["cell_id"]}
            changed.append(r)
    return changed
