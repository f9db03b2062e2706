"""Judge a whole gate: every cell, every gated metric, one exit code.

Per cell, each metric of the policy set is compared (harness.gate.stats) when the head has
samples of it. A cell's verdict is its worst metric's. The gate's exit code (DESIGN.md):

    2  something is wrong or missing: a head or baseline cell failed, a cell has no baseline
       (unless allow_missing), the head lost a metric the baseline has, or nothing at all was
       compared. A gate never passes on nothing.
    1  a regression (or, with fail_on_inconclusive, an inconclusive metric)
    0  otherwise
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.gate.baselines import Side, check_same_class
from harness.gate.policy import Policy
from harness.gate.stats import (IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Comparison,
                                compare, looks_regressed)

# Cell-level states besides the metric verdicts.
OK, ERROR, MISSING = "ok", "error", "missing"
# Worst first: what a cell's verdict is when its metrics disagree.
SEVERITY = (ERROR, MISSING, REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED)


@dataclass
class CellVerdict:
    cell_id: str
    label: str
    status: str = OK                     # ok | error | missing
    message: str | None = None           # why error / missing
    comparisons: list[Comparison] = field(default_factory=list)
    lost_metrics: list[str] = field(default_factory=list)   # in the baseline, not in the head
    new_metrics: list[str] = field(default_factory=list)    # in the head, no baseline yet
    base_source: str = ""
    head_source: str = ""
    remeasured: bool = False

    @property
    def verdict(self) -> str:
        if self.status != OK:
            return self.status
        if self.lost_metrics:
            return MISSING
        verdicts = [c.verdict for c in self.comparisons] or [UNCHANGED]
        return min(verdicts, key=SEVERITY.index)

    def to_dict(self) -> dict:
        return {"cell_id": self.cell_id, "label": self.label, "verdict": self.verdict,
                "status": self.status, "message": self.message,
                "remeasured": self.remeasured, "base_source": self.base_source,
                "head_source": self.head_source, "lost_metrics": self.lost_metrics,
                "new_metrics": self.new_metrics,
                "metrics": [c.to_dict() for c in self.comparisons]}


@dataclass
class GateResult:
    scenario: str
    mode: str                            # "ab" | "mlflow" | "file" | "run"
    base: str                            # what the baseline is, for humans
    head: str
    cells: list[CellVerdict]
    policies: dict[str, Policy]
    allow_missing: bool = False
    fail_on_inconclusive: bool = False
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # mode-specific facts for the JSON report

    @property
    def compared(self) -> int:
        return sum(len(c.comparisons) for c in self.cells if c.status == OK)

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cells)

    def exit_code(self) -> int:
        verdicts = [c.verdict for c in self.cells]
        if self.compared == 0 or ERROR in verdicts:
            return 2
        if MISSING in verdicts and not self.allow_missing:
            return 2
        if REGRESSED in verdicts:
            return 1
        if self.fail_on_inconclusive and INCONCLUSIVE in verdicts:
            return 1
        return 0

    def headline(self) -> str:
        code = self.exit_code()
        if code == 2 and self.compared == 0:
            return "nothing was compared"
        parts = [f"{self.count(v)} {v}" for v in SEVERITY if self.count(v)]
        return ", ".join(parts) + f" ({len(self.cells)} cell(s))"

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "mode": self.mode, "base": self.base,
                "head": self.head, "exit_code": self.exit_code(), "headline": self.headline(),
                "counts": {v: self.count(v) for v in SEVERITY},
                "policies": {k: {"direction": p.direction, "threshold_rel": p.threshold_rel,
                                 "threshold_abs": p.threshold_abs, "alpha": p.alpha}
                             for k, p in self.policies.items()},
                "notes": self.notes, **self.extra,
                "cells": [c.to_dict() for c in self.cells]}


def judge_cell(head: Side | None, base: Side | None, policies: dict[str, Policy], *,
               with_ci: bool = True, seed: int = 0) -> CellVerdict:
    """Compare one cell's head with its baseline under every policy."""
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
    for name, policy in policies.items():
        h, b = head.samples.get(name), base.samples.get(name)
        if h and b:
            cv.comparisons.append(compare(b, h, policy, with_ci=with_ci, seed=seed))
        elif b and not h:
            cv.lost_metrics.append(name)
        elif h and not b:
            cv.new_metrics.append(name)
    if cv.lost_metrics:
        cv.message = f"head has no {', '.join(cv.lost_metrics)} (the baseline has)"
    elif not cv.comparisons:
        cv.status, cv.message = MISSING, "no gated metric measured on both sides"
    return cv


def needs_remeasure(cv: CellVerdict, screen: float) -> bool:
    """Whether a cell looks regressed on any metric (stats.looks_regressed)."""
    return cv.status == OK and any(looks_regressed(c, screen) for c in cv.comparisons)
