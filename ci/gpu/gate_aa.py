"""Issue 7 on a GPU: the gate on real repeated decode cells with no code change (A/A).

    OUT=/tmp/out PYTHONPATH=. python3 ci/gpu/gate_aa.py [--budget-s 160] [--rounds 4]

Runs PR-gate cells (scenarios/pr.yaml's shapes: qwen3-8b synthetic, tau 6.5, N 64, B 16,
graph-captured verify, 5 repeats) as the A/B gate does: one `python -m harness.worker` process
per round and side, sides interleaved A B, B A, ... on the same GPU — but both sides run this
same tree, so any regression the gate reports is a false alarm. Needs only torch + numpy here
(harness.hosts.local.LocalHost and harness.gate.abtest.side_order are standard library only).
Stops starting new worker runs after --budget-s so the script ends in under 3 minutes.

Writes $OUT/gate_aa.json; judge it on a machine with the controller installed:

    python -m harness.gate.evaluate aa gpu-out/gate_aa.json --append results/gate-evaluation.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

from harness.gate.abtest import side_order
from harness.hosts.local import LocalHost
from harness.protocol import params

BASE = dict(model="qwen3-8b", device="cuda", dtype="bfloat16", acceptance="synthetic", tau=6.5,
            tree_budget=64, block_size=16, accept="cpu", graph_capture="verify",
            warmup_steps=3, steps=16, repeats=5, profile_steps=0, timeout_s=150)
CELLS = [dict(BASE, context_length=4096, verify_mode="sdpa", tree_build="cpu"),
         dict(BASE, context_length=32768, verify_mode="sdpa", tree_build="gpu")]


async def main_async(args) -> dict:
    host = LocalHost(python=sys.executable).for_code_tree(os.getcwd())
    deadline = time.monotonic() + args.budget_s
    cells = {params.cell_id(c): {"label": params.cell_label(c), "cell": c, "A": [], "B": []}
             for c in CELLS}
    for r in range(args.rounds):                       # round-major: every cell gets round 1 first
        for cid, entry in cells.items():
            for side in side_order(["A", "B"], r):
                if time.monotonic() > deadline:
                    print(f"budget reached before round {r + 1} of {entry['label']} {side}",
                          flush=True)
                    return cells
                t0 = time.monotonic()
                result = await host.run_cell(entry["cell"], 0, lambda _p: None)
                entry[side].append(result)
                tps = (result.get("metrics") or {}).get("tokens_per_s")
                print(f"round {r + 1} {side} {entry['label']}: {result['status']} "
                      f"{tps if tps is None else f'{tps:.1f} tok/s'} in {time.monotonic() - t0:.1f} s",
                      flush=True)
    return cells


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=160.0)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    cells = asyncio.run(main_async(args))
    gpu = next((r.get("env", {}).get("gpu") for e in cells.values() for r in e["A"] + e["B"]
                if r.get("env", {}).get("gpu")), None)
    with open(os.path.join(out_dir, "gate_aa.json"), "w") as f:
        json.dump({"gpu": gpu, "rounds": args.rounds, "cells": cells}, f)

    print(f"\nA/A on {gpu}: tokens/s per worker run (median of its repeats); the gate is judged "
          f"off-box with harness.gate.evaluate aa")
    print(f"{'cell':58s} {'side':4s} {'runs':>4s} {'medians':40s} {'pooled':>8s}")
    for entry in cells.values():
        pooled = {}
        for side in ("A", "B"):
            ok = [r for r in entry[side] if r.get("status") == "ok"]
            meds = [r["metrics"]["tokens_per_s"] for r in ok]
            allv = [v for r in ok for v in r["samples"]["tokens_per_s"]]
            pooled[side] = statistics.median(allv) if allv else float("nan")
            print(f"{entry['label'][:58]:58s} {side:4s} {len(entry[side]):4d} "
                  f"{' '.join(f'{m:.1f}' for m in meds)[:40]:40s} {pooled[side]:8.1f}")
        print(f"{'':58s} B/A {pooled['B'] / pooled['A']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
