"""The gate's design: how many rounds before it may look, how often it may look, at which
levels, and whether a design can reach a verdict at all -- decided before anything is measured.

A round is one worker run per side of a cell (`repeats` samples of a per-repeat metric, one
sample of a per-run metric; harness.gate.policy). The gate measures `first_look` rounds, looks,
and while a gated metric is still inconclusive measures one more round and looks again, up to
`max_rounds` (or until its time budget is spent). Every look is a chance of a false alarm, so
the levels are split among the looks that the design allows: with K = max_rounds - first_look + 1
looks, each look tests at alpha / K (regressed / improved) and alpha_eq / K (unchanged) -- the
Bonferroni correction. By the union bound the whole sequence then keeps each error below its
level whatever the noise and whenever the gate stops (stopping early only spends less), which
`harness.gate.evaluate` checks by simulation. A metric's verdict is final at the first look that
decides it; the cell is measured on only while another gated metric is undecided.

Power before measuring: with n_base and n_head samples the smallest attainable p is
1 / C(n_base + n_head, n_base) (stats.min_p). A design whose first look cannot go below
alpha / K for every gated metric could never fail, so it is re-planned (A/B: a later first
look) or refused with one line that says what it needs (a stored baseline with too few
samples, a head run measured with too few repeats): exit 2, never a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.gate.policy import PER_REPEAT, Policy
from harness.gate.stats import Comparison, ci_rank, compare, min_p
from harness.protocol.errors import InputError

DEFAULT_MAX_ROUNDS = 15
PLAN_SEARCH_LIMIT = 500      # rounds or samples tried when saying what a refused design needs


@dataclass(frozen=True)
class Design:
    first_look: int          # rounds per side measured before the first look
    max_rounds: int          # rounds per side at most

    @property
    def looks(self) -> int:
        return self.max_rounds - self.first_look + 1

    def levels(self, policy: Policy) -> tuple[float, float]:
        """(alpha, alpha_eq) of one look."""
        return policy.alpha / self.looks, policy.alpha_eq / self.looks

    def to_dict(self) -> dict:
        return {"first_look": self.first_look, "max_rounds": self.max_rounds,
                "looks": self.looks, "correction": "bonferroni"}


def per_round(policy: Policy, repeats: int) -> int:
    """Samples one worker run gives of this metric."""
    return repeats if policy.per == PER_REPEAT else 1


def gated(policies: dict[str, Policy]) -> list[Policy]:
    return [p for p in policies.values() if p.gate]


def reachable(policy: Policy, n_base: int, n_head: int, looks: int) -> bool:
    """Whether n_base vs n_head samples can decide the metric at one of `looks` looks: a p
    below alpha / looks is attainable, and so is an interval for 'unchanged'."""
    return (min_p(n_base, n_head) < policy.alpha / looks
            and ci_rank(n_base, n_head, 1 - 2 * policy.alpha_eq / looks) >= 1)


# -- planning ----------------------------------------------------------------------------------


def plan_ab(policies: dict[str, Policy], repeats: int, max_rounds: int = DEFAULT_MAX_ROUNDS,
            min_rounds: int = 1) -> Design:
    """The earliest first look at which every gated metric can be decided, both sides growing
    by one worker run a round (`repeats`: the fewest repeats of any cell)."""
    _check_rounds(min_rounds, max_rounds)
    found = _first_look(policies, lambda r: (r, r), repeats, min_rounds, max_rounds)
    if found is not None:
        return Design(found, max_rounds)
    need = next((m for m in range(max_rounds + 1, PLAN_SEARCH_LIMIT)
                 if _first_look(policies, lambda r: (r, r), repeats, min_rounds, m) is not None), None)
    worst = _hardest(policies, repeats)
    raise InputError(None, None, None,
                     f"the gate cannot reach a verdict on `{worst.metric}` ({_per_text(worst, repeats)}) "
                     f"within --max-rounds {max_rounds}: it needs --max-rounds {need or 'far more'}"
                     f" (or more repeats per cell)")


def plan_stored(policies: dict[str, Policy], base_counts: dict[str, dict[str, int]],
                repeats: dict[str, int], labels: dict[str, str], source: str,
                max_rounds: int = DEFAULT_MAX_ROUNDS, min_rounds: int = 1) -> Design:
    """The earliest first look at which, for every cell and gated metric, the stored
    baseline's samples (`base_counts[cell][metric]`) against the head's growing ones can reach
    a verdict. A baseline with too few samples is refused, saying how many it needs."""
    _check_rounds(min_rounds, max_rounds)
    for first in range(min_rounds, max_rounds + 1):
        looks = max_rounds - first + 1
        if all(reachable(p, counts[p.metric], first * per_round(p, repeats[cid]), looks)
               for cid, counts in base_counts.items() for p in gated(policies)
               if counts.get(p.metric)):
            return Design(first, max_rounds)
    # Refused: name the first cell and metric whose baseline cannot get there.
    for cid, counts in base_counts.items():
        for p in gated(policies):
            n_b = counts.get(p.metric)
            if not n_b or reachable(p, n_b, max_rounds * per_round(p, repeats[cid]), 1):
                continue
            s = per_round(p, repeats[cid])
            need = next((n for n in range(n_b + 1, PLAN_SEARCH_LIMIT)
                         if reachable(p, n, max_rounds * s, max_rounds)), None)
            raise InputError(None, None, None,
                             f"baseline {source} has {n_b} sample(s) of `{p.metric}` for cell "
                             f"{cid} ({labels.get(cid, cid)}): the gate can never reach alpha "
                             f"{p.alpha:g} with it; a stored baseline needs at least "
                             f"{need or 'far more'} (mark a run with more repeats, or gate A/B "
                             f"with --base REF)")
    raise InputError(None, None, None, f"baseline {source}: no design within --max-rounds "
                                       f"{max_rounds} can reach a verdict; raise --max-rounds")


def check_fixed(policies: dict[str, Policy], counts: dict[str, tuple[int, int]],
                labels: dict[str, str], what: str) -> Design:
    """One look at samples measured earlier (`harness gate --baseline … --run RUN`):
    `counts[cell]` = {metric: (n_base, n_head)}. Refused when any gated metric cannot reach
    its level, with the repeats both sides would need."""
    for cid, per_metric in counts.items():
        for p in gated(policies):
            if p.metric not in per_metric:
                continue
            n_b, n_h = per_metric[p.metric]
            if reachable(p, n_b, n_h, 1):
                continue
            equal = next((n for n in range(2, PLAN_SEARCH_LIMIT) if reachable(p, n, n, 1)), None)
            raise InputError(None, None, None,
                             f"{what}: {n_b} vs {n_h} sample(s) of `{p.metric}` for cell {cid} "
                             f"({labels.get(cid, cid)}) can never be significant (the smallest "
                             f"p they can give is {min_p(n_b, n_h):.3g}, alpha is {p.alpha:g}): "
                             f"measure both sides with at least {equal or 'far more'} samples, "
                             f"or let the gate measure the head (without --run)")
    return Design(1, 1)


def _check_rounds(min_rounds: int, max_rounds: int) -> None:
    if min_rounds < 1 or max_rounds < min_rounds:
        raise InputError(None, None, None, f"--rounds must be >= 1 and --max-rounds >= --rounds "
                                           f"(got {min_rounds} and {max_rounds})")


def _first_look(policies, sizes, repeats, min_rounds, max_rounds) -> int | None:
    for first in range(min_rounds, max_rounds + 1):
        looks = max_rounds - first + 1
        if all(reachable(p, *(n * per_round(p, repeats) for n in sizes(first)), looks)
               for p in gated(policies)):
            return first
    return None


def _hardest(policies, repeats) -> Policy:
    return min(gated(policies), key=lambda p: (per_round(p, repeats), -p.alpha))


def _per_text(policy: Policy, repeats: int) -> str:
    n = per_round(policy, repeats)
    return f"{n} sample{'s' if n != 1 else ''} per worker run"


# -- looking -----------------------------------------------------------------------------------


def look(base, head, policy: Policy, design: Design, round_no: int) -> Comparison:
    """One metric at one look, at the design's per-look levels."""
    alpha, alpha_eq = design.levels(policy)
    return compare(base, head, policy, alpha=alpha, alpha_eq=alpha_eq, look=round_no)


