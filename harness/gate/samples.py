"""A result's samples of one metric, as the gate and `harness compare` test them.

Standard library only: the statistics (harness.gate.stats) take plain lists, and the stores
(harness.gate.baselines) and the journal comparisons (harness.gate.runs) both read results
through here, so the two can never sample a cell differently.
"""

from __future__ import annotations

import statistics

from harness.protocol.numbers import is_finite_number


def repeat_samples(result: dict, name: str) -> list[float] | None:
    """A result's per-repeat samples of metric `name` (None where it has none). A decode cell's
    tokens/s repeats come with the accepted length each repeat drew: its tokens/s are divided by
    it and multiplied by the repeats' mean, so the repeats keep the run's level but not the
    draws' scatter. With synthetic acceptance a repeat's draws swing tokens/s by +-10 % (5.4 /
    5.5 / 6.0 / 4.75 / 6.0 tokens a step on the H200, session 24) while its step time moves by
    well under 1 %: raw, a 12 % slowdown read inconclusive. The draws come from the cell's seed,
    so both sides of a comparison draw the same; a change in acceptance itself still moves the
    level, and `accept_len_mean` is gated on its own."""
    listed = (result.get("samples") or {}).get(name)
    if not (isinstance(listed, list) and listed and all(is_finite_number(v) for v in listed)):
        return None
    values = [float(v) for v in listed]
    if acceptance_normalised(result, name):
        accept = [float(a) for a in result["samples"]["accept_len_mean"]]
        mean = statistics.fmean(accept)
        values = [v * mean / a for v, a in zip(values, accept)]
    return values


def acceptance_normalised(result: dict, name: str) -> bool:
    """Whether `repeat_samples` divides the repeats' acceptance out of `name`'s: decode tokens/s
    with an accepted length a repeat, all positive."""
    samples = result.get("samples") or {}
    listed, accept = samples.get(name), samples.get("accept_len_mean")
    return (name == "tokens_per_s" and isinstance(listed, list) and isinstance(accept, list)
            and len(accept) == len(listed) > 0 and all(is_finite_number(a) and a > 0 for a in accept))
