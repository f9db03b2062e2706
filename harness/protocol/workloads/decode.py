"""The decode workload: speculative (DDTree) or plain decoding of a preset model, timed.

Runner: harness/worker/workloads/decode.py. Its parameters predate workloads of their own, so
they are `shared_params`: every cell has them, whatever its workload (the kernel workload reads
verify_mode, context_length and batch_size from them), and moving them would change every id.
"""

from __future__ import annotations

from harness.protocol import presets
from harness.protocol.numbers import is_finite_number
from harness.protocol.workloads import (Param, WorkloadSpec, choice, non_negative_int,
                                       positive_int, yaml_word)

VERIFY_MODES = ("custom", "triton", "sdpa", "flex")
GRAPH_CAPTURES = ("none", "verify", "full")
TREE_BUILDS = ("cpu", "gpu")
ACCEPTS = ("cpu", "gpu")
ACCEPTANCES = ("greedy", "synthetic")
SPECULATIONS = ("ddtree", "none")
TOPK_IMPLS = ("torch", "triton")            # the drafter's top-k log-probs
TREE_BUILD_IMPLS = ("triton", "cuda", "torch")   # the kernel of tree_build: gpu
# the custom verify kernel: QK^T (and P V) on wgmma; wgmma_tail: wgmma_pv with the rows past the
# last full row block (65 tree tokens: one a KV head's query head) as tail rows of the full blocks;
# wgmma_sumcheck: wgmma_pv whose softmax takes a tile's max only where its exponentials' sums say
# the max may move; wgmma_tma: wgmma_pv with its tiles by tensor copies where the cache is contiguous
CUSTOM_IMPLS = ("mma", "wgmma", "wgmma_pv", "wgmma_tail", "wgmma_sumcheck", "wgmma_tma")
# P V on wgmma: head_dim 128 only
PIPELINED_IMPLS = ("wgmma_pv", "wgmma_tail", "wgmma_sumcheck", "wgmma_tma")
LINEAR_IMPLS = ("torch", "triton", "wgmma")  # the forward's weight GEMMs at decode's few rows
ACCEPT_IMPLS = ("torch", "triton")          # the accept's argmax, path and bookkeeping (accept: gpu)
# the library under the GEMMs that go to torch; cublaslt_tuned: cuBLASLt with each shape's
# algorithm timed at its first call in the process (kernels/linear/lt_linear.py)
BLAS_IMPLS = ("torch", "cublaslt", "cublaslt_tuned")
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

