"""The worker: runs cells on this host.

    python -m harness.worker < cell.json > result.json        # one cell
    python -m harness.worker --serve                           # many cells, one per line
    python -m harness.worker --cells cells.jsonl --out DIR     # a batch (harness/worker/batch.py)

One-cell mode reads one cell (a JSON object of parameters, see harness.protocol.params) on stdin, writes
progress lines on stderr (`@@progress {json}`; anything else on stderr is plain log) and exactly
one result JSON object on stdout. The SSH launcher (harness/remote/launcher.py) and older callers use it.

Serve mode keeps one process (and whatever its workloads cache: torch, models, compiled
kernels) for a whole sweep of one slot. It reads requests as JSON lines on stdin,
`{"seq": N, "cell": {...}}`, runs them one after the other and writes exactly one line per
request on stdout: the result object plus `"seq": N`. On stderr, each cell starts with a line
`@@cell {"seq": N}`, so the controller knows which cell the progress and log lines that follow
belong to. EOF on stdin ends the process (exit 0). A request that is not a JSON object with
`seq` and `cell` gets the line `{"seq": null, "status": "failed", "error": "..."}` and the
process exits 2: the controller and the worker no longer agree on the stream, so the controller
treats the worker as broken. The result stream is protected: before the first cell, stdout
(fd 1) is pointed at stderr and results go to a private duplicate of the original stdout, so a
stray print from a workload (Python or a C library) lands in the log, never among the results;
stdin gets the same treatment, so nothing a workload starts can read the requests.
`SERVE_PROTOCOL` (harness/protocol/wire.py) names this protocol: the controller reads it from a
source tree to know whether that tree's worker can serve (an older commit's cannot).

Both modes import only the standard library, torch, numpy and the bundled kernels, and torch
only when a workload needs it, so the worker runs under a GPU host's own Python with nothing
installed there.

A cell that fails inside the workload (a kernel error, out of memory at 65k) still produces a
result, with status "failed" and the error; only a crash of the process itself leaves stdout
without a result, and the controller records that as a failed cell with the stderr tail.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path

from harness.protocol.errors import CellRefused
from harness.protocol.wire import CELL_PREFIX, PROGRESS_PREFIX, SERVE_PROTOCOL  # noqa: F401


# The tree the worker runs from (a checkout, or the copy the controller shipped to a host): a
# failed cell's traceback names its files relative to it, so a journal committed from any host
# carries no host's directory layout.
CODE_ROOT = Path(__file__).resolve().parents[2]


def relative_traceback(tb: str) -> str:
    """`tb` with the code root's absolute paths made relative to it."""
    return tb.replace(f"{CODE_ROOT}{os.sep}", "")


def progress(**fields) -> None:
    print(PROGRESS_PREFIX + json.dumps(fields), file=sys.stderr, flush=True)


def environment() -> dict:
    """Fingerprint of where the cell ran: what a reader needs to trust or compare a number.

    torch's own facts where the workload has imported it (called after the workload runs); a
    cell that needs no torch (noop) is not made to import it, ~2 s of CPU, for its fingerprint:
    then the torch version comes from the installed package's version file and the GPU from
    NVML (hostfacts.gpu_identity), and what neither can say is absent."""
    from harness.worker import hostfacts

    env = {"hostname": socket.gethostname(), "platform": platform.platform(),
           "python": platform.python_version(), "cpu_count": os.cpu_count(),
           "cpu_model": hostfacts.cpu_model(),   # a CPU cell's baseline class
           "torch": None, "cuda": None, "gpu": None, "gpu_count": 0, "driver": None}
    torch = sys.modules.get("torch")
    if torch is None:
        env.update(_torch_version_file())
        env.update(hostfacts.gpu_identity())
        return env
    graphs = sys.modules.get("harness.worker.graphstate")
    settled = graphs.settled() if graphs is not None else None
    if settled:                                        # harness/worker/graphstate.py says why
        env["cuda_graphs_settled"] = settled
    build = sys.modules.get("harness.kernels.build")
    extra = build.nvcc_flags()[len(build.NVCC_FLAGS):] if build is not None else ()
    if extra:                     # a debug or tensor-copy build of the CUDA kernels ran, not the default
        env["kernel_build_flags"] = list(extra)
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    env["threads"] = torch.get_num_threads()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   sm=f"{props.major}.{props.minor}", driver=_driver_version())
    return env


