"""GPU check of the DDTree tree build (issue 3, tree_build: gpu): exactness, capture, timing.

    OUT=/tmp/out PYTHONPATH=. python ci/gpu/tree_build.py          # from the repo root

Needs only torch (CUDA), triton and the repo. Under 3 minutes on an H200. Writes
$OUT/tree_build.json and prints a table last. For N in 16..256 and block B in 8, 16 (D = B-1):

1. Exactness: drafter logits [2, D, 151936] from random normals, float32 (no ties) and bf16 x 8
   (ties: bf16 has 8 bits of mantissa, so the top-k of 151936 values holds equal logits; they are
   counted and reported). Both GPU builds (triton kernel, torch ops) must equal the CPU heap node
   for node (tokens, depths, parents, links, visibility), ties included, and each other bit for
   bit. Also: batched top-k == the CPU path's per-row top-k.
2. No host sync: topk + build under torch.cuda.set_sync_debug_mode("error").
3. CUDA graphs: topk + build captured with static input and outputs; a replay on new logits
   must equal an eager build.
4. Timing, median of graph replays timed with CUDA events; each graph holds REPS copies of the
   work, so the graph launch is amortised as in a full-step graph:
     cpu    the baseline: per-row topk on the GPU, .tolist(), heap, visibility, H2D copy of
            tokens / positions / mask (host wall clock, perf_counter, synchronised)
     topk   topk_logprobs_batched alone (float32 topk + logsumexp over the vocabulary)
     triton the tree build kernel alone;  torch  the torch-ops build alone
     step   topk + triton build (the tree phase of a full-graph step). Target: <= 30 us at
            N = 64, B = 16 (issue 3); there the kernel is also timed at 4 / 8 / 16 warps.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from ci.gpu.gputime import graph_of, replay_us, run_parts, versions
from ci.gpu.treecheck import FIELDS, heap_mismatch
from harness.decode import tree as ddtree
from harness.decode.tree_gpu import GpuTree, build_tree_gpu, candidate_pairs, topk_logprobs_batched

OUT = os.environ.get("OUT", "gpu-out")
VOCAB = 151936
BUDGETS = (16, 32, 64, 128, 256)
BLOCKS = (8, 16)
REPS = 10          # copies of the work inside one timed graph
REPLAYS = 25       # timed replays (median)
SWEEP = (64, 16)   # (N, B) where the kernel is also timed at 4, 8 and 16 warps
DEV = torch.device("cuda")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def logits_for(b: int, D: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(b, D, VOCAB, generator=g, device=DEV)
    return (x * 8).to(torch.bfloat16) if dtype == torch.bfloat16 else x


def exactness(N: int, B: int) -> dict:
    D = B - 1
    row = {}
    for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        logits = logits_for(2, D, dtype, seed=N * 100 + B)
        lp, ids = topk_logprobs_batched(logits, N)
        row[f"{name}_tied_pairs"] = int((lp[..., 1:] == lp[..., :-1]).sum())   # adjacent equal log-probs
        per_row = [ddtree.topk_logprobs(logits[i], N) for i in range(2)]
        row[f"{name}_topk_batched_equals_per_row"] = all(
            torch.equal(lp[i], a) and torch.equal(ids[i], b) for i, (a, b) in enumerate(per_row))
        trees = {}
        for impl in ("triton", "torch"):
            try:
                trees[impl] = build_tree_gpu(lp, ids, N, impl=impl)
                row[f"{name}_{impl}_vs_heap"] = heap_mismatch(trees[impl], lp, ids, N) or "equal"
            except Exception as exc:  # report, keep going
                row[f"{name}_{impl}_vs_heap"] = f"error: {exc!r}"[:300]
        if len(trees) == 2:
            row[f"{name}_triton_equals_torch"] = all(
                torch.equal(getattr(trees["triton"], f), getattr(trees["torch"], f)) for f in FIELDS)
    return row


def no_sync(N: int, B: int) -> dict:
    """Each part of the tree phase under set_sync_debug_mode("error"), after a warm-up."""
    logits = logits_for(1, B - 1, torch.bfloat16, seed=7)
    lp, ids = topk_logprobs_batched(logits, N)
    trees = {impl: GpuTree.empty(1, N, DEV) for impl in ("triton", "torch")}
    parts = {"topk": lambda: topk_logprobs_batched(logits, N)}
    for impl in trees:
        parts[impl] = lambda impl=impl: build_tree_gpu(lp, ids, N, out=trees[impl], impl=impl)
    out = {}
    for name, fn in parts.items():
        fn()
        torch.cuda.synchronize()
        try:
            torch.cuda.set_sync_debug_mode("error")
            fn()
            out[f"no_sync_{name}"] = True
        except Exception as exc:
            out[f"no_sync_{name}"] = f"sync: {exc!r}"[:300]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return out


def capture_and_time(N: int, B: int) -> dict:
    D = B - 1
    row = {}
    logits = logits_for(1, D, torch.bfloat16, seed=11)          # static input of the graphs
    lp, ids = topk_logprobs_batched(logits, N)
    lp_static, ids_static = lp.clone(), ids.clone()
    tree = {impl: GpuTree.empty(1, N, DEV) for impl in ("triton", "torch", "step")}

    def step():
        build_tree_gpu(*topk_logprobs_batched(logits, N), N, out=tree["step"], impl="triton")

    # Capture correctness: a replay on new logits == an eager build on them.
    try:
        g = graph_of(step)
        logits.copy_(logits_for(1, D, torch.bfloat16, seed=12))
        g.replay()
        want = build_tree_gpu(*topk_logprobs_batched(logits, N), N, impl="triton")
        row["graph_replay_equals_eager"] = all(
            torch.equal(getattr(tree["step"], f), getattr(want, f)) for f in FIELDS)
    except Exception as exc:
        row["graph_replay_equals_eager"] = f"error: {exc!r}"[:300]

    timed = {"topk": lambda: topk_logprobs_batched(logits, N), "step": step}
    for impl in ("triton", "torch"):
        timed[impl] = lambda impl=impl: build_tree_gpu(lp_static, ids_static, N, out=tree[impl], impl=impl)
    if (N, B) == SWEEP:  # the kernel's warp count (default: 4 up to N = 32, 8 at 64, 16 above)
        from harness.kernels.tree.triton_tree_build import build_tree
        J, R = candidate_pairs(N, N, DEV)
        for nw in (4, 8, 16):
            timed[f"triton_nw{nw}"] = lambda nw=nw: build_tree(lp_static, ids_static, N, J, R, tree["triton"], num_warps=nw)
    for name, fn in timed.items():
        try:
            row[f"{name}_us"] = round(replay_us(graph_of(fn, REPS), REPS, REPLAYS), 2)
        except Exception as exc:
            row[f"{name}_us"] = None
            row[f"{name}_error"] = repr(exc)[:300]

    try:  # the torch-ops build replayed from a graph == eager
        want = build_tree_gpu(lp_static, ids_static, N, impl="torch")
        row["graph_torch_equals_eager"] = all(
            torch.equal(getattr(tree["torch"], f), getattr(want, f)) for f in FIELDS)
    except Exception as exc:
        row["graph_torch_equals_eager"] = f"error: {exc!r}"[:300]

    # The baseline, host-driven: per-row topk, .tolist() + heap, visibility, H2D copies.
    def cpu_path():
        T = N + 1
        t = ddtree.build_tree_cpu(*ddtree.topk_logprobs(logits[0], N), N)
        tokens = torch.zeros(1, T, dtype=torch.long)
        positions = torch.zeros(1, T, dtype=torch.long)
        vis = torch.eye(T, dtype=torch.bool)[None].clone()
        n = t.num_nodes + 1
        tokens[0, 1:n] = torch.tensor(t.tokens)
        positions[0, :n] = torch.tensor(ddtree.tree_positions(t))
        vis[0, :n, :n] = ddtree.visibility_matrix(t)
        for x in (tokens, positions, vis):
            x.to(DEV)
        torch.cuda.synchronize()

    for _ in range(3):
        cpu_path()
    times = []
    for _ in range(REPLAYS):
        t0 = time.perf_counter()
        cpu_path()
        times.append((time.perf_counter() - t0) * 1e6)
    row["cpu_us"] = round(statistics.median(times), 1)
    return row


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    t_start = time.time()
    rows = []
    for B in BLOCKS:
        for N in BUDGETS:
            t0 = time.time()
            row = {"budget": N, "block": B, **run_parts((exactness, no_sync, capture_and_time), N, B)}
            rows.append(row)
            log(f"N={N} B={B} in {time.time() - t0:.1f} s: {row}")
    result = {**versions(), "vocab": VOCAB, "reps_per_graph": REPS,
              "replays": REPLAYS, "seconds": round(time.time() - t_start, 1), "rows": rows}
    with open(os.path.join(OUT, "tree_build.json"), "w") as f:
        json.dump(result, f, indent=1)

    def ok(*vals):
        return "ok" if all(v in (True, "equal") for v in vals) else "FAIL"

    print(f"\n{result['device']}  torch {result['torch']}  triton {result['triton']}  ({result['seconds']} s)")
    print("exact: triton and torch builds == CPU heap node for node, f32 / bf16 logits ('!': triton != torch); "
          "ties: equal adjacent bf16 log-probs; sync: topk, triton, torch without host sync; graph: "
          "replays == eager; times: us per call inside a graph (cpu: host wall clock)")
    print(f"{'N':>4} {'B':>3} {'ties':>5} {'exact':>9} {'sync':>5} {'graph':>5} "
          f"{'cpu':>8} {'topk':>7} {'triton':>7} {'torch':>7} {'step':>7}")
    for r in rows:
        exact = "/".join(ok(r.get(f"{d}_triton_vs_heap"), r.get(f"{d}_torch_vs_heap")) for d in ("f32", "bf16"))
        exact += "" if r.get("f32_triton_equals_torch") and r.get("bf16_triton_equals_torch") else "!"
        sync = ok(*(r.get(f"no_sync_{p}") for p in ("topk", "triton", "torch")))
        graph = ok(r.get("graph_replay_equals_eager"), r.get("graph_torch_equals_eager"))
        print(f"{r['budget']:>4} {r['block']:>3} {r.get('bf16_tied_pairs', '-'):>5} {exact:>9} {sync:>5} "
              f"{graph:>5} {_f(r.get('cpu_us')):>8} {_f(r.get('topk_us')):>7} "
              f"{_f(r.get('triton_us')):>7} {_f(r.get('torch_us')):>7} {_f(r.get('step_us')):>7}")
    sweep = [r for r in rows if (r["budget"], r["block"]) == SWEEP]
    if sweep:
        print(f"triton kernel at N={SWEEP[0]} B={SWEEP[1]} by warps: " +
              ", ".join(f"{nw}: {_f(sweep[0].get(f'triton_nw{nw}_us'))} us" for nw in (4, 8, 16)))


def _f(v):
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
