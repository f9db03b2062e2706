"""The parameters of one cell: names, allowed values, defaults.

This module is the single source of truth shared by the controller (scenario validation,
cell ids, MLflow params) and the worker (which reads a cell from JSON). It imports only the
standard library, so the worker can use it on a GPU host with nothing installed.

A *cell* is one point of a scenario's matrix: a flat dict of the parameters below, all
JSON scalars. Its id is a hash of its canonical form (see `cell_id`).
"""

from __future__ import annotations

import hashlib
import json

# Allowed values of the enumerated knobs (docs/ARCHITECTURE.md, "Knobs each cell sets").
WORKLOADS = ("decode", "calibrate", "noop", "kernel")
VERIFY_MODES = ("custom", "triton", "sdpa", "flex")
GRAPH_CAPTURES = ("none", "verify", "full")
TREE_BUILDS = ("cpu", "gpu")
ACCEPTS = ("cpu", "gpu")
ACCEPTANCES = ("greedy", "synthetic")
SPECULATIONS = ("ddtree", "none")
DEVICES = ("auto", "cpu", "cuda")
TOPK_IMPLS = ("torch", "triton")            # decode: the drafter's top-k log-probs
TREE_BUILD_IMPLS = ("triton", "cuda", "torch")   # decode: the kernel of tree_build: gpu
DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")
REPLAYS = ("eager", "graph")   # calibrate: eager launches or one CUDA graph replay per step
PRESETS = ("tiny", "qwen3-8b", "kimi-k2.6-rank")  # shapes in harness/protocol/presets.py
ATTENTIONS = ("gqa", "mla")        # kernel: grouped-query heads, or the MLA latent (one 576-wide head)
LAYOUTS = ("contiguous", "paged")  # kernel: KV cache layout

# Every cell parameter with its default. A scenario's `defaults:` and `matrix:` may set any of
# these and nothing else. Changing a default changes the ids of cells that relied on it, so
# defaults are folded into the id (see `canonical`).
DEFAULTS: dict[str, object] = {
    "workload": "decode",
    "model": "tiny",              # a preset name
    "checkpoint": None,           # path to a local HF-format safetensors checkpoint (overrides weights)
    "context_length": 256,        # tokens already in the KV cache when decoding starts
    "batch_size": 1,
    "verify_mode": "sdpa",
    "graph_capture": "none",
    "tree_build": "cpu",
    "accept": "cpu",
    "speculation": "ddtree",
    "acceptance": "greedy",
    "tau": 6.5,                   # mean accepted length per step when acceptance is synthetic
    "tree_budget": 16,            # DDTree node budget N
    "block_size": 8,              # DFlash block size B (bonus + B-1 drafted positions)
    "device": "auto",
    "dtype": "auto",              # auto: float32 on CPU, bfloat16 on CUDA
    "seed": 0,
    "warmup_steps": 2,
    "steps": 8,                   # decode steps timed per repeat (the steady window)
    "repeats": 3,
    "profile_steps": 4,           # steps under the CUDA-activity profiler (GPU only; 0 = off)
    "profile": True,              # false: no profile and no sync audit this run (the gate's
                                  # later rounds, which need only the timed window)
    "timeout_s": 900,             # the controller kills the worker after this long
}

# Implementation knobs: which kernels a CUDA decode step runs, not what it computes. Each joins
# a cell's id only when set away from its default, so cells (and their baselines) from before
# a knob existed keep their ids, and a cell that switches a kernel on is a different cell.
IMPL_DEFAULTS: dict[str, object] = {
    "fused_ops": False,           # true: residual+RMSNorm, q/k norm+RoPE+KV write, SiLU*up fused
    "topk_impl": "torch",         # triton: the three-launch top-k + logsumexp kernel
    "tree_build_impl": "triton",  # cuda: the shared-memory CUDA C++ tree build (tree_build: gpu)
}
DEFAULTS.update(IMPL_DEFAULTS)

