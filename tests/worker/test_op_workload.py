"""The op workload (harness/worker/workloads/op.py) on a CPU: every family checked against its
reference and timed, a wrong kernel refused before timing, the Triton kernels under the
interpreter, and the cells a scenario may and may not have. The GPU runs are scenarios/ops.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness.decode import tree_gpu
from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.scenario import load_scenario, parse_scenario
from harness.worker import main as worker
from harness.worker.workloads import op

REPO = Path(__file__).resolve().parents[2]


def op_cell(**over) -> dict:
    cell = {"workload": "op", "op": "topk", "device": "cpu", "model": "tiny", "block_size": 6,
            "tree_budget": 12, "batch_size": 2, "context_length": 40, "repeats": 3,
            "warmup_steps": 1}
    if over.get("op") == "tree_build":
        cell["tree_build_impl"] = "torch"
    cell.update(over)
    return params.canonical(cell)


def quiet(**_):
    pass


@pytest.mark.parametrize("family", ["topk", "tree_build", "fused_forward", "linear", "accept"])
def test_each_family_checks_then_times_on_a_cpu(family):
    out = op.run(op_cell(op=family), quiet)
    m = out["metrics"]
    assert len(out["samples"]["kernel_us"]) == 3 and m["kernel_us"] > 0
    assert m["pct_roofline"] == pytest.approx(100 * m["roofline_us"] / m["kernel_us"])
    assert m["achieved_tbps"] == pytest.approx(out["kernel"]["bytes"] / m["kernel_us"] / 1e6)
    assert m["check_error"] < 1e-4
    assert out["kernel"]["input_sets"] == 2 and out["kernel"]["graph"] is False


def test_traffic_counts_what_one_call_must_move():
    fam = op.family(op_cell(op="topk"), torch.device("cpu"), torch.float32)
    rows = 2 * 5
    assert fam.traffic() == (rows * 512 * 4 + rows * 12 * 12, 0)   # logits once, top-k out once
    fwd = op.family(params.canonical({"workload": "op", "op": "fused_forward", "model": "qwen3-8b",
                                      "tree_budget": 64, "context_length": 4096}),
                    torch.device("cpu"), torch.bfloat16)
    bytes_, flops = fwd.traffic()
    # Qwen3-8B without its embedding table: 7.57e9 weights; 4161 keys of 36 layers x 8 x 128 x 2.
    weights = (bytes_ - 2 * 36 * 8 * 128 * 2 * 4161) / 2
    assert weights == pytest.approx(7.57e9, rel=0.01)
    assert flops == pytest.approx(2 * weights * 65 + 4 * 36 * 32 * 128 * 65 * 4161, rel=1e-9)
    assert fwd.set_bytes() == 2 * 36 * 8 * 128 * 4161 * 2      # sets share the weights


def test_topk_agrees_with_float64_and_a_wrong_one_is_never_timed(monkeypatch):
    real = tree_gpu.topk_logprobs_batched

    def off_by_one_id(logits, k, impl="torch"):
        lp, ids = real(logits, k, impl)
        ids = ids.clone()
        ids[0, 0, -1] = ids[0, 0, -2]       # one row's last id wrong
        return lp, ids

    monkeypatch.setattr(tree_gpu, "topk_logprobs_batched", off_by_one_id)
    timed = []
    monkeypatch.setattr(op, "time_calls", lambda *a, **k: timed.append(1))
    with pytest.raises(AssertionError, match=r"1 of 10 rows pick other ids.*not timing it"):
        op.run(op_cell(op="topk"), quiet)
    assert not timed


def test_topk_log_probs_off_by_more_than_the_tolerance_are_refused(monkeypatch):
    real = tree_gpu.topk_logprobs_batched
    monkeypatch.setattr(tree_gpu, "topk_logprobs_batched",
                        lambda logits, k, impl="torch": (real(logits, k, impl)[0] + 2e-3,
                                                         real(logits, k, impl)[1]))
    with pytest.raises(AssertionError, match="log-probs 0.002 from float64"):
        op.run(op_cell(op="topk"), quiet)


def test_a_tree_other_than_the_heap_is_refused(monkeypatch):
    real = tree_gpu.build_tree_gpu

    def swapped(lp, ids, budget, out=None, impl="auto"):
        t = real(lp, ids, budget, out=out, impl=impl)
        t.tokens[1, [1, 2]] = t.tokens[1, [2, 1]]        # two siblings' tokens exchanged
        return t

    monkeypatch.setattr(tree_gpu, "build_tree_gpu", swapped)
    with pytest.raises(AssertionError, match="1 of 2 trees differ from the reference heap"):
        op.run(op_cell(op="tree_build"), quiet)


def test_a_forward_off_its_reference_is_refused(monkeypatch):
    real_call = op.FusedForward.call

    def one_percent_off(self, inp):          # the cell's forward, not the float64 reference
        f = real_call(self, inp)
        return lambda: f() * (1.0 if inp["cache"].k.dtype == torch.float64 else 1.01)

    monkeypatch.setattr(op.FusedForward, "call", one_percent_off)
    with pytest.raises(AssertionError, match=r"logits 0.01 from float64 \(> 0.001\)"):
        op.run(op_cell(op="fused_forward"), quiet)


def test_a_linear_off_its_reference_is_refused(monkeypatch):
    real_call = op.LayerLinear.call

    def one_percent_off(self, inp):
        f = real_call(self, inp)
        return lambda: [y * 1.01 for y in f()]

    monkeypatch.setattr(op.LayerLinear, "call", one_percent_off)
    with pytest.raises(AssertionError, match=r"linear torch is wrong: outputs 0.01 from float64"):
        op.run(op_cell(op="linear"), quiet)


def test_an_accept_off_the_tensor_ops_is_refused(monkeypatch):
    real_call = op.Accept.call

    def one_long(self, inp):
        f = real_call(self, inp)
        return lambda: (f(), inp["lengths"].add_(1))

    monkeypatch.setattr(op.Accept, "call", one_long)
    with pytest.raises(AssertionError, match=r"accept torch is wrong: lengths differ from the host walk"):
        op.run(op_cell(op="accept"), quiet)


def test_cuda_kernels_are_refused_on_a_cpu_rather_than_timed_as_torch():
    with pytest.raises(RuntimeError, match="topk_impl triton is a CUDA kernel"):
        op.run({**op_cell(), "topk_impl": "triton"}, quiet)
    with pytest.raises(RuntimeError, match="tree_build_impl cuda is a CUDA kernel"):
        op.run({**op_cell(op="tree_build"), "tree_build_impl": "cuda"}, quiet)
    with pytest.raises(RuntimeError, match="blas_impl cublaslt is a CUDA library"):
        op.run({**op_cell(op="linear"), "blas_impl": "cublaslt"}, quiet)


def test_the_ops_that_run_torch_gemms_record_the_library_they_ran():
    # The linear op and the verify forward run GEMMs on torch's library, as the loop does: what
    # ran is part of what identifies their results (auto resolved: torch's default on a CPU).
    out = op.run({**op_cell(op="linear"), "blas_impl": "auto"}, quiet)
    assert out["kernels"] == {"linear_impl": "torch", "blas_impl": "torch"}
    assert params.cell_kernels(op_cell(op="fused_forward")) == ("fused_ops", "blas_impl")
    assert params.cell_kernels(op_cell(op="topk")) == ("topk_impl",)


def test_worker_runs_an_op_cell_with_its_label():
    result = worker.run_cell(op_cell(op="tree_build"))
    assert result["status"] == "ok", result["error"]
    assert result["label"] == "op tree_build torch tiny D=5 k=12 bs=2"
    assert {"kernel_us", "achieved_tbps", "pct_roofline", "check_error"} <= set(result["metrics"])
    assert result["kernels"] == {"tree_build_impl": "torch"}
    # Left auto, the knob runs this device's kernel and the result says which.
    auto = worker.run_cell({**op_cell(op="tree_build"), "tree_build_impl": "auto"})
    assert auto["status"] == "ok" and auto["kernels"] == {"tree_build_impl": "torch"}
    assert auto["label"] == "op tree_build auto tiny D=5 k=12 bs=2"


# -- the Triton kernels, under the interpreter --------------------------------------------------
def _run_in_interpreter(cell: dict) -> dict:
    from harness.worker.workloads import op as op_in_child
    return op_in_child.run(cell, lambda **_: None)["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("over", [{"op": "topk", "topk_impl": "triton"},
                                  {"op": "tree_build", "tree_build_impl": "triton"},
                                  {"op": "fused_forward", "fused_ops": True},
                                  {"op": "linear", "linear_impl": "triton", "tree_budget": 15},
                                  {"op": "accept", "accept_impl": "triton"}],
                         ids=["topk", "tree_build", "fused_forward", "linear", "accept"])
def test_the_triton_kernels_pass_their_checks_under_the_interpreter(interp, over):
    # Small: the interpreter runs every program instance in Python.
    cell = {**op_cell(op=over["op"]), "repeats": 1, "warmup_steps": 0,
            "context_length": 8, "batch_size": 1, "block_size": 4, "tree_budget": 6, **over}
    metrics = interp.apply(_run_in_interpreter, (cell,))
    assert metrics["check_error"] < 1e-4 and metrics["kernel_us"] > 0


# -- cells and scenarios ---------------------------------------------------------------------
def test_the_ops_scenario_covers_every_family():
    scenario = load_scenario(REPO / "scenarios" / "ops.yaml")
    cells = scenario.cells()
    assert len(cells) == 33 == len(set(scenario.cell_ids()))
    ops = {(c["op"], c[op.KNOBS[c["op"]]]) for c in cells if c["workload"] == "op"}
    assert ops == {("topk", "torch"), ("topk", "triton"), ("tree_build", "torch"),
                   ("tree_build", "triton"), ("tree_build", "cuda"), ("fused_forward", False),
                   ("fused_forward", True), ("linear", "torch"), ("linear", "triton"), ("linear", "wgmma"),
                   ("accept", "torch"), ("accept", "triton")}
    rows = {op.linear_rows(c) for c in cells if c["workload"] == "op" and c["op"] == "linear"}
    assert rows == {1, 16, 65}
    verify = {(c["verify_mode"], c["layout"], c["attention"]) for c in cells if c["workload"] == "kernel"}
    assert {m for m, _, _ in verify} == {"custom", "triton", "sdpa", "flex"}
    assert ("custom", "paged", "gqa") in verify and ("custom", "contiguous", "mla") in verify
    # Paged at one row block (16 tree tokens x 4 heads) and at several (64 x 4): planned apart.
    assert {c["tree_tokens"] for c in cells if c["workload"] == "kernel" and c["layout"] == "paged"} == {16, 64}


def test_op_ids_and_labels():
    assert "op" not in params.canonical({})                 # an op parameter joins op cells only
    a = params.cell_id({"workload": "op", "op": "topk"})
    assert a != params.cell_id({"workload": "op", "op": "topk", "topk_impl": "triton", "device": "cuda"})
    assert params.cell_id({"workload": "op", "op": "topk", "repeats": 50}) == a
    fwd = params.canonical({"workload": "op", "op": "fused_forward", "fused_ops": True,
                            "model": "qwen3-8b", "tree_budget": 64, "context_length": 4096})
    assert params.SPECS["op"].cell_label(fwd) == "op fused_forward on qwen3-8b ctx=4096 T=65 verify=sdpa"
    lin = params.canonical({"workload": "op", "op": "linear", "linear_impl": "triton",
                            "model": "qwen3-8b", "speculation": "none"})
    assert params.SPECS["op"].cell_label(lin) == "op linear triton qwen3-8b rows=1"
    # the library under the GEMMs, where a cell names one (two cells otherwise read alike)
    assert (params.SPECS["op"].cell_label({**lin, "blas_impl": "cublaslt_tuned"})
            == "op linear triton qwen3-8b rows=1 blas=cublaslt_tuned")
    assert (params.SPECS["op"].cell_label({**fwd, "blas_impl": "torch"})
            == "op fused_forward on qwen3-8b ctx=4096 T=65 verify=sdpa blas=torch")
    from harness.kernels.linear import skinny_linear
    from harness.protocol.workloads import op as op_spec
    assert op_spec.SKINNY_MAX_ROWS == skinny_linear.MAX_ROWS
    from harness.kernels.linear import stream_linear
    assert op_spec.STREAM_MAX_ROWS == stream_linear.MAX_ROWS


def test_one_gemm_of_the_linear_op():
    """linear_gemm times one GEMM (or the lm_head) alone: its shape from the model preset, its
    name in the label and the id; at `layer` (the four, as before the parameter) the ids of the
    cells recorded before it are unchanged."""
    base = {"workload": "op", "op": "linear", "linear_impl": "wgmma", "model": "qwen3-8b", "tree_budget": 64}
    assert params.cell_id({**base, "linear_gemm": "layer"}) == params.cell_id(base)
    # Every linear cell results/h200 recorded before the parameter keeps its id.
    recorded = [json.loads(f.read_text()) for f in sorted((REPO / "results" / "h200" / "runs").glob("*/cells/*.json"))]
    linear = [r for r in recorded if r["cell"].get("workload") == "op" and r["cell"].get("op") == "linear"]
    assert linear and all(params.cell_id(r["cell"]) == r["cell_id"] for r in linear)
    ids = {params.cell_id({**base, "linear_gemm": g}) for g in op_spec_gemms()}
    assert len(ids) == 6
    qkv = params.canonical({**base, "linear_gemm": "qkv"})
    assert params.SPECS["op"].cell_label(qkv) == "op linear wgmma qwen3-8b qkv rows=65"
    shapes = {g: op.family(params.canonical({**base, "linear_gemm": g}), torch.device("cpu"),
                           torch.bfloat16).shapes() for g in op_spec_gemms()}
    assert shapes["layer"] == [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)]
    assert shapes["lm_head"] == [(151936, 4096)] and shapes["down"] == [(4096, 12288)]
    out = op.run(op_cell(op="linear", linear_gemm="lm_head"), quiet)    # tiny: vocab 512, hidden 128
    rows = 2 * (1 + 12)
    assert out["kernel"]["bytes"] == 4 * (512 * 128 + rows * (512 + 128))   # float32, each once
    assert out["kernel"]["flops"] == 2 * 512 * 128 * rows


def op_spec_gemms():
    from harness.protocol.workloads import op as op_spec
    return op_spec.LINEAR_GEMMS


@pytest.mark.parametrize("defaults, matrix, message", [
    ("  op: topk\n  device: cuda\n", "  tree_build_impl: [cuda]\n",
     "op topk times the kernel topk_impl picks; tree_build_impl picks the kernels of other ops"),
    ("  op: tree_build\n  device: cuda\n", "  fused_ops: [true]\n", "fused_ops picks the kernels of other ops"),
    ("  op: topk\n  device: cpu\n", "  topk_impl: [triton]\n",
     "topk_impl triton is a CUDA kernel; on device cpu op topk runs topk_impl: torch"),
    ("  op: tree_build\n  device: cpu\n", "  tree_build_impl: [triton]\n",
     "tree_build_impl triton is a CUDA kernel; on device cpu op tree_build runs tree_build_impl: torch"),
    # blas_impl belongs to the ops that run GEMMs on torch (linear, fused_forward) only
    ("  op: topk\n  device: cuda\n", "  blas_impl: [cublaslt]\n",
     "op topk times the kernel topk_impl picks; blas_impl picks the kernels of other ops"),
    ("  op: linear\n  device: cpu\n", "  blas_impl: [cublaslt]\n",
     "blas_impl cublaslt is a CUDA library; on device cpu op linear runs blas_impl: torch"),
    ("  op: tree_build\n  device: cuda\n  tree_build_impl: cuda\n", "  tree_budget: [512]\n",
     "tree_build_impl cuda builds up to 256 nodes"),
    ("  op: fused_forward\n", "  context_length: [8190]\n",
     "context_length 8190 plus a tree of 17 tokens exceeds model 'tiny' limit 8192"),
    ("  op: attention\n", "  batch_size: [1]\n", "unknown op 'attention'"),
    ("  op: linear\n  linear_impl: triton\n", "  tree_budget: [64]\n",
     "linear_impl triton takes up to 16 rows and leaves more to cuBLAS; this cell's forward has 65"),
    ("  op: linear\n  linear_impl: wgmma\n", "  tree_budget: [64]\n  batch_size: [2]\n",
     "linear_impl wgmma takes up to 72 rows and leaves more to cuBLAS; this cell's forward has 130"),
    ("  op: topk\n", "  linear_gemm: [qkv]\n",
     "linear_gemm qkv picks a GEMM of op linear; op topk has none"),
])
def test_bad_op_cells_are_input_errors(defaults, matrix, message):
    text = "name: o\ndefaults:\n  workload: op\n" + defaults + "matrix:\n" + matrix
    with pytest.raises(InputError, match=message) as err:
        parse_scenario(text, "o.yaml")
    assert str(err.value).startswith("o.yaml:")


def test_the_op_spec_restates_the_decode_knobs_as_they_are():
    """protocol/workloads/op.py may not import decode's spec, so it restates the kernel knobs
    and their defaults: they must stay the ones every cell has."""
    from harness.protocol.workloads import op as op_spec
    # custom_impl picks a variant of the verify attention, which the kernel workload times
    # (no op family of its own).
    op_knobs = {k: v for k, v in params.IMPL_DEFAULTS.items() if k != "custom_impl"}
    assert op_spec.KNOB_DEFAULTS == op_knobs
    assert set(op_spec.KNOBS.values()) | {op_spec.BLAS} == set(op_knobs) == set(op_spec.ON_CPU)
