"""The op workload: one kernel family of the decode step, at the loop's own shapes, timed.

Runner: harness/worker/workloads/op.py. `op` names the family; the decode knob that picks its
kernel in the loop picks it here too, so an op cell and the decode cells that run its kernel
read the same knob:

  op             kernel knob        shapes (from the model preset and the decode parameters)
  topk           topk_impl          drafter logits [batch, block_size - 1, vocab] -> top tree_budget
  tree_build     tree_build_impl    DDTree of tree_budget nodes over [batch, block_size - 1, k]
  fused_forward  fused_ops          one verify forward of the target: 1 + tree_budget tokens over
                 (+ blas_impl)      context_length (attention: verify_mode)
  linear         linear_impl        the weight GEMMs of one target layer (q/k/v, o, gate/up, down)
                 (+ blas_impl)      at the rows of one forward: 1 + tree_budget a sequence (the
                                    verify), 1 with speculation: none (plain decoding); one of
                                    them, or the lm_head, alone with linear_gemm
  accept         accept_impl        the verify's logits [batch, 1 + tree_budget, vocab] over a tree
                                    of tree_budget nodes -> the accepted path and the step's
                                    bookkeeping (greedy acceptance)

blas_impl, the library under the GEMMs torch runs, is the decode loop's: the two ops whose GEMMs
go to torch run under it as the loop does, and record it beside their own knob.

The verify attention on its own is the kernel workload (custom / triton / sdpa / flex,
contiguous and paged, GQA and MLA); scenarios/ops.yaml times every family, that one included.
"""

from __future__ import annotations

from harness.protocol import presets
from harness.protocol.workloads import WorkloadSpec, choice, yaml_word

OPS = ("topk", "tree_build", "fused_forward", "linear", "accept")
# The knob of each family, and the values that run on a CPU host (torch, or no fusion).
KNOBS = {"topk": "topk_impl", "tree_build": "tree_build_impl", "fused_forward": "fused_ops",
         "linear": "linear_impl", "accept": "accept_impl"}
# The library under the GEMMs torch runs (decode's blas_impl): the ops whose GEMMs go to torch
# (the verify forward's, the linear op's beyond the kernels of linear_impl) run under it too,
# as the loop does, and it is part of what they ran.
BLAS = "blas_impl"
BLAS_OPS = ("fused_forward", "linear")
ON_CPU = {"topk_impl": "torch", "tree_build_impl": "torch", "fused_ops": False,
          "linear_impl": "torch", "accept_impl": "torch", BLAS: "torch"}
# The knobs' defaults (decode's IMPL_PARAMS: `auto`, the kernel measured fastest on the cell's
# device), restated: a spec imports no other spec's module.
KNOB_DEFAULTS = {"fused_ops": "auto", "topk_impl": "auto", "tree_build_impl": "auto",
                 "linear_impl": "auto", "accept_impl": "auto", BLAS: "auto"}


def op_knobs(op: str) -> tuple[str, ...]:
    """The knobs whose kernels an op cell runs: its family's, and blas_impl where it runs GEMMs."""
    return (KNOBS[op],) + ((BLAS,) if op in BLAS_OPS else ())

# The linear op's GEMMs: one target layer's four (`layer`), or one of them, or the lm_head alone.
LINEAR_GEMMS = ("layer", "qkv", "o", "gate_up", "down", "lm_head")

PARAMS = (choice("op", "topk", OPS), choice("linear_gemm", "layer", LINEAR_GEMMS, id_when_set=True))


def check_knobs(cell: dict):
    """One cell times one kernel: the knobs of the other families stay at their defaults, and
    a CPU cell runs what runs on a CPU."""
    own = KNOBS[cell["op"]]
    others = [k for k in KNOB_DEFAULTS if k not in op_knobs(cell["op"])
              and cell[k] != KNOB_DEFAULTS[k]]
    if others:
        return tuple(others), (f"op {cell['op']} times the kernel {own} picks; "
                               f"{', '.join(others)} pick{'s' if len(others) == 1 else ''} "
                               f"the kernels of other ops: leave them at their defaults")
    for knob in op_knobs(cell["op"]):
        if cell["device"] == "cpu" and cell[knob] not in (ON_CPU[knob], "auto"):
            what = "library" if knob == BLAS else "kernel"
            return (knob, "device"), (f"{knob} {yaml_word(cell[knob])} is a CUDA {what}; on "
                                      f"device cpu op {cell['op']} runs {knob}: "
                                      f"{yaml_word(ON_CPU[knob])}")
    return None


