"""Judge a whole gate: every cell, every metric, one exit code.

Per cell, each metric of the policy set is compared (harness.gate.sequential.look) when both
sides have samples of it; a metric decided at an earlier look keeps that verdict (the design
spent its share of alpha there). A cell's verdict is its worst gated metric's; metrics with
`gate: false` are shown beside them and never decide. The gate's exit code (docs/ARCHITECTURE.md):

    2  something is wrong or missing: a head or baseline cell failed, a cell has no baseline
       or only one that ran other kernels (unless allow_missing), the head lost a metric the
       baseline has, or no gated metric was compared at all. A gate never passes on nothing.
    1  a regression
    3  undecided: a gated metric is still inconclusive (the budget or the rounds ran out first);
       0 with allow_undecided, which the headline says
    0  every gated metric decided, none regressed
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.gate.baselines import (Side, check_same_class, other_deployment, other_kernels,
                                    other_settling)
from harness.gate.noise import Noise
from harness.gate.policy import Policy
from harness.gate.sequential import Design, look
from harness.gate.stats import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Comparison

# Cell-level states besides the metric verdicts.
OK, ERROR, MISSING = "ok", "error", "missing"
# Worst first: what a cell's verdict is when its metrics disagree.
SEVERITY = (ERROR, MISSING, REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED)
EXIT_OK, EXIT_REGRESSION, EXIT_ERROR, EXIT_UNDECIDED = 0, 1, 2, 3


@dataclass
class CellVerdict:
    cell_id: str
    label: str
    status: str = OK                     # ok | error | missing
    message: str | None = None           # why error / missing
    comparisons: list[Comparison] = field(default_factory=list)   # gated and reported
    lost_metrics: list[str] = field(default_factory=list)   # in the baseline, not in the head
    new_metrics: list[str] = field(default_factory=list)    # in the head, no baseline yet
    base_source: str = ""
    head_source: str = ""
    rounds: dict[str, int] = field(default_factory=dict)    # worker runs per side
    noise: list[Noise] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)       # noise over half a threshold
    host_notes: list[str] = field(default_factory=list)     # host facts that explain noise
    to_decide: dict[str, int | None] = field(default_factory=dict)  # undecided metric -> rounds
    budget_out: bool = False             # more rounds were wanted, the budget said no

    @property
    def gated(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.policy.gate]

    @property
    def verdict(self) -> str:
        if self.status != OK:
            return self.status
        if self.lost_metrics:
            return MISSING
        verdicts = [c.verdict for c in self.gated] or [UNCHANGED]
        return min(verdicts, key=SEVERITY.index)

    @property
    def undecided(self) -> list[Comparison]:
        return [c for c in self.gated if c.verdict == INCONCLUSIVE]

    def to_dict(self) -> dict:
        return {"cell_id": self.cell_id, "label": self.label, "verdict": self.verdict,
                "status": self.status, "message": self.message, "rounds": self.rounds,
                "base_source": self.base_source, "head_source": self.head_source,
                "lost_metrics": self.lost_metrics, "new_metrics": self.new_metrics,
                "budget_out": self.budget_out, "to_decide": self.to_decide,
                "warnings": self.warnings, "host_notes": self.host_notes,
                "noise": [n.to_dict() for n in self.noise],
                "metrics": [c.to_dict() for c in self.comparisons]}


@dataclass
class GateResult:
    scenario: str
    mode: str                            # "ab" | "mlflow" | "file" | "run"
    base: str                            # what the baseline is, for humans
    head: str
    cells: list[CellVerdict]
    policies: dict[str, Policy]
    design: Design | None = None
    allow_missing: bool = False
    allow_undecided: bool = False
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # mode-specific facts for the JSON report
    # The scenario's absolute goals judged on the head's numbers (harness.sweep.targets.Outcome):
    # reported beside the verdict, never part of it (a gate is relative to its baseline).
    targets: list = field(default_factory=list)
    targets_base: list | None = None   # the same on the base, where it is a journaled run

    @property
    def compared(self) -> int:
        return sum(len(c.gated) for c in self.cells if c.status == OK)

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    @property
    def undecided(self) -> list[CellVerdict]:
        return [c for c in self.cells if c.verdict == INCONCLUSIVE]

    def exit_code(self) -> int:
        verdicts = [c.verdict for c in self.cells]
        if self.compared == 0 or ERROR in verdicts:
            return EXIT_ERROR
        if MISSING in verdicts and not self.allow_missing:
            return EXIT_ERROR
        if REGRESSED in verdicts:
            return EXIT_REGRESSION
        if INCONCLUSIVE in verdicts and not self.allow_undecided:
            return EXIT_UNDECIDED
        return EXIT_OK

    def headline(self) -> str:
        if self.compared == 0:
            return "nothing was compared"
        parts = [f"{self.count(v)} {v}" for v in SEVERITY if self.count(v)]
        text = ", ".join(parts) + f" ({len(self.cells)} cell(s))"
        if self.undecided and self.allow_undecided and self.exit_code() == EXIT_OK:
            text += " — undecided cells allowed (--allow-undecided)"
        return text

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "mode": self.mode, "base": self.base,
                "head": self.head, "exit_code": self.exit_code(), "headline": self.headline(),
                "counts": {v: self.count(v) for v in SEVERITY},
                "design": self.design.to_dict() if self.design else None,
                "allow_undecided": self.allow_undecided,
                "policies": {k: p.to_dict() for k, p in self.policies.items()},
                "notes": self.notes, **self.extra,
                "targets": [o.to_dict() for o in self.targets],
                "targets_base": (None if self.targets_base is None
                                 else [o.to_dict() for o in self.targets_base]),
                "cells": [c.to_dict() for c in self.cells]}


def judge_cell(head: Side | None, base: Side | None, policies: dict[str, Policy], design: Design,
               round_no: int, decided: dict[str, Comparison] | None = None) -> CellVerdict:
    """Compare one cell's head with its baseline under every policy at look `round_no`;
    metrics in `decided` keep the verdict an earlier look gave them."""
    ref = head or base
    cv = CellVerdict(ref.cell_id, ref.label, base_source=base.source if base else "",
                     head_source=head.source if head else "")
    if head is None or head.error:
        cv.status, cv.message = ERROR, f"head: {head.error if head else 'not measured'}"
        return cv
    if base is None:
        cv.status, cv.message = MISSING, "no baseline for this cell"
        return cv
    if base.error:
        cv.status, cv.message = MISSING, f"baseline: {base.error}"
        return cv
    check_same_class(head, base)
    if (why := other_kernels(head, base) or other_settling(head, base)
            or other_deployment(head, base)) is not None:
        cv.status, cv.message = MISSING, why
        return cv
    decided = decided or {}
    for name, policy in policies.items():
        h, b = head.samples.get(name), base.samples.get(name)
        if name in decided:
            cv.comparisons.append(decided[name])
        elif h and b:
            cv.comparisons.append(look(b, h, policy, design, round_no))
        elif b and not h and policy.gate:
            cv.lost_metrics.append(name)
        elif h and not b:
            cv.new_metrics.append(name)
    if cv.lost_metrics:
        cv.message = f"head has no {', '.join(cv.lost_metrics)} (the baseline has)"
    elif not cv.gated:
        cv.status, cv.message = MISSING, "no gated metric measured on both sides"
    return cv


def settled(cv: CellVerdict) -> dict[str, Comparison]:
    """The metrics of a look that are decided (and stay so)."""
    return {c.metric: c for c in cv.comparisons if c.decided}


def wants_more(cv: CellVerdict) -> bool:
    """Whether another round could change the cell's verdict: a gated metric is undecided."""
    return cv.status == OK and not cv.lost_metrics and bool(cv.undecided)
