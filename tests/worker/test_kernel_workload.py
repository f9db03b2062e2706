"""The kernel workload on a CPU (sdpa, flex: the GPU-only modes are covered by
test_custom_kernel_emulated.py and the GPU tests), its reference, its roofline arithmetic and
its scenario parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from harness.protocol import params

from harness.worker import main as worker
from harness.protocol.errors import InputError
from harness.kernels.verify import verify_reference as ref
from harness.sweep.scenario import load_scenario, parse_scenario
from harness.worker.workloads import kernel as kw
REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def small_cell(**over):
    cell = {"workload": "kernel", "device": "cpu", "verify_mode": "sdpa", "context_length": 70,
            "tree_tokens": 9, "heads": 4, "kv_heads": 2, "head_dim": 32, "repeats": 3,
            "warmup_steps": 1, "batch_size": 2}
    cell.update(over)
    return params.canonical(cell)


# -- roofline arithmetic -----------------------------------------------------------------------
def test_roofline_matches_the_reference_table():
    """The H200 roofline: GQA 32/8 d128 at 4.3 TB/s and 790 TFLOP/s -> 62.4 us (T 16, 65536) and
    21.7 us (T 64, 16384). Ours also counts the T tree keys, q and the output: within 1 %."""
    def roofline(ctx, T):
        pt = kw.Point("gqa", 1, ctx, T, 32, 8, 128, 128, "contiguous", 16)
        return max(pt.bytes(2) / 4.3e12, pt.flops() / 790e12) * 1e6
    assert roofline(65536, 16) == pytest.approx(62.4, rel=0.01)
    assert roofline(16384, 64) == pytest.approx(21.7, rel=0.01)
    assert roofline(4096, 16) == pytest.approx(3.9, rel=0.02)


def test_mla_reads_one_latent_row_per_key():
    pt = kw.Point("mla", 1, 65536, 16, 8, 1, 576, 512, "contiguous", 16)
    keys = 65536 + 16
    assert pt.kv_bytes(2) == keys * 576 * 2                         # values live in the key row
    assert pt.flops() == 2 * 8 * 16 * keys * (576 + 512)


def test_point_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="mla needs kv_heads 1"):
        kw.Point.from_cell(params.canonical({"workload": "kernel", "attention": "mla"}))
    with pytest.raises(ValueError, match="not a multiple"):
        kw.Point.from_cell(params.canonical({"workload": "kernel", "heads": 12, "kv_heads": 8}))


# -- reference ---------------------------------------------------------------------------------
def test_visibility_bits_round_trip():
    vis = ref.random_tree(3, 70, torch.Generator().manual_seed(0))
    bits = ref.pack_visibility(vis)
    assert bits.shape == (3, 70, 3) and bits.dtype == torch.int32
    assert torch.equal(ref.unpack_visibility(bits, 70), vis)
    assert vis.diagonal(dim1=1, dim2=2).all() and vis[:, :, 0].all()    # self and root


def test_reference_equals_dense_masked_softmax():
    """An independent formulation: one dense boolean mask over the whole cache, float64 SDPA."""
    pt = kw.Point("gqa", 2, 0, 7, 4, 2, 16, 16, "contiguous", 16)
    inp = kw.make_inputs(pt, [20, 9], 3, CPU, torch.float64)
    S = inp["k"].shape[2]
    vis = ref.unpack_visibility(inp["bits"], 7)
    mask = torch.zeros(2, 1, 7, S, dtype=torch.bool)
    for b, L in enumerate([20, 9]):
        mask[b, 0, :, :L] = True
        mask[b, 0, :, L:L + 7] = vis[b]
    k = inp["k"].repeat_interleave(2, dim=1)
    v = inp["v"].repeat_interleave(2, dim=1)
    dense = F.scaled_dot_product_attention(inp["q"], k, v, attn_mask=mask)
    assert torch.allclose(kw.reference(pt, inp), dense, atol=1e-12)


def test_paged_inputs_hold_the_same_keys_as_their_pages_say():
    pt = kw.Point("gqa", 2, 0, 5, 4, 2, 8, 8, "paged", 4)
    inp = kw.make_inputs(pt, [10, 3], 0, CPU, torch.float32)
    table = inp["page_table"]
    assert table.dtype == torch.int32 and table.shape == (2, 4)
    used = torch.cat([table[0, :4], table[1, :2]])
    assert sorted(used.tolist()) == list(range(6))                       # each page once
    keys = ref.gather_pages(inp["k"], table, 1, 8)
    assert torch.equal(keys[:, 5], inp["k"][table[1, 1], :, 1])          # key 5 = page 1, slot 1


def test_tree_boost_scales_only_the_tree_keys():
    pt = kw.Point("gqa", 1, 0, 4, 2, 1, 8, 8, "contiguous", 16)
    plain = kw.make_inputs(pt, [6], 0, CPU, torch.float32)
    boosted = kw.make_inputs(pt, [6], 0, CPU, torch.float32, tree_boost=3.0)
    assert torch.equal(plain["k"][:, :, :6], boosted["k"][:, :, :6])
    assert torch.allclose(plain["k"][:, :, 6:] * 3, boosted["k"][:, :, 6:])


# -- the cell ----------------------------------------------------------------------------------
def test_cpu_cell_checks_then_times():
    out = kw.run(small_cell(compare_modes="custom"), lambda **_: None)
    m = out["metrics"]
    assert m["rel_error"] < 1e-5                              # float32 on the CPU
    assert len(out["samples"]["kernel_us"]) == 3
    assert m["kernel_us"] > 0 and 0 < m["pct_roofline"]
    assert m["achieved_tbps"] == pytest.approx(out["kernel"]["bytes"] / m["kernel_us"] / 1e6)
    # custom needs a GPU: its comparison is a recorded note, not a failed cell.
    assert "custom" in out["kernel"]["compare_errors"] and "speedup_vs_custom" not in m


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_compare_modes_report_speedups():
    out = kw.run(small_cell(context_length=30, tree_tokens=4, batch_size=1, compare_modes="flex"),
                 lambda **_: None)
    m = out["metrics"]
    assert m["speedup_vs_flex"] == pytest.approx(m["flex.kernel_us"] / m["kernel_us"])
    assert m["flex.rel_error"] < 1e-5
    assert out["kernel"]["compare_graph"] == {"flex": False}     # a CPU: eager launches


def test_the_vendor_peer_is_checked_and_timed_beside_the_mode():
    """compare_modes: vendor (torch's fused prefix kernel + the tree block, merged): on a CPU the
    CPU flash kernel, sequences of different prefix lengths in the check, the prefix in two key
    ranges."""
    out = kw.run(small_cell(compare_modes="vendor", context_length=2100), lambda **_: None)
    m = out["metrics"]
    assert out["kernel"]["compare_errors"] == {} and out["kernel"]["vendor_backend"] == "cpu"
    assert out["kernel"]["vendor_ranges"] == 2          # 2100 keys: two ranges of 1050
    assert m["vendor.rel_error"] < 1e-5
    assert m["speedup_vs_vendor"] == pytest.approx(m["vendor.kernel_us"] / m["kernel_us"])


def test_a_wrong_kernel_is_never_timed(monkeypatch):
    real = kw.prepare

    def broken(mode, pt, inp, out=None, **kwargs):
        fn = real(mode, pt, inp, out, **kwargs)
        return lambda: fn() * 1.05          # 5 % off: well past the 1e-2 tolerance

    monkeypatch.setattr(kw, "prepare", broken)
    timed = []
    monkeypatch.setattr(kw, "time_calls", lambda *a, **k: timed.append(1))
    with pytest.raises(AssertionError, match="not timing it"):
        kw.run(small_cell(), lambda **_: None)
    assert not timed


def test_worker_runs_a_kernel_cell():
    result = worker.run_cell(small_cell())
    assert result["status"] == "ok", result["error"]
    assert result["label"] == "kernel sdpa ctx=70 T=9 gqa 4/2 d32 contiguous bs=2"
    assert {"kernel_us", "achieved_tbps", "pct_roofline"} <= set(result["metrics"])


def test_custom_on_cpu_fails_the_cell_with_a_reason():
    result = worker.run_cell(small_cell(verify_mode="custom"))
    assert result["status"] == "failed" and "needs a CUDA device" in result["error"]
    # Its traceback names the worker's files relative to the tree it runs from: a journal
    # committed from a GPU host carries none of that host's paths.
    assert 'File "harness/worker/workloads/kernel.py"' in result["error"]
    assert str(worker.CODE_ROOT) not in result["error"]


# -- parameters and scenarios --------------------------------------------------------------------
def test_kernel_params_join_only_kernel_cells():
    assert "tree_tokens" not in params.canonical({})
    kernel = params.canonical({"workload": "kernel"})
    assert {k: kernel[k] for k in params.WORKLOAD_PARAMS["kernel"]} == params.WORKLOAD_PARAMS["kernel"]
    # compare_modes only adds metrics: it is a measurement knob, not part of the id.
    assert params.cell_id({"workload": "kernel", "compare_modes": "sdpa"}) == \
        params.cell_id({"workload": "kernel"})
    assert params.cell_id({"workload": "kernel", "tree_tokens": 64}) != params.cell_id({"workload": "kernel"})


def test_kernels_scenario_validates():
    scenario = load_scenario(REPO / "scenarios" / "kernels.yaml")
    cells = scenario.cells()
    assert len(cells) == 54 == len(set(scenario.cell_ids()))
    custom = [c for c in cells if c["verify_mode"] == "custom" and c["layout"] == "contiguous"]
    assert all(c["compare_modes"] == "triton,sdpa,flex" for c in custom)
    assert all(c["compare_modes"] == "" for c in cells if c["verify_mode"] != "custom")
    assert {c["context_length"] for c in cells} >= {4096, 65536, 131072}   # beyond tiny's limit


@pytest.mark.parametrize("matrix, message", [
    ("  attention: [mla]\n", "attention mla is one latent KV head of 576 values"),
    ("  heads: [24]\n", "heads 24 over kv_heads 8 is not a power-of-two group"),
    ("  compare_modes: ['custom,sdpa']\n", "repeats a mode or names the cell's own verify_mode"),
    ("  compare_modes: ['cuda']\n", "compare_modes must be a comma-separated list of verify modes"),
    ("  head_dim: [96]\n", "the custom kernel supports head_dim 64 and 128"),
    ("  layout: [paged]\n  compare_modes: [sdpa]\n", "sdpa, flex and vendor read a contiguous cache only"),
    ("  layout: [paged]\n  compare_modes: [vendor]\n", "sdpa, flex and vendor read a contiguous cache only"),
    ("  attention: [mla]\n  heads: [8]\n  kv_heads: [1]\n  head_dim: [576]\n  compare_modes: [vendor]\n",
     "vendor attends with one head dim for keys and values"),
    ("  layout: [ring]\n", "unknown layout 'ring'"),
])
def test_bad_kernel_cells_are_input_errors(matrix, message):
    text = "name: k\ndefaults:\n  workload: kernel\n  verify_mode: custom\nmatrix:\n" + matrix
    with pytest.raises(InputError, match=message) as err:
        parse_scenario(text, "k.yaml")
    assert str(err.value).startswith("k.yaml:")


def test_kernel_param_on_a_decode_cell_is_an_input_error():
    with pytest.raises(InputError, match="tree_tokens is a parameter of workload 'kernel' only"):
        parse_scenario("name: s\nmatrix:\n  tree_tokens: [16]\n", "s.yaml")


def test_context_limit_binds_decode_cells_only():
    text = "name: k\ndefaults:\n  workload: kernel\nmatrix:\n  context_length: [131072]\n"
    assert parse_scenario(text, "k.yaml").cells()[0]["context_length"] == 131072
    with pytest.raises(InputError, match="exceeds model 'tiny' limit"):
        parse_scenario("name: d\nmatrix:\n  context_length: [131072]\n", "d.yaml")
