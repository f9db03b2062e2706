"""What refusing a hostile input costs (pytest-benchmark; run explicitly, not in `make test`):

    .venv/bin/python -m pytest tests/bench_input_budgets.py --benchmark-only \
        --benchmark-columns=min,median,max,rounds

Each case is parsed in-process, from the text to the InputError, so the numbers are the
validator's own cost (the CLI adds its interpreter start). An ordinary nightly sweep is timed
beside them for scale.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.protocol.errors import InputError
from harness.sweep.scenario import parse_scenario
from test_input_budgets import alias_bomb, merge_bomb

REPO = Path(__file__).resolve().parents[1]
MILLION = ", ".join(str(v) for v in range(1, 101))

CASES = {
    "alias_bomb_9x9": alias_bomb(),
    "merge_bomb_12": merge_bomb(),
    "nesting_5000_flow": "name: s\nmatrix: {workload: [noop]}\nx: " + "[" * 5000 + "]" * 5000,
    "nesting_5000_block": "name: s\nmatrix: {workload: [noop]}\nx:\n  " + "- " * 5000 + "deep",
    "million_cells": f"name: s\nmatrix:\n  workload: [noop]\n  context_length: [{MILLION}]\n"
                     f"  batch_size: [{MILLION}]\n  seed: [{MILLION}]\n",
    "name_100kB": f"name: {'n' * 100_000}\nmatrix: {{workload: [noop]}}\n",
    "seed_1e29": f"name: s\nmatrix:\n  workload: [noop]\n  seed: [{10**29}]\n",
}


@pytest.mark.parametrize("case", list(CASES))
def test_refuse(benchmark, case):
    text = CASES[case]

    def refuse():
        try:
            parse_scenario(text, "s.yaml")
        except InputError as err:
            return str(err)
        raise AssertionError(f"{case} was accepted")

    assert benchmark(refuse).startswith("s.yaml")


def test_nightly_for_scale(benchmark):
    text = (REPO / "scenarios" / "nightly.yaml").read_text()
    scenario = benchmark(parse_scenario, text, str(REPO / "scenarios" / "nightly.yaml"))
    assert len(scenario.cells()) == 145
