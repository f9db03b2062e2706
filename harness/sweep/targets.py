"""A scenario's `targets`: absolute bounds on what its cells measure, judged met, not met or absent.

The gate asks whether a run is worse than its baseline; a target asks whether it reached a
number, e.g. issue-style goals a benchmark is for ("idle <= 1 % in gpu/full", "top-k + tree build
<= 20 µs", "custom >= 1.2x the Triton verify at 64k"). A scenario states them beside its cells:

    targets:
      - name: idle <= 1 % (gpu/full, custom verify)
        cells: verify_mode=custom and graph_capture=full   # a -k expression (harness.sweep.cellfilter)
        metric: idle_fraction
        max: 0.01                # each selected cell (min: a lower bound; both: a range)
      - name: top-k + tree build <= 20 µs (b 1)
        cells: workload=op and batch_size=1
        metric: kernel_us
        of: sum                  # the selected cells' values summed, then bounded
        max: 20
      - name: custom >= 1.2x Triton at 64k
        cells: verify_mode=custom and context_length=65536 and speculation=ddtree
        per: verify_mode=triton and context_length=65536 and speculation=ddtree
        metric: tokens_per_s     # each selected cell's value over the one `per` cell's
        min: 1.2

The scenario's parser checks the keys and that each expression selects some of its cells (`per`:
exactly one); this module judges a run's results and writes nothing. A verdict is `met` only
when every number it needs was measured and each is within the bound; `not met` when a measured
number is outside it (whatever else is missing); otherwise `absent`, with why (a failed cell, a
metric the host could not measure, no cell of the run selected): a target is never met on
nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.protocol.numbers import is_finite_number
from harness.sweep.cellfilter import cell_matcher

MET, NOT_MET, ABSENT = "met", "not met", "absent"


@dataclass(frozen=True)
class Outcome:
    """One target judged on a run: the measured numbers it used and the verdict."""

    name: str
    bound: str                                   # bound_text: "idle_fraction <= 0.01", ...
    measured: list[tuple[str, float | None]]     # (cell label, value; a ratio with `per`)
    value: float | None                          # of: sum: the sum, else None
    verdict: str                                 # MET | NOT_MET | ABSENT
    why: str = ""                                # what is absent, or which number missed

    def to_dict(self) -> dict:
        return {"name": self.name, "bound": self.bound, "verdict": self.verdict, "why": self.why,
                "value": self.value,
                "measured": [{"label": label, "value": v} for label, v in self.measured]}


def default_name(target: dict) -> str:
    """A target's name where the scenario gives none: what it bounds."""
    return f"{bound_text(target)} ({target['cells']})"


def bound_text(target: dict) -> str:
    """What is bounded and how: `idle_fraction <= 0.01`, `sum of kernel_us <= 20`,
    `tokens_per_s / per >= 1.2`, `x in [-2, 2]`."""
    metric = target["metric"]
    what = (f"sum of {metric}" if target.get("of") == "sum" else
            f"{metric} / per" if target.get("per") else metric)
    lo, hi = target.get("min"), target.get("max")
    if lo is not None and hi is not None:
        return f"{what} in [{lo:g}, {hi:g}]"
    return f"{what} >= {lo:g}" if lo is not None else f"{what} <= {hi:g}"


def _within(value: float, target: dict) -> bool:
    lo, hi = target.get("min"), target.get("max")
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def _value(result: dict, metric: str) -> tuple[float | None, str]:
    """The cell's finite `metric`, or None and why not."""
    if result.get("status") != "ok":
        return None, "failed"
    value = (result.get("metrics") or {}).get(metric)
    if not is_finite_number(value):
        return None, "not measured"
    return float(value), ""


def _selected(expr: str, name: str, results: list[dict]) -> list[dict]:
    selects = cell_matcher(expr, name)
    return [r for r in results if selects(r["cell"])]


