"""Metrics computed across cells of one run, after the sweep (controller side).

`speedup_vs_ar`: a speculative cell's tokens/s over the tokens/s of plain autoregressive
decoding (`speculation: none`) of the same target at the same context, batch, device and dtype
in the same run — the number speculative speedups are quoted as.
`speedup_vs_peer`: a decode cell's tokens/s over the peer workload's (transformers' own greedy
decoding) of the same target, context, batch, device and dtype in the same run.
Cells without such a reference get no value (absent, never guessed).
"""

from __future__ import annotations

from harness.protocol import params

# What must match for a reference cell to be a cell's reference: plain decoding for a
# speculative cell; the peer (transformers' decoding) for any decode cell.
_SAME_AR = ("workload", "model", "checkpoint", "context_length", "batch_size", "device", "dtype",
            "seed")
_SAME_PEER = ("model", "checkpoint", "context_length", "batch_size", "device", "dtype")


def add_speedups(results: list[dict]) -> list[dict]:
    """Both speed-ups (module docstring); returns the results that changed, each once."""
    changed = {id(r): r for r in add_speedup_vs_ar(results) + add_speedup_vs_peer(results)}
    return list(changed.values())


def add_speedup_vs_ar(results: list[dict]) -> list[dict]:
    """Set metrics.speedup_vs_ar on speculative cells that have an AR reference; returns the
    results that changed."""
    return _add(results, "speedup_vs_ar", _SAME_AR,
                is_reference=lambda c: c["workload"] == "decode" and c["speculation"] == "none",
                applies=lambda c: c["workload"] == "decode" and c["speculation"] != "none")


def add_speedup_vs_peer(results: list[dict]) -> list[dict]:
    """Set metrics.speedup_vs_peer on decode cells that have a peer cell in the run; returns
    the results that changed."""
    return _add(results, "speedup_vs_peer", _SAME_PEER,
                is_reference=lambda c: c["workload"] == "peer",
                applies=lambda c: c["workload"] == "decode")


def _add(results: list[dict], metric: str, same: tuple[str, ...], is_reference, applies) -> list[dict]:
    """metrics[metric] = tokens/s over the reference's, on every ok cell `applies` to that has
    an ok reference agreeing on `same`. Among several references the fastest one counts: a
    speed-up is only honest against the best the run measured."""
    def key(c: dict) -> tuple:
        return tuple(repr(c[k]) for k in same)

    refs: dict[tuple, list[dict]] = {}
    for r in results:
        c = params.canonical(r["cell"])
        if r["status"] == "ok" and is_reference(c) and r["metrics"].get("tokens_per_s"):
            refs.setdefault(key(c), []).append(r)
    changed = []
    for r in results:
        c = params.canonical(r["cell"])
        if r["status"] != "ok" or not applies(c) or not r["metrics"].get("tokens_per_s"):
            continue
        candidates = refs.get(key(c))
        if not candidates:
            continue
        best = max(candidates, key=lambda a: a["metrics"]["tokens_per_s"])
        value = r["metrics"]["tokens_per_s"] / best["metrics"]["tokens_per_s"]
        if r["metrics"].get(metric) != value:
            r["metrics"][metric] = value
            r.setdefault("derived", {})[metric] = {"reference_cell": best["cell_id"]}
            changed.append(r)
    return changed