# The skinny linear kernel's most rows (kernels/linear/skinny_linear.py MAX_ROWS, restated:
# this module imports only the standard library); a forward of more runs cuBLAS.
SKINNY_MAX_ROWS = 16
STREAM_MAX_ROWS = 72        # the stream-K kernel's (linear_impl wgmma; kernels/linear/stream_linear.py)


def check_gemm(cell: dict):
    """linear_gemm picks the linear op's GEMMs; another op has none."""
    if cell["linear_gemm"] != "layer" and cell["op"] != "linear":
        return ("linear_gemm", "op"), (f"linear_gemm {cell['linear_gemm']} picks a GEMM of op linear; "
                                       f"op {cell['op']} has none (leave it at layer)")
    return None


def check_shape(cell: dict):
    """What the kernels take: the CUDA tree build keeps its state in shared memory (N <= 256,
    D <= 16, kernels/tree/cuda_tree_build.py); a forward's tree must fit the model's context;
    the skinny linear kernel takes up to SKINNY_MAX_ROWS rows, with the stream-K kernel
    (wgmma) up to STREAM_MAX_ROWS (a cell of more would time cuBLAS under their name)."""
    if cell["op"] == "tree_build" and cell["tree_build_impl"] == "cuda" and (
            cell["tree_budget"] > 256 or cell["block_size"] - 1 > 16):
        return ("tree_budget", "block_size", "tree_build_impl"), (
            f"tree_build_impl cuda builds up to 256 nodes over up to 16 positions (got "
            f"tree_budget {cell['tree_budget']}, block_size {cell['block_size']})")
    if (cell["op"] == "linear" and cell["linear_impl"] == "triton"
            and linear_rows(cell) > SKINNY_MAX_ROWS):
        return ("linear_impl", "tree_budget", "batch_size"), (
            f"linear_impl triton takes up to {SKINNY_MAX_ROWS} rows and leaves more to cuBLAS; "
            f"this cell's forward has {linear_rows(cell)} (linear_impl: torch times them)")
    if (cell["op"] == "linear" and cell["linear_impl"] == "wgmma"
            and linear_rows(cell) > STREAM_MAX_ROWS):
        return ("linear_impl", "tree_budget", "batch_size"), (
            f"linear_impl wgmma takes up to {STREAM_MAX_ROWS} rows and leaves more to cuBLAS; "
            f"this cell's forward has {linear_rows(cell)} (linear_impl: torch times them)")
    if cell["op"] == "fused_forward":
        limit = presets.max_context(cell["model"])
        if cell["context_length"] + 1 + cell["tree_budget"] > limit:
            return ("context_length", "model"), (
                f"context_length {cell['context_length']} plus a tree of {1 + cell['tree_budget']} "
                f"tokens exceeds model '{cell['model']}' limit {limit}")
    return None


def linear_rows(c: dict) -> int:
    """The rows of the linear op's GEMMs: one forward's tokens, every sequence's."""
    return c["batch_size"] * (1 if c["speculation"] == "none" else 1 + c["tree_budget"])


def label(c: dict) -> str:
    """e.g. `op topk triton qwen3-8b D=15 k=64`, `op fused_forward on qwen3-8b ctx=4096 T=65`,
    `op linear triton qwen3-8b rows=16`, `op linear wgmma qwen3-8b qkv rows=65` or
    `op linear torch qwen3-8b lm_head rows=65 blas=cublaslt_tuned`."""
    knob = c[KNOBS[c["op"]]]
    impl = ("on" if knob else "off") if isinstance(knob, bool) else knob
    parts = ["op", c["op"], impl, c["model"]]
    # the library under its GEMMs, where named: a cell apart from the same op on `auto`'s
    blas = [f"blas={c[BLAS]}"] if c["op"] in BLAS_OPS and c.get(BLAS, "auto") != "auto" else []
    if c["op"] == "fused_forward":
        parts += [f"ctx={c['context_length']}", f"T={1 + c['tree_budget']}",
                  f"verify={c['verify_mode']}"] + blas
    elif c["op"] == "linear":
        gemm = [] if c["linear_gemm"] == "layer" else [c["linear_gemm"]]
        return " ".join(parts + gemm + [f"rows={linear_rows(c)}"] + blas)
    elif c["op"] == "accept":
        parts += [f"T={1 + c['tree_budget']}"]
    else:
        parts += [f"D={c['block_size'] - 1}", f"k={c['tree_budget']}"]
    if c["batch_size"] != 1:
        parts.append(f"bs={c['batch_size']}")
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="op",
    runner="harness.worker.workloads.op:run",
    order=4,
    params=PARAMS,
    checks=(check_knobs, check_gemm, check_shape),
    label=label,
    policies={"kernel_us": {"direction": "lower", "threshold_rel": 0.03}},
)
