"""One metric of one cell, baseline samples vs head samples: how big is the change, is it real,
and is it small enough to call "unchanged"?

The samples are the repeats of a cell (pooled over the rounds measured so far). Three
questions:

1. Is it worse? A one-sided Mann-Whitney U test (scipy) says head is worse than baseline at
   the level `alpha`, AND the estimated change is beyond the policy's threshold (relative,
   absolute, or both; harness.gate.policy). Rank-based, so one slow outlier repeat cannot fake
   a regression.
2. Is it better? The same, the other way.
3. Is it unchanged? The change's confidence interval lies inside the threshold band. This is
   an equivalence test (two one-sided tests at `alpha_eq` each, hence a 1 - 2 alpha_eq
   interval): a point estimate inside the threshold is not enough, because with a wide
   interval a real regression would pass as "unchanged".

Anything else is inconclusive: measure more (harness.gate.sequential decides how often one may
look and at which levels).

The change is the Hodges-Lehmann estimator that belongs to the Mann-Whitney test: the median
over all (baseline, head) pairs of head/base (taken in log space) and of head - base. Its
interval is the distribution-free one of the same test (Moses): the k-th smallest and k-th
largest of those pairwise differences, with k from the exact null distribution of U
(`u_cdf`). It is exact for any continuous noise under a shift, needs no resampling, and cannot
disagree with the test: the interval excludes 0 exactly when the two-sided test rejects.

Small samples cannot be significant at all: with n_base and n_head samples and no ties the
exact one-sided p is at least 1 / C(n_base + n_head, n_base) (`min_p`): 1/252 with 5 vs 5,
1/20 with 3 vs 3. harness.gate.sequential plans the rounds so that the levels can be reached
before anything is measured.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from harness.gate.policy import HIGHER, Policy

REGRESSED = "regressed"
IMPROVED = "improved"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REGRESSED, IMPROVED, INCONCLUSIVE, UNCHANGED)

# Exact Mann-Whitney distributions are cheap up to this many (n_base x n_head) pairs; beyond,
# the normal approximation is within a hair of them.
EXACT_MAX_PAIRS = 2500
# With ties the exact null distribution needs a permutation test: exhaustive while the number
# of distinct splits stays below this, Monte Carlo (seeded) beyond.
PERMUTATIONS = 9999


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
    ci_ratio: tuple[float, float] | None = None   # interval of `ratio` (None: not attainable)
    ci_diff: tuple[float, float] | None = None    # interval of `diff`
    confidence: float = 0.90    # of the interval: 1 - 2 alpha_eq
    alpha: float = 0.01         # level the p-values were held against
    look: int | None = None     # the round at which the verdict was reached (sequential gate)

    @property
    def median_ratio(self) -> float | None:
        """head / base of the medians: the ratio the table's base and head columns show."""
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

    @property
    def decided(self) -> bool:
        return self.verdict != INCONCLUSIVE

    def to_dict(self) -> dict:
        return {"metric": self.metric, "verdict": self.verdict, "n_base": self.n_base,
                "n_head": self.n_head, "base_median": self.base, "head_median": self.head,
                "median_ratio": self.median_ratio, "hl_ratio": self.ratio, "hl_diff": self.diff,
                "ci_ratio": list(self.ci_ratio) if self.ci_ratio else None,
                "ci_diff": list(self.ci_diff) if self.ci_diff else None,
                "confidence": self.confidence, "alpha": self.alpha, "look": self.look,
                "p": self.p, "p_worse": self.p_worse, "p_better": self.p_better,
                "policy": self.policy.to_dict()}


# -- the statistics ----------------------------------------------------------------------------


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


def min_p(n_base: int, n_head: int) -> float:
    """The smallest one-sided Mann-Whitney p that n_base vs n_head samples can give (no ties:
    the two sides completely separated, one ordering out of C(n_base + n_head, n_base))."""
    if n_base < 1 or n_head < 1:
        return 1.0
    return 1.0 / math.comb(n_base + n_head, n_base)


@functools.lru_cache(maxsize=256)
def _u_pmf(m: int, n: int) -> np.ndarray:
    """P(U = u), u = 0..m*n, under the null (no ties), by the recurrence on which sample the
    largest observation belongs to: f(m, n) = m/(m+n) f(m-1, n) shifted by n + n/(m+n) f(m, n-1).
    Kept as probabilities so large m, n do not overflow."""
    rows = [np.ones(1) for _ in range(n + 1)]      # f(0, j): U = 0 surely
    for i in range(1, m + 1):
        prev = rows
        rows = [np.ones(1)] + [None] * n               # f(i, 0): U = 0 surely
        for j in range(1, n + 1):
            f = np.zeros(i * j + 1)
            f[j:j + len(prev[j])] += prev[j] * (i / (i + j))        # largest from the first sample
            f[:len(rows[j - 1])] += rows[j - 1] * (j / (i + j))     # largest from the second
            rows[j] = f
    return rows[n]


def u_cdf(m: int, n: int, u: int) -> float:
    """P(U <= u) under the null for samples of m and n: exact up to EXACT_MAX_PAIRS pairs, the
    normal approximation (with continuity correction) beyond."""
    if u < 0:
        return 0.0
    if u >= m * n:
        return 1.0
    if m * n <= EXACT_MAX_PAIRS:
        return float(min(1.0, _u_pmf(m, n)[: u + 1].sum()))
    from scipy.stats import norm
    mu, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
    return float(norm.cdf((u + 0.5 - mu) / sd))


