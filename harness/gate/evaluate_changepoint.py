"""How good is `harness history`'s change-point detection? A simulation benchmark of
harness.gate.changepoint next to established implementations of the same job, each run with its
own code:

- ruptures 1.1.10 (in the `eval` extra): PELT with the l2 cost and the BIC penalty 2 σ² ln n
  (σ from the first differences, robustly: MAD / 0.6745 / √2), and binary segmentation with the
  rank cost (the rank statistic changepoint.py tests, there with a permutation test) and the
  penalty 2 ln n (ranks are standardised: no σ), and again with 3 ln n: the penalty at which
  its false alarms on these series match changepoint.py's (2, 3, 4 and 5 tried);
- Apache Otava 0.8.0 (Hunter's successor): `compute_change_points`, its default (e-divisive on
  sliding windows of 50, a t-test merge, max_pvalue 0.001), and `compute_change_points_orig`
  (Matteson & James' e-divisive with a permutation test) at p 0.01, this module's level.
  Otava's package pins other numpy and scipy versions than this project's and pulls in BigQuery,
  Postgres and Slack clients; its analysis module needs only numpy and scipy, so
  `pip install --no-deps apache-otava==0.8.0` is what this needs.

    python -m harness.gate.evaluate_changepoint [--trials 100] [--seed 7] [--out FILE]

Series: a nightly higher-is-better metric at level 100 with normal noise of a given CV; some
with outlier nights (5 % of the nights 10-40 % low: a busy host), some on a coarse grid (values
rounded to 5: ties, as acceptance lengths have), some with steps at known points. Every
detector's change points go through the same last step (changepoint.steps_that_matter: steps
under the 3 % threshold merged away), so the tables compare the detection alone.

Outcomes per series: a false alarm (no step in it, a step reported), found (every true step
reported within 2 points of where it is), extra (a step reported further than 2 points from
every true one); and the time per series. A detector whose package is not installed is left
out, and the output says so.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from harness.gate.changepoint import find_steps, steps_that_matter
from harness.gate.policy import DEFAULT_POLICIES

POLICY = DEFAULT_POLICIES["tokens_per_s"]
NEAR = 2                    # a step reported this close to a true one found it
OUTLIER_RATE = 0.05
OUTLIER_DROP = (0.10, 0.40)
GRID = 5.0                  # the coarse series' resolution, at level 100


@dataclass(frozen=True)
class Case:
    name: str
    n: int
    cv: float
    steps: tuple[tuple[int, float], ...] = ()    # (index, level ratio from there on)
    outliers: bool = False
    coarse: bool = False
    share: float = 1.0                           # of --trials (the long series are slow)


CASES = (
    Case("no step, n 30, CV 3 %", 30, 0.03),
    Case("no step, n 60, CV 3 %", 60, 0.03),
    Case("no step, n 60, CV 3 %, outlier nights", 60, 0.03, outliers=True),
    Case("no step, n 120, CV 3 %, outlier nights", 120, 0.03, outliers=True),
    Case("no step, n 60, coarse values (ties)", 60, 0.03, coarse=True),
    Case("-5 % at 30, n 60, CV 1.5 %", 60, 0.015, ((30, 0.95),)),
    Case("-5 % at 30, n 60, CV 3 %", 60, 0.03, ((30, 0.95),)),
    Case("-5 % at 30, n 60, CV 3 %, outlier nights", 60, 0.03, ((30, 0.95),), outliers=True),
    Case("-10 % at 30, n 60, CV 3 %, outlier nights", 60, 0.03, ((30, 0.90),), outliers=True),
    Case("-10 % at 30, n 60, coarse values (ties)", 60, 0.03, ((30, 0.90),), coarse=True),
    Case("-10 %, 3 points after it, n 30, CV 1.5 %", 30, 0.015, ((27, 0.90),)),
    Case("-10 %, 5 points after it, n 30, CV 1.5 %", 30, 0.015, ((25, 0.90),)),
    Case("-8 % at 30, +6 % at 60, n 90, CV 2 %", 90, 0.02, ((30, 0.92), (60, 1.06))),
    Case("-8 % at 30, +6 % at 60, n 90, CV 2 %, outlier nights", 90, 0.02,
         ((30, 0.92), (60, 1.06)), outliers=True),
    Case("-8 %, +6 %, -5 % at 150, 300, 400, n 500, CV 2 %", 500, 0.02,
         ((150, 0.92), (300, 1.06), (400, 0.95)), share=0.1),
)


def series(case: Case, rng: np.random.Generator) -> np.ndarray:
    level = np.full(case.n, 100.0)
    for k, ratio in case.steps:
        level[k:] *= ratio
    x = level * (1 + rng.normal(0.0, case.cv, case.n))
    if case.outliers:
        hit = rng.random(case.n) < OUTLIER_RATE
        x[hit] *= 1 - rng.uniform(*OUTLIER_DROP, hit.sum())
    return np.round(x / GRID) * GRID if case.coarse else x


# -- the detectors: values -> change indices (the first point of each new level) ---------------


def _ours(x: np.ndarray) -> list[int]:
    return [s.index for s in find_steps(x, POLICY)]


def _sigma(x: np.ndarray) -> float:
    d = np.diff(x)
    return float(np.median(np.abs(d - np.median(d))) / 0.6745 / math.sqrt(2)) or 1e-9


def _filtered(x: np.ndarray, found) -> list[int]:
    points = [(int(k), math.nan) for k in sorted(set(found)) if 0 < k < len(x)]
    return [s.index for s in steps_that_matter(x, points, POLICY)]


def detectors() -> tuple[dict[str, Callable[[np.ndarray], list[int]]], list[str]]:
    """(name -> detector, lines saying which packages are missing)."""
    found: dict[str, Callable] = {"this module (rank CUSUM, permutation test, p < 0.01)": _ours}
    missing = []
    try:
        import ruptures as rpt

        def pelt_l2(x):
            pen = 2 * _sigma(x) ** 2 * math.log(len(x))
            return _filtered(x, rpt.Pelt(model="l2", min_size=3, jump=1).fit(x).predict(pen)[:-1])

        def binseg_rank(factor: float):
            def detect(x):
                algo = rpt.Binseg(model="rank", min_size=3, jump=1).fit(x.reshape(-1, 1))
                return _filtered(x, algo.predict(pen=factor * math.log(len(x)))[:-1])
            return detect

        version = rpt.__version__.lstrip("v")
        found[f"ruptures {version} PELT, l2, BIC penalty"] = pelt_l2
        found[f"ruptures {version} binary segmentation, rank, penalty 2 ln n"] = binseg_rank(2)
        found[f"ruptures {version} binary segmentation, rank, penalty 3 ln n (the false alarms "
              f"of (a) at n 30-120, found by trying 2, 3, 4, 5)"] = binseg_rank(3)
    except ImportError:
        missing.append("ruptures (pip install ruptures==1.1.10)")
    try:
        from otava.analysis import compute_change_points, compute_change_points_orig

        def otava_default(x):
            cps, _ = compute_change_points(list(map(float, x)), window_len=50, max_pvalue=0.001)
            return _filtered(x, [c.index for c in cps])

        def otava_orig(x):
            cps, _ = compute_change_points_orig(x, max_pvalue=0.01, seed=0)
            return _filtered(x, [c.index for c in cps])

        found["Otava 0.8.0 default (windowed e-divisive, t-test, p < 0.001)"] = otava_default
        found["Otava 0.8.0 e-divisive, permutation test, p < 0.01"] = otava_orig
    except ImportError:
        missing.append("apache-otava (pip install --no-deps apache-otava==0.8.0)")
    return found, missing


# -- running -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    trials: int = 0
    alarms: int = 0      # series without a step with a step reported
    found: int = 0       # series with steps whose every step was found
    extra: int = 0       # series with a step reported far from every true one
    seconds: float = 0.0

    def pct(self, count: int) -> str:
        return f"{100 * count / self.trials:.0f} %" if self.trials else "–"


def evaluate(trials: int, seed: int, log=lambda _m: None) -> tuple[dict, list[str]]:
    """{case name: {detector name: Outcome}}, the missing packages."""
    methods, missing = detectors()
    warnings.filterwarnings("ignore", category=RuntimeWarning)   # Otava's t-test on equal values
    table: dict[str, dict[str, Outcome]] = {}
    for i, case in enumerate(CASES):
        rng = np.random.default_rng(seed * 1000 + i)
        data = [series(case, rng) for _ in range(max(5, round(trials * case.share)))]
        truth = [k for k, _ in case.steps]
        row = table.setdefault(case.name, {})
        for name, detect in methods.items():
            out = row.setdefault(name, Outcome())
            for x in data:
                t0 = time.perf_counter()
                got = detect(x)
                out.seconds += time.perf_counter() - t0
                out.trials += 1
                if not truth:
                    out.alarms += bool(got)
                    continue
                out.found += all(any(abs(g - k) <= NEAR for g in got) for k in truth)
                out.extra += any(all(abs(g - k) > NEAR for k in truth) for g in got)
        log(f"{case.name}: done")
    return table, missing


def markdown(table: dict, missing: list[str], trials: int, seed: int, seconds: float) -> str:
    names = list(next(iter(table.values())))
    short = {n: f"({chr(ord('a') + i)})" for i, n in enumerate(names)}
    lines = ["# Change-point detection next to ruptures and Otava", "",
             f"Generated by `python -m harness.gate.evaluate_changepoint --trials {trials} "
             f"--seed {seed}` (harness/gate/evaluate_changepoint.py; method in its docstring). "
             f"Every detector's steps then pass the same policy step (`tokens_per_s`: steps under "
             f"3 % merged away), so the tables compare detection alone.", ""]
    lines += [f"- {short[n]} {n}" for n in names]
    if missing:
        lines += ["", "Not installed, so not measured: " + "; ".join(missing) + "."]
    head = "| series | " + " | ".join(short[n] for n in names) + " |"
    rule = "|---|" + "---:|" * len(names)
    lines += ["", "## No step: false alarms (a step reported)", "", head, rule]
    for case in CASES:
        if not case.steps:
            row = table[case.name]
            lines.append(f"| {case.name} ({row[names[0]].trials}) | "
                         + " | ".join(row[n].pct(row[n].alarms) for n in names) + " |")
    lines += ["", f"## Steps: found within {NEAR} points / a step reported elsewhere", "",
              head, rule]
    for case in CASES:
        if case.steps:
            row = table[case.name]
            lines.append(f"| {case.name} ({row[names[0]].trials}) | "
                         + " | ".join(f"{row[n].pct(row[n].found)} / {row[n].pct(row[n].extra)}"
                                      for n in names) + " |")
    lines += ["", "## Time per series (ms, mean)", "", head, rule]
    for case in (CASES[1], CASES[12], CASES[-1]):
        row = table[case.name]
        lines.append(f"| {case.name} | " + " | ".join(
            f"{1e3 * row[n].seconds / max(row[n].trials, 1):.1f}" for n in names) + " |")
    lines += ["", f"_Run time: {seconds:.0f} s._", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gate.evaluate_changepoint")
    ap.add_argument("--trials", type=int, default=100,
                    help="series per case (the n 500 case: a tenth)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    args = ap.parse_args(argv)
    t0 = time.time()
    table, missing = evaluate(args.trials, args.seed,
                              log=lambda m: print(m, file=sys.stderr, flush=True))
    text = markdown(table, missing, args.trials, args.seed, time.time() - t0)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
