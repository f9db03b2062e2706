"""Change points in a metric's history: binary segmentation with a rank statistic and a
permutation test.

For a series x[0..n) and each split k (both parts at least `min_size` long), the two parts are
compared with the standardised Mann-Whitney statistic

    Z_k = (U_k - k(n-k)/2) / sqrt(k(n-k)(n+1)/12),   U_k = (sum of the ranks of x[:k]) - k(k+1)/2

(the rank-based CUSUM behind Pettitt's test). The best split maximises |Z_k|; it is a change
point if a permutation test says a maximum that large is unlikely without one (p < alpha; the
permutations shuffle the ranks, so the test is exact in distribution-free terms and a single
outlier night carries the weight of one rank, not of its value). Each side is then searched
again (binary segmentation) until no significant split is left. Finally, steps smaller than the
smallest change that matters (the metric's policy, harness.gate.policy) are dropped one at a
time, smallest first, merging their segments: a 0.5 % step found in 200 quiet nights is real
but nobody should be paged for it.

Deterministic: the permutations come from a seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.gate.policy import Policy
from harness.gate.stats import matters, worse_change

DEFAULT_MIN_SIZE = 3
DEFAULT_ALPHA = 0.01
DEFAULT_PERMUTATIONS = 999


@dataclass(frozen=True)
class Step:
    index: int           # the first point of the new level: between points index-1 and index
    before: float        # median of the segment before
    after: float         # median of the segment after
    p_value: float       # permutation p of the split when it was found

    @property
    def ratio(self) -> float | None:
        return self.after / self.before if self.before else None


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x)  # average ranks for ties


def _max_z(ranks: np.ndarray, min_size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row of `ranks` (shape [m, n]): (best split k, max |Z_k|)."""
    n = ranks.shape[-1]
    k = np.arange(1, n)                                   # split after k points
    s = np.cumsum(ranks, axis=-1)[..., :-1]               # rank sums of x[:k]
    u = s - k * (k + 1) / 2
    z = np.abs(u - k * (n - k) / 2) / np.sqrt(k * (n - k) * (n + 1) / 12)
    z[..., : min_size - 1] = -1                           # parts shorter than min_size
    z[..., n - min_size:] = -1
    best = np.argmax(z, axis=-1)
    return best + 1, np.take_along_axis(z, best[..., None], axis=-1)[..., 0]


def best_split(values, min_size: int = DEFAULT_MIN_SIZE, n_perm: int = DEFAULT_PERMUTATIONS,
               rng: np.random.Generator | None = None) -> tuple[int, float] | None:
    """(k, permutation p) of the strongest split of `values`, or None if it is too short."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2 * min_size:
        return None
    ranks = _ranks(x)
    k, stat = _max_z(ranks[None, :], min_size)
    rng = rng if rng is not None else np.random.default_rng(0)
    shuffled = rng.permuted(np.tile(ranks, (n_perm, 1)), axis=1)
    _, null = _max_z(shuffled, min_size)
    p = (1 + np.count_nonzero(null >= stat[0] - 1e-9)) / (n_perm + 1)
    return int(k[0]), float(p)


def change_points(values, *, min_size: int = DEFAULT_MIN_SIZE, alpha: float = DEFAULT_ALPHA,
                  n_perm: int = DEFAULT_PERMUTATIONS, seed: int = 0) -> list[tuple[int, float]]:
    """Binary segmentation: every significant split as (index, p), sorted by index."""
    rng = np.random.default_rng(seed)
    x = np.asarray(values, dtype=float)
    found: list[tuple[int, float]] = []
    todo = [(0, len(x))]
    while todo:
        lo, hi = todo.pop(0)
        split = best_split(x[lo:hi], min_size, n_perm, rng)
        if split is None or split[1] >= alpha:
            continue
        k = lo + split[0]
        found.append((k, split[1]))
        todo += [(lo, k), (k, hi)]
    return sorted(found)


def find_steps(values, policy: Policy | None = None, *, min_size: int = DEFAULT_MIN_SIZE,
               alpha: float = DEFAULT_ALPHA, n_perm: int = DEFAULT_PERMUTATIONS,
               seed: int = 0) -> list[Step]:
    """The level shifts of `values` (oldest first) that are significant and, given a policy,
    at least as large as its threshold (in either direction)."""
    x = np.asarray(values, dtype=float)
    points = change_points(x, min_size=min_size, alpha=alpha, n_perm=n_perm, seed=seed)
    return steps_that_matter(x, points, policy)


def steps_that_matter(values, points: list[tuple[int, float]],
                      policy: Policy | None) -> list[Step]:
    """The steps at `points` ((index, p) pairs sorted by index), each measured between its
    neighbours; given a policy, those smaller than its threshold are merged away one at a time,
    smallest first, re-measuring the rest."""
    x = np.asarray(values, dtype=float)
    points = list(points)
    while True:
        steps = _steps(x, points)
        if policy is None or not steps:
            return steps
        small = [(abs(_relative(s)), i) for i, s in enumerate(steps) if not _matters(s, policy)]
        if not small:
            return steps
        del points[min(small)[1]]      # merge the smallest step's two segments, then re-measure


def _steps(x: np.ndarray, points: list[tuple[int, float]]) -> list[Step]:
    bounds = [0] + [k for k, _ in points] + [len(x)]
    out = []
    for j, (k, p) in enumerate(points):
        before = float(np.median(x[bounds[j]:k]))
        after = float(np.median(x[k:bounds[j + 2]]))
        out.append(Step(k, before, after, p))
    return out


def _relative(step: Step) -> float:
    return (step.after - step.before) / abs(step.before) if step.before else float("inf")


def _matters(step: Step, policy: Policy) -> bool:
    ratio = step.after / step.before if step.before > 0 and step.after > 0 else None
    worse = worse_change(step.before, ratio, step.after - step.before, policy)
    return matters(*worse, policy) or matters(-worse[0], -worse[1], policy)


def is_regression(step: Step, policy: Policy) -> bool:
    ratio = step.after / step.before if step.before > 0 and step.after > 0 else None
    return matters(*worse_change(step.before, ratio, step.after - step.before, policy), policy)
