"""What the GPU scripts share: graph timing, the versions, parts run so one failure hides nothing.

    from ci.gpu.gputime import graph_of, replay_us, run_parts, versions  # PYTHONPATH=<root>
"""

from __future__ import annotations

import statistics

import torch


def graph_of(fn, reps: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `reps` calls of fn (after two warm-up calls on a side stream, which
    torch wants before a capture and which compile / load whatever fn needs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    torch.cuda.synchronize()
    return g


def replay_us(g: torch.cuda.CUDAGraph, reps: int, replays: int = 25) -> float:
    """Median over `replays` replays of g's time per call in µs (CUDA events; g holds `reps`
    calls, so the launch of the graph is amortised as in a whole-step graph)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return statistics.median(times)


def versions() -> dict:
    """What a GPU number depends on besides the code: device, driver-side CUDA, torch, Triton."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton_version}


def run_parts(parts, *args) -> dict:
    """The merged dicts of part(*args) for each part; a part that raises is recorded as
    `<name>_error` instead, so that one broken part never hides the others' results."""
    row = {}
    for part in parts:
        try:
            row.update(part(*args))
        except Exception as exc:
            row[f"{part.__name__}_error"] = repr(exc)[:500]
    return row