# Implementation knobs: which kernels a decode step runs, not what it computes (every choice
# gives the same tokens). Each defaults to `auto`: the kernel measured fastest where the cell
# runs (AUTO_KERNELS), resolved by the worker, which records in the result what ran (its
# `kernels`); the gate compares a cell only with a baseline that ran the same kernels. A knob
# joins a cell's id only when set (not auto), so a cell that names a kernel is another cell
# than one that leaves the choice to the harness.
AUTO = "auto"
IMPL_PARAMS = (
    # residual+RMSNorm, q/k norm+RoPE+KV write, SiLU*up fused (kernels/fused/triton_fused.py)
    choice("fused_ops", AUTO, (AUTO, True, False)),
    choice("topk_impl", AUTO, (AUTO,) + TOPK_IMPLS),   # triton: the three-launch top-k kernel
    # cuda: the shared-memory CUDA C++ tree build (tree_build: gpu)
    choice("tree_build_impl", AUTO, (AUTO,) + TREE_BUILD_IMPLS),
    # the custom verify kernel's S = QK^T (verify_mode: custom; kernels/verify/custom_verify.py):
    # mma.sync (any GPU from sm_80) or Hopper's warpgroup MMA
    choice("custom_impl", AUTO, (AUTO,) + CUSTOM_IMPLS),
    # the target's and drafter's weight GEMMs (q/k/v, o, gate/up, down, lm_head, the drafter's
    # fc) where a forward has few rows: cuBLAS; the skinny Triton kernel up to 16 rows
    # (kernels/linear/skinny_linear.py); wgmma: that kernel, and the verify's 17-72 rows on the
    # stream-K CUDA kernel (kernels/linear/stream_linear.py, Hopper, bf16). More rows than a kernel
    # takes always go to cuBLAS
    choice("linear_impl", AUTO, (AUTO,) + LINEAR_IMPLS),
    # accept: gpu's argmax over the tree's logits, accepted path and step bookkeeping: tensor
    # ops, or two Triton launches (kernels/accept/triton_accept.py)
    choice("accept_impl", AUTO, (AUTO,) + ACCEPT_IMPLS),
    # the GEMMs linear_impl leaves to torch (the verify's 65 rows on its default kernels,
    # prefill): torch's default BLAS library (cuBLAS on CUDA), or cuBLASLt, whose heuristics
    # pick other kernels at the verify's shapes (kernel_choice.blas_library)
    choice("blas_impl", AUTO, (AUTO,) + BLAS_IMPLS),
)
IMPL_DEFAULTS = {p.name: p.default for p in IMPL_PARAMS}
# What `auto` runs, by device. CUDA: the winners of the op and decode timings on an H200
# (results/h200/README.md: the fused forward 5.8 vs 8.0 ms at 4096, Triton top-k 26 vs 114 us,
# the CUDA tree build 65 vs 83 us for Triton). A CPU host runs the torch code, the only one there.
# The custom verify kernel on Hopper (9.0): both products on wgmma at head_dim 128 (0.62-0.84x
# the mma.sync variant's time at 64 and 65 tree tokens, 4k-64k, H200: kernels/NOTES.md, session
# 7) and for the MLA latent (62.97 vs 72.72 us at 65536 keys in one call, 57.15 after a second
# change; H200, kernels/NOTES.md, session 16), QK^T only at other head dims (the d64 P V failed
# the float64 check there); mma.sync on other GPUs. The GQA kernel with the sum-checked softmax
# (wgmma_sumcheck: bit-equal to wgmma_pv; 1.02-1.07x faster at 65 tree tokens over 4k-64k keys,
# level at 16, the loop at 64k 2-3 % more tokens/s and level at 4k; H100 and H200,
# kernels/NOTES.md, session 31); the MLA latent runs its own P V kernel with its tiles by tensor
# copies (wgmma_tma; see custom_auto).
# The skinny linear kernel on Hopper: graph-captured plain decoding of Qwen3-8B 2.1-2.8 % more
# tokens/s at 4k-64k (442 -> 370 kernels a step), gpu/full 0.4 % shorter steps at 4k, level at
# 64k (H200, results/h200/README.md, session 12); not measured on other GPUs.
# The Triton accept: two launches for ~30 (see kernels/accept/triton_accept.py) on any CUDA GPU.
# cuBLASLt on Hopper: at the verify's 65 rows it runs the down GEMM (12288 -> 4096) as one
# kernel where cuBLAS splits K into a second, reduce kernel (38.8 against 43.9 µs a call, 36 a
# step); gpu/full custom 2.2 / 1.7 / 0.6 % more tokens/s at 4k / 16k / 64k, idle 2.18 -> 1.82 %
# at 4k, 493 -> 457 kernels a step (H100; kernels/NOTES.md, session 35); the other GEMMs run
# the same kernels either way. Not measured on other GPUs.
AUTO_KERNELS = {
    "cuda": {"fused_ops": True, "topk_impl": "triton", "tree_build_impl": "cuda",
             "custom_impl": "mma", "linear_impl": "torch", "accept_impl": "triton",
             "blas_impl": "torch"},
    "hopper": {"fused_ops": True, "topk_impl": "triton", "tree_build_impl": "cuda",
               "custom_impl": "wgmma_sumcheck", "linear_impl": "triton", "accept_impl": "triton",
               "blas_impl": "cublaslt"},
    "cpu": {"fused_ops": False, "topk_impl": "torch", "tree_build_impl": "torch",
            "custom_impl": "mma", "linear_impl": "torch", "accept_impl": "torch",
            "blas_impl": "torch"},
}
# What a cell ran before the knobs had `auto`: a result that does not record its kernels ran
# its cell's knobs, and these where its cell predates a knob.
BEFORE_AUTO = {"fused_ops": False, "topk_impl": "torch", "tree_build_impl": "triton",
               "custom_impl": "mma", "linear_impl": "torch", "accept_impl": "torch",
               "blas_impl": "torch"}