def ci_rank(m: int, n: int, confidence: float) -> int:
    """k such that [D_(k), D_(mn+1-k)] (1-based order statistics of the m*n pairwise
    differences) covers the shift with probability >= `confidence`: the largest k with
    P(U <= k-1) <= (1 - confidence) / 2. 0 when no interval that narrow is attainable."""
    tail = (1.0 - confidence) / 2
    lo, hi = 0, m * n // 2                 # P(U <= k-1) grows with k: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if u_cdf(m, n, mid - 1) <= tail:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shift_ci(base, head, confidence: float, log: bool = False) -> tuple[float, float] | None:
    """The distribution-free interval of the Hodges-Lehmann shift head - base (of the logs
    when `log`, returned as a ratio), or None when the samples are too few for `confidence`."""
    b = np.log(np.asarray(base, float)) if log else np.asarray(base, float)
    h = np.log(np.asarray(head, float)) if log else np.asarray(head, float)
    k = ci_rank(len(b), len(h), confidence)
    if k < 1:
        return None
    d = np.sort((h[:, None] - b[None, :]).ravel())
    lo, hi = float(d[k - 1]), float(d[len(d) - k])
    return (math.exp(lo), math.exp(hi)) if log else (lo, hi)


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
        if not ties:   # the exact null distribution this module keeps anyway (u_cdf)
            u = int((x[:, None] > y[None, :]).sum())
            if alternative == "less":
                return u_cdf(len(x), len(y), u)
            return 1.0 - u_cdf(len(x), len(y), u - 1)
        method = PermutationMethod(n_resamples=PERMUTATIONS, rng=np.random.default_rng(seed))
    else:
        method = "asymptotic"
    p = float(mannwhitneyu(x, y, alternative=alternative, method=method).pvalue)
    return 1.0 if math.isnan(p) else min(1.0, p)


# -- thresholds --------------------------------------------------------------------------------


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


def matters(worse_rel: float, worse_abs: float, policy: Policy) -> bool:
    """Whether a change of this size in the bad direction crosses every threshold the policy
    sets (with none set, any change in that direction does)."""
    if policy.threshold_rel is None and policy.threshold_abs is None:
        return worse_abs > 0
    rel_ok = policy.threshold_rel is None or worse_rel > policy.threshold_rel
    abs_ok = policy.threshold_abs is None or worse_abs > policy.threshold_abs
    return rel_ok and abs_ok


def inside_band(ci_ratio, ci_diff, base_median: float, policy: Policy) -> bool:
    """Whether the whole interval lies within the threshold on either side. A change matters
    only when it crosses every threshold, so lying inside one of them is enough; with no
    threshold at all, only an interval of exactly zero is."""
    rel, abs_ = policy.threshold_rel, policy.threshold_abs
    if rel is None and abs_ is None:
        abs_ = 0.0
    if abs_ is not None and ci_diff is not None and -abs_ <= ci_diff[0] and ci_diff[1] <= abs_:
        return True
    if rel is not None:
        if ci_ratio is not None:
            return 1.0 - rel <= ci_ratio[0] and ci_ratio[1] <= 1.0 + rel
        if ci_diff is not None and base_median != 0:
            scale = abs(base_median)
            return -rel <= ci_diff[0] / scale and ci_diff[1] / scale <= rel
    return False


# -- one comparison ----------------------------------------------------------------------------


def compare(base, head, policy: Policy, *, alpha: float | None = None,
            alpha_eq: float | None = None, seed: int = 0, look: int | None = None) -> Comparison:
    """Compare the baseline samples with the head samples of one metric under `policy`, at the
    levels `alpha` (regressed / improved) and `alpha_eq` (unchanged); the policy's own levels
    by default. Both sample lists must be non-empty (the caller reports a missing side)."""
    base = [float(v) for v in base]
    head = [float(v) for v in head]
    if not base or not head:
        raise ValueError("compare needs at least one sample on each side")
    alpha = policy.alpha if alpha is None else alpha
    alpha_eq = policy.alpha_eq if alpha_eq is None else alpha_eq
    mb, mh = float(np.median(base)), float(np.median(head))
    ratio, diff = hodges_lehmann(base, head)
    worse_first = "less" if policy.direction == HIGHER else "greater"
    better_first = "greater" if policy.direction == HIGHER else "less"
    p_worse = mann_whitney_p(head, base, worse_first, seed)
    p_better = mann_whitney_p(head, base, better_first, seed)

    confidence = 1.0 - 2.0 * alpha_eq
    ci_diff = shift_ci(base, head, confidence)
    ci_ratio = shift_ci(base, head, confidence, log=True) if ratio is not None else None

    worse_rel, worse_abs = worse_change(mb, ratio, diff, policy)
    if matters(worse_rel, worse_abs, policy) and p_worse < alpha:
        verdict = REGRESSED
    elif matters(-worse_rel, -worse_abs, policy) and p_better < alpha:
        verdict = IMPROVED
    elif inside_band(ci_ratio, ci_diff, mb, policy):
        verdict = UNCHANGED
    else:
        verdict = INCONCLUSIVE
    return Comparison(metric=policy.metric, policy=policy, n_base=len(base), n_head=len(head),
                      base=mb, head=mh, ratio=ratio, diff=diff, p_worse=p_worse,
                      p_better=p_better, verdict=verdict, ci_ratio=ci_ratio, ci_diff=ci_diff,
                      confidence=confidence, alpha=alpha, look=look)
