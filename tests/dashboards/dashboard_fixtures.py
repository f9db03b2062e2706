"""Recorded-looking results for the dashboard and report tests, written through RunJournal.

Shapes follow what the worker writes (harness.worker.main.run_cell + harness.worker.workloads.decode):
an H200-like sweep (idle fraction, per-phase host/GPU/idle ms, a timeline), CPU cells without
an idle fraction, a failed cell with a traceback, a cell that never ran, and kernel cells.
"""

from __future__ import annotations

from pathlib import Path

from harness.protocol.params import canonical, cell_id, cell_label
from harness.sweep.journal import RunJournal

H200_ENV = {"hostname": "gpu-a", "python": "3.11.9", "torch": "2.11.0+cu130", "cuda": "13.0",
            "gpu": "NVIDIA H200", "gpu_count": 8, "driver": "580.65.06", "device": "cuda"}
CPU_ENV = {"hostname": "laptop", "python": "3.11.7", "torch": "2.13.0", "cuda": None,
           "gpu": None, "gpu_count": 0, "driver": None, "device": "cpu"}
META = {"git_sha": "3b9887d0c1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6", "git_branch": "main",
        "git_dirty": False, "trigger": "nightly", "hosts": ["gpu-a"]}

GPU_BASE = {"model": "qwen3-8b", "device": "cuda", "dtype": "bfloat16", "acceptance": "synthetic",
            "tau": 6.5, "tree_budget": 64, "block_size": 16, "accept": "gpu"}


def _timeline(step_ms: float, idle: float, steps: int = 3) -> list[dict]:
    """A few steps of host phase ranges and GPU busy intervals, idle where the host works."""
    out, t = [], 0.0
    shares = {"draft": 0.15, "tree": 0.25, "verify": 0.45, "accept": 0.1, "commit": 0.05}
    for _ in range(steps):
        out.append({"phase": "step", "start_ms": t, "end_ms": t + step_ms, "kind": "host"})
        for phase, share in shares.items():
            dur = step_ms * share
            out.append({"phase": phase, "start_ms": t, "end_ms": t + dur, "kind": "host"})
            if phase != "tree":  # the host tree build leaves the GPU idle
                busy = dur * (1 - idle)
                out.append({"phase": phase, "start_ms": t + dur - busy, "end_ms": t + dur,
                            "kind": "gpu"})
            t += dur
    return out


def gpu_result(ctx: int, mode: str, graph: str = "full", tree: str = "gpu", tps: float = 500.0,
               idle: float | None = 0.3, phases_idle: bool = True, timeline: bool = True) -> dict:
    cell = canonical({**GPU_BASE, "context_length": ctx, "verify_mode": mode,
                      "graph_capture": graph, "tree_build": tree})
    step_ms = 1000 * 6.5 / tps
    metrics = {"tokens_per_s": tps, "tokens_per_s_spread": tps * 0.01, "accept_len_mean": 6.5,
               "step_ms_p50": step_ms, "step_ms_p90": step_ms * 1.1, "idle_fraction": idle,
               "idle_fraction_est": None if idle is None else idle + 0.01, "syncs_per_step": 2.0}
    shares = {"draft": 0.15, "tree": 0.25, "verify": 0.45, "accept": 0.1, "commit": 0.05}
    for phase, share in shares.items():
        metrics[f"phase.{phase}.host_ms"] = step_ms * share
        metrics[f"phase.{phase}.gpu_ms"] = step_ms * share * (1 - (idle or 0))
        if phases_idle and idle is not None:
            metrics[f"phase.{phase}.idle_ms"] = step_ms * share * idle * 0.8
    result = {"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell), "status": "ok",
              "error": None, "metrics": metrics,
              "samples": {"tokens_per_s": [tps * 0.99, tps, tps * 1.02],
                          "accept_len_mean": [6.4, 6.5, 6.6]},
              "env": H200_ENV, "host": "gpu-a", "started_at": "2026-05-01T02:00:00+00:00",
              "wall_s": 41.0}
    if timeline and idle is not None:
        result["timeline"] = _timeline(step_ms, idle)
    return result


def failed_result(cell: dict, env: dict = H200_ENV, host: str = "gpu-a") -> dict:
    cell = canonical(cell)
    return {"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell),
            "status": "failed",
            "error": ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                      "<& \"quoted\" >\nTraceback (most recent call last):\n  File \"harness/"
                      "workloads/decode.py\", line 88, in run\n"),
            "metrics": {}, "samples": {}, "env": env, "host": host,
            "started_at": "2026-05-01T02:10:00+00:00", "wall_s": 3.2}


