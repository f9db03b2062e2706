"""A scenario's `targets`: checked when the scenario is read (one line at the node at fault) and
judged on a run's results as met, not met or absent, never met on a number that was not measured."""

from __future__ import annotations

import pytest

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep import targets
from harness.sweep.scenario import parse_scenario, parse_targets

HEAD = """\
name: t
defaults: {model: tiny, device: cpu}
matrix:
  context_length: [256, 1024]
  verify_mode: [sdpa, triton]
"""


def scenario(body: str):
    return parse_scenario(HEAD + "targets:\n" + body, "t.yaml")


def test_targets_are_read_with_their_defaults():
    sc = scenario("  - {cells: verify_mode=sdpa, metric: tokens_per_s, min: 10}\n"
                  "  - {name: ratio, cells: context_length=1024 and sdpa, metric: tokens_per_s, max: 1,\n"
                  "     per: context_length=256 and verify=sdpa}\n")
    assert sc.targets == [
        {"name": None, "cells": "verify_mode=sdpa", "metric": "tokens_per_s", "min": 10.0, "max": None,
         "of": "each", "per": None},
        {"name": "ratio", "cells": "context_length=1024 and sdpa", "metric": "tokens_per_s", "min": None,
         "max": 1.0, "of": "each", "per": "context_length=256 and verify=sdpa"}]
    assert parse_scenario(HEAD, "t.yaml").targets == []


@pytest.mark.parametrize("body, where, message", [
    ("  - {cells: sdpa, metric: tokens_per_s}\n", "7:5", "targets[0] needs a bound: min, max or both"),
    ("  - {cells: sdpa, metric: tokens_per_s, min: 2, max: 1}\n", "7:46",
     "targets[0].min 2 is above its max 1"),
    ("  - {cells: sdpa, metric: tokens_per_s, mn: 1}\n", "7:41", "unknown key 'mn' (did you mean 'min'?)"),
    ("  - {cells: sdpa, metric: 3, min: 1}\n", "7:27", "targets[0].metric must be a metric name"),
    ("  - {cells: sdpa, metric: tokens_per_s, min: 1, of: mean}\n", "7:53", "unknown targets[0].of 'mean' "
     "(allowed: each, sum"),
    ("  - {cells: sdpa, metric: kernel_us, max: 1, of: sum, per: context_length=256 and sdpa}\n", "7:60",
     "per (each value over one cell's) and of: sum do not go together"),
    ("  - {cells: '(sdpa', metric: tokens_per_s, min: 1}\n", "7:13",
     "targets[0].cells '(sdpa': the '(' at column 1 is never closed"),
    ("  - {cells: ctx=999, metric: tokens_per_s, min: 1}\n", "7:13",
     "targets[0].cells 'ctx=999' selects 0 of the scenario's 4 cells, not at least one"),
    ("  - {cells: sdpa, metric: tokens_per_s, min: 1, per: triton}\n", "7:54",
     "targets[0].per 'triton' selects 2 of the scenario's 4 cells, not one"),
])
def test_a_bad_target_is_one_line_at_its_node(body, where, message):
    with pytest.raises(InputError) as err:
        scenario(body)
    text = str(err.value)
    assert text.startswith(f"t.yaml:{where}: ") and message in text and "\n" not in text


def test_a_stored_scenario_that_no_longer_expands_still_gives_its_targets():
    """A run's stored scenario may name what this code has since removed; its targets read."""
    text = (HEAD.replace("verify_mode: [sdpa, triton]", "custom_impl: [wgmma_merge]")
            + "targets:\n  - {cells: sdpa, metric: tokens_per_s, min: 1}\n")
    with pytest.raises(InputError):
        parse_scenario(text, "t.yaml")
    assert parse_targets(text, "t.yaml")[0]["cells"] == "sdpa"
    assert parse_targets("name: t\n") == [] and parse_targets("") == []
    with pytest.raises(InputError, match=r"^run/scenario.yaml:2:\d+: unknown key 'bogus'"):
        parse_targets("name: t\ntargets: [{cells: a, metric: m, min: 1, bogus: 1}]\n", "run/scenario.yaml")
    with pytest.raises(InputError, match=r"^run/scenario.yaml:2:\d+: targets\[0\] needs a bound"):
        parse_targets("name: t\ntargets: [{cells: a, metric: m}]\n", "run/scenario.yaml")


# -- judging -----------------------------------------------------------------------------------

def result(ctx: int, mode: str, status: str = "ok", **metrics) -> dict:
    cell = params.canonical({"model": "tiny", "device": "cpu", "context_length": ctx, "verify_mode": mode})
    return {"cell": cell, "cell_id": params.cell_id(cell), "status": status, "metrics": metrics}