def device_class(cuda: bool, capability: tuple[int, int] | None = None) -> str:
    """The AUTO_KERNELS row of a device: cpu, cuda, or hopper (compute capability 9.0)."""
    if not cuda:
        return "cpu"
    return "hopper" if capability is not None and tuple(capability) == (9, 0) else "cuda"


# The CUDA tree build keeps a tree in shared memory: up to this many nodes over this many
# drafted positions (kernels/tree/cuda_tree_build.py); `auto` takes Triton's beyond.
CUDA_TREE_MAX_NODES, CUDA_TREE_MAX_DEPTH = 256, 16


def custom_auto(device: str, head_dim: int | None, mla: bool = False) -> str:
    """What custom_impl `auto` runs on a device class for a head dim (None: not known here)."""
    impl = AUTO_KERNELS[device]["custom_impl"]
    if impl in PIPELINED_IMPLS and mla:
        # The latent's own P V kernel, its tiles by tensor copies (contiguous caches; a paged one
        # runs it by cp.async): 1.09-1.12x faster than by cp.async from 32k keys on an H100,
        # level to 1.15x at 16k (kernels/NOTES.md, session 57). The GQA variants are not its.
        return "wgmma_tma"
    if impl in PIPELINED_IMPLS and head_dim != 128:
        return "wgmma"        # the GQA P V wgmma is checked at head_dim 128 only
    return impl


def resolve_kernels(cell: dict, cuda: bool, capability: tuple[int, int] | None = None) -> dict:
    """Every knob of `cell` with `auto` replaced by what it runs on this device (a CUDA device's
    compute capability where known) and shape (a checkpoint's head dim is not known here)."""
    device = device_class(cuda, capability)
    auto = dict(AUTO_KERNELS[device])
    head_dim = (None if cell.get("checkpoint")
                else presets.PRESETS[cell["model"]]["target"]["head_dim"])
    auto["custom_impl"] = custom_auto(device, head_dim)
    if auto["tree_build_impl"] == "cuda" and (cell["tree_budget"] > CUDA_TREE_MAX_NODES
                                              or cell["block_size"] - 1 > CUDA_TREE_MAX_DEPTH):
        auto["tree_build_impl"] = "triton"
    return {k: auto[k] if cell[k] == AUTO else cell[k] for k in IMPL_DEFAULTS}


def kernel_knobs(cell: dict) -> tuple[str, ...]:
    """The knobs that pick a kernel this decode cell runs: the fused forward and the weight
    GEMMs always, the top-k where there is a tree, the tree build's kernel where the tree is
    built on the GPU, the accept's where the accept runs there."""
    custom = ("custom_impl",) if cell["verify_mode"] == "custom" else ()
    if cell["speculation"] == "none":
        return ("fused_ops", "linear_impl", "blas_impl") + custom
    return (("fused_ops", "topk_impl") + (("tree_build_impl",) if cell["tree_build"] == "gpu" else ())
            + custom + ("linear_impl", "blas_impl")
            + (("accept_impl",) if cell["accept"] == "gpu" else ()))


# decode's own parameters (its cells only). check_tokens: after the timed windows, decode this
# many tokens per sequence under greedy acceptance with the cell's loop and compare every one
# with plain greedy decoding of the target (harness/worker/lossless.py); 0 = no check. How a
# cell is checked, not what it measures: not part of its id.
PARAMS = (non_negative_int("check_tokens", 0, measurement=True),
          # seconds a repeat decodes at the cell's context before its warm-up steps (stepping,
          # rewinding to the prefill's state, stepping on), so the window times a GPU that has
          # settled into sustained decoding rather than the start of a burst; null: the
          # device's default (settle_seconds)
          Param("warmup_s", None, float, "a number of seconds >= 0, or null (the device's "
                "default)", ge=0, le=600, nullable=True, measurement=True))

