"""The sync audit (harness/worker/syncaudit.py) on a GPU: a toy step with a known number of host
syncs of each kind is counted exactly and charged to the lines that make them. The CPU tests
(test_syncaudit.py) exercise the wrappers on CPU tensors; only here do torch's own sync debug
mode and the explicit waits see CUDA work."""

from __future__ import annotations

import inspect

import pytest
import torch

from harness.worker import syncaudit

pytestmark = pytest.mark.gpu


def toy_step(device):
    a = torch.randn(64, device=device)
    pinned = torch.zeros(64).pin_memory()

    def step():
        for _ in range(3):
            a.sum().item()                        # audit: d2h (x3)
        for _ in range(2):
            a[:4].tolist()                        # audit: d2h (x2)
        torch.tensor([1.0, 2.0]).to(device)       # audit: h2d_pageable
        if (a > 0).any():                         # audit: sync (bool of a CUDA tensor)
            pass
        torch.nonzero(a > 0)                      # audit: sync (its size is known on the GPU only)
        pinned.to(device, non_blocking=True)      # pinned and asynchronous: no sync
        torch.cuda.synchronize()                  # audit: sync (an explicit wait)
    return step


def tagged_lines() -> dict[str, str]:
    """'file:line' -> kind of each line of toy_step tagged `# audit: KIND`."""
    src, first = inspect.getsourcelines(toy_step)
    path = "tests/worker/" + inspect.getsourcefile(toy_step).replace("\\", "/").rsplit("/", 1)[-1]
    return {f"{path}:{first + i}": line.split("# audit: ")[1].split()[0]
            for i, line in enumerate(src) if "# audit: " in line}


def test_a_toy_step_is_audited_by_kind_and_line(cuda):
    step = toy_step(cuda)
    step()
    out = syncaudit.audit_window(step, 4, cuda)
    by_kind = {}
    for s in out["sync_sites"]:
        by_kind[s["kind"]] = by_kind.get(s["kind"], 0) + s["per_step"]
    assert by_kind == {"d2h": 5, "h2d_pageable": 1, "sync": 3}
    assert out["syncs_per_step"] == 9 and out["syncs_per_step_max"] == 9
    assert {s["site"]: s["kind"] for s in out["sync_sites"]} == tagged_lines()
