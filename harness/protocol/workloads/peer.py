"""The peer workload: the decode speed of the library a user would try first — Hugging Face
transformers' own greedy decoding of the same model on the same GPU — so the bundled loop's
speed-ups are quoted against it too, not only against the harness's own AR reference.

Runner: harness/worker/workloads/peer.py (needs `transformers` on the worker host; a host
without it fails the cell saying so). The cell's target — a preset's shapes as transformers'
Qwen3ForCausalLM with seeded random weights, or its `checkpoint` — decodes greedily after a
random prompt of context_length tokens with `generate`, the cache `peer_cache` names: `static`
(transformers then compiles the forward itself on a GPU, as a user gets it) or `dynamic` (its
default cache, eager). tokens/s counts decoding only: each repeat times `generate` for 2 and for
2 + steps new tokens and divides the extra tokens by the extra time, so the prefill cancels.
A decode cell of the same model, context, batch, device and dtype in the same run gets
`speedup_vs_peer` (harness/sweep/derived.py).
"""

from __future__ import annotations

from harness.protocol import presets
from harness.protocol.workloads import WorkloadSpec, choice

CACHES = ("static", "dynamic")
SHORT = 2          # new tokens of the shorter generate of a repeat (the prefill's and a token's)

PARAMS = (choice("peer_cache", "static", CACHES),)


def check_context(cell: dict):
    longest = cell["context_length"] + SHORT + cell["steps"]
    limit = presets.max_context(cell["model"])
    if longest > limit:
        return ("context_length", "steps"), (
            f"context_length {cell['context_length']} plus {SHORT + cell['steps']} generated "
            f"tokens exceeds model '{cell['model']}' limit {limit}")
    return None


def label(c: dict) -> str:
    """e.g. `peer transformers static qwen3-8b ctx=4096`."""
    parts = ["peer transformers", c["peer_cache"], c["model"], f"ctx={c['context_length']}"]
    if c["batch_size"] != 1:
        parts.append(f"bs={c['batch_size']}")
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="peer",
    runner="harness.worker.workloads.peer:run",
    order=5,
    params=PARAMS,
    checks=(check_context,),
    label=label,
    policies={"tokens_per_s": {"direction": "higher", "threshold_rel": 0.03}},
)
