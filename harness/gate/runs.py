"""Two runs compared cell by cell: the verdict `harness report RUN --compare BASE` shows.

Each head cell is compared with the base run's cell of the same id (the same parameters) on
its workload's headline metric (decode: tokens/s, higher is better; kernel: µs, lower is
better) by the statistical gate (harness.gate.stats.compare: one-sided Mann–Whitney on the
repeats plus the default policy's threshold). A cell whose two sides are not both measured
gets a plain word (no base, base failed, head failed).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.gate.policy import DEFAULT_POLICIES
from harness.gate.samples import acceptance_normalised, repeat_samples
from harness.gate.stats import compare as gate_compare
from harness.protocol.numbers import is_finite_number

VERDICT_NOTE = ("Verdicts: the regression gate (one-sided Mann–Whitney on the repeats and the "
                "default policy threshold); with few repeats a real change can stay inconclusive.")


@dataclass
class Verdict:
    metric: str                  # what was compared: tokens_per_s (decode) or kernel_us (kernel)
    base: float | None           # the base run's value of `metric`
    ratio: float | None          # head / base of `metric` (the gate's Hodges–Lehmann estimate)
    verdict: str                 # regressed | improved | unchanged | inconclusive | no base | ...
    detail: str = ""             # p-value and CI from the gate, or why there is no verdict
    head: float | None = None    # the head run's value of `metric` (the median of its repeats)


def compared_metric(result: dict) -> str:
    """The metric a cell is compared on: decode tokens/s; kernel time for the cells that time
    one kernel (the kernel and op workloads)."""
    from harness.protocol.params import times_a_kernel

    return "kernel_us" if times_a_kernel(result.get("cell") or {}) else "tokens_per_s"


def compare(head: dict[str, dict], base: dict[str, dict]) -> dict[str, Verdict]:
    """Verdict per head cell id against the base run's cell of the same id."""
    out = {}
    for cid, h in head.items():
        metric = compared_metric(h)
        b = base.get(cid)
        hs, bs = _samples(h, metric), _samples(b, metric)
        if b is None:
            out[cid] = Verdict(metric, None, None, "no base", "cell not in the base run")
        elif b.get("status") != "ok" or not bs:
            out[cid] = Verdict(metric, None, None, "base failed")
        elif h.get("status") != "ok" or not hs:
            out[cid] = Verdict(metric, _value(b, metric), None, "head failed")
        else:
            c = gate_compare(bs, hs, DEFAULT_POLICIES[metric])
            bits = [f"p={c.p:.2g}", f"n={c.n_base}/{c.n_head}"]
            if acceptance_normalised(h, metric) and acceptance_normalised(b, metric):
                bits.append("repeats per accepted token")
            if c.ci_ratio:
                bits.insert(1, f"{c.confidence:.0%} CI {c.ci_ratio[0]:.3f}–{c.ci_ratio[1]:.3f}")
            out[cid] = Verdict(metric, c.base, c.ratio, c.verdict, ", ".join(bits), c.head)
    return out


def pair_across(results: dict[str, dict], knob: str, value, key_value) -> dict[str, dict]:
    """The results whose cell has `knob` = `value`, keyed by the id their cell would have with
    `knob` = `key_value`: two runs' cells keyed with the same `key_value` line up where every
    other parameter is equal (an A/B of the knob, never a comparison of one configuration)."""
    from harness.protocol import params

    out = {}
    for r in results.values():
        cell = r.get("cell") or {}
        if knob in cell and params.canonical(cell).get(knob) == value:
            out[params.cell_id({**cell, knob: key_value})] = r
    return out


def _samples(result: dict | None, metric: str) -> list[float]:
    """The repeats of `metric` (samples.repeat_samples: decode tokens/s with each repeat's
    acceptance scatter divided out), else its single value, else nothing."""
    if not result:
        return []
    values = repeat_samples(result, metric) or []
    if not values and _value(result, metric) is not None:
        values = [_value(result, metric)]
    return values


def _value(result: dict | None, metric: str) -> float | None:
    v = ((result or {}).get("metrics") or {}).get(metric)
    return float(v) if is_finite_number(v) else None
