"""The process Nsight Compute profiles for a kernel cell (harness/worker/ncu.py starts it).

`python -m harness.worker.ncu_target CELL.json MODE CUSTOM_IMPL CUSTOM_SPLITS`: the cell's first
timed input set, three untimed calls of MODE (Triton compiles, the CUDA library loads, the plan
is cached), then one call between cudaProfilerStart and cudaProfilerStop, the only kernels ncu
(`--profile-from-start off`) records. Exit 2 with one line when the cell cannot run here.
"""

from __future__ import annotations

import json
import sys

import torch

from harness.worker.workloads import kernel as kw
from harness.worker.workloads.decode import resolve_device, resolve_dtype

WARMUP_CALLS = 3


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m harness.worker.ncu_target CELL.json MODE CUSTOM_IMPL CUSTOM_SPLITS",
              file=sys.stderr)
        return 2
    cell_file, mode, impl, splits = argv
    with open(cell_file, encoding="utf-8") as f:
        cell = json.load(f)
    try:
        device = resolve_device(cell)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    if device.type != "cuda":
        print(f"ncu profiles CUDA kernels; this cell runs on {device}", file=sys.stderr)
        return 2
    dtype = resolve_dtype(cell, device)
    pt = kw.Point.from_cell(cell)
    inp = kw.make_inputs(pt, [pt.context] * pt.batch, cell["seed"] * 1000 + 1, device, dtype)
    call = kw.prepare(mode, pt, inp, custom_impl=impl, custom_splits=int(splits) or None)
    for _ in range(WARMUP_CALLS):
        call()
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize(device)
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
