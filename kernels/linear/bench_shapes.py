"""Benchmark: the stream-K GEMM's launch shapes against cuBLAS at the verify's 65 rows.

    python -m harness.kernels.linear.bench_shapes          (on a Hopper GPU; one JSON line a point)

The op workload times the kernel at its default shape (`linear_impl: wgmma`, scenarios/
linear-ab.yaml); this sweeps the `Shape` knobs the workload does not expose (CTAs, ring stages,
consumer groups, the cluster kernel's size) over Qwen3-8B's four weight GEMMs, to find a shape
worth making the default before the product measures it. Each point is checked against float64
first and timed as the op workload times: a CUDA graph of calls cycling through weight copies
that together exceed L2, median of eleven replays.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from harness.kernels.linear import stream_linear as sl

ROWS = 65                                   # a 64-node tree and its root
GEMMS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
# 48, 64 and 96 CTAs leave q/k/v's 48 tiles of 64 k steps no CTA whose whole range lies inside one
# tile (the "middle CTA", whose part is the fix-up's last round trip; 48: no fix-up at all), and
# 48 and 64 leave o's 32 tiles none.
SHAPES = {"default": sl.DEFAULT_SHAPE, "ctas64": sl.Shape(ctas=64), "ctas66": sl.Shape(ctas=66),
          "ctas96": sl.Shape(ctas=96), "ctas100": sl.Shape(ctas=100), "ctas48": sl.Shape(ctas=48),
          "stages4": sl.Shape(stages=4), "stages6": sl.Shape(stages=6),
          "groups2": sl.Shape(groups=2, stages=5), "cluster2": sl.Shape(stages=7, cluster=2),
          "cluster4": sl.Shape(stages=7, cluster=4), "cluster8": sl.CLUSTER_SHAPE}
PAST_L2 = 120 * 2**20                       # bytes of weight copies cycled through (H200 L2: 50 MB)


def time_us(call, n_inputs: int, replays: int = 11) -> tuple[float, float]:
    """Median and spread (µs a call) of graph replays of 16 x n_inputs calls. (Session 28's sweep
    replayed 4 x n_inputs, ~0.2 ms at q/k/v, for 7 replays: spreads of 2-4 µs a call.)"""
    calls = 16 * n_inputs
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):          # the first calls load the library and warm up
        call(0)
        call(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    times.sort()
    return times[len(times) // 2], times[-1] - times[0]


def main() -> None:
    device = torch.device("cuda")
    for gemm, (N, K) in GEMMS.items():
        copies = max(2, -(-PAST_L2 // (N * K * 2)))
        weights = [torch.randn(N, K, device=device, dtype=torch.bfloat16) / 64 for _ in range(copies)]
        x = torch.randn(ROWS, K, device=device, dtype=torch.bfloat16)
        ref = F.linear(x.double(), weights[0].double()).float()
        runs = {"cublas": lambda i: F.linear(x, weights[i % copies])}
        runs.update({name: (lambda i, s=shape: sl.linear(x, weights[i % copies], s))
                     for name, shape in SHAPES.items()})
        for name, call in runs.items():
            point = {"gemm": gemm, "shape": name}
            try:
                point["rel_error"] = ((call(0).float() - ref).norm() / ref.norm()).item()
                point["us"], point["spread"] = (round(v, 2) for v in time_us(call, copies))
            except Exception as exc:         # a shape this GPU cannot launch is a line, not a stop
                point["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(json.dumps(point), flush=True)
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