def rounds_to_decide(c: Comparison, design: Design, samples_per_round: int,
                     rounds_done: int) -> int | None:
    """About how many rounds per side in all would likely decide an inconclusive metric, from
    the interval seen: its width shrinks as 1 / sqrt(samples). None when the interval is not
    attainable yet or the change sits right at the threshold (no number of rounds is likely
    to decide it)."""
    from scipy.stats import norm

    thr, est, ci = _scale(c)
    if ci is None or thr is None or samples_per_round < 1:
        return None
    z_eq = norm.ppf(1 - design.levels(c.policy)[1])
    se = (ci[1] - ci[0]) / (2 * z_eq)
    if se <= 0:
        return None
    if abs(est) < thr:       # heading for "unchanged": the interval must fit inside the band
        se_needed = (thr - abs(est)) / z_eq
    else:                    # heading for "regressed"/"improved": the change must be significant
        se_needed = abs(est) / norm.ppf(1 - design.levels(c.policy)[0])
    if se_needed <= 0:
        return None
    n_now = min(c.n_base, c.n_head)
    n_needed = n_now * (se / se_needed) ** 2
    return max(rounds_done + 1, math.ceil(n_needed / samples_per_round))


def _scale(c: Comparison) -> tuple[float | None, float, tuple[float, float] | None]:
    """(threshold, estimate, interval) on one scale: log ratio for a relative threshold,
    differences for an absolute one."""
    p = c.policy
    if p.threshold_rel is not None and c.ratio is not None:
        ci = (math.log(c.ci_ratio[0]), math.log(c.ci_ratio[1])) if c.ci_ratio else None
        return -math.log(1 - p.threshold_rel) if p.threshold_rel < 1 else None, math.log(c.ratio), ci
    return p.threshold_abs, c.diff, c.ci_diff