def cpu_result(ctx: int, acceptance: str, tps: float) -> dict:
    cell = canonical({"model": "tiny", "device": "cpu", "dtype": "float32", "context_length": ctx,
                      "acceptance": acceptance, "tau": 4.0, "profile_steps": 0})
    metrics = {"tokens_per_s": tps, "tokens_per_s_spread": 1.5, "accept_len_mean": 3.9,
               "step_ms_p50": 4.0, "step_ms_p90": 4.6, "idle_fraction": None,
               "phase.draft.host_ms": 1.0, "phase.tree.host_ms": 0.8, "phase.verify.host_ms": 1.6,
               "phase.accept.host_ms": 0.3, "phase.commit.host_ms": 0.2}
    return {"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell), "status": "ok",
            "error": None, "metrics": metrics,
            "samples": {"tokens_per_s": [tps - 2, tps, tps + 1]}, "env": CPU_ENV,
            "host": "local", "started_at": "2026-05-01T02:00:00+00:00", "wall_s": 1.2}


def kernel_result(ctx: int, mode: str, tree_tokens: int, pct: float | None,
                  status: str = "ok") -> dict:
    cell = canonical({"workload": "kernel", "verify_mode": mode, "context_length": ctx,
                      "tree_tokens": tree_tokens, "device": "cuda", "dtype": "bfloat16",
                      "compare_modes": "triton,sdpa" if mode == "custom" else ""})
    ok = status == "ok"
    us = 60.0 * ctx / 65536 / ((pct or 1) / 100) * (1 + tree_tokens / 256)
    return {"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell), "status": status,
            "error": None if ok else "CompilationError: x",
            "metrics": {"kernel_us": us, "achieved_tbps": 4.2 * (pct or 0) / 100,
                        "pct_roofline": pct} if ok else {},
            "samples": {"kernel_us": [us, us * 1.01]} if ok else {}, "env": H200_ENV,
            "host": "gpu-a", "started_at": "2026-05-01T03:00:00+00:00", "wall_s": 5.0}


def gpu_sweep(speed: float = 1.0) -> list[dict]:
    """An H200-like decode sweep: 3 contexts × (custom, triton, sdpa) × two graph modes, one
    failed cell, one cell with an idle fraction but no per-phase split, one unprofiled cell."""
    out = []
    base = {"custom": 900.0, "triton": 250.0, "sdpa": 180.0}
    for ctx in (4096, 16384, 65536):
        for mode, tps in base.items():
            for graph, tree in (("full", "gpu"), ("none", "cpu")):
                rate = speed * tps * (4096 / ctx) ** 0.3 * (1.0 if graph == "full" else 0.6)
                idle = 0.12 if graph == "full" else 0.45
                if (ctx, mode, graph) == (65536, "sdpa", "none"):
                    out.append(failed_result({**GPU_BASE, "context_length": ctx,
                                              "verify_mode": mode, "graph_capture": graph,
                                              "tree_build": tree}))
                elif (ctx, mode, graph) == (16384, "sdpa", "none"):
                    out.append(gpu_result(ctx, mode, graph, tree, rate, idle, phases_idle=False))
                elif (ctx, mode, graph) == (4096, "sdpa", "none"):
                    out.append(gpu_result(ctx, mode, graph, tree, rate, None, timeline=False))
                else:  # timelines on the shortest context only: a few figures are enough
                    out.append(gpu_result(ctx, mode, graph, tree, rate, idle,
                                          timeline=ctx == 4096))
    return out


def kernel_sweep() -> list[dict]:
    out = []
    for ctx in (4096, 16384, 65536):
        for mode, pct in (("custom", 78.0), ("sdpa", 4.4), ("flex", 11.0)):
            for tree in (16, 64):
                if mode == "flex" and tree == 64:
                    out.append(kernel_result(ctx, mode, tree, None, status="failed"))
                else:
                    out.append(kernel_result(ctx, mode, tree, pct * (1 + ctx / 2**20) * (1 - tree / 512)))
    return out


def write_journal(root: Path, run_id: str, results: list[dict], extra_cells=(),
                  scenario: str = "nightly", meta: dict | None = None) -> RunJournal:
    """A journal holding `results`, plus `extra_cells` that never produced a result."""
    cells = [r["cell"] for r in results] + list(extra_cells)
    journal = RunJournal.create(root, run_id, scenario, f"scenarios/{scenario}.yaml",
                                f"name: {scenario}\n", cells, dict(meta or META))
    for r in results:
        journal.write_cell(r)
    return journal
