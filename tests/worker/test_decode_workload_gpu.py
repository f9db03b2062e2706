"""The decode workload (harness/worker/workloads/decode.py) on a GPU: a cell of every loop mode
runs through the worker (harness.worker.main.run_cell, what a worker process runs) on the tiny
model with the default kernels, and the host loop and the full-step graph also with every
kernel switch on. What the modes commit is checked token for token in
tests/decode/test_fast_loop_gpu.py; here the cell around them: it succeeds, its accepted
lengths are possible ones (plain decoding: exactly 1), and on a GPU it reports the roofline
and the sync audit. Tokens/s per mode is what scenarios/decode-modes.yaml times.
"""

from __future__ import annotations

import pytest
import torch

from harness.protocol import params
from harness.protocol.workloads.decode import GPU_SETTLE_S
from harness.worker import main as worker
from harness.worker import measure

pytestmark = pytest.mark.gpu

MODES = {  # label: (speculation, tree_build, accept, graph_capture)
    "ar/full": ("none", "cpu", "cpu", "full"),
    "baseline": ("ddtree", "cpu", "cpu", "none"),
    "cpu/verify-graph": ("ddtree", "cpu", "cpu", "verify"),
    "gpu/verify-graph": ("ddtree", "gpu", "gpu", "verify"),
    "gpu/full": ("ddtree", "gpu", "gpu", "full"),
}
SWITCHES = {"defaults": {}, "every-switch": {"verify_mode": "triton", "fused_ops": True,
                                              "topk_impl": "triton", "blas_impl": "cublaslt"}}


CASES = [(mode, "defaults") for mode in MODES] + [("baseline", "every-switch"),
                                                  ("gpu/full", "every-switch")]


@pytest.mark.parametrize("mode,switches", CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_a_cell_of_every_mode_runs_on_the_gpu(cuda, mode, switches):
    speculation, tree_build, accept, graph = MODES[mode]
    knobs = dict(SWITCHES[switches])
    if knobs and tree_build == "gpu":           # the knob of the device tree build only
        knobs["tree_build_impl"] = "cuda"
    cell = params.canonical(dict(
        model="tiny", device="cuda", dtype="float32", context_length=512, batch_size=2,
        speculation=speculation, tree_build=tree_build, accept=accept, graph_capture=graph,
        acceptance="synthetic", tau=3.0, tree_budget=16, block_size=8, warmup_steps=2, steps=6,
        repeats=1, profile_steps=0, **knobs))
    blas_before = torch.backends.cuda.preferred_blas_library()
    out = worker.run_cell(cell)
    assert out["status"] == "ok", out["error"]
    m = out["metrics"]
    if "blas_impl" in knobs:                    # what ran is recorded, and put back after
        assert out["kernels"]["blas_impl"] == "cublaslt"
        assert torch.backends.cuda.preferred_blas_library() == blas_before
    assert m["tokens_per_s"] > 0 and m["bw_pct_roofline"] > 0
    ways = out["ceilings"]["copy_tbps"]         # the roofline's copy ceiling is the faster way
    assert set(ways) == {"memcpy", "elementwise"} and max(ways.values()) == m["copy_bw_tbps"]
    if speculation == "none":
        assert m["accept_len_mean"] == 1
    else:
        assert 1 <= m["accept_len_mean"] <= 8
    assert m["syncs_per_step"] >= 0 and out["sync_sites"] is not None
    # Settled by the GPU default before the window, and each timed step on the GPU's clock.
    assert out["settle"]["seconds"] == GPU_SETTLE_S and out["settle"]["steps"][0] >= 8
    gpu_steps = out["samples"]["gpu_step_ms"]
    assert len(gpu_steps) == 6 and all(t > 0 for t in gpu_steps)
    assert m["window_drift_pct"] == out["samples"]["window_drift_pct"][0]
    assert m["window_drift_pct"] == pytest.approx(measure.drift_pct(gpu_steps))


def test_a_cell_on_timed_cublaslt_algorithms_records_them(cuda):
    """blas_impl cublaslt_tuned: the verify's GEMMs (17 rows here) on cuBLASLt with each shape's
    algorithm timed before the capture; the cell is lossless and says what each shape ran."""
    cell = params.canonical(dict(
        model="tiny", device="cuda", dtype="bfloat16", context_length=512, batch_size=1,
        speculation="ddtree", tree_build="gpu", accept="gpu", graph_capture="full",
        acceptance="synthetic", tau=3.0, tree_budget=16, block_size=8, warmup_steps=2, steps=6,
        repeats=1, profile_steps=0, check_tokens=16, blas_impl="cublaslt_tuned"))
    blas_before = torch.backends.cuda.preferred_blas_library()
    out = worker.run_cell(cell)
    assert out["status"] == "ok", out["error"]
    assert out["kernels"]["blas_impl"] == "cublaslt_tuned"
    assert torch.backends.cuda.preferred_blas_library() == blas_before
    verify = [p for p in out["blas_plans"] if p["rows"] == 17]
    # q/k/v, o, gate/up, down and the lm_head of the tiny target, each timed outside the capture
    assert {(p["n"], p["k"]) for p in verify} >= {(256, 128), (128, 128), (512, 128), (128, 256), (512, 128)}
    assert all(p["timed"] and p["torch_us"] > 0 for p in verify)