@functools.lru_cache(maxsize=1)
def _torch_version_file() -> dict:
    """{"torch": version, "cuda": the CUDA it was built for} from the installed torch's
    version.py, run on its own (it assigns a few constants), or {} without torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")     # finds the package without importing it
        path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
        names: dict = {}
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), names)
        return {"torch": str(names["__version__"]), "cuda": names.get("cuda")}
    except Exception:   # no torch, or a layout this does not know: absent, not guessed
        return {}


@functools.lru_cache(maxsize=None)
def _driver_version() -> str | None:
    # Cached: a serving worker fingerprints every cell, and nvidia-smi takes a while; the
    # driver cannot change under a process that has a CUDA context.
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def run_cell(cell: dict) -> dict:
    from harness.protocol import params
    from harness.worker import gpuseries, hostfacts
    from harness.worker.workloads import resolve

    cell = params.canonical(cell)
    result = {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
              "status": "failed", "error": None, "metrics": {}, "samples": {},
              "env": None, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    t0 = time.perf_counter()
    origin = time.time()
    # The facts that explain noise (load, clocks, throttling, foreign GPU processes), sampled
    # at the start and the end of the cell; absent where they cannot be read. Where NVML reads
    # the cell's GPU, also every gpuseries.INTERVAL_S in between, for its time series (a
    # snapshot's queries take a few µs each once its static fields are cached, see hostfacts);
    # a host without a GPU or NVML gets no sampler thread, since it would get no series.
    gpu = hostfacts.visible_gpu_index()
    interval = gpuseries.INTERVAL_S if gpu is not None and hostfacts.nvml_ready() else None
    facts = hostfacts.Sampler(gpu_index=gpu, interval_s=interval)
    try:
        with facts:
            out = resolve(cell["workload"])(cell, progress)
        result.update(out)
        result["status"] = "ok"
    except CellRefused as exc:  # the input is at fault, and the message says where
        result["error"] = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a failing cell is a result, not a crash
        tb = relative_traceback(traceback.format_exc(limit=6))
        result["error"] = f"{type(exc).__name__}: {exc}\n{tb[-4000:]}"
    result["env"] = environment()      # after the workload: it knows whether torch was needed
    result["host_facts"] = facts.summary()
    series = gpuseries.gpu_series(facts.samples, origin, interval)
    if series is not None:
        result["gpu_series"] = series
    result["wall_s"] = round(time.perf_counter() - t0, 3)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.worker",
                                     description="Run cells of the harness on this host.")
    parser.add_argument("--serve", action="store_true",
                        help="run many cells: JSON request lines on stdin, one result line each")
    parser.add_argument("--cells", type=Path, metavar="FILE",
                        help="batch: run the cells of this JSON-lines file (harness run "
                             "--export-cells), with no controller")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="batch: write DIR/batch.json and DIR/cells/<cell_id>.json "
                             "(harness import DIR)")
    args = parser.parse_args(argv)
    if (args.cells is None) != (args.out is None):
        parser.error("--cells FILE and --out DIR go together")
    if args.cells is not None:
        from harness.worker.batch import run_batch
        return run_batch(args.cells, args.out)
    return serve() if args.serve else run_one()


def run_one() -> int:
    """One-cell mode: one cell JSON on stdin, one result JSON on stdout."""
    try:
        cell = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        print(f"worker: stdin is not a JSON cell: {exc}", file=sys.stderr)
        return 2
    result = run_cell(cell)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def serve() -> int:
    """Serve mode: request lines on stdin, one result line per request on stdout."""
    # Private copies of the two protocol streams (os.dup makes them non-inheritable, so no
    # subprocess of a workload gets them); fd 0 and 1 become /dev/null and stderr.
    request_fd, result_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = os.fdopen(request_fd, "rb")
    while True:
        line = requests.readline()
        if not line:
            return 0                  # EOF: the controller is done with this worker
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or "seq" not in request \
                    or not isinstance(request.get("cell"), dict):
                raise ValueError("not an object with 'seq' and a 'cell' object")
        except ValueError as exc:     # json.JSONDecodeError is a ValueError
            _write_line(result_fd, {"seq": None, "status": "failed",
                                    "error": f"worker: bad request line: {exc}"})
            return 2
        seq = request["seq"]
        print(CELL_PREFIX + json.dumps({"seq": seq}), file=sys.stderr, flush=True)
        result = run_cell(request["cell"])
        try:
            reply = json.dumps({**result, "seq": seq})
        except (TypeError, ValueError) as exc:   # a workload returned something JSON cannot hold
            kept = {k: result.get(k) for k in ("cell", "cell_id", "label", "env", "started_at",
                                               "wall_s")}
            reply = json.dumps({**kept, "status": "failed", "metrics": {}, "samples": {},
                                "error": f"worker: result is not JSON: {exc}", "seq": seq})
        _write_line(result_fd, reply)


def _write_line(fd: int, reply: dict | str) -> None:
    data = ((reply if isinstance(reply, str) else json.dumps(reply)) + "\n").encode()
    while data:                       # a pipe may take a large line in several writes
        data = data[os.write(fd, data):]


if __name__ == "__main__":
    sys.exit(main())
