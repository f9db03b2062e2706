"""The sync audit's code paths that run on a CPU: the wrapping of .item/.tolist/.cpu (counted on
CPU tensors with device_only=False), call sites, the warning hook, and the clean-up."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from harness.worker import syncaudit
from harness.worker.syncaudit import SYNC_WARNING, SyncAudit


def toy_step(x):
    total = x.sum().item()
    rows = x.tolist()
    for _ in range(2):
        x.cpu()
    x.to(torch.float64)              # a dtype change, not a transfer
    return total, rows


def line_of(func, text):
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if text in line)


def site(func, text):
    return f"tests/worker/test_syncaudit.py:{line_of(func, text)}"


def test_counts_calls_and_sites_per_step():
    x = torch.arange(6.0).reshape(2, 3)
    audit = SyncAudit(device_only=False)
    with audit:
        for i in range(3):
            audit.step = i
            toy_step(x)
    s = audit.summary(3)
    assert s["syncs_per_step"] == 4 and s["syncs_per_step_max"] == 4 and s["sync_steps"] == 3
    assert s["sync_sites"] == [
        {"site": site(toy_step, "x.cpu()"), "kind": "d2h", "count": 6, "per_step": 2.0},
        {"site": site(toy_step, ".item()"), "kind": "d2h", "count": 3, "per_step": 1.0},
        {"site": site(toy_step, ".tolist()"), "kind": "d2h", "count": 3, "per_step": 1.0},
    ]


def patched():
    return ({name: torch.Tensor.__dict__.get(name) for name in syncaudit._WRAPPED},
            [owner.__dict__.get(name) for owner, name in syncaudit._EXPLICIT_SYNCS])


def test_results_are_unchanged_and_methods_restored():
    x = torch.arange(4.0)
    before = patched()
    with SyncAudit(device_only=False):
        assert x.tolist() == [0.0, 1.0, 2.0, 3.0] and x[1].item() == 1.0
        assert torch.Tensor.item is not before[0]["item"]
        assert torch.cuda.synchronize.__wrapped__ is before[1][0]
    assert patched() == before
    with pytest.raises(ZeroDivisionError):      # restored on an exception too
        with SyncAudit():
            1 / 0
    assert "item" not in torch.Tensor.__dict__


def test_cpu_tensors_do_not_count_by_default():
    audit = SyncAudit()
    with audit:
        toy_step(torch.ones(2))
    assert audit.summary(1)["syncs_per_step"] == 0


def test_torch_sync_warnings_are_counted_at_the_project_line():
    def flagged():
        warnings.warn(SYNC_WARNING, UserWarning)   # what torch emits in sync debug mode "warn"

    audit = SyncAudit()
    with audit:
        flagged()
        audit._depth = 1           # inside a wrapped call: the wrapper already counts it
        flagged()
        audit._depth = 0
    assert dict(audit.counts) == {(site(flagged, "warnings.warn"), "sync"): 1}


def test_explicit_synchronize_counts_once():
    class FakeEvent:
        def synchronize(self):
            warnings.warn(SYNC_WARNING, UserWarning)   # as if torch also flagged it

    audit = SyncAudit()
    with audit:
        wrapped = audit._wrap_explicit(FakeEvent.synchronize)
        wrapped(FakeEvent())
    assert dict(audit.counts) == {(site(test_explicit_synchronize_counts_once,
                                        "wrapped(FakeEvent())"), "sync"): 1}


def test_other_warnings_pass_through():
    with pytest.warns(UserWarning, match="something else"):
        with SyncAudit():
            warnings.warn("something else", UserWarning)


def test_sites_outside_the_project_fall_back_to_the_innermost_frame(tmp_path):
    audit = SyncAudit(root=str(tmp_path), device_only=False)   # nothing of ours under tmp_path
    with audit:
        torch.ones(1).item()
    (where, kind), = audit.counts
    here = test_sites_outside_the_project_fall_back_to_the_innermost_frame
    assert kind == "d2h" and where.startswith("/")      # an absolute path: not project code
    assert where.endswith(f"test_syncaudit.py:{line_of(here, 'torch.ones(1).item()')}")


def test_non_blocking_argument_forms():
    nb = syncaudit._non_blocking
    assert nb((), {}) is False
    assert nb(("cuda",), {"non_blocking": True}) is True
    assert nb(("cuda", torch.float16, True), {}) is True
    assert nb((torch.float16, False, True), {}) is False   # (dtype, non_blocking, copy)


def test_audit_window_is_absent_on_cpu():
    assert syncaudit.audit_window(lambda: torch.ones(1).item(), 2, "cpu") is None
