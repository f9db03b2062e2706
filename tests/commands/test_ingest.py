"""`harness ingest FILE.json` on the JSON of real pytest-benchmark runs: a benchmark test file is
written, run with `pytest --benchmark-json` in a git repository of its own (so commit_info has a
commit), ingested, and then journaled, logged (a real sqlite MLflow store), reported and gated
against an earlier ingest like any run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_process import run_cli
from harness.gate.baselines import gpu_class
from harness.protocol import params
from harness.protocol.errors import CellRefused
from harness.worker import workloads as runners

REPO = Path(__file__).resolve().parents[2]

# Sleeps: a regression of a known size that a busy CI machine cannot fake or hide. test_sleep
# has params and a group; test_short has neither, and more rounds than ingest keeps as samples.
BENCH = """
import time

import pytest

DELAY = {delay}


@pytest.mark.parametrize("n", [1, 2])
def test_sleep(benchmark, n):
    benchmark.group = "sleep"
    benchmark.pedantic(time.sleep, args=(DELAY * n,), rounds=20, warmup_rounds=1)


def test_short(benchmark):
    benchmark.pedantic(time.sleep, args=(DELAY / 4,), rounds=120)
"""


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160")
    for k in ("MLFLOW_TRACKING_URI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
              "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST"):
        e.pop(k, None)
    return e


def harness(*args, cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(list(args), cwd=cwd, env=env(), timeout=240)


def git(*args, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def bench(tmp_path: Path, delay: float, out: str, *extra: str) -> dict:
    """Commit the benchmark file at `delay` and run it under pytest-benchmark; its JSON."""
    (tmp_path / "test_bench.py").write_text(BENCH.format(delay=delay))
    git("add", "test_bench.py", cwd=tmp_path)
    git("commit", "-q", "-m", f"delay {delay}", cwd=tmp_path)
    args = [f"--benchmark-json={out}"] if out else []
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "test_bench.py", *args, *extra], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((tmp_path / out).read_text()) if out else {}


def only_new_run(tmp_path: Path, before: set[str]) -> Path:
    (run,) = [p for p in (tmp_path / "results" / "runs").iterdir() if p.name not in before]
    return run


def runs(tmp_path: Path) -> set[str]:
    root = tmp_path / "results" / "runs"
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


@pytest.fixture
def project(tmp_path):
    git("init", "-q", cwd=tmp_path)
    return tmp_path


def test_ingest_journals_logs_reports_and_gates_like_a_run(project, fresh_store):
    tmp = project
    base = bench(tmp, 0.002, "base.json")
    sha = git("rev-parse", "HEAD", cwd=tmp)
    assert base["commit_info"]["id"] == sha and all(b["stats"]["data"] for b in base["benchmarks"])
    uri = fresh_store(tmp)

    out = harness("ingest", "base.json", "--tracking-uri", uri, cwd=tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "3 benchmark(s) from base.json" in out.stdout
    first = only_new_run(tmp, set())

    # The journal: one cell per benchmark, as a worker result, with the file's numbers.
    run = json.loads((first / "run.json").read_text())
    assert run["meta"]["git_sha"] == sha and run["scenario"].startswith("pytest-benchmark.")
    cells = {r["cell"]["benchmark"]: r for r in
             (json.loads(p.read_text()) for p in (first / "cells").glob("*.json"))}
    assert sorted(cells) == ["test_bench.py::test_short", "test_bench.py::test_sleep[1]",
                             "test_bench.py::test_sleep[2]"]
    machine = base["machine_info"]
    for b in base["benchmarks"]:
        r = cells[b["fullname"]]
        assert r["status"] == "ok" and r["cell_id"] == params.cell_id(r["cell"])
        assert r["cell"]["bench_group"] == b["group"]
        assert r["metrics"]["kernel_us"] == pytest.approx(b["stats"]["median"] * 1e6)
        assert r["env"]["cpu_model"] == machine["cpu"]["brand_raw"]
        assert r["host_facts"]["machine_info"]["node"] == machine["node"] == r["host"]
        assert "data" not in r["pytest_benchmark"]["stats"]
    sleep1 = cells["test_bench.py::test_sleep[1]"]
    assert sleep1["cell"]["bench_params"] == "n=1"
    assert sleep1["samples"]["kernel_us"] == pytest.approx(
        [v * 1e6 for v in base["benchmarks"][0]["stats"]["data"]])          # 20 rounds: all kept
    short = cells["test_bench.py::test_short"]
    assert short["cell"]["bench_group"] is None and short["cell"]["bench_params"] == ""
    assert len(short["samples"]["kernel_us"]) == 50                         # 120 rounds: 50 medians
    assert 400 < short["metrics"]["kernel_us"] < 5000

    # MLflow: the scenario's experiment, a child run per benchmark with its parameters.
    import mlflow
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(run["scenario"])
    children = client.search_runs([exp.experiment_id], "tags.status = 'ok'")
    assert len(children) == 3
    logged = {c.data.params["benchmark"]: c for c in children}
    assert logged["test_bench.py::test_sleep[2]"].data.params["bench_params"] == "n=2"
    assert logged["test_bench.py::test_sleep[2]"].data.tags["git.sha"] == sha
    assert logged["test_bench.py::test_short"].data.metrics["kernel_us"] == pytest.approx(
        short["metrics"]["kernel_us"])

    # The report draws the cells.
    report = harness("report", first.name, "--no-mlflow", cwd=tmp)
    assert report.returncode == 0, report.stdout + report.stderr
    page = (first / "report" / "index.html").read_text()
    assert "test_bench.py::test_sleep[1]" in page and "kernel µs" in page

    # The same data again: unchanged. A benchmark twice as slow: a regression.
    scenario = first / "scenario.yaml"
    assert harness("ingest", "base.json", "--tracking-uri", uri, cwd=tmp).returncode == 0
    again = only_new_run(tmp, {first.name})
    same = harness("gate", scenario, "--baseline", f"run:{first.name}", "--run", again.name,
                   cwd=tmp)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "3 unchanged" in same.stdout

    bench(tmp, 0.004, "slow.json")
    before = runs(tmp)
    assert harness("ingest", "slow.json", "--tracking-uri", uri, cwd=tmp).returncode == 0
    slow = only_new_run(tmp, before)
    worse = harness("gate", scenario, "--baseline", f"run:{first.name}", "--run", slow.name,
                    cwd=tmp)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "3 regressed" in worse.stdout

    # Baselines by machine: the first run marked in MLflow is the baseline of this CPU model.
    mark = harness("baseline", "mark", first.name, "--tracking-uri", uri, cwd=tmp)
    assert mark.returncode == 0, mark.stdout + mark.stderr
    stored = harness("gate", scenario, "--baseline", "mlflow", "--run", slow.name,
                     "--tracking-uri", uri, "--json", "gate.json", cwd=tmp)
    assert stored.returncode == 1, stored.stdout + stored.stderr
    report = json.loads((tmp / "gate.json").read_text())
    assert report["gpu_classes"] == [gpu_class(None, machine["cpu"]["brand_raw"])]
    assert {c["verdict"] for c in report["cells"]} == {"regressed"}


def test_summary_statistics_only_are_reported_never_gated(project, fresh_store):
    """A file saved without --benchmark-save-data has no rounds: one value a benchmark, which
    ingest says and the gate refuses to decide on."""
    bench(project, 0.001, "", "--benchmark-save=nodata", "--benchmark-storage=file://store")
    (saved,) = (project / "store").rglob("*_nodata.json")
    assert "data" not in json.loads(saved.read_text())["benchmarks"][0]["stats"]
    uri = fresh_store(project)
    out = harness("ingest", saved, "--tracking-uri", uri, cwd=project)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 of 3 benchmark(s) have summary statistics only" in out.stderr
    (run,) = (project / "results" / "runs").iterdir()
    results = [json.loads(p.read_text()) for p in (run / "cells").glob("*.json")]
    assert all(r["samples"] == {} and r["metrics"]["kernel_us"] > 0 for r in results)
    assert {r["pytest_benchmark"]["samples"] for r in results} == {"none: summary statistics only"}

    gate = harness("gate", run / "scenario.yaml", "--baseline", f"run:{run.name}", "--run",
                   run.name, cwd=project)
    assert gate.returncode == 2 and "Traceback" not in gate.stderr
    (line,) = gate.stderr.strip().splitlines()
    assert "1 vs 1 sample(s) of `kernel_us`" in line and "can never be significant" in line


@pytest.mark.parametrize("text, message", [
    ('{"benchmarks": [\n  {"fullname": "t",, "stats": {}}\n]}',
     "bad.json:2:20: not valid JSON: Expecting property name enclosed in double quotes"),
    ("[1, 2]", "bad.json: not pytest-benchmark JSON (no 'benchmarks' list)"),
    ('{"benchmarks": []}', "bad.json: no benchmarks in it"),
    ('{"benchmarks": [{"fullname": "t.py::a", "stats": {"median": -1, "rounds": 3}}]}',
     "bad.json: benchmarks[0] (t.py::a): stats.median is not a time"),
    ('{"benchmarks": ['
     + ", ".join(['{"fullname": "t.py::a", "stats": {"median": 1, "rounds": 1}}'] * 2) + "]}",
     "bad.json: benchmarks[1] (t.py::a): the same test as benchmarks[0]"),
])
def test_a_file_that_is_not_pytest_benchmark_json_is_one_line_and_exit_2(tmp_path, text, message):
    (tmp_path / "bad.json").write_text(text)
    out = harness("ingest", "bad.json", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert not (tmp_path / "results").exists()


def test_a_worker_refuses_to_measure_an_ingested_cell():
    cell = params.canonical({"workload": "pytest_benchmark", "benchmark": "t.py::test_a"})
    with pytest.raises(CellRefused, match="measured by pytest-benchmark, not by a worker"):
        runners.resolve("pytest_benchmark")(cell, lambda **_: None)
