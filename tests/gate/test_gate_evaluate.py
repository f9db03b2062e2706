"""The evaluation benchmark's building blocks: the sequential gate on simulated series, the
other tools' rules it runs beside, and the judge of real A/A measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.gate import evaluate
from harness.gate.sequential import Design

BASE = np.array([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8])


def test_sequential_trial_stops_at_the_first_decision():
    design = Design(first_look=2, max_rounds=6)
    calls = []

    def draw(r):
        calls.append(r)
        return BASE[:5], BASE[:5] * 0.8          # a 20 % slowdown, plainly separated
    verdict, rounds = evaluate.sequential_trial(draw, design)
    assert verdict == "regressed" and rounds == 2 and calls == [0, 1]


def test_sequential_trial_undecided_when_noise_swamps_the_threshold():
    rng = np.random.default_rng(0)
    verdict, rounds = evaluate.sequential_trial(
        lambda r: (rng.normal(100, 30, 5), rng.normal(100, 30, 5)), Design(2, 4))
    assert verdict == "inconclusive" and rounds == 4


def test_simulation_rates_go_the_right_way():
    slow = evaluate.simulate(0.01, 0.10, trials=40, seed=1)
    same = evaluate.simulate(0.01, 0.0, trials=40, seed=2)
    noisy = evaluate.simulate(0.20, 0.0, trials=20, seed=3, max_rounds=8)
    assert slow.rate("regressed") == 1.0
    assert same.rate("unchanged") == 1.0 and same.mean_rounds < 10
    assert noisy.rate("inconclusive") == 1.0 and noisy.mean_rounds == 8
    # Run-to-run noise the repeats cannot average away: rounds, not repeats, are the samples.
    between = evaluate.simulate(0.0, 0.0, trials=20, seed=4, between=0.10, max_rounds=8)
    assert between.outcomes["regressed"] + between.outcomes["improved"] <= 1
    assert between.rate("inconclusive") >= 0.9
    assert evaluate.wilson(0, 100)[0] == 0.0 and 0 < evaluate.wilson(5, 100)[0] < 0.05


def test_pytest_benchmark_rule_is_a_bare_threshold():
    pytest.importorskip("pytest_benchmark")
    assert evaluate.pytest_benchmark(BASE, BASE * 0.96, 3)        # 4 % slower per token
    assert not evaluate.pytest_benchmark(BASE, BASE * 0.98, 3)
    assert not evaluate.pytest_benchmark(BASE, BASE * 0.96, 5)


def test_asv_rule_needs_factor_and_significance():
    pytest.importorskip("asv", reason="the comparison with asv needs the [eval] extra")
    assert evaluate.asv(BASE, BASE * 0.8, 1.1)                     # 20 % slower, 7 vs 7
    assert not evaluate.asv(BASE, BASE * 0.95, 1.1)                # under the factor
    assert evaluate.asv(BASE, BASE * 0.95, 1.03)
    noisy = np.array([100.0, 80.0, 120.0, 90.0, 110.0, 85.0, 115.0])
    assert not evaluate.asv(noisy, noisy * 0.85, 1.1)              # not different enough


def test_judge_aa_counts_false_alarms(tmp_path):
    def run(tps):
        return {"status": "ok", "metrics": {"tokens_per_s": float(np.median(tps))},
                "samples": {"tokens_per_s": list(tps)}}
    rng = np.random.default_rng(0)
    cells = {"c1": {"label": "cell one",
                    "A": [run(rng.normal(100, 1, 5)) for _ in range(8)],
                    "B": [run(rng.normal(100, 1, 5)) for _ in range(8)]},
             "c2": {"label": "cell two",
                    "A": [run(rng.normal(100, 1, 5)) for _ in range(8)],
                    "B": [run(rng.normal(80, 1, 5)) for _ in range(8)]},
             "c3": {"label": "cell three",                  # 4 rounds: no design can decide
                    "A": [run(rng.normal(100, 1, 5)) for _ in range(4)],
                    "B": [run(rng.normal(80, 1, 5)) for _ in range(4)]}}
    path = tmp_path / "aa.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "rounds": 8, "cells": cells}))
    text = evaluate.judge_aa(path)
    assert "Real A/A on NVIDIA H200" in text and "False alarms: 1 of 2" in text
    assert "| cell three | – | 4/4 | | | | not judged:" in text
