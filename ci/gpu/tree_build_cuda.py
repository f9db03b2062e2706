"""GPU check of the CUDA C++ tree build (kernels/tree/tree_build.cu): exactness, no sync, capture, timing.

    OUT=/tmp/out PYTHONPATH=. python ci/gpu/tree_build_cuda.py          # from the repo root

Needs only torch (CUDA), triton, nvcc (for the first-use build of the kernel) and the repo.
Under 2 minutes on an H200 including that build. Writes $OUT/tree_build_cuda.json and prints a
table last. For N in 16..256 and block B in 8, 16 (D = B-1), b = 2 sequences:

1. Exactness, drafter logits [2, D, 151936] of three kinds: "flat" float32 random normals x 1
   (many survivors per depth), "peaked" standardised float32 normals x 32 (drafter-like), "bf16"
   normals x 8 in bfloat16 (equal top logits: ties). The CUDA build must equal the Triton build
   and the torch-ops build bit for bit (every GpuTree field) and the CPU heap node for node.
2. No host sync: the CUDA build under torch.cuda.set_sync_debug_mode("error").
3. CUDA graphs: topk + CUDA build captured; a replay on new logits equals an eager build.
4. Timing, median of graph replays (CUDA events), each graph holding REPS copies of the call:
   cuda / triton (the build alone, same inputs), topk (topk_logprobs_batched alone) and step
   (topk + cuda build: the tree phase, issue 3's budget is 30 us at N = 64, B = 16). At N = 64,
   B = 16 and N = 256, B = 16 the CUDA kernel is also timed at 128 / 256 / 512 threads.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from ci.gpu.gputime import graph_of, replay_us, run_parts, versions
from ci.gpu.treecheck import FIELDS, heap_mismatch
from harness.decode.tree_gpu import GpuTree, build_tree_gpu, candidate_pairs, topk_logprobs_batched

OUT = os.environ.get("OUT", "gpu-out")
VOCAB = 151936
BATCH = 2
BUDGETS = (16, 32, 64, 128, 256)
BLOCKS = (8, 16)
KINDS = ("flat", "peaked", "bf16")
REPS = 10          # copies of the call inside one timed graph
REPLAYS = 25       # timed replays (median)
SWEEP = {(64, 16), (256, 16)}
THREADS = (128, 256, 512)
DEV = torch.device("cuda")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def logits_for(kind: str, D: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(BATCH, D, VOCAB, generator=g, device=DEV)
    if kind == "peaked":
        x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True) * 32
    elif kind == "bf16":
        x = (x * 8).to(torch.bfloat16)
    return x


def same(a: GpuTree, b: GpuTree) -> bool | str:
    bad = [f for f in FIELDS if not torch.equal(getattr(a, f), getattr(b, f))]
    return True if not bad else f"differ: {bad}"


def exactness(N: int, B: int) -> dict:
    row = {}
    for kind in KINDS:
        lp, ids = topk_logprobs_batched(logits_for(kind, B - 1, seed=N * 100 + B), N)
        row[f"{kind}_tied_pairs"] = int((lp[..., 1:] == lp[..., :-1]).sum())
        try:
            cuda = build_tree_gpu(lp, ids, N, impl="cuda")
            row[f"{kind}_cuda_eq_triton"] = same(cuda, build_tree_gpu(lp, ids, N, impl="triton"))
            row[f"{kind}_cuda_eq_torch"] = same(cuda, build_tree_gpu(lp, ids, N, impl="torch"))
            row[f"{kind}_cuda_vs_heap"] = heap_mismatch(cuda, lp, ids, N) or True
        except Exception as exc:  # report, keep going
            row[f"{kind}_error"] = repr(exc)[:300]
    return row


def no_sync(N: int, B: int) -> dict:
    lp, ids = topk_logprobs_batched(logits_for("bf16", B - 1, seed=7), N)
    tree = GpuTree.empty(BATCH, N, DEV)
    build_tree_gpu(lp, ids, N, out=tree, impl="cuda")
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        build_tree_gpu(lp, ids, N, out=tree, impl="cuda")
        return {"no_sync": True}
    except Exception as exc:
        return {"no_sync": f"sync: {exc!r}"[:300]}
    finally:
        torch.cuda.set_sync_debug_mode("default")


def capture_and_time(N: int, B: int) -> dict:
    from harness.kernels.tree import cuda_tree_build

    D = B - 1
    row = {}
    logits = logits_for("bf16", D, seed=11)            # static input of the graphs
    lp, ids = topk_logprobs_batched(logits, N)
    lp_static, ids_static = lp.clone(), ids.clone()
    tree = {name: GpuTree.empty(BATCH, N, DEV) for name in ("cuda", "triton", "step")}

    def step():
        build_tree_gpu(*topk_logprobs_batched(logits, N), N, out=tree["step"], impl="cuda")

    try:
        g = graph_of(step)
        logits.copy_(logits_for("bf16", D, seed=12))
        g.replay()
        want = build_tree_gpu(*topk_logprobs_batched(logits, N), N, impl="cuda")
        row["graph_replay_eq_eager"] = same(tree["step"], want)
    except Exception as exc:
        row["graph_replay_eq_eager"] = f"error: {exc!r}"[:300]

    timed = {"topk": lambda: topk_logprobs_batched(logits, N), "step": step}
    for impl in ("cuda", "triton"):
        timed[impl] = lambda impl=impl: build_tree_gpu(lp_static, ids_static, N, out=tree[impl], impl=impl)
    if (N, B) in SWEEP:
        J, R = candidate_pairs(N, N, DEV)
        for t in THREADS:
            if J.numel() > 8 * t:
                continue
            timed[f"cuda_t{t}"] = lambda t=t: cuda_tree_build.build_tree(lp_static, ids_static, N, J, R,
                                                                          tree["cuda"], num_threads=t)
    for name, fn in timed.items():
        try:
            row[f"{name}_us"] = round(replay_us(graph_of(fn, REPS), REPS, REPLAYS), 2)
        except Exception as exc:
            row[f"{name}_us"] = None
            row[f"{name}_error"] = repr(exc)[:300]
    try:  # after all the timed replays (every thread count) the outputs are still the eager ones
        row["graph_cuda_eq_eager"] = same(tree["cuda"], build_tree_gpu(lp_static, ids_static, N, impl="cuda"))
    except Exception as exc:
        row["graph_cuda_eq_eager"] = f"error: {exc!r}"[:300]
    return row


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    t_start = time.time()
    compile_s = None
    try:  # the first use builds the library (cached on disk afterwards)
        from harness.kernels import build

        t0 = time.time()
        build.load_library(source=build.TREE_BUILD_SOURCE)
        compile_s = round(time.time() - t0, 1)
        log(f"tree_build.cu loaded in {compile_s} s")
    except Exception as exc:
        log(f"building tree_build.cu failed: {exc!r}")
    rows = []
    for B in BLOCKS:
        for N in BUDGETS:
            t0 = time.time()
            row = {"budget": N, "block": B, **run_parts((exactness, no_sync, capture_and_time), N, B)}
            rows.append(row)
            log(f"N={N} B={B} in {time.time() - t0:.1f} s: {row}")
    result = {**versions(), "vocab": VOCAB, "batch": BATCH,
              "reps_per_graph": REPS, "replays": REPLAYS, "first_load_s": compile_s,
              "seconds": round(time.time() - t_start, 1), "rows": rows}
    with open(os.path.join(OUT, "tree_build_cuda.json"), "w") as f:
        json.dump(result, f, indent=1)

    def ok(*vals):
        return "ok" if all(v is True for v in vals) else "FAIL"

    print(f"\n{result['device']}  torch {result['torch']}  triton {result['triton']}  "
          f"(first load {compile_s} s, total {result['seconds']} s)")
    print("exact: cuda == triton == torch build bit for bit and == CPU heap node for node, for flat / "
          "peaked / bf16 logits; ties: equal adjacent bf16 log-probs; sync: no host sync; graph: "
          "replays == eager; times: us per call inside a graph, b = 2; step = topk + cuda build")
    print(f"{'N':>4} {'B':>3} {'ties':>5} {'exact':>14} {'sync':>5} {'graph':>5} "
          f"{'triton':>8} {'cuda':>7} {'x':>6} {'topk':>7} {'step':>7}")
    for r in rows:
        exact = "/".join(ok(r.get(f"{k}_cuda_eq_triton"), r.get(f"{k}_cuda_eq_torch"), r.get(f"{k}_cuda_vs_heap"))
                         for k in KINDS)
        graph = ok(r.get("graph_replay_eq_eager"), r.get("graph_cuda_eq_eager"))
        tri, cu = r.get("triton_us"), r.get("cuda_us")
        speedup = f"{tri / cu:.1f}" if tri and cu else "-"
        print(f"{r['budget']:>4} {r['block']:>3} {r.get('bf16_tied_pairs', '-'):>5} {exact:>14} "
              f"{ok(r.get('no_sync')):>5} {graph:>5} {_f(tri):>8} {_f(cu):>7} {speedup:>6} "
              f"{_f(r.get('topk_us')):>7} {_f(r.get('step_us')):>7}")
    for r in rows:
        if (r["budget"], r["block"]) in SWEEP:
            print(f"cuda kernel at N={r['budget']} B={r['block']} by threads: " +
                  ", ".join(f"{t}: {_f(r.get(f'cuda_t{t}_us'))} us" for t in THREADS))


def _f(v):
    return "-" if v is None else f"{v:.1f}"


if __name__ == "__main__":
    main()
