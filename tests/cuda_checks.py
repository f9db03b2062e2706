"""What the kernel tests share: CUDA-graph capture and the no-host-sync check (`pytest -m gpu`),
and a KV cache that runs past its sequences with NaN there (the GPU and the emulated ones).

    from cuda_checks import capture, no_host_sync        # tests/ is on pytest's pythonpath
"""

from __future__ import annotations

import contextlib

import torch


def capture(fn, reps: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `reps` calls of fn, after two warm-up calls on a side stream (torch wants
    them before a capture, and they compile / load / allocate whatever fn needs)."""
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


@contextlib.contextmanager
def no_host_sync():
    """Inside, any CUDA call that synchronises the host raises (set_sync_debug_mode "error").
    Make the calls once before (compiles, first allocations, cached tables), not only here."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def with_nan_tail(inp: dict, lengths, tokens: int, rows: int) -> None:
    """Make inp's contiguous K and V [b, heads, keys, d] `rows` keys longer than the longest
    sequence, with NaN in every key past each sequence's L + tokens: a kernel that reads the cache
    there (a tensor copy's box does) must keep those rows out of its output."""
    for name in ("k", "v"):
        t = inp[name]
        t = torch.cat([t, torch.full((*t.shape[:2], rows, t.shape[3]), float("nan"), dtype=t.dtype,
                                     device=t.device)], 2)
        for i, L in enumerate(lengths):
            t[i, :, L + tokens:] = float("nan")
        inp[name] = t
