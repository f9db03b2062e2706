"""Local worker benchmark (printed, not asserted): what a trivial cell costs on the local host
with serving workers (the default) and with a fresh worker process per cell (--fresh-workers).

    .venv/bin/python tests/bench_local_worker.py --cells 150

It writes a scenario of N noop cells (sleep_s 0, `seed` swept over N values so the cells are
distinct) and runs `harness run` on it twice, in a temporary folder with its own results dir
and sqlite MLflow store. Each output line of `harness run` is timestamped as it arrives, which
splits the wall time into: start (interpreter, imports, scenario, journal of N cells), sweep
(first cell line to last), and the end (derived metrics, summary table, MLflow logging, the
HTML report). It also times the layers below the command in this process: LocalHost.run_cell
alone, then runner.run_cells (journal writes and progress display added), for the same N cells
with a serving worker and FRESH_LAYER_CELLS of them with fresh workers (their cost is the same
for every cell), so a per-cell cost can be put on the layer that spends it.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from harness.hosts.local import LocalHost  # noqa: E402
from harness.sweep import runner  # noqa: E402
from harness.sweep.journal import RunJournal  # noqa: E402

FRESH_LAYER_CELLS = 20


def scenario(n: int) -> str:
    seeds = ", ".join(str(i) for i in range(n))
    return (f"name: bench-local-worker\ndefaults:\n  workload: noop\n  sleep_s: 0.0\n"
            f"  timeout_s: 120\nmatrix:\n  seed: [{seeds}]\n")


def harness_run(folder: Path, n: int, extra: list[str]) -> dict:
    """Run `harness run` and time its phases from the moments its lines arrive."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    env.pop("MLFLOW_TRACKING_URI", None)
    tag = "fresh" if extra else "persistent"
    cmd = [sys.executable, "-m", "harness.cli", "run", str(folder / "bench.yaml"),
           "--tracking-uri", f"sqlite:///{folder}/mlflow-{tag}.db",
           "--results", str(folder / f"results-{tag}"), *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    stamps: dict[str, float] = {}
    for line in proc.stdout:
        now = time.perf_counter() - t0
        text = line.strip()
        if text.startswith("Run "):
            stamps.setdefault("run", now)
        elif " cell " in text and (text.startswith("ok") or text.startswith("failed")):
            stamps.setdefault("first_cell", now)
            stamps["last_cell"] = now
        elif text.startswith("MLflow:"):
            stamps["mlflow"] = now
        elif text.startswith("Report:"):
            stamps["report"] = now
    stderr = proc.stderr.read()
    code = proc.wait()
    total = time.perf_counter() - t0
    if code != 0:
        sys.exit(f"harness run {' '.join(extra)} exited {code}:\n{stderr[-3000:]}")
    return {"total": total, **stamps}


def in_process(n: int, folder: Path) -> dict:
    cells = [{"workload": "noop", "sleep_s": 0.0, "timeout_s": 120, "seed": i} for i in range(n)]
    out = {}
    for persistent in (True, False):
        host = LocalHost(persistent=persistent)
        some = cells if persistent else cells[:FRESH_LAYER_CELLS]

        async def go():
            try:
                for c in some:
                    result = await host.run_cell(c, 0, lambda _p: None)
                    assert result["status"] == "ok", result["error"]
            finally:
                await host.close()
        t0 = time.perf_counter()
        asyncio.run(go())
        out[f"host_{'persistent' if persistent else 'fresh'}"] = (time.perf_counter() - t0) / len(some)
        if persistent:     # the runner adds the journal and the progress display
            journal = RunJournal.create(folder / "runner-journal", "bench", "bench", None, "",
                                        cells, {})
            t0 = time.perf_counter()
            outcome = runner.run_cells(cells, [LocalHost(persistent=True)], journal,
                                       Console(file=io.StringIO(), width=200))
            out["runner_persistent"] = (time.perf_counter() - t0) / n
            assert outcome.n_failed == 0 and len(outcome.results) == n
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=150, help="noop cells per run (default 150)")
    parser.add_argument("--skip-layers", action="store_true",
                        help="only the two `harness run` timings")
    args = parser.parse_args()
    n = args.cells
    with tempfile.TemporaryDirectory(prefix="bench-local-worker-") as tmp:
        folder = Path(tmp)
        (folder / "bench.yaml").write_text(scenario(n))
        runs = {"persistent": harness_run(folder, n, []),
                "fresh": harness_run(folder, n, ["--fresh-workers"])}
        layers = {} if args.skip_layers else in_process(n, folder)

    print(f"{n} noop cells (sleep_s 0) on the local host; {os.cpu_count()} CPU(s), "
          f"Python {sys.version.split()[0]}\n")
    print(f"{'harness run':<28}{'per cell':>10}{'total':>9}{'start':>9}{'sweep':>9}"
          f"{'sweep/cell':>12}{'mlflow':>8}{'report':>8}{'rest':>7}")
    for name, r in runs.items():
        sweep = r["last_cell"] - r["run"]
        mlflow = r.get("mlflow", r["last_cell"]) - r["last_cell"]
        report = r.get("report", r.get("mlflow", r["last_cell"])) - r.get("mlflow", r["last_cell"])
        rest = r["total"] - r["last_cell"] - mlflow - report
        label = "default (serving workers)" if name == "persistent" else "--fresh-workers"
        print(f"{label:<28}{r['total'] / n:>9.3f}s{r['total']:>8.1f}s{r['run']:>8.1f}s"
              f"{sweep:>8.1f}s{sweep / n:>11.3f}s{mlflow:>7.1f}s{report:>7.1f}s{rest:>6.1f}s")
    if layers:
        print("\nlayers, in this process (per cell):")
        print(f"  LocalHost.run_cell, serving worker   {layers['host_persistent'] * 1000:8.1f} ms"
              f"   ({n} cells, the first one starting the worker)")
        print(f"  runner.run_cells, serving worker     {layers['runner_persistent'] * 1000:8.1f} ms"
              "   (+ journal writes, progress display)")
        print(f"  LocalHost.run_cell, fresh worker     {layers['host_fresh'] * 1000:8.1f} ms"
              f"   ({FRESH_LAYER_CELLS} cells)")
    print("\nper cell = total / cells; start = until the run id is printed; sweep = from there to "
          "the last cell's line; mlflow = from there to the MLflow line (derived metrics, summary "
          "table, logging every cell); report = the HTML report; rest = until the command exits.")


if __name__ == "__main__":
    main()
