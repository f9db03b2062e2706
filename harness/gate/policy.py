"""Which metrics the gate judges, in which direction, and the smallest change that matters.

A scenario may carry a `metrics:` mapping (validated by harness.sweep.scenario):

    metrics:
      tokens_per_s:  {direction: higher, threshold_rel: 0.03}
      idle_fraction: {direction: lower,  threshold_abs: 0.02}

A scenario with such a mapping gates exactly the metrics it names; a field it leaves out comes
from the default policy of that metric. A scenario without one gets `DEFAULT_POLICIES`: the
union of the policies each workload declares (harness/protocol/workloads/).
Acceptance length is its own entry, so a drop in accepted tokens per step is reported even when
tokens/s hides it (or the other way round).

When both thresholds are given, a change must exceed both to matter: the relative one keeps
noise on large numbers quiet, the absolute one keeps noise on numbers near zero quiet.

Two levels per metric: `alpha`, the false-alarm rate (calling a change regressed or improved
that is not there), and `alpha_eq`, the rate of calling "unchanged" a change of exactly the
threshold's size (the "unchanged" interval is a 1 - 2 alpha_eq one). Both are rates of the whole
gate, over every look it takes (harness.gate.sequential splits them among the looks).

`per` says how many samples one worker run gives: "repeat" (one per repeat: tokens/s, step
time p50, acceptance, kernel time) or "run" (one per worker run: the profiled idle fraction).
The gate plans its rounds from it before measuring. A metric with `gate: false` is reported
beside the gated ones (with its noise) but never decides the exit code: idle_fraction by
default, since one sample a run needs more rounds to decide than a PR gate can afford.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.protocol.errors import InputError
from harness.protocol.workloads import SPECS

HIGHER, LOWER = "higher", "lower"
PER_REPEAT, PER_RUN = "repeat", "run"
DEFAULT_ALPHA = 0.01
DEFAULT_ALPHA_EQ = 0.05


@dataclass(frozen=True)
class Policy:
    metric: str
    direction: str                      # "higher" or "lower" is better
    threshold_rel: float | None = None  # e.g. 0.03: a 3 % change matters
    threshold_abs: float | None = None  # e.g. 0.02: two points of a 0..1 fraction matter
    alpha: float = DEFAULT_ALPHA        # one-sided significance level (false alarms)
    alpha_eq: float = DEFAULT_ALPHA_EQ  # risk of "unchanged" for a change at the threshold
    gate: bool = True                   # False: reported, never decides the exit code
    per: str = PER_REPEAT               # samples per worker run: one per repeat, or one

    def to_dict(self) -> dict:
        return {"direction": self.direction, "threshold_rel": self.threshold_rel,
                "threshold_abs": self.threshold_abs, "alpha": self.alpha,
                "alpha_eq": self.alpha_eq, "gate": self.gate, "per": self.per}

    def threshold_text(self) -> str:
        """`3 %`, `0.02 abs`, `3 % and 0.02 abs`."""
        parts = []
        if self.threshold_rel is not None:
            parts.append(f"{self.threshold_rel:.0%}" if (self.threshold_rel * 100).is_integer()
                         else f"{self.threshold_rel:.1%}")
        if self.threshold_abs is not None:
            parts.append(f"{self.threshold_abs:g} abs")
        return " and ".join(parts) or "any change"

    def describe(self) -> str:
        """`higher is better, 3 %`: what a report footnote says about the policy."""
        what = f"{self.direction} is better, {self.threshold_text()}"
        return what + ("" if self.gate else " (reported, not gated)")


def _workload_policies() -> dict[str, Policy]:
    """The union of the policies every workload declares (WorkloadSpec.policies, in workload
    order); two workloads that declare one metric must declare the same policy."""
    found: dict[str, Policy] = {}
    for spec in SPECS.values():
        for metric, fields in spec.policies.items():
            policy = Policy(metric, **fields)
            if found.setdefault(metric, policy) != policy:
                raise RuntimeError(f"workloads disagree on the default policy of {metric}: "
                                   f"{found[metric]} and {policy} (workload {spec.name})")
    return found


DEFAULT_POLICIES: dict[str, Policy] = _workload_policies()


def resolve_policies(scenario_metrics: dict[str, dict] | None, *, alpha: float | None = None,
                     alpha_eq: float | None = None, where: str | None = None) -> dict[str, Policy]:
    """The policies a gate applies: the scenario's `metrics:` (a validated mapping of metric
    name -> {direction, threshold_rel, threshold_abs, gate}), filled from the defaults, or the
    defaults. `alpha` / `alpha_eq` override every policy's levels; `where` names the scenario
    file in errors."""
    if alpha is not None and not 0 < alpha < 1:
        raise InputError(None, None, None, f"--alpha must lie between 0 and 1, got {alpha}")
    if alpha_eq is not None and not 0 < alpha_eq < 0.5:
        raise InputError(None, None, None, f"--alpha-eq must lie between 0 and 0.5, got {alpha_eq}")
    if not scenario_metrics:
        chosen = dict(DEFAULT_POLICIES)
    else:
        chosen = {}
        for name, given in scenario_metrics.items():
            default = DEFAULT_POLICIES.get(name)
            direction = given.get("direction") or (default.direction if default else None)
            if direction is None:
                raise InputError(where, None, None,
                                 f"metrics.{name}: no direction given and no default policy "
                                 f"for this metric (set direction: higher or lower)")
            explicit = given.get("threshold_rel") is not None or given.get("threshold_abs") is not None
            rel = given.get("threshold_rel") if explicit else (default.threshold_rel if default else None)
            abs_ = given.get("threshold_abs") if explicit else (default.threshold_abs if default else None)
            gate = given.get("gate")
            chosen[name] = Policy(name, direction, rel, abs_,
                                  gate=(default.gate if default else True) if gate is None else gate,
                                  per=default.per if default else PER_RUN)
    levels = {k: v for k, v in (("alpha", alpha), ("alpha_eq", alpha_eq)) if v is not None}
    if levels:
        chosen = {k: replace(p, **levels) for k, p in chosen.items()}
    return chosen
