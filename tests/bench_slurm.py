"""Slurm benchmark (recorded, not asserted): what a cell costs on a slurm host against the
local host, one cell at a time and over a sweep.

    .venv/bin/python tests/bench_slurm.py         # as root: it starts a Slurm cluster
    -> results/slurm-benchmark.md

The cluster is tests/hosts/slurm_cluster.py (munged, slurmctld, slurmd from Debian's
packages; one node, this machine), run twice: with Slurm's stock scheduling and with
`batch_sched_delay=0`, the one setting that decides how soon a submitted batch job starts
(stock: up to 3 s later). Cells are `noop` (what is timed is the harness and Slurm, not a
workload) and the quickstart's first decode cell (a torch import per cell: a slurm task is a
fresh worker process, where the local host keeps one serving worker per slot). Both hosts run
the project's venv Python.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "hosts"))
import slurm_cluster  # noqa: E402
from slurm_cluster import SlurmCluster  # noqa: E402

from harness.hosts.local import LocalHost  # noqa: E402
from harness.hosts.slurm import SlurmHost  # noqa: E402
from harness.hosts.slurm_job import JobOptions  # noqa: E402
from harness.sweep import runner  # noqa: E402
from harness.sweep.journal import RunJournal  # noqa: E402

OUT = REPO / "results" / "slurm-benchmark.md"
NODE_SLOTS = 4                   # tasks the node runs at once (twice this machine's 2 cores)
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")
DECODE = {"model": "tiny", "device": "cpu", "dtype": "float32", "context_length": 256,
          "tree_budget": 16, "verify_mode": "sdpa", "graph_capture": "none", "tree_build": "cpu",
          "accept": "cpu", "block_size": 8, "warmup_steps": 2, "steps": 8, "repeats": 3,
          "profile_steps": 0, "timeout_s": 300}


def noop(i: int, sleep_s: float = 0.0) -> dict:
    return {"workload": "noop", "sleep_s": sleep_s, "seed": i, "timeout_s": 120}


async def one_at_a_time(host, cells: list[dict], warm: int = 1) -> dict:
    """run_cell's wall time minus the worker's own time in the cell, per cell, in a row."""
    over, walls = [], []
    try:
        for i, cell in enumerate(cells):
            t0 = time.perf_counter()
            result = await host.run_cell(cell, 0, lambda p: None)
            wall = time.perf_counter() - t0
            assert result["status"] == "ok", result.get("error")
            if i >= warm:                       # the first starts a worker / fills caches
                walls.append(wall)
                over.append(wall - result["wall_s"])
    finally:
        await host.close()
    return {"median": statistics.median(over), "max": max(over), "wall": statistics.median(walls),
            "n": len(over)}


def sweep(host, cells: list[dict], root: Path) -> float:
    journal = RunJournal.create(root, f"bench-{time.monotonic_ns()}", "bench", None, "", cells, {})
    t0 = time.perf_counter()
    outcome = runner.run_cells(cells, [host], journal, Console(file=io.StringIO(), width=200))
    took = time.perf_counter() - t0
    bad = [r.get("error") for r in outcome.results if r["status"] != "ok"]
    assert not bad and len(outcome.results) == len(cells), bad[:3]
    return took


def slurm_host(root: Path, max_tasks: int) -> SlurmHost:
    return SlurmHost(name="cluster", python=VENV_PYTHON, workdir=str(root / "work"),
                     options=JobOptions(), max_tasks=max_tasks)


async def decode_side_by_side(local: LocalHost, slurm: SlurmHost, n: int) -> dict:
    """Decode cells on both hosts in turn (the cores' other load hits both alike): per host,
    the median wall time per cell and the median overhead (wall minus the worker's wall_s)."""
    walls: dict = {"local": [], "slurm": []}
    over: dict = {"local": [], "slurm": []}
    try:
        for i in range(n + 1):
            for name, host in (("local", local), ("slurm", slurm)):
                t0 = time.perf_counter()
                result = await host.run_cell(dict(DECODE, seed=i), 0, lambda p: None)
                wall = time.perf_counter() - t0
                assert result["status"] == "ok", result.get("error")
                if i:                            # the first builds the serving worker
                    walls[name].append(wall)
                    over[name].append(wall - result["wall_s"])
    finally:
        await local.close()
        await slurm.close()
    return {name: {"wall": statistics.median(walls[name]), "over": statistics.median(over[name])}
            for name in walls}


def measure(root: Path, scheduler_parameters: str | None, n_latency: int, n_sweep: int,
            n_decode: int) -> dict:
    cluster = SlurmCluster(root / "cluster", scheduler_parameters=scheduler_parameters,
                           cpus=NODE_SLOTS)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        cluster.start()
        out = {"noop": asyncio.run(one_at_a_time(slurm_host(root, 1),
                                                 [noop(i) for i in range(n_latency + 1)])),
               "decode": asyncio.run(decode_side_by_side(
                   LocalHost(python=VENV_PYTHON, persistent=True), slurm_host(root, 1), n_decode)),
               "version": cluster.run("sbatch", "--version").stdout.strip()}
        for sleep_s in (0.0, 2.0):
            out[f"sweep_{sleep_s:g}"] = sweep(slurm_host(root, 32),
                                              [noop(i, sleep_s) for i in range(n_sweep)],
                                              root / "runs") / n_sweep
    finally:
        cluster.stop()
    return out


def measure_local(root: Path, n_latency: int, n_sweep: int, n_decode: int) -> dict:
    out = {
        "noop": asyncio.run(one_at_a_time(LocalHost(python=VENV_PYTHON, persistent=True),
                                          [noop(i) for i in range(n_latency + 1)])),
        "noop_fresh": asyncio.run(one_at_a_time(LocalHost(python=VENV_PYTHON, persistent=False),
                                                [noop(i) for i in range(n_latency + 1)])),
    }
    for sleep_s in (0.0, 2.0):
        out[f"sweep_{sleep_s:g}"] = sweep(LocalHost(python=VENV_PYTHON, persistent=True),
                                          [noop(i, sleep_s) for i in range(n_sweep)],
                                          root / "runs") / n_sweep
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=10, help="noop cells in a row (default 10)")
    parser.add_argument("--sweep", type=int, default=24, help="noop cells per sweep (default 24)")
    parser.add_argument("--decode", type=int, default=3, help="decode cells in a row (default 3)")
    args = parser.parse_args()
    why = slurm_cluster.available()
    if why:
        print(f"cannot run: {why}")
        return 2
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    root = Path(tempfile.mkdtemp(prefix="specdec-bench-slurm-"))
    try:
        local = measure_local(root / "local", args.cells, args.sweep, args.decode)
        stock = measure(root / "stock", None, args.cells, args.sweep, args.decode)
        tuned = measure(root / "tuned", "batch_sched_delay=0", args.cells, args.sweep, args.decode)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    slurm_version = stock["version"]
    load = os.getloadavg()
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    lines = [
        "# Slurm executor benchmark",
        "",
        "Recorded, not asserted. Produced by `.venv/bin/python tests/bench_slurm.py` (as root: "
        "it starts a single-node cluster, tests/hosts/slurm_cluster.py).",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}, Python "
        f"{platform.python_version()}, {slurm_version}; load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (other jobs shared the cores).  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}.",
        "",
        "## Overhead per cell, one cell at a time",
        "",
        "Wall time of `run_cell` minus the worker's own time in the cell (`wall_s`), median "
        f"over {local['noop']['n']} `noop` cells (sleep 0) in a row after a first one. Slurm: "
        "`max_tasks: 1`, so each cell is an array of one task: sbatch, scheduling, the task's "
        "start on the node, a fresh worker, its result file seen by the controller.",
        "",
        "| host | noop: overhead (median) | noop: max |",
        "| --- | --- | --- |",
        f"| local, serving worker (default) | {ms(local['noop']['median'])} | "
        f"{ms(local['noop']['max'])} |",
        f"| local, `--fresh-workers` | {ms(local['noop_fresh']['median'])} | "
        f"{ms(local['noop_fresh']['max'])} |",
        f"| slurm, stock scheduling | {ms(stock['noop']['median'])} | {ms(stock['noop']['max'])} |",
        f"| slurm, `batch_sched_delay=0` | {ms(tuned['noop']['median'])} | "
        f"{ms(tuned['noop']['max'])} |",
        "",
        f"The quickstart's first decode cell (CPU, the tiny model), {args.decode} in a row on "
        "each host in turn after a first one: the wall time per cell, and what of it is outside "
        "the worker's own `wall_s`. A slurm task's worker imports torch inside the cell, where "
        "the local host's serving worker imported it once, for the first cell.",
        "",
        "| cluster scheduling | local: wall per cell | slurm: wall per cell | slurm − local | "
        "slurm: outside the worker |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, m in (("stock", stock), ("`batch_sched_delay=0`", tuned)):
        d = m["decode"]
        lines.append(f"| {label} | {d['local']['wall']:.2f} s | {d['slurm']['wall']:.2f} s | "
                     f"{d['slurm']['wall'] - d['local']['wall']:+.2f} s | {ms(d['slurm']['over'])} |")
    lines += [
        "",
        f"## A sweep of {args.sweep} cells",
        "",
        "Whole sweep through `runner.run_cells` (journal writes included), divided by the "
        "number of cells. Local: one slot (one serving worker). Slurm: `max_tasks: 32`, so "
        "the sweep is one job array; the node takes "
        f"{NODE_SLOTS} tasks at once.",
        "",
        "| cells (`noop` sleep_s) | local, per cell | slurm stock, per cell | slurm "
        "`batch_sched_delay=0`, per cell |",
        "| --- | --- | --- | --- |",
        f"| 0 s | {ms(local['sweep_0'])} | {ms(stock['sweep_0'])} | {ms(tuned['sweep_0'])} |",
        f"| 2 s | {ms(local['sweep_2'])} | {ms(stock['sweep_2'])} | {ms(tuned['sweep_2'])} |",
        "",
        "Reading it: a slurm cell pays Slurm's scheduling (stock: a new batch job waits up to "
        "`batch_sched_delay`, 3 s, to be scheduled; then slurmctld's scheduler runs about once "
        "a second), the task's start on the node and a fresh worker process; the controller's "
        "own share is small (it sees a result file within 0.25 s of its writing). A decode "
        "cell also pays the torch import each time, which the local host's serving worker "
        "pays once. Against GPU cells of minutes the overhead is noise; for sweeps of many "
        "short cells, the array's tasks run side by side on as many nodes and GPUs as the "
        "cluster gives, which the sweep rows show with a node of "
        f"{NODE_SLOTS} task slots.",
        "",
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
