"""A worker process's CUDA graph state, settled before the first timed replay.

Measured on an H200 (driver 580.159.04, CUDA 13.0, torch 2.11; kernels/NOTES.md, "The process's
graph count" and "The graph-count slowdown, narrowed"): a process that has instantiated one or
two CUDA graph executables replays them with almost no time between kernels; from the third on
(instantiated, replayed or not), replays in it, of old graphs and new ones, run ~0.2-0.3 us
longer a kernel boundary, and the decode step's PDL launches stop overlapping: the gpu/full step
at 4096 keys (~490 kernels) went from 6.84-6.95 ms and 0.6 % idle to 7.0-7.1 ms and 2.7 % idle
(a plain chain of elementwise kernels slowed too; a Triton PDL chain and a cuBLAS chain did not).
Destroying the other executables does not undo it, nor does a garbage collection, an emptied
cache, cuGraphUpload, a fresh instantiation of the same graph, or 20 s of an idle GPU.

So a worker that runs a sweep in one process measured its first one or two graph-replaying cells
in the first state and every later one in the second (each decode cell captures its step graph
and its lossless check another; each op or kernel cell one), and the same cell read 2 % apart
by its place in the sweep. A serving engine captures a graph per batch size, dozens, and lives
in the second state. `settle` puts the process there before anything is timed: it instantiates
`SETTLE_GRAPHS` one-kernel graphs once per process, then frees them. Every cell then measures in
the same state whatever ran before it, and the result says so (`env.cuda_graphs_settled`).
"""

from __future__ import annotations

# More than the three that flip the state on the H200, with a margin for a driver that counts
# differently; each is one capture and one instantiation of a one-kernel graph.
SETTLE_GRAPHS = 8

_settled: dict[str, int] = {}      # device -> graphs instantiated by `settle` in this process


def settle(device) -> int:
    """Instantiate SETTLE_GRAPHS small CUDA graphs on `device` (a torch.device), once per device
    and process; returns how many this process instantiated for it (0 on a CPU device)."""
    import torch

    if device.type != "cuda":
        return 0
    key = str(device)
    if key not in _settled:
        with torch.cuda.device(device):
            x = torch.zeros(32, device=device)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):          # torch wants one run before a capture
                x.add_(1)
            torch.cuda.current_stream(device).wait_stream(side)
            for _ in range(SETTLE_GRAPHS):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    x.add_(1)
                graph.replay()
                del graph
            torch.cuda.synchronize(device)
        _settled[key] = SETTLE_GRAPHS
    return _settled[key]


def settled() -> int | None:
    """Graphs `settle` instantiated in this process (the largest over devices), None if none."""
    return max(_settled.values()) if _settled else None
