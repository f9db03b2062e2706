"""The kernel workload (harness/worker/workloads/kernel.py) on a GPU: every verify mode passes the
workload's own float64 check at the points the H200 benchmark times (scenarios/kernels.yaml),
and one kernel cell runs end to end through the worker, its compared modes included.

`kw.check` draws fresh inputs (tree keys boosted so a tree-mask bug shows), runs the mode into
a NaN-poisoned output and compares it with the float64 reference (harness.kernels.verify.
verify_reference): relative error above 1e-2 raises. The points: GQA 32/8 d128 at T 16 and 64
over 16k / 64k / 128k-token prefixes (custom, triton, sdpa), a batch of two with different
prefixes, MLA 8 heads at 64k (custom, sdpa; the Triton baseline has no MLA variant that fits
in shared memory), the paged cache with pages of 16 and 1 (custom), and on Hopper the custom
kernel's wgmma variant. The timing itself is the workload's (scenarios/kernels.yaml).
"""

from __future__ import annotations

import pytest
import torch

from harness.protocol import params
from harness.worker import main as worker
from harness.worker.workloads import kernel as kw

pytestmark = pytest.mark.gpu

BF = torch.bfloat16


def gqa(ctx: int, T: int, batch: int = 1, layout: str = "contiguous", page_size: int = 16) -> kw.Point:
    return kw.Point("gqa", batch, ctx, T, 32, 8, 128, 128, layout, page_size)


MLA = kw.Point("mla", 1, 65536, 16, 8, 1, kw.MLA_DK, kw.MLA_DV, "contiguous", 16)

POINTS = {f"gqa-T{T}-{ctx}": gqa(ctx, T) for T in (16, 64) for ctx in (16384, 65536, 131072)}
POINTS["gqa-T16-16384-b2"] = gqa(16384, 16, batch=2)
CASES = [(name, mode) for name in POINTS for mode in ("custom", "triton", "sdpa")]
CASES += [("mla-T16-65536", "custom"), ("mla-T16-65536", "sdpa"),
          ("paged16-T16-65536", "custom"), ("paged1-T16-65536", "custom")]
POINTS.update({"mla-T16-65536": MLA, "paged16-T16-65536": gqa(65536, 16, layout="paged"),
               "paged1-T16-65536": gqa(65536, 16, layout="paged", page_size=1)})


@pytest.mark.parametrize("name,mode", CASES, ids=[f"{m}-{n}" for n, m in CASES])
def test_every_mode_passes_the_workload_check_at_the_benchmark_points(cuda, name, mode):
    if mode == "triton":
        pytest.importorskip("triton", reason="Triton is needed")
    assert kw.check(mode, POINTS[name], cuda, BF, seed=7919) <= kw.TOLERANCE


@pytest.mark.parametrize("name", ["gqa-T16-65536", "gqa-T64-65536", "mla-T16-65536"])
def test_the_wgmma_variant_passes_the_workload_check(cuda, name):
    if torch.cuda.get_device_capability(cuda) != (9, 0):
        pytest.skip("wgmma needs compute capability 9.0")
    assert kw.check("custom", POINTS[name], cuda, BF, seed=7919, custom_impl="wgmma") <= kw.TOLERANCE
    if not POINTS[name].mla:
        assert kw.check("custom", POINTS[name], cuda, BF, seed=7919,
                        custom_impl="wgmma_pv") <= kw.TOLERANCE


def test_a_kernel_cell_runs_through_the_worker(cuda):
    pytest.importorskip("triton", reason="Triton is needed")
    cell = params.canonical({"workload": "kernel", "device": "cuda", "dtype": "bfloat16",
                             "verify_mode": "custom", "context_length": 16384, "tree_tokens": 16,
                             "compare_modes": "triton,sdpa", "repeats": 5, "warmup_steps": 1})
    out = worker.run_cell(cell)
    assert out["status"] == "ok", out["error"]
    m = out["metrics"]
    assert m["rel_error"] <= kw.TOLERANCE and m["kernel_us"] > 0
    for other in ("triton", "sdpa"):        # a compared mode that failed would leave these out
        assert m[f"{other}.rel_error"] <= kw.TOLERANCE and m[f"{other}.kernel_us"] > 0


def test_a_forced_split_count_is_the_one_the_custom_kernel_runs(cuda):
    """custom_splits replaces the plan's count (recorded in kernel.custom_plan) and the forced
    kernel still passes the workload's float64 check; 0 leaves the plan's. The forced counts
    are taken off the plan's, so the test holds on any GPU's plan."""
    base = params.canonical({"workload": "kernel", "device": "cuda", "dtype": "bfloat16",
                             "verify_mode": "custom", "context_length": 16384, "tree_tokens": 65,
                             "repeats": 3, "warmup_steps": 1})
    planned = worker.run_cell(base)
    assert planned["status"] == "ok", planned["error"]
    plan = planned["kernel"]["custom_plan"]["num_splits"]
    for splits in (plan + 1, max(1, plan // 2), 2 * plan + 3):
        if splits == plan:
            continue
        forced = worker.run_cell({**base, "custom_splits": splits})
        assert forced["status"] == "ok", forced["error"]
        assert forced["metrics"]["rel_error"] <= kw.TOLERANCE
        assert forced["kernel"]["custom_plan"]["num_splits"] == splits
