"""The process Nsight Compute profiles for a kernel or op cell (harness/worker/ncu.py starts it).

`python -m harness.worker.ncu_target CELL.json MODE`: the call the cell's workload runner builds
for MODE (`profile_call`: a kernel cell's verify mode on its first timed input set, an op cell's
kernel on its first), three untimed calls (Triton compiles, the CUDA libraries load, plans are
cached), then one call between cudaProfilerStart and cudaProfilerStop, the only kernels ncu
(`--profile-from-start off`) records. Exit 2 with one line when the cell cannot run here.
"""

from __future__ import annotations

import importlib
import json
import sys

import torch

from harness.protocol import workloads
from harness.worker.workloads.decode import resolve_device, resolve_dtype

WARMUP_CALLS = 3


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m harness.worker.ncu_target CELL.json MODE", file=sys.stderr)
        return 2
    cell_file, mode = argv
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
    runner = importlib.import_module(workloads.SPECS[cell["workload"]].runner.partition(":")[0])
    with torch.no_grad():
        call = runner.profile_call(cell, mode, device, resolve_dtype(cell, device))
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
