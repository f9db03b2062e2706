"""Benchmark: the stream-K GEMM's launch shapes against cuBLAS at the verify's 65 rows.

    python -m harness.kernels.linear.bench_shapes          (on a Hopper GPU; one JSON line a point)

The op workload times the kernel at its default shape (`linear_impl: wgmma`, scenarios/
linear-ab.yaml); this sweeps the `Shape` knobs the workload does not expose (CTAs, ring stages,
consumer groups) over Qwen3-8B's four weight GEMMs, to find a shape worth making the default
before the product measures it. Each point is checked against float64 first and timed by the op
workload's own timer (harness.worker.kerneltime): a CUDA graph of calls cycling through weight
copies that together exceed L2, the median of its replays and their median absolute deviation.
(Session 28's sweep, results/h200/runs/bench-shapes-s28.jsonl, timed 7 replays of 4 calls a copy
by a copy of that timer and gave max - min as its spread: 2-4 µs a call.)
"""

from __future__ import annotations

import json
import statistics

import torch
import torch.nn.functional as F

from harness.kernels.linear import stream_linear as sl
from harness.worker.kerneltime import set_count, time_calls
from harness.worker.measure import spread

ROWS = 65                                   # a 64-node tree and its root
GEMMS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
# 48, 64 and 96 CTAs leave q/k/v's 48 tiles of 64 k steps no CTA whose whole range lies inside one
# tile (the "middle CTA", whose part is the fix-up's last round trip; 48: no fix-up at all), and
# 48 and 64 leave o's 32 tiles none.
SHAPES = {"default": sl.DEFAULT_SHAPE, "ctas64": sl.Shape(ctas=64), "ctas66": sl.Shape(ctas=66),
          "ctas96": sl.Shape(ctas=96), "ctas100": sl.Shape(ctas=100), "ctas48": sl.Shape(ctas=48),
          "stages4": sl.Shape(stages=4), "stages6": sl.Shape(stages=6),
          "groups2": sl.Shape(groups=2, stages=5)}
REPEATS, WARMUP = 15, 3                     # graph replays timed, and replayed before


def main() -> None:
    device = torch.device("cuda")
    for gemm, (N, K) in GEMMS.items():
        copies = set_count(N * K * 2, device)
        weights = [torch.randn(N, K, device=device, dtype=torch.bfloat16) / 64 for _ in range(copies)]
        x = torch.randn(ROWS, K, device=device, dtype=torch.bfloat16)
        ref = F.linear(x.double(), weights[0].double()).float()
        runs = {"cublas": lambda w: (lambda: F.linear(x, w))}
        runs.update({name: (lambda w, s=shape: (lambda: sl.linear(x, w, s))) for name, shape in SHAPES.items()})
        for name, bind in runs.items():
            point = {"gemm": gemm, "shape": name}
            try:
                calls = [bind(w) for w in weights]
                point["rel_error"] = ((calls[0]().float() - ref).norm() / ref.norm()).item()
                samples, _ = time_calls(calls, REPEATS, WARMUP, device)
                point["us"], point["spread"] = round(statistics.median(samples), 2), round(spread(samples), 2)
            except Exception as exc:         # a shape this GPU cannot launch is a line, not a stop
                point["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(json.dumps(point), flush=True)
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
