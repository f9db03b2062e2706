"""The custom verify kernel's variant as a cell knob (custom_impl): what `auto` runs where, which
cells it belongs to, and that a result records it so the gate never mixes the two variants."""

from __future__ import annotations

import pytest

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.scenario import parse_scenario


def decode_cell(**kw) -> dict:
    return params.canonical({"workload": "decode", **kw})


@pytest.mark.parametrize("on_cuda,capability,expected", [
    (True, (9, 0), "wgmma_sumcheck"), (True, (8, 0), "mma"), (True, (12, 0), "mma"), (True, None, "mma"),
    (False, None, "mma")])
def test_auto_is_wgmma_on_hopper_only(on_cuda, capability, expected):
    cell = decode_cell(verify_mode="custom", model="qwen3-8b")       # head_dim 128
    assert params.resolve_kernels(cell, on_cuda, capability)["custom_impl"] == expected
    named = decode_cell(verify_mode="custom", model="qwen3-8b", custom_impl="mma")
    assert params.resolve_kernels(named, on_cuda, capability)["custom_impl"] == "mma"


@pytest.mark.parametrize("cell,expected", [
    ({"model": "tiny"}, "wgmma"),                          # head_dim 32
    ({"model": "qwen3-8b", "checkpoint": "ckpt"}, "wgmma"),  # a checkpoint's head dim: unknown
])
def test_the_pv_wgmma_only_where_the_head_dim_is_128_or_mla(cell, expected):
    cell = decode_cell(verify_mode="custom", **cell)
    assert params.resolve_kernels(cell, True, (9, 0))["custom_impl"] == expected
    assert params.custom_auto("hopper", 576, mla=True) == "wgmma_tma"
    assert params.custom_auto("hopper", 64) == "wgmma"
    assert params.custom_auto("cuda", 128) == "mma"


def test_the_knob_belongs_to_cells_that_run_the_custom_kernel():
    assert "custom_impl" in params.cell_kernels(decode_cell(verify_mode="custom"))
    assert "custom_impl" in params.cell_kernels(decode_cell(verify_mode="custom", speculation="none"))
    assert "custom_impl" not in params.cell_kernels(decode_cell(verify_mode="triton"))
    kernel = {"workload": "kernel", "verify_mode": "triton", "compare_modes": "custom,sdpa"}
    assert params.cell_kernels(kernel) == ("custom_impl",)
    assert params.cell_kernels({"workload": "kernel", "verify_mode": "triton"}) == ()


def test_auto_keeps_the_cell_id_and_a_named_variant_is_another_cell():
    base = {"workload": "kernel", "verify_mode": "custom", "context_length": 4096}
    assert params.cell_id({**base, "custom_impl": "auto"}) == params.cell_id(base)
    assert params.cell_id({**base, "custom_impl": "wgmma"}) != params.cell_id(base)


def test_a_result_from_before_the_knob_ran_mma():
    old = {"cell": {"workload": "kernel", "verify_mode": "custom", "context_length": 4096}}
    assert params.kernels_ran(old) == {"custom_impl": "mma"}
    new = {**old, "kernels": {"custom_impl": "wgmma_pv"}}
    assert params.kernels_ran(new) != params.kernels_ran(old)


@pytest.mark.parametrize("defaults,matrix,message", [
    ("  workload: decode\n  verify_mode: triton\n", "  custom_impl: [wgmma]\n",
     "custom_impl picks the kernel of verify_mode: custom"),
    ("  workload: kernel\n  verify_mode: triton\n", "  custom_impl: [mma]\n",
     "this cell does not time the custom kernel"),
    ("  workload: noop\n", "  custom_impl: [mma]\n", "custom_impl picks kernels of the decode workload"),
    ("  workload: kernel\n  verify_mode: custom\n", "  custom_impl: [tensor]\n", "custom_impl"),
])
def test_a_knob_that_picks_nothing_is_refused(defaults, matrix, message):
    text = "name: c\ndefaults:\n" + defaults + "matrix:\n" + matrix
    with pytest.raises(InputError, match=message) as err:
        parse_scenario(text, "c.yaml")
    assert str(err.value).startswith("c.yaml:")


# The variants measured slower and removed (kernels/NOTES.md, sessions 26-32).
REMOVED_IMPLS = ("wgmma_merge", "wgmma_ahead", "wgmma_polyexp")


@pytest.mark.parametrize("impl", REMOVED_IMPLS)
@pytest.mark.parametrize("where", ["matrix:\n  custom_impl: [{}]\n",
                                   "  custom_impl: {}\nmatrix:\n  context_length: [4096]\n"],
                         ids=["matrix", "defaults"])
def test_a_removed_variant_is_refused_as_any_unknown_name(impl, where):
    """A removed variant is no longer a name: a scenario that asks for one, in its matrix or its
    defaults, is refused with the line and column of the value, as a misspelt name is, before
    anything runs."""
    text = ("name: c\ndefaults:\n  workload: kernel\n  verify_mode: custom\n  device: cuda\n"
            + where.format(impl))
    with pytest.raises(InputError, match=f"unknown custom_impl '{impl}' \\(allowed: auto, mma, ") as err:
        parse_scenario(text, "c.yaml")
    assert str(err.value).startswith("c.yaml:") and "\n" not in str(err.value)
    assert impl not in str(err.value).split("allowed:", 1)[1]