def judge(target: dict, results: list[dict]) -> Outcome:
    """`target` (a scenario's entry: cells, metric, min / max, of, per, name) on `results`
    (a run's results, any order; cells the run did not get to are simply not among them)."""
    metric = target["metric"]
    name = target.get("name") or default_name(target)

    def outcome(measured, value, verdict, why=""):
        return Outcome(name, bound_text(target), measured, value, verdict, why)

    try:    # a stored scenario's expressions were checked when it ran; one edited since may not parse
        chosen = _selected(target["cells"], "cells", results)
        per = _selected(target["per"], "per", results) if target.get("per") else None
    except InputError as e:
        return outcome([], None, ABSENT, e.message)
    if not chosen:
        return outcome([], None, ABSENT, f"no result of this run matches cells: {target['cells']}")
    values = [(params.cell_label(r["cell"]), *_value(r, metric)) for r in chosen]
    if per is not None:
        if len(per) != 1:
            return outcome([(label, None) for label, *_ in values], None, ABSENT,
                           f"per selects {len(per)} results of this run, not one: {target['per']}")
        denominator, why = _value(per[0], metric)
        if denominator is None or denominator == 0:
            return outcome([(label, None) for label, *_ in values], None, ABSENT,
                           f"the per cell's {metric}: {why or 'zero'}")
        values = [(label, None if v is None else v / denominator, why) for label, v, why in values]
    measured = [(label, v) for label, v, _ in values]
    reasons = Counter(why for _, v, why in values if v is None)
    missing = "; ".join(f"{why}: {n} of {len(values)}" for why, n in reasons.items())
    present = [v for _, v, _ in values if v is not None]

    if target.get("of") == "sum":
        if missing:
            return outcome(measured, None, ABSENT, missing)
        total = sum(present)
        return outcome(measured, total, MET if _within(total, target) else NOT_MET)
    outside = [v for v in present if not _within(v, target)]
    if outside:
        return outcome(measured, None, NOT_MET,
                       f"{len(outside)} of {len(values)} outside" + (f"; {missing}" if missing else ""))
    if missing:
        return outcome(measured, None, ABSENT, missing)
    return outcome(measured, None, MET)


def judge_all(targets: list[dict], results: list[dict], order: list[str] = ()) -> list[Outcome]:
    """Every target on `results`, each target's numbers in the order of the cell ids `order`
    (the run's matrix order), the rest after them."""
    rank = {cid: i for i, cid in enumerate(order)}
    ordered = sorted(results, key=lambda r: rank.get(r.get("cell_id"), len(rank)))
    return [judge(t, ordered) for t in targets]


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """How many targets reached each verdict, every verdict named (0 where none did)."""
    return {v: sum(o.verdict == v for o in outcomes) for v in (MET, NOT_MET, ABSENT)}


def among(targets: list[dict], cells: list[dict]) -> tuple[list[dict], list[dict]]:
    """The targets that select at least one of `cells` (a gate's, after -k), and with `per` its
    cell too, and the others: a target about cells that were not measured is left out and
    counted, not judged absent."""
    def any_of(expr: str, key: str) -> bool:
        selects = cell_matcher(expr, key)
        return any(selects(c) for c in cells)

    inside, outside = [], []
    for t in targets:
        judged = any_of(t["cells"], "cells") and (not t.get("per") or any_of(t["per"], "per"))
        (inside if judged else outside).append(t)
    return inside, outside


def of_run(journal) -> list[dict]:
    """The targets of a journaled run: its scenario's as it was run (none where it had none).
    An InputError names the stored scenario file where they do not read."""
    from harness.sweep.scenario import parse_targets

    path = journal.scenario_file
    return parse_targets(path.read_text(encoding="utf-8"), path) if path.is_file() else []


def judge_run(journal, results: list[dict], wanted: list[dict] | None = None) -> list[Outcome]:
    """A journaled run's targets (or `wanted`) judged on `results`, each target's numbers in the
    run's cell order; an InputError where its stored targets do not read."""
    wanted = of_run(journal) if wanted is None else wanted
    return judge_all(wanted, results, [c["cell_id"] for c in journal.cells])
