"""The NVML idle estimate of a serving engine without a profiler route, against a fake pynvml:
how it is read, what it says of itself, and its absence with a reason wherever NVML cannot
answer. (On a real GPU it was read once, by hand, on the H200: results/h200/README.md,
"Session 7": the NVML fallback.)"""

from __future__ import annotations

import re
import sys
import time
from types import SimpleNamespace

import pytest

from harness.gate.policy import DEFAULT_POLICIES
from harness.worker import hostfacts, nvml_idle
from test_hostfacts import use


class NvmlError(Exception):
    pass


def fake_nvml(utilisation: dict):
    """A pynvml answering only the utilisation query: GPU index -> a function of the call's
    number (0 first) giving its percent, or an exception to raise. Every other query fails,
    which hostfacts records as unavailable, field by field."""
    calls = {i: 0 for i in utilisation}

    def by_index(i):
        if i not in utilisation:
            raise NvmlError("Invalid Argument")
        return i

    def rates(handle):
        n = calls[handle]
        calls[handle] += 1
        value = utilisation[handle](n)
        if isinstance(value, Exception):
            raise value
        return SimpleNamespace(gpu=value, memory=0)

    return SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=by_index,
                           nvmlDeviceGetUtilizationRates=rates)


@pytest.fixture
def short_window(monkeypatch):
    """Windows of a fifth of a second count as long enough (the real bound is NVML's 1 s)."""
    monkeypatch.setattr(nvml_idle, "LONGEST_PERIOD_S", 0.1)


def measured(gpus, seconds=0.25, interval_s=0.02):
    with nvml_idle.Window(gpus, interval_s=interval_s) as window:
        time.sleep(seconds)
    return window.estimate()


def test_idle_is_one_minus_mean_utilisation_over_the_window_and_says_how(monkeypatch,
                                                                         short_window):
    # The first reading (taken as the window opens, so of NVML's period before it) is 0 %:
    # dropped. After it GPU 0 is 75 % busy and GPU 1 25 %.
    use(monkeypatch, fake_nvml({0: lambda n: 0 if n == 0 else 75,
                                1: lambda n: 0 if n == 0 else 25}))
    idle, how = measured([0, 1])
    assert idle == pytest.approx(0.5)
    per = {g["gpu"]: g for g in how["per_gpu"]}
    assert per[0]["idle_fraction"] == 0.25 and per[1]["idle_fraction"] == 0.75
    assert per[0]["readings"] >= 3 and per[0]["utilization_pct_mean"] == 75
    assert (how["source"], how["gpus"], how["interval_s"]) == ("nvml", [0, 1], 0.02)
    assert how["nvml_period"] == "1/6 s to 1 s, by product" and how["window_s"] >= 0.25
    assert "read every 0.02 s" in how["note"] and "1/6 s to 1 s" in how["note"]
    assert "not comparable with the trace-based idle_fraction" in how["note"]


def test_absent_with_a_reason_where_nvml_cannot_answer(monkeypatch, short_window):
    monkeypatch.setattr(hostfacts, "_NVML", hostfacts._NvmlState())
    monkeypatch.setitem(sys.modules, "pynvml", None)                 # not installed
    idle, how = measured([0])
    assert idle is None and how["note"].startswith("no NVML estimate: GPU 0: pynvml not "
                                                   "importable")
    use(monkeypatch, fake_nvml({0: lambda n: 50}))
    idle, how = measured([None])                                     # the worker has no GPU
    assert idle is None and how["note"] == ("no NVML estimate: the worker's GPU: no GPU "
                                            "visible to this process")
    # a board that does not report utilisation; one GPU of two failing leaves no estimate,
    # rather than the other's passed off as the engine's
    use(monkeypatch, fake_nvml({0: lambda n: 50, 1: lambda n: NvmlError("Not Supported")}))
    idle, how = measured([0, 1])
    assert idle is None and how["note"] == ("no NVML estimate: GPU 1: utilisation unavailable "
                                            "(Not Supported)")
    idle, how = measured([0, 7])                                     # no such GPU
    assert idle is None and "GPU 7: " in how["note"]


def test_a_window_shorter_than_nvmls_period_gives_no_estimate(monkeypatch):
    use(monkeypatch, fake_nvml({0: lambda n: 50}))
    idle, how = measured([0], seconds=0.05)
    assert idle is None
    # (0.05 s asked for; a loaded test host may take a little longer, still well under 1 s)
    assert re.match(r"no NVML estimate: the load window \(0\.\d+ s\)", how["note"]), how["note"]
    assert "shorter than NVML's longest sample period (1 s)" in how["note"]


def test_the_engines_gpus(monkeypatch):
    assert nvml_idle.engine_gpus("0,2,5") == [0, 2, 5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert nvml_idle.engine_gpus(None) == [3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert nvml_idle.engine_gpus(None) == [None]


def test_reported_never_gated():
    policy = DEFAULT_POLICIES["idle_fraction_nvml"]
    assert policy.gate is False and policy.direction == "lower" and policy.per == "run"
    assert DEFAULT_POLICIES["idle_fraction"] != policy