# A repeat settles this long on a GPU. Its reset and prefill are a pause, after which the first
# step runs 2-4 % slow and, where the GPU decodes at its power cap, steps slow ~2 % over the
# first 2 s and then hold (an H100 at 64k, steady from 2 s to 18 s; an H200's 8-step windows
# read 1-5 % faster than 96-step ones): without settling, a window's time depends on what ran
# before it (kernels/NOTES.md, sessions 41-42). A CPU's loop is timed as it starts, as before.
GPU_SETTLE_S = 2.0


def settle_seconds(cell: dict, cuda: bool) -> float:
    """How long a repeat of `cell` decodes before its warm-up steps (warmup_s, resolved)."""
    if cell["warmup_s"] is not None:
        return float(cell["warmup_s"])
    return GPU_SETTLE_S if cuda else 0.0


def settled(result: dict) -> float | None:
    """How long each repeat of a result settled before its window, as the worker recorded it
    (`settle.seconds`): 0 for a decode result from before settling, whose windows were timed
    unsettled; None for another workload's result, or one whose cell is not known. The gate
    compares a decode cell only with a baseline that settled as long."""
    cell = result.get("cell")
    if not isinstance(cell, dict) or cell.get("workload", "decode") != "decode":
        return None
    seconds = (result.get("settle") or {}).get("seconds", 0.0)
    return float(seconds) if is_finite_number(seconds) else None


def check_lossless(cell: dict):
    """Plain decoding is the reference the check compares with: nothing to check there."""
    if cell["check_tokens"] and cell["speculation"] == "none":
        return ("check_tokens", "speculation"), (
            "check_tokens compares speculative decoding with plain greedy decoding; this cell "
            "decodes plainly (speculation: none)")
    return None


# The steps a decode cell runs besides its warm-up and timed windows (harness/worker/workloads/
# decode.py): in the last repeat on a GPU, the profiled window with the same window run
# unprofiled just before and just after it, each after at most PROFILE_WARMUP steps (the fast
# loops' steps in flight, plus one), then the sync audit's AUDIT_STEPS.
PROFILE_WARMUP = 3
AUDIT_STEPS = 3


def profiling_steps(cell: dict) -> int:
    return 3 * (cell["profile_steps"] + PROFILE_WARMUP) + AUDIT_STEPS


def repeat_steps(cell: dict) -> int:
    """The most steps a decoder takes between two prefills of a repeat (a settle's runs are
    rewound, so never more): its warm-up steps, its window, the profiling. What its KV cache
    and synthetic draws are sized for."""
    return cell["warmup_steps"] + cell["steps"] + profiling_steps(cell)


def decoded_tokens_bound(cell: dict) -> int:
    """The most positions a cell's decoding can add to the KV cache after the prompt.

    Conservative on purpose: every step (warm-up, timed, profiling) may commit a whole block,
    no repeat is assumed to restart from the prompt, and the last verify adds a tree of
    1 + tree_budget tokens on top.
    """
    step_count = repeat_steps(cell) + (cell["repeats"] - 1) * cell["steps"]
    if cell["speculation"] == "none":
        return step_count
    # The lossless check decodes from a fresh prompt of the same length: its steps, not added.
    steps = max(step_count, cell.get("check_tokens", 0) + 2)
    return steps * cell["block_size"] + 1 + cell["tree_budget"]


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
    if cell["graph_capture"] != "none" and cell["device"] == "cpu":
        return ("graph_capture", "device"), (
            f"graph_capture '{cell['graph_capture']}' records CUDA graphs; this cell runs on "
            f"device 'cpu' (graph_capture: none, or device: cuda / auto)")
    # Plain decoding (speculation: none) has no tree and no accept walk: any capture works.
    if (cell["graph_capture"] == "full" and cell["speculation"] != "none"
            and (cell["tree_build"], cell["accept"]) != ("gpu", "gpu")):
        return ("graph_capture",), ("graph_capture 'full' captures tree build and accept in one "
                                    "replay: it needs tree_build: gpu and accept: gpu")
    return None


