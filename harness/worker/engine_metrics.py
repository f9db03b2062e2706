"""Acceptance length from a serving engine's Prometheus `/metrics` text, where it exposes one.

  - SGLang: the gauge `sglang:spec_accept_length` (its mean accepted length, bonus token
    included), read after the cell's requests.
  - vLLM: the counters `vllm:spec_decode_num_accepted_tokens_total` and
    `vllm:spec_decode_num_drafts_total`, read before and after: over the cell,
    `1 + accepted / drafts` (the drafted tokens accepted per verify step, plus its bonus token).
An engine without them (no speculative decoding, or `transformers serve`: no /metrics) gives no
`accept_len_mean`: absent, never made up.
"""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
SGLANG_ACCEPT = "sglang:spec_accept_length"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"


def parse(text: str) -> dict[str, float]:
    """Metric name -> its value over all label sets: counters (`_total`) summed, gauges
    averaged (one per engine rank or model)."""
    samples: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isfinite(value):
            samples.setdefault(match.group(1), []).append(value)
    return {name: sum(v) if name.endswith("_total") else sum(v) / len(v)
            for name, v in samples.items()}


def accept_len(before: dict[str, float], after: dict[str, float]) -> float | None:
    if SGLANG_ACCEPT in after and after[SGLANG_ACCEPT] > 0:
        return after[SGLANG_ACCEPT]
    drafts = after.get(VLLM_DRAFTS, 0.0) - before.get(VLLM_DRAFTS, 0.0)
    if drafts > 0:
        return 1.0 + (after.get(VLLM_ACCEPTED, 0.0) - before.get(VLLM_ACCEPTED, 0.0)) / drafts
    return None