# Parameters that describe how a cell is measured rather than what it measures. They are
# logged but excluded from the cell id, so raising `repeats` still lines up with baselines.
MEASUREMENT_KNOBS = ("warmup_steps", "steps", "repeats", "profile_steps", "profile", "timeout_s",
                     "compare_modes")

# Parameters that only one workload has, with their defaults. They join a cell's canonical form
# (and so its id) only when the cell runs that workload, so adding a workload or a parameter
# here never changes the ids of other workloads' cells. (DEFAULTS above keeps the shared and the
# decode parameters exactly as before this registry existed: decode ids are unchanged.)
WORKLOAD_PARAMS: dict[str, dict[str, object]] = {
    "calibrate": {                # harness/worker/workloads/calibrate.py: checks the idle meter
        "work_us": 500.0,         # GPU work per step in µs (one self-timed spin kernel)
        "idle_target": 0.5,       # the GPU's true idle fraction by construction, in [0, 1)
        "replay": "eager",        # eager launches or one CUDA graph replay per step
    },
    "noop": {                     # harness/worker/workloads/noop.py: a harness self-test (SSH, runner)
        "sleep_s": 0.0,           # seconds the cell sleeps; nothing is measured
    },
    "kernel": {                   # harness/worker/workloads/kernel.py: one verify-attention kernel
        "attention": "gqa",       # gqa, or mla (kv_heads 1, head_dim 576: values are its first 512)
        "tree_tokens": 16,        # T: queries of one verify forward (root + tree nodes)
        "heads": 32,              # query heads
        "kv_heads": 8,
        "head_dim": 128,
        "layout": "contiguous",   # KV cache: contiguous [b, Hkv, S, d] or paged [pages, Hkv, ps, d]
        "page_size": 16,          # paged layout only
        "compare_modes": "",      # comma-separated verify modes also timed in this cell
    },
}

# Every parameter some cell may set: the scenario schema.
ALL_PARAMS: dict[str, object] = {
    **DEFAULTS, **{k: v for own in WORKLOAD_PARAMS.values() for k, v in own.items()}}


def canonical(cell: dict) -> dict:
    """The cell with every default filled in (its workload's own ones too), keys sorted."""
    full = dict(DEFAULTS)
    full.update(WORKLOAD_PARAMS.get(cell.get("workload", DEFAULTS["workload"]), {}))
    full.update(cell)
    return {k: full[k] for k in sorted(full)}


def cell_id(cell: dict) -> str:
    """Stable id of a cell: a short hash of its canonical identity parameters.

    Reruns and baselines of the same configuration get the same id; measurement knobs
    (repeats, steps, ...) do not change it.
    """
    ident = {k: v for k, v in canonical(cell).items() if k not in MEASUREMENT_KNOBS
             and not (k in IMPL_DEFAULTS and v == IMPL_DEFAULTS[k])}
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cell_label(cell: dict) -> str:
    """A readable name, e.g. `qwen3-8b ctx=32768 N=64 verify=sdpa graph=none tree=cpu`.

    Knobs left at their defaults are omitted unless they are the ones sweeps usually vary.
    """
    c = canonical(cell)
    if c["workload"] == "kernel":  # e.g. `kernel custom ctx=65536 T=16 gqa 32/8 d128 contiguous`
        parts = ["kernel", c["verify_mode"], f"ctx={c['context_length']}", f"T={c['tree_tokens']}",
                 c["attention"], f"{c['heads']}/{c['kv_heads']}", f"d{c['head_dim']}", c["layout"]]
        if c["layout"] == "paged":
            parts.append(f"ps={c['page_size']}")
        if c["batch_size"] != 1:
            parts.append(f"bs={c['batch_size']}")
        return " ".join(parts)
    if c["workload"] in WORKLOAD_PARAMS:  # e.g. `calibrate work_us=500 idle_target=0.5 replay=eager`
        return " ".join([c["workload"]] + [f"{k}={c[k]:g}" if isinstance(c[k], float)
                                           else f"{k}={c[k]}" for k in WORKLOAD_PARAMS[c["workload"]]])
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
