"""The worker: runs one cell on this host.

    python -m harness.worker < cell.json > result.json

Reads one cell (a JSON object of parameters, see harness.params) on stdin, writes progress lines
on stderr (`@@progress {json}`; anything else on stderr is plain log) and exactly one result
JSON object on stdout. It imports only the standard library, torch, numpy and the bundled
kernels, so it runs under a GPU host's own Python with nothing installed there.

A cell that fails inside the workload (a kernel error, out of memory at 65k) still produces a
result, with status "failed" and the error; only a crash of the process itself leaves stdout
empty, and the controller records that as a failed cell with the stderr tail.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
import traceback

PROGRESS_PREFIX = "@@progress "


def progress(**fields) -> None:
    print(PROGRESS_PREFIX + json.dumps(fields), file=sys.stderr, flush=True)


def environment() -> dict:
    """Fingerprint of where the cell ran: what a reader needs to trust or compare a number."""
    env = {"hostname": socket.gethostname(), "platform": platform.platform(),
           "python": platform.python_version(), "cpu_count": os.cpu_count(),
           "torch": None, "cuda": None, "gpu": None, "gpu_count": 0, "driver": None}
    try:
        import torch
    except ImportError:
        return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    env["threads"] = torch.get_num_threads()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   sm=f"{props.major}.{props.minor}", driver=_driver_version())
    return env


def _driver_version() -> str | None:
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def run_cell(cell: dict) -> dict:
    from harness import params
    from harness.workloads import resolve

    cell = params.canonical(cell)
    result = {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
              "status": "failed", "error": None, "metrics": {}, "samples": {},
              "env": environment(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    t0 = time.perf_counter()
    try:
        out = resolve(cell["workload"])(cell, progress)
        result.update(out)
        result["status"] = "ok"
    except Exception as exc:  # a failing cell is a result, not a crash
        tb = traceback.format_exc(limit=6)
        result["error"] = f"{type(exc).__name__}: {exc}\n{tb[-4000:]}"
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    return result


def main() -> int:
    try:
        cell = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        print(f"worker: stdin is not a JSON cell: {exc}", file=sys.stderr)
        return 2
    result = run_cell(cell)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
