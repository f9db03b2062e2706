"""A GPU kernel of known duration that times itself: the calibration workload's "known work".

One program (one warp) reads the GPU's global nanosecond timer (%globaltimer, 32 ns steps on
Hopper, the clock CUPTI's kernel timestamps come from too) and spins until `duration_ns` have
passed, then writes its own [start, end] into slot `counter % capacity` of `stamps` and bumps
`counter`. So:
  - the duration does not depend on SM clocks, power or caches (a matmul's does: on an H200 a
    10 ms matmul ran 16 % faster with 50 % idle gaps than back to back, which is what broke
    the first calibration run);
  - what ran when is measured by the GPU itself, independently of the profiler and of CUDA
    events: the ground truth the idle meter is checked against.
The counter lives on the GPU, so the kernel works unchanged inside a CUDA graph (replays would
otherwise repeat one baked-in slot). Kernels of one stream run one after another, and Triton
lets only lane 0 store a scalar, so the read-modify-write of the counter needs no atomic.
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl


@triton.jit
def _globaltimer():
    # Not pure: the read must stay inside the loop (a pure asm could be hoisted out of it).
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _spin_kernel(stamps_ptr, counter_ptr, capacity, duration_ns):
    start = _globaltimer()
    now = start
    while now - start < duration_ns:
        now = _globaltimer()
    slot = tl.load(counter_ptr)
    tl.store(counter_ptr, slot + 1)
    i = (slot % capacity) * 2
    tl.store(stamps_ptr + i, start)
    tl.store(stamps_ptr + i + 1, now)


class SpinWork:
    """Launches the spin kernel on the current stream and remembers, per launch, the host time
    (time.perf_counter_ns) just before it: launch k (from 0, in launch order) writes stamp k.

    `launch()` runs it eagerly; `graphed()` returns a replay function of a CUDA graph that holds
    one spin kernel. Call `stamps()` after a synchronize: the [start, end] GPU nanoseconds of
    every launch so far (None for a launch whose slot was overwritten: keep windows shorter
    than `capacity` launches)."""

    def __init__(self, duration_us: float, device="cuda", capacity: int = 1 << 16):
        self.duration_ns = max(1, round(duration_us * 1e3))
        self.capacity = capacity
        self.stamp_buf = torch.zeros(capacity, 2, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.launch_ns: list[int] = []

    def _enqueue(self) -> None:
        _spin_kernel[(1,)](self.stamp_buf, self.counter, self.capacity, self.duration_ns,
                           num_warps=1)

    def launch(self) -> None:
        self.launch_ns.append(time.perf_counter_ns())
        self._enqueue()

    def graphed(self):
        """One spin kernel captured in a CUDA graph; returns the replay call (which counts as a
        launch). The warm-up outside the capture compiles the kernel and runs once."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.launch()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._enqueue()                  # captured, not run: no launch recorded

        def replay():
            self.launch_ns.append(time.perf_counter_ns())
            graph.replay()
        self.graph = graph                   # keep it alive with the work
        return replay

    def launches(self) -> int:
        return len(self.launch_ns)

    def stamps(self) -> list[tuple[int, int] | None]:
        """[start, end] GPU ns of launch 0, 1, ...; None where the slot was reused. Raises if
        the GPU counted a different number of kernels than were launched (a lost launch would
        shift every later stamp onto the wrong host time)."""
        counted = int(self.counter.item())
        n = self.launches()
        if counted != n:
            raise RuntimeError(f"spin kernel ran {counted} times for {n} launches")
        buf = self.stamp_buf.tolist()
        return [tuple(buf[k % self.capacity]) if k >= n - self.capacity else None
                for k in range(n)]