def check_impl(cell: dict):
    """Implementation knobs pick kernels of the decode loop: nothing else runs them, and a CPU
    runs only the torch code."""
    if cell["workload"] == "op":     # one knob picks the kernel an op cell times: its own check
        return None
    named = [k for k in IMPL_DEFAULTS if cell[k] != AUTO]
    if not named:
        return None
    if cell["workload"] == "kernel" and named == ["custom_impl"]:
        return None      # the kernel workload times the custom kernel too (its own check)
    if cell["workload"] != "decode":
        return tuple(named), (f"{', '.join(named)} pick{'s' if len(named) == 1 else ''} kernels "
                              f"of the decode workload; this cell runs workload "
                              f"'{cell['workload']}'")
    cuda = [k for k in named if cell["device"] == "cpu" and cell[k] != AUTO_KERNELS["cpu"][k]]
    if cuda:
        return tuple(cuda), (f"{', '.join(f'{k} {yaml_word(cell[k])}' for k in cuda)} "
                             f"pick{'s' if len(cuda) == 1 else ''} CUDA kernels; this cell runs "
                             f"on device 'cpu' (leave {'it' if len(cuda) == 1 else 'them'} auto)")
    if cell["custom_impl"] != AUTO and cell["verify_mode"] != "custom":
        return ("custom_impl", "verify_mode"), (
            f"custom_impl picks the kernel of verify_mode: custom; this cell verifies with "
            f"'{cell['verify_mode']}'")
    if cell["tree_build_impl"] != AUTO and cell["tree_build"] != "gpu":
        return ("tree_build_impl", "tree_build"), (
            "tree_build_impl picks the kernel of tree_build: gpu; this cell builds "
            "its trees on the host (tree_build: cpu)")
    return None


def acceptance_word(c: dict, tau: str = "tau") -> str | None:
    """`greedy` or `synthetic tau=4` for a speculative decode cell, None for plain decoding:
    whether its accepted length is real argmax matching or drawn, which every name of the cell
    must say (a synthetic cell's tokens/s is not the model's). The one spelling the label and
    the report's names share; `tau` is the sign the report draws (`τ`). Missing keys read as
    their defaults, so journaled cells of any age are named alike."""
    if c.get("speculation", "ddtree") == "none":
        return None
    if c.get("acceptance", "greedy") == "synthetic":
        value = c.get("tau", 6.5)
        return f"synthetic {tau}={value:g}" if isinstance(value, (int, float)) else "synthetic"
    return "greedy"


def label(c: dict) -> str:
    """e.g. `qwen3-8b ctx=32768 N=64 verify=sdpa graph=none tree=cpu greedy`: knobs left at
    their defaults are omitted unless they are the ones sweeps usually vary; a speculative
    cell always says its acceptance (acceptance_word). Labels are not in cell ids, so
    renaming changes no id."""
    parts = [c["model"], f"ctx={c['context_length']}"]
    if c["speculation"] == "none":  # plain decoding: no tree, no accept walk, no acceptance model
        parts += ["spec=none", f"verify={c['verify_mode']}", f"graph={c['graph_capture']}"]
    else:
        parts += [f"N={c['tree_budget']}", f"verify={c['verify_mode']}",
                  f"graph={c['graph_capture']}", f"tree={c['tree_build']}"]
        if c["accept"] != "cpu":
            parts.append(f"accept={c['accept']}")
        parts.append(acceptance_word(c))
    if c["batch_size"] != 1:
        parts.append(f"bs={c['batch_size']}")
    parts += [k if c[k] is True else f"{k}={yaml_word(c[k])}"
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
    params=PARAMS,
    checks=(check_context, check_lossless),
    label=label,
    policies={
        "tokens_per_s": {"direction": "higher", "threshold_rel": 0.03},
        "accept_len_mean": {"direction": "higher", "threshold_rel": 0.03},
        # one sample per worker run (the profiled window): reported, not gated
        "idle_fraction": {"direction": "lower", "threshold_abs": 0.02, "gate": False, "per": "run"},
        # the profiled window against the same window unprofiled either side of it
        # (scenarios/profiler-overhead.yaml)
        "profiler_overhead_pct": {"direction": "lower", "threshold_abs": 1.0, "gate": False,
                                  "per": "run"},
        "step_ms_p50": {"direction": "lower", "threshold_rel": 0.03},
    },
)
