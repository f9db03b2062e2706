"""The decode workload: speculative (DDTree) or plain decoding of a preset model, timed.

Runner: harness/worker/workloads/decode.py. Its parameters predate workloads of their own, so
they are `shared_params`: every cell has them, whatever its workload (the kernel workload reads
verify_mode, context_length and batch_size from them), and moving them would change every id.
"""

from __future__ import annotations

from harness.protocol import presets
from harness.protocol.workloads import Param, WorkloadSpec, choice, flag, positive_int

VERIFY_MODES = ("custom", "triton", "sdpa", "flex")
GRAPH_CAPTURES = ("none", "verify", "full")
TREE_BUILDS = ("cpu", "gpu")
ACCEPTS = ("cpu", "gpu")
ACCEPTANCES = ("greedy", "synthetic")
SPECULATIONS = ("ddtree", "none")
TOPK_IMPLS = ("torch", "triton")            # the drafter's top-k log-probs
TREE_BUILD_IMPLS = ("triton", "cuda", "torch")   # the kernel of tree_build: gpu
PRESETS = ("tiny", "qwen3-8b", "kimi-k2.6-rank")  # shapes in harness/protocol/presets.py

SHARED_PARAMS = (
    choice("model", "tiny", tuple(presets.PRESETS)),   # a preset name
    # a local HF-format safetensors checkpoint (overrides the preset's random weights)
    Param("checkpoint", None, str, "a path to a local checkpoint (or null)", nullable=True),
    positive_int("context_length", 256),   # tokens already in the KV cache when decoding starts
    positive_int("batch_size", 1),
    choice("verify_mode", "sdpa", VERIFY_MODES),
    choice("graph_capture", "none", GRAPH_CAPTURES),
    choice("tree_build", "cpu", TREE_BUILDS),
    choice("accept", "cpu", ACCEPTS),
    choice("speculation", "ddtree", SPECULATIONS),
    choice("acceptance", "greedy", ACCEPTANCES),
    # mean accepted length per step when acceptance is synthetic
    Param("tau", 6.5, float, "a number >= 1", ge=1),
    positive_int("tree_budget", 16),       # DDTree node budget N
    # DFlash block size B (bonus + B-1 drafted positions)
    Param("block_size", 8, int, "an integer >= 2", ge=2),
)

# Implementation knobs: which kernels a CUDA decode step runs, not what it computes. Each joins
# a cell's id only when set away from its default, so cells (and their baselines) from before
# a knob existed keep their ids, and a cell that switches a kernel on is a different cell.
IMPL_PARAMS = (
    flag("fused_ops", False),              # residual+RMSNorm, q/k norm+RoPE+KV write, SiLU*up fused
    choice("topk_impl", "torch", TOPK_IMPLS),   # triton: the three-launch top-k + logsumexp kernel
    # cuda: the shared-memory CUDA C++ tree build (tree_build: gpu)
    choice("tree_build_impl", "triton", TREE_BUILD_IMPLS),
)
IMPL_DEFAULTS = {p.name: p.default for p in IMPL_PARAMS}


def decoded_tokens_bound(cell: dict) -> int:
    """The most positions a cell's decoding can add to the KV cache after the prompt.

    Conservative on purpose: every step (warm-up, timed, profiled) may commit a whole block,
    no repeat is assumed to restart from the prompt, and the last verify adds a tree of
    1 + tree_budget tokens on top.
    """
    step_count = cell["warmup_steps"] + cell["repeats"] * cell["steps"] + cell["profile_steps"]
    if cell["speculation"] == "none":
        return step_count
    return step_count * cell["block_size"] + 1 + cell["tree_budget"]


def check_context(cell: dict):
    """A model's context limit binds only the cells that run it (decode cells)."""
    limit = presets.max_context(cell["model"])
    context = cell["context_length"]
    at = ("context_length", "model")
    if context > limit:
        return at, f"context_length {context} exceeds model '{cell['model']}' limit {limit}"
    decoded = decoded_tokens_bound(cell)
    if context + decoded > limit:
        return at, (f"context_length {context} plus up to {decoded} decoded tokens "
                    f"exceeds model '{cell['model']}' limit {limit}")
    return None


