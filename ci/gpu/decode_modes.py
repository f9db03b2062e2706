"""Issue 2/3 proof on a GPU: the decode loop in every mode, in one process, plus losslessness.

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/decode_modes.py [--contexts 4096,16384,65536] [--verify sdpa,triton]

Runs the cells of scenarios/nightly.yaml's issue-3 slice (qwen3-8b, synthetic tau 6.5, tree
budget 64, block 16) through harness.worker.main.run_cell — the same code a worker runs — for the
mode combinations cpu/eager, cpu/verify-graph, gpu/verify-graph, gpu/full and plain AR
(graph-captured), then checks that every fast mode commits the same tokens as the baseline
loop under greedy acceptance on qwen3-8b at 4096 (float32, so that no argmax flips on rounding).
Writes $OUT/decode_modes.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from harness.protocol import params
from harness.sweep.derived import add_speedup_vs_ar
from harness.worker.main import environment, run_cell

MODES = {  # name: (tree_build, accept, graph_capture)
    "cpu/eager": ("cpu", "cpu", "none"),
    "cpu/verify-graph": ("cpu", "cpu", "verify"),
    "gpu/verify-graph": ("gpu", "gpu", "verify"),
    "gpu/full": ("gpu", "gpu", "full"),
}
BASE = dict(model="qwen3-8b", acceptance="synthetic", tau=6.5, tree_budget=64, block_size=16,
            warmup_steps=3, steps=16, repeats=3, profile_steps=6, device="cuda", dtype="bfloat16")


def lossless_check(steps: int = 12) -> dict:
    """Greedy outputs of every fast mode == the baseline loop's == plain AR, qwen3-8b @ 4096.
    A drafter that knows the target's continuation (as in tests/decode/test_decode.py) makes whole
    paths, sibling branches included, get accepted, so KV compaction is exercised."""
    sys.path.insert(0, "tests/decode")
    from test_decode import OracleDrafter
    from harness.decode.fast import FastSpecDecoder
    from harness.decode.loop import ARDecoder, SpecDecoder
    from harness.decode.kernel_choice import Kernels
    from harness.worker.workloads.decode import _build_models
    cell = params.canonical(dict(BASE, acceptance="greedy", dtype="float32"))
    kernels = Kernels.from_cell(cell, "cuda")       # --impl's knobs, for every decoder here
    target, drafter = _build_models(cell, torch.device("cuda"), torch.float32)
    gen = torch.Generator().manual_seed(0)
    prompt = [torch.randint(0, 151935, (4096,), generator=gen).tolist()]
    ar = ARDecoder(target, batch=1, max_len=4096 + 400, kernels=kernels)
    ar.prefill(prompt)
    for _ in range(steps * 16 + 16):
        ar.step()
    ref = ar.output
    oracle = OracleDrafter(drafter, ref, [4096], wrong_at={(0, 5), (20, 2)}, second_at={(6, 1), (40, 0)})
    outs = {}
    base = SpecDecoder(target, oracle, batch=1, max_len=4096 + 600, tree_budget=64, kernels=kernels)
    base.prefill(prompt)
    for _ in range(steps):
        base.step()
    outs["cpu/eager"] = base.output[0]
    for name, (tb, acc, graph) in MODES.items():
        if name == "cpu/eager":
            continue
        # The oracle drafter reads lengths on the host, which a full-step graph cannot
        # capture: there the real drafter runs (fewer accepted tokens, same check).
        dec = FastSpecDecoder(target, drafter if graph == "full" else oracle, batch=1,
                              max_len=4096 + 600, tree_budget=64, kernels=kernels, tree_build=tb,
                              accept=acc, graph_capture=graph)
        dec.prefill(prompt)
        for _ in range(steps):
            dec.step()
        dec.finish()
        outs[name] = dec.output[0]
    n = min(len(o) for o in outs.values())
    report = {name: {"tokens": len(o), "equal_to_ar": o == ref[0][: len(o)]} for name, o in outs.items()}
    report["compared_tokens"] = n
    del target, drafter
    torch.cuda.empty_cache()
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="4096,16384,65536")
    ap.add_argument("--verify", default="sdpa")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--no-lossless", action="store_true")
    ap.add_argument("--impl", default="", help="implementation knobs for every cell, e.g. "
                    "fused_ops=true,topk_impl=triton,tree_build_impl=cuda (harness/protocol/params.py)")
    args = ap.parse_args()
    for item in filter(None, args.impl.split(",")):
        key, _, value = item.partition("=")
        if key not in params.IMPL_DEFAULTS or not value:
            raise SystemExit(f"--impl: {item!r} is not knob=value with a knob of "
                             f"{', '.join(params.IMPL_DEFAULTS)}")
        BASE[key] = value == "true" if isinstance(params.IMPL_DEFAULTS[key], bool) else value
    out_dir = os.environ.get("OUT", "gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    results, t0 = [], time.time()
    for ctx in map(int, args.contexts.split(",")):
        cells = []
        for vm in args.verify.split(","):
            # Plain AR with the same attention kernel; speedup_vs_ar uses the fastest.
            cells.append(dict(BASE, context_length=ctx, speculation="none", graph_capture="full",
                              steps=32, verify_mode=vm))
        for vm in args.verify.split(","):
            for name in args.modes.split(","):
                tb, acc, graph = MODES[name]
                cells.append(dict(BASE, context_length=ctx, verify_mode=vm, tree_build=tb,
                                  accept=acc, graph_capture=graph))
        for cell in cells:
            r = run_cell(cell)
            results.append(r)
            m = r["metrics"]
            print(f"[{time.time() - t0:6.0f}s] {r['label']:<70} {r['status']:<6} "
                  f"{m.get('tokens_per_s', 0):8.1f} tok/s idle {m.get('idle_fraction')}"
                  + ("" if r["status"] == "ok" else " " + r["error"][:300]), flush=True)
    add_speedup_vs_ar(results)
    lossless = None if args.no_lossless else lossless_check()
    with open(os.path.join(out_dir, "decode_modes.json"), "w") as f:
        json.dump({"env": environment(), "results": results, "lossless": lossless}, f)
    print("\n| ctx | mode | verify | tok/s (±) | accept | step p50 ms | idle | bw % roofline | x AR | kernels/step | phases host ms (draft/tree/verify/accept/commit) |")
    for r in results:
        c, m = r["cell"], r["metrics"]
        if r["status"] != "ok":
            print(f"| {c['context_length']} | {r['label']} | FAILED {r['error'][:80]} |")
            continue
        mode = "AR" if c["speculation"] == "none" else next(
            k for k, v in MODES.items() if v == (c["tree_build"], c["accept"], c["graph_capture"]))
        ph = "/".join(f"{m.get(f'phase.{p}.host_ms', float('nan')):.2f}" for p in
                      ("draft", "tree", "verify", "accept", "commit"))
        idle = m.get("idle_fraction")
        kps = (r.get("profile") or {}).get("kernels_per_step") or ["n/a"]
        print(f"| {c['context_length']} | {mode} | {c['verify_mode']} | {m['tokens_per_s']:.1f} (±{m['tokens_per_s_spread']:.1f}) "
              f"| {m['accept_len_mean']:.2f} | {m['step_ms_p50']:.2f} | {'n/a' if idle is None else f'{idle:.1%}'} "
              f"| {m.get('bw_pct_roofline', float('nan')):.1%} | {m.get('speedup_vs_ar', float('nan')):.2f} | {kps[0]} | {ph} |")
    print("lossless:", json.dumps(lossless))


if __name__ == "__main__":
    main()