def target(cells: str, metric: str = "tokens_per_s", **bound) -> dict:
    return {"name": None, "cells": cells, "metric": metric, "min": None, "max": None, "of": "each",
            "per": None, **bound}


RUN = [result(256, "sdpa", tokens_per_s=100.0, idle_fraction=None), result(1024, "sdpa", tokens_per_s=80.0),
       result(256, "triton", tokens_per_s=50.0), result(1024, "triton", status="failed")]


@pytest.mark.parametrize("t, verdict, value, why", [
    (target("verify_mode=sdpa", min=80), "met", None, ""),
    (target("verify_mode=sdpa", min=90), "not met", None, "1 of 2 outside"),
    (target("verify_mode=sdpa", min=80, max=90), "not met", None, "1 of 2 outside"),
    # a failed cell leaves the verdict open ... unless a measured number already misses
    (target("verify_mode=triton", min=10), "absent", None, "failed: 1 of 2"),
    (target("verify_mode=triton", min=60), "not met", None, "1 of 2 outside; failed: 1 of 2"),
    # a metric the host could not measure (idle on a CPU) is absent, never a pass
    (target("context_length=256 and sdpa", "idle_fraction", max=0.01), "absent", None, "not measured: 1 of 1"),
    (target("context_length=999", max=1), "absent", None, "no result of this run matches cells: context_length=999"),
    (target("verify_mode=sdpa", of="sum", max=180), "met", 180.0, ""),
    (target("verify_mode=sdpa", of="sum", max=179.9), "not met", 180.0, ""),
    (target("verify_mode=triton", of="sum", max=1e9), "absent", None, "failed: 1 of 2"),
    (target("verify_mode=sdpa", per="context_length=256 and verify_mode=triton", min=2), "not met", None,
     "1 of 2 outside"),
    (target("context_length=256 and verify_mode=sdpa", per="context_length=256 and verify_mode=triton", min=2),
     "met", None, ""),
    (target("verify_mode=sdpa", per="context_length=1024 and verify_mode=triton", min=0), "absent", None,
     "the per cell's tokens_per_s: failed"),
    (target("verify_mode=sdpa", per="verify_mode=triton", min=0), "absent", None,
     "per selects 2 results of this run, not one"),
])
def test_judged_met_not_met_or_absent(t, verdict, value, why):
    o = targets.judge(t, RUN)
    assert (o.verdict, o.value) == (verdict, value)
    assert why in o.why and (why == "") == (o.why == "")


def test_ratios_and_order_follow_the_run():
    t = target("verify_mode=sdpa", per="context_length=256 and verify_mode=triton", min=1)
    order = [RUN[1]["cell_id"], RUN[0]["cell_id"]]
    [o] = targets.judge_all([t], RUN, order)
    assert [v for _, v in o.measured] == [1.6, 2.0]
    assert o.bound == "tokens_per_s / per >= 1" and o.name == "tokens_per_s / per >= 1 (verify_mode=sdpa)"
    assert targets.bound_text(target("a", "kernel_us", of="sum", max=20)) == "sum of kernel_us <= 20"
    assert targets.bound_text(target("a", "x", min=-2, max=2)) == "x in [-2, 2]"


def test_an_expression_that_does_not_parse_is_absent_not_a_crash():
    """A stored scenario edited by hand after its run: its target is absent, saying why."""
    o = targets.judge(target("(sdpa", min=0), RUN)
    assert (o.verdict, o.why) == ("absent", "cells '(sdpa': the '(' at column 1 is never closed")
    assert targets.judge(target("sdpa", per="and", min=0), RUN).why.startswith("per 'and': ")


def test_no_results_is_never_met():
    assert targets.judge(target("verify_mode=sdpa", min=0), []).verdict == "absent"


def test_measured_text_lists_a_few_values_and_ranges_many():
    from harness.sweep.summary import measured_text

    def outcome(values, value=None):
        return targets.Outcome("n", "m >= 0", [(f"c{i}", v) for i, v in enumerate(values)], value, "met")
    assert measured_text(outcome([1.0, None, 3.0])) == "1 / ? / 3"
    assert measured_text(outcome([1.0, 2.0], value=3.0)) == "1 + 2 = 3"
    assert measured_text(outcome([0.5, None, 2.0, 1.0, 1.5])) == "0.5 .. 2 (5 cells, 1 unmeasured)"
    assert measured_text(outcome([None] * 5)) == "? / ? / ? / ? / ?"
    assert measured_text(outcome([])) == "–"