def check_tau(cell: dict):
    # tau only drives synthetic acceptance; greedy cells ignore it, so their block size is free.
    if cell["acceptance"] == "synthetic" and cell["tau"] > cell["block_size"]:
        return ("tau", "block_size", "acceptance"), (
            f"tau {cell['tau']} exceeds block_size {cell['block_size']}: a step "
            f"accepts at most block_size tokens")
    return None


def check_graph_capture(cell: dict):
    # Plain decoding (speculation: none) has no tree and no accept walk: any capture works.
    if (cell["graph_capture"] == "full" and cell["speculation"] != "none"
            and (cell["tree_build"], cell["accept"]) != ("gpu", "gpu")):
        return ("graph_capture",), ("graph_capture 'full' captures tree build and accept in one "
                                    "replay: it needs tree_build: gpu and accept: gpu")
    return None


def check_impl(cell: dict):
    """Implementation knobs pick CUDA kernels of the decode loop: nothing else runs them."""
    if cell["workload"] == "op":     # one knob picks the kernel an op cell times: its own check
        return None
    changed = [k for k, v in IMPL_DEFAULTS.items() if cell[k] != v]
    if not changed:
        return None
    if cell["workload"] != "decode" or cell["device"] == "cpu":
        return tuple(changed), (f"{', '.join(changed)} pick{'s' if len(changed) == 1 else ''} CUDA "
                                f"kernels of the decode workload; "
                                f"this cell runs workload '{cell['workload']}' on device "
                                f"'{cell['device']}'")
    if cell["tree_build_impl"] != IMPL_DEFAULTS["tree_build_impl"] and cell["tree_build"] != "gpu":
        return ("tree_build_impl", "tree_build"), (
            "tree_build_impl picks the kernel of tree_build: gpu; this cell builds "
            "its trees on the host (tree_build: cpu)")
    return None


def label(c: dict) -> str:
    """e.g. `qwen3-8b ctx=32768 N=64 verify=sdpa graph=none tree=cpu`: knobs left at their
    defaults are omitted unless they are the ones sweeps usually vary."""
    parts = [c["model"], f"ctx={c['context_length']}"]
    if c["speculation"] == "none":  # plain decoding: no tree, no accept walk, no acceptance model
        parts += ["spec=none", f"verify={c['verify_mode']}", f"graph={c['graph_capture']}"]
    else:
        parts += [f"N={c['tree_budget']}", f"verify={c['verify_mode']}",
                  f"graph={c['graph_capture']}", f"tree={c['tree_build']}"]
        if c["accept"] != "cpu":
            parts.append(f"accept={c['accept']}")
        if c["acceptance"] == "synthetic":
            parts.append(f"tau={c['tau']:g}")
    if c["batch_size"] != 1:
        parts.append(f"bs={c['batch_size']}")
    parts += [k if c[k] is True else f"{k}={c[k]}"
              for k, v in IMPL_DEFAULTS.items() if c.get(k, v) != v]
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="decode",
    runner="harness.worker.workloads.decode:run",
    order=0,
    shared_params=SHARED_PARAMS,
    impl_params=IMPL_PARAMS,
    # tau, graph_capture and the kernel knobs are in every cell, so every cell is checked
    shared_checks=(check_tau, check_graph_capture, check_impl),
    checks=(check_context,),
    label=label,
    policies={
        "tokens_per_s": {"direction": "higher", "threshold_rel": 0.03},
        "accept_len_mean": {"direction": "higher", "threshold_rel": 0.03},
        # one sample per worker run (the profiled window): reported, not gated
        "idle_fraction": {"direction": "lower", "threshold_abs": 0.02, "gate": False, "per": "run"},
        # the profiled window against the timed ones (scenarios/profiler-overhead.yaml)
        "profiler_overhead_pct": {"direction": "lower", "threshold_abs": 1.0, "gate": False,
                                  "per": "run"},
        "step_ms_p50": {"direction": "lower", "threshold_rel": 0.03},
    },
)