def test_a_kernel_cell_may_name_the_variant():
    text = ("name: c\ndefaults:\n  workload: kernel\n  verify_mode: custom\n  device: cuda\n"
            "matrix:\n  custom_impl: [mma, wgmma]\n")
    cells = parse_scenario(text, "c.yaml").cells()
    assert sorted(c["custom_impl"] for c in cells) == ["mma", "wgmma"]


def test_the_pipelined_kernels_variants_are_cells_of_their_own_and_never_auto():
    """wgmma_pv (what auto ran on Hopper until session 31's wgmma_sumcheck, 1.03-1.06x faster at
    65 tree tokens) and wgmma_tail (kernels/NOTES.md, session 27: level with wgmma_pv) are chosen
    by name only, each its own cell; no device class gets them from `auto` (at GQA head dim 128)."""
    variants = ("wgmma_pv", "wgmma_tail")
    text = ("name: c\ndefaults:\n  workload: kernel\n  verify_mode: custom\n  device: cuda\n"
            f"matrix:\n  custom_impl: [wgmma_sumcheck, {', '.join(variants)}]\n")
    cells = parse_scenario(text, "c.yaml").cells()
    assert len({params.cell_id(c) for c in cells}) == 3
    for device in ("hopper", "cuda", "cpu"):
        assert params.custom_auto(device, 128) not in variants
    assert params.custom_auto("hopper", 128) == "wgmma_sumcheck"
    for impl in variants:
        decode = decode_cell(verify_mode="custom", model="qwen3-8b", custom_impl=impl)
        assert params.resolve_kernels(decode, True, (9, 0))["custom_impl"] == impl


def test_a_kernel_cell_may_force_the_custom_kernels_split_count():
    """custom_splits (0: the plan's) sweeps the split plan through the product: a forced count
    is a cell of its own (and says so in its label), 0 keeps the ids of cells recorded before
    the knob, and a cell that does not time the custom kernel may not set it."""
    from harness.protocol.workloads import kernel as spec

    base = params.canonical({"workload": "kernel", "verify_mode": "custom", "context_length": 65536,
                             "tree_tokens": 65})
    before = {k: v for k, v in base.items() if k != "custom_splits"}
    assert params.cell_id(base) == params.cell_id(before)
    forced = {**base, "custom_splits": 8}
    assert params.cell_id(forced) != params.cell_id(base)
    assert spec.label(forced).endswith("splits=8") and "splits" not in spec.label(base)
    # a sweep over several variants: each row of a table says which variant it is
    assert spec.label({**forced, "custom_impl": "wgmma_tail"}).endswith("custom_impl=wgmma_tail splits=8")
    assert "custom_impl" not in spec.label(base)
    text = ("name: c\ndefaults:\n  workload: kernel\n  verify_mode: custom\n  device: cuda\n"
            "matrix:\n  custom_splits: [0, 8, 13]\n")
    assert sorted(c["custom_splits"] for c in parse_scenario(text, "c.yaml").cells()) == [0, 8, 13]
    for mode, value, message in (("triton", 8, "custom_splits sets the custom kernel's split count"),
                                 ("custom", -1, "custom_splits")):
        text = (f"name: c\ndefaults:\n  workload: kernel\n  verify_mode: {mode}\n"
                f"matrix:\n  custom_splits: [{value}]\n")
        with pytest.raises(InputError, match=message) as err:
            parse_scenario(text, "c.yaml")
        assert str(err.value).startswith("c.yaml:")


def test_the_protocols_variant_names_are_the_kernels():
    """A scenario's custom_impl is checked against the protocol's list (no torch there), the
    launch against custom_verify's: one name added to only one of them would pass validation and
    fail on the GPU host, or the reverse."""
    from harness.kernels.verify import custom_verify as cv
    from harness.protocol.workloads import decode

    assert decode.CUSTOM_IMPLS == cv.IMPLS
    assert decode.PIPELINED_IMPLS == cv.PIPELINED


def test_tma_ab_times_each_shape_by_both_copy_paths():
    """scenarios/tma-ab.yaml: every shape it times runs once with wgmma_pv and once with
    wgmma_tma, so `--across custom_impl=wgmma_pv:wgmma_tma` pairs them all."""
    from pathlib import Path
    from harness.sweep.scenario import load_scenario

    cells = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "tma-ab.yaml").cells()
    shapes: dict = {}
    for c in cells:
        key = (c["attention"], c["tree_tokens"], c["context_length"])
        shapes.setdefault(key, []).append(c["custom_impl"])
    assert {k[0] for k in shapes} == {"mla", "gqa"}
    assert all(sorted(v) == ["wgmma_pv", "wgmma_tma"] for v in shapes.values()), shapes
