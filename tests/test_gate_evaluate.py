"""The evaluation benchmark's building blocks: the rules it runs side by side, and the judge of
real A/A measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.gate import evaluate

pytest.importorskip("asv", reason="the comparison with asv needs the [eval] extra")

BASE = np.array([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8])


def test_pytest_benchmark_rule_is_a_bare_threshold():
    assert evaluate.pytest_benchmark(BASE, BASE * 0.96, 3)        # 4 % slower per token
    assert not evaluate.pytest_benchmark(BASE, BASE * 0.98, 3)
    assert not evaluate.pytest_benchmark(BASE, BASE * 0.96, 5)


def test_asv_rule_needs_factor_and_significance():
    assert evaluate.asv(BASE, BASE * 0.8, 1.1)                     # 20 % slower, 7 vs 7
    assert not evaluate.asv(BASE, BASE * 0.95, 1.1)                # under the factor
    assert evaluate.asv(BASE, BASE * 0.95, 1.03)
    noisy = np.array([100.0, 80.0, 120.0, 90.0, 110.0, 85.0, 115.0])
    assert not evaluate.asv(noisy, noisy * 0.85, 1.1)              # not different enough


def test_gate_variants_and_a_small_simulation():
    out = evaluate.gate_all(BASE[:5], BASE[:5] * 0.95, BASE, BASE * 0.95)
    assert out["gate"] and out["gate_ab"] and out["extra"] == 7
    rates = evaluate.simulate(0.03, 0.10, 5, trials=30, seed=1)
    assert rates.rate("gate_ab") == 1.0 and rates.rate("asv110") < 1.0
    assert evaluate.wilson(0, 100)[0] == 0.0 and 0 < evaluate.wilson(5, 100)[0] < 0.05


def test_judge_aa_counts_false_alarms(tmp_path):
    def run(tps):
        return {"status": "ok", "metrics": {"tokens_per_s": float(np.median(tps))},
                "samples": {"tokens_per_s": list(tps)}}
    rng = np.random.default_rng(0)
    cells = {"c1": {"label": "cell one",
                    "A": [run(rng.normal(100, 1, 5)) for _ in range(4)],
                    "B": [run(rng.normal(100, 1, 5)) for _ in range(4)]}}
    path = tmp_path / "aa.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "rounds": 4, "cells": cells}))
    text = evaluate.judge_aa(path)
    assert "Real A/A on NVIDIA H200" in text and "False alarms: 0 of 1" in text
