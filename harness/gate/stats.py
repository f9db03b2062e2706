"""One metric of one cell, baseline samples vs head samples: how big is the change, is it real?

The repeats of a cell are the samples. Two questions, both must say yes before a change is
called a regression (or an improvement):

1. Does it matter? The estimated change moved in the bad direction by more than the policy's
   threshold (relative, absolute, or both; harness.gate.policy).
2. Is it real? A one-sided Mann-Whitney U test (scipy) says head is worse than baseline at the
   policy's significance level. Rank-based, so one slow outlier repeat cannot fake a regression.

The change is estimated with the Hodges-Lehmann estimator that belongs to the Mann-Whitney test:
the median over all (baseline, head) pairs of head/base (for the relative threshold) and of
head - base (for the absolute one). It is as robust as the ratio of medians but much less noisy
on few repeats (asymptotic efficiency 0.95 vs 0.64 under normal noise), and that is worth a lot:
the gate's detection rate at a given number of repeats is limited by how precisely the change
is estimated (results/gate-evaluation.md). The plain ratio of medians is reported too.

Verdicts:
    regressed     worse by more than the threshold, and significant
    improved      better by more than the threshold, and significant
    inconclusive  beyond the threshold either way, but not significant: measure more
    unchanged     within the threshold (a real but small change is still "unchanged")

A bootstrap confidence interval of the ratio (and of the difference) is reported alongside: it
shows how sure the numbers are; it does not decide the verdict.

Small samples cannot be significant at all: with 5 vs 5 repeats the exact one-sided p is at
least 1/252 = 0.004, and with 3 vs 3 at least 1/20 = 0.05. `looks_regressed` is the cheap
screen that sends a cell back for more samples (harness.gate.abtest) before the final verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.gate.policy import HIGHER, Policy

REGRESSED = "regressed"
IMPROVED = "improved"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REGRESSED, IMPROVED, INCONCLUSIVE, UNCHANGED)

# Exact Mann-Whitney distributions are cheap up to this many (n_base x n_head) pairs.
EXACT_MAX_PAIRS = 2500
# With ties the exact null distribution needs a permutation test: exhaustive while the number
# of distinct splits stays below this, Monte Carlo (seeded) beyond.
PERMUTATIONS = 9999
# A cell is re-measured when its change is worse by more than this fraction of the threshold.
DEFAULT_SCREEN = 0.25


@dataclass(frozen=True)
class Comparison:
    metric: str
    policy: Policy
    n_base: int
    n_head: int
    base: float                 # median of the baseline samples
    head: float                 # median of the head samples
    ratio: float | None         # Hodges-Lehmann head/base (None unless every sample is > 0)
    diff: float                 # Hodges-Lehmann head - base
    p_worse: float              # one-sided Mann-Whitney p that head is worse than base
    p_better: float             # ... that head is better
    verdict: str
    ci_ratio: tuple[float, float] | None = None   # bootstrap CI of `ratio`
    ci_diff: tuple[float, float] | None = None    # bootstrap CI of `diff`
    confidence: float = 0.95

    @property
    def median_ratio(self) -> float | None:
        return self.head / self.base if self.base != 0 else None

    @property
    def worse_rel(self) -> float:
        """Relative change in the bad direction (0.05 = 5 % worse; negative = better)."""
        return worse_change(self.base, self.ratio, self.diff, self.policy)[0]

    @property
    def worse_abs(self) -> float:
        return worse_change(self.base, self.ratio, self.diff, self.policy)[1]

    @property
    def p(self) -> float:
        """The p-value behind the verdict: toward 'better' when the change is an improvement."""
        return self.p_better if self.worse_abs < 0 else self.p_worse

    def to_dict(self) -> dict:
        return {"metric": self.metric, "verdict": self.verdict, "n_base": self.n_base,
                "n_head": self.n_head, "base_median": self.base, "head_median": self.head,
                "ratio": self.ratio, "diff": self.diff, "median_ratio": self.median_ratio,
                "ci_ratio": list(self.ci_ratio) if self.ci_ratio else None,
                "ci_diff": list(self.ci_diff) if self.ci_diff else None,
                "confidence": self.confidence, "p": self.p, "p_worse": self.p_worse,
                "p_better": self.p_better,
                "policy": {"direction": self.policy.direction,
                           "threshold_rel": self.policy.threshold_rel,
                           "threshold_abs": self.policy.threshold_abs,
                           "alpha": self.policy.alpha}}


def hodges_lehmann(base, head) -> tuple[float | None, float]:
    """(ratio, difference): the medians over all pairs of head_j / base_i (None unless every
    sample is positive; taken in log space so it is symmetric) and of head_j - base_i."""
    base = np.asarray(base, dtype=float)
    head = np.asarray(head, dtype=float)
    diff = float(np.median(head[:, None] - base[None, :]))
    if np.all(base > 0) and np.all(head > 0):
        ratio = float(np.exp(np.median(np.log(head)[:, None] - np.log(base)[None, :])))
    else:
        ratio = None
    return ratio, diff


def worse_change(base_median: float, ratio: float | None, diff: float,
                 policy: Policy) -> tuple[float, float]:
    """(relative, absolute) change in the bad direction; negative values mean better."""
    worse_abs = -diff if policy.direction == HIGHER else diff
    if ratio is not None:
        worse_rel = (1.0 - ratio) if policy.direction == HIGHER else (ratio - 1.0)
    elif base_median != 0:
        worse_rel = worse_abs / abs(base_median)
    else:
        worse_rel = 0.0 if worse_abs == 0 else math.copysign(math.inf, worse_abs)
    return worse_rel, worse_abs


def matters(worse_rel: float, worse_abs: float, policy: Policy, scale: float = 1.0) -> bool:
    """Whether a change of this size in the bad direction crosses every threshold the policy
    sets, each multiplied by `scale` (with none set, any change in that direction does)."""
    if policy.threshold_rel is None and policy.threshold_abs is None:
        return worse_abs > 0
    rel_ok = policy.threshold_rel is None or worse_rel > policy.threshold_rel * scale
    abs_ok = policy.threshold_abs is None or worse_abs > policy.threshold_abs * scale
    return rel_ok and abs_ok


def mann_whitney_p(x, y, alternative: str, seed: int = 0) -> float:
    """One-sided Mann-Whitney p that x is stochastically `alternative` ('less'|'greater') than y.

    Exact when there are no ties (the usual case for timings), a permutation test when there
    are (acceptance lengths from seeded draws tie a lot), the normal approximation for large
    samples. 1.0 when there is nothing to test.
    """
    from scipy.stats import PermutationMethod, mannwhitneyu

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) == 0 or len(y) == 0:
        return 1.0
    both = np.concatenate([x, y])
    if np.all(both == both[0]):
        return 1.0
    ties = len(np.unique(both)) < len(both)
    if len(x) * len(y) <= EXACT_MAX_PAIRS:
        method = (PermutationMethod(n_resamples=PERMUTATIONS, rng=np.random.default_rng(seed))
                  if ties else "exact")
    else:
        method = "asymptotic"
    p = float(mannwhitneyu(x, y, alternative=alternative, method=method).pvalue)
    return 1.0 if math.isnan(p) else min(1.0, p)


def bootstrap_ci(base, head, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0):
    """Percentile-bootstrap CIs of the Hodges-Lehmann ratio and difference, resampling each
    side independently: (ci_ratio or None, ci_diff)."""
    base = np.asarray(base, dtype=float)
    head = np.asarray(head, dtype=float)
    rng = np.random.default_rng(seed)
    positive = bool(np.all(base > 0) and np.all(head > 0))
    diffs, log_ratios = [], []
    chunk = max(1, 2_000_000 // (len(base) * len(head)))  # keep each chunk's pair matrix small
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        b = base[rng.integers(0, len(base), (k, len(base)))]
        h = head[rng.integers(0, len(head), (k, len(head)))]
        diffs.append(np.median(h[:, :, None] - b[:, None, :], axis=(1, 2)))
        if positive:
            log_ratios.append(np.median(np.log(h)[:, :, None] - np.log(b)[:, None, :], axis=(1, 2)))
    tail = (1.0 - confidence) / 2
    q = [tail, 1.0 - tail]
    lo, hi = np.quantile(np.concatenate(diffs), q)
    ci_diff = (float(lo), float(hi))
    if not positive:
        return None, ci_diff
    lo, hi = np.exp(np.quantile(np.concatenate(log_ratios), q))
    return (float(lo), float(hi)), ci_diff


def compare(base, head, policy: Policy, *, confidence: float = 0.95, n_boot: int = 2000,
            seed: int = 0, with_ci: bool = True) -> Comparison:
    """Compare the baseline samples with the head samples of one metric under `policy`.

    Both sample lists must be non-empty (the caller reports a missing side itself).
    """
    base = [float(v) for v in base]
    head = [float(v) for v in head]
    if not base or not head:
        raise ValueError("compare needs at least one sample on each side")
    mb, mh = float(np.median(base)), float(np.median(head))
    ratio, diff = hodges_lehmann(base, head)
    worse_first = "less" if policy.direction == HIGHER else "greater"
    better_first = "greater" if policy.direction == HIGHER else "less"
    p_worse = mann_whitney_p(head, base, worse_first, seed)
    p_better = mann_whitney_p(head, base, better_first, seed)

    worse_rel, worse_abs = worse_change(mb, ratio, diff, policy)
    if matters(worse_rel, worse_abs, policy):
        verdict = REGRESSED if p_worse < policy.alpha else INCONCLUSIVE
    elif matters(-worse_rel, -worse_abs, policy):
        verdict = IMPROVED if p_better < policy.alpha else INCONCLUSIVE
    else:
        verdict = UNCHANGED

    ci_ratio = ci_diff = None
    if with_ci:
        ci_ratio, ci_diff = bootstrap_ci(base, head, confidence, n_boot, seed)
    return Comparison(metric=policy.metric, policy=policy, n_base=len(base), n_head=len(head),
                      base=mb, head=mh, ratio=ratio, diff=diff, p_worse=p_worse,
                      p_better=p_better, verdict=verdict, ci_ratio=ci_ratio, ci_diff=ci_diff,
                      confidence=confidence)


def looks_regressed(c: Comparison, screen: float = DEFAULT_SCREEN) -> bool:
    """The cheap screen that sends a cell back for more samples: it is judged regressed, or
    its estimated change is worse by more than `screen` x the policy threshold (significant
    or not).

    Re-measuring only these never raises the false-alarm rate above the final test's alpha:
    the final verdict is the test on the pooled samples, whose size is fixed in advance, and
    the screen only adds a condition. Screening 'probably worse' cells rather than only
    'judged worse' ones is what lets the re-measure step add detection power
    (results/gate-evaluation.md).
    """
    return c.verdict == REGRESSED or matters(c.worse_rel, c.worse_abs, c.policy, screen)
