"""The kernel workload: one verify-attention kernel at one shape, against its roofline.

Runner: harness/worker/workloads/kernel.py. The cell's verify_mode, context_length and batch_size
(decode's shared parameters) say which kernel runs over how long a prefix, for how many sequences.
"""

from __future__ import annotations

from harness.protocol.workloads import Param, WorkloadSpec, choice, non_negative_int, positive_int
from harness.protocol.workloads.decode import VERIFY_MODES

ATTENTIONS = ("gqa", "mla")        # grouped-query heads, or the MLA latent (one 576-wide head)
LAYOUTS = ("contiguous", "paged")  # KV cache layout

# What a kernel cell can also time beside its verify_mode: the loop's verify modes, and `vendor`
# (kernels/verify/vendor_verify.py: torch's fused attention over the prefix, merged with the tree
# block; it slices each prefix on the host, so it is a kernel-cell peer, not a loop mode).
COMPARE_MODES = VERIFY_MODES + ("vendor",)
_MODE = "(" + "|".join(COMPARE_MODES) + ")"
_MODE_LIST = rf"^({_MODE}(,{_MODE})*)?$"

PARAMS = (
    choice("attention", "gqa", ATTENTIONS),   # mla: kv_heads 1, head_dim 576 (values: its first 512)
    positive_int("tree_tokens", 16),          # T: queries of one verify forward (root + tree nodes)
    positive_int("heads", 32),                # query heads
    positive_int("kv_heads", 8),
    positive_int("head_dim", 128),
    # KV cache: contiguous [b, Hkv, S, d] or paged [pages, Hkv, ps, d]
    choice("layout", "contiguous", LAYOUTS),
    positive_int("page_size", 16),            # paged layout only
    # comma-separated verify modes also timed in this cell (adds metrics: not in the id)
    Param("compare_modes", "", str,
          "a comma-separated list of verify modes (custom, triton, sdpa, flex, vendor), or ''",
          pattern=_MODE_LIST, measurement=True),
    # The custom kernel's split-KV count: 0 takes its plan (custom_verify.plan); N forces N
    # splits, to sweep the plan's choice through the product (`--across custom_splits=0:8`).
    non_negative_int("custom_splits", 0, id_when_set=True),
)


def check_shape(cell: dict):
    """Shapes a verify-attention kernel cell can have (harness/worker/workloads/kernel.py)."""
    heads, kv_heads = cell["heads"], cell["kv_heads"]
    if cell["attention"] == "mla":
        if kv_heads != 1 or cell["head_dim"] != 576:
            return ("kv_heads", "head_dim", "attention"), (
                "attention mla is one latent KV head of 576 values (512 latent + "
                "64 rope; values are the first 512): set kv_heads: 1, head_dim: 576")
    group = heads // kv_heads
    if heads % kv_heads or group & (group - 1):
        return ("heads", "kv_heads"), (
            f"heads {heads} over kv_heads {kv_heads} is not a power-of-two group")
    modes = [cell["verify_mode"]] + [m for m in cell["compare_modes"].split(",") if m]
    if len(set(modes)) != len(modes):
        return ("compare_modes", "verify_mode"), (
            f"compare_modes '{cell['compare_modes']}' repeats a mode or names the "
            f"cell's own verify_mode '{cell['verify_mode']}'")
    if cell["attention"] == "gqa" and "custom" in modes and cell["head_dim"] not in (64, 128):
        return ("head_dim",), (
            f"the custom kernel supports head_dim 64 and 128, not {cell['head_dim']}")
    if cell.get("custom_impl", "auto") != "auto" and "custom" not in modes:
        return ("custom_impl", "verify_mode", "compare_modes"), (
            "custom_impl picks the custom kernel's variant; this cell does not time the custom "
            "kernel (verify_mode or compare_modes: custom)")
    if cell.get("custom_splits", 0) and "custom" not in modes:
        return ("custom_splits", "verify_mode", "compare_modes"), (
            "custom_splits sets the custom kernel's split count; this cell does not time the "
            "custom kernel (verify_mode or compare_modes: custom)")
    if cell["layout"] == "paged" and {"sdpa", "flex", "vendor"} & set(modes):
        return ("layout", "verify_mode", "compare_modes"), (
            "sdpa, flex and vendor read a contiguous cache only: drop them from paged cells")
    if cell["attention"] == "mla" and "vendor" in modes:
        return ("attention", "compare_modes"), (
            "vendor attends with one head dim for keys and values: drop it from mla cells")
    return None


def label(c: dict) -> str:
    """e.g. `kernel custom ctx=65536 T=16 gqa 32/8 d128 contiguous`, or with the knobs a sweep
    sets: `... contiguous custom_impl=wgmma_tail splits=8`."""
    parts = ["kernel", c["verify_mode"], f"ctx={c['context_length']}", f"T={c['tree_tokens']}",
             c["attention"], f"{c['heads']}/{c['kv_heads']}", f"d{c['head_dim']}", c["layout"]]
    if c["layout"] == "paged":
        parts.append(f"ps={c['page_size']}")
    if c["batch_size"] != 1:
        parts.append(f"bs={c['batch_size']}")
    # the custom kernel's variant when a cell picks one: cells that differ only in it (a sweep
    # across custom_splits over several variants) would otherwise read alike in a table
    if c.get("custom_impl", "auto") != "auto":
        parts.append(f"custom_impl={c['custom_impl']}")
    if c.get("custom_splits", 0):
        parts.append(f"splits={c['custom_splits']}")
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="kernel",
    runner="harness.worker.workloads.kernel:run",
    order=3,
    params=PARAMS,
    checks=(check_shape,),
    label=label,
    policies={"kernel_us": {"direction": "lower", "threshold_rel": 0.03}},
)
