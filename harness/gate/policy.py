"""Which metrics the gate judges, in which direction, and the smallest change that matters.

A scenario may carry a `metrics:` mapping (validated by harness.scenario):

    metrics:
      tokens_per_s:  {direction: higher, threshold_rel: 0.03}
      idle_fraction: {direction: lower,  threshold_abs: 0.02}

A scenario with such a mapping gates exactly the metrics it names; a field it leaves out comes
from the default policy of that metric. A scenario without one gets `DEFAULT_POLICIES`.
Acceptance length is its own entry, so a drop in accepted tokens per step is reported even when
tokens/s hides it (or the other way round).

When both thresholds are given, a change must exceed both to matter: the relative one keeps
noise on large numbers quiet, the absolute one keeps noise on numbers near zero quiet.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import InputError

HIGHER, LOWER = "higher", "lower"
DEFAULT_ALPHA = 0.01


@dataclass(frozen=True)
class Policy:
    metric: str
    direction: str                      # "higher" or "lower" is better
    threshold_rel: float | None = None  # e.g. 0.03: a 3 % change matters
    threshold_abs: float | None = None  # e.g. 0.02: two points of a 0..1 fraction matter
    alpha: float = DEFAULT_ALPHA        # one-sided significance level

    def describe(self) -> str:
        """`higher is better, 3 % / 0.02 abs`: what a report footnote says about the policy."""
        parts = []
        if self.threshold_rel is not None:
            parts.append(f"{self.threshold_rel:.0%}" if (self.threshold_rel * 100).is_integer()
                         else f"{self.threshold_rel:.1%}")
        if self.threshold_abs is not None:
            parts.append(f"{self.threshold_abs:g} abs")
        return f"{self.direction} is better, " + (" and ".join(parts) or "any significant change")


DEFAULT_POLICIES: dict[str, Policy] = {
    p.metric: p for p in (
        Policy("tokens_per_s", HIGHER, threshold_rel=0.03),
        Policy("accept_len_mean", HIGHER, threshold_rel=0.03),
        Policy("idle_fraction", LOWER, threshold_abs=0.02),
        Policy("step_ms_p50", LOWER, threshold_rel=0.03),
        Policy("kernel_us", LOWER, threshold_rel=0.03),
    )
}


def resolve_policies(scenario_metrics: dict[str, dict] | None, *, alpha: float | None = None,
                     where: str | None = None) -> dict[str, Policy]:
    """The policies a gate applies: the scenario's `metrics:` (a validated mapping of metric
    name -> {direction, threshold_rel, threshold_abs}), filled from the defaults, or the
    defaults. `alpha` overrides every policy's significance level; `where` names the scenario
    file in errors."""
    if alpha is not None and not 0 < alpha < 1:
        raise InputError(None, None, None, f"--alpha must lie between 0 and 1, got {alpha}")
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
            chosen[name] = Policy(name, direction, rel, abs_)
    if alpha is not None:
        chosen = {k: Policy(p.metric, p.direction, p.threshold_rel, p.threshold_abs, alpha)
                  for k, p in chosen.items()}
    return chosen
