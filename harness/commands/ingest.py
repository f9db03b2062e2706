"""`harness ingest FILE.json`: a pytest-benchmark run (the JSON of `pytest --benchmark-json=FILE`,
or a file it saved with --benchmark-save / --benchmark-autosave) becomes a normal run: journal,
MLflow, report, gate.

Each benchmark is one cell of workload pytest_benchmark (harness/protocol/workloads/
pytest_benchmark.py): its `fullname`, `group` and `params` are the cell's parameters, so the
next run of the same test is the same cell and is gated against this one. Its metric is
kernel_us, the median time per call in µs (pytest-benchmark's own `stats.median`), with
kernel_us_spread, the median absolute deviation of the rounds.

Samples. `--benchmark-json` writes the time of every round (`stats.data`, per call); a file
saved with --benchmark-save carries them only with --benchmark-save-data. With them the samples
are the rounds, or, past MAX_SAMPLES rounds, the medians of MAX_SAMPLES runs of consecutive
rounds: the gate's statistics compare every pair of samples, and thousands of rounds of one
process say no more about the next process than fifty of their medians do. Without them there
is one number per benchmark and no samples are made up from the summary: ingest says so, and
the gate reports that metric but cannot gate it (one value a side is never significant: exit 2
when nothing else is left to gate).

Like a stored baseline's, these samples come from one process: a difference between two
processes larger than the threshold (code layout, clocks) reads as a change.

The scenario is made here, one `include` entry per benchmark, and kept in the journal
(scenario.yaml); its name is `--scenario NAME`, by default `pytest-benchmark.<project>` from
commit_info's project. The run records pytest-benchmark's commit (commit_info.id), not this
checkout's; `machine_info` becomes each result's environment and host facts, and its CPU model
the baseline class (harness.gate.baselines: CPU cells are compared by CPU model). A conftest
hook that sets `machine_info["gpu"]` to the GPU's name (torch.cuda.get_device_name()) makes the
GPU the class, as for the harness's own cells.

Exit codes as `harness import`: 0 every benchmark journaled and logged, 1 the MLflow upload
failed (the journal has everything; the printed command finishes it), 2 a FILE that is not
pytest-benchmark JSON (one line; file:line:column for a JSON syntax error).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import statistics
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import (console, err, fail_input, results_option,
                                      tracking_uri_option)
from harness.protocol.errors import InputError

WORKLOAD = "pytest_benchmark"
METRIC = "kernel_us"
# Above this many rounds the samples are medians of this many runs of consecutive rounds:
# 50 x 50 pairs is as far as the gate's exact Mann-Whitney distribution goes (stats.py).
MAX_SAMPLES = 50
# A suite with per-round data is a few MB; this is far past any, and short of what json.loads
# turns into gigabytes of Python objects.
MAX_BYTES = 64 * 2**20
UNVERSIONED = ("", "unversioned", "(unknown)")   # what pytest-benchmark writes outside git


def ingest(
    file: Path = typer.Argument(..., metavar="FILE.json",
                                help="pytest-benchmark JSON (pytest --benchmark-json=FILE)"),
    scenario_name: Optional[str] = typer.Option(
        None, "--scenario", metavar="NAME",
        help="scenario (MLflow experiment) name; default pytest-benchmark.<project>"),
    trigger: str = typer.Option("manual", "--trigger", help="manual | nightly | pr"),
    tracking_uri: Optional[str] = tracking_uri_option(
        "MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
):
    """Make a pytest-benchmark run a harness run: journal, MLflow, report, ready to gate.

    One cell per benchmark; the run is journaled, logged and reported as `harness run` does, so
    `harness gate` judges it like any run."""
    from harness.commands.run import finish
    from harness.protocol import params
    from harness.sweep import journal as jr, tracking
    from harness.sweep.runner import SweepOutcome
    from harness.sweep.scenario import TRIGGERS, parse_scenario, validate_tracking_uri

    try:
        if trigger not in TRIGGERS:
            raise InputError(None, None, None, f"--trigger must be one of {', '.join(TRIGGERS)}")
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        text = read_file(file)
        data = parse(text, str(file))
        commit = data["commit_info"]
        name = scenario_name or default_name(commit, file)
        cells = [bench_cell(b) for b in data["benchmarks"]]
        made = scenario_text(name, cells, file)
        try:
            sc = parse_scenario(made, f"{file} (the scenario made from it)",
                                max_cells=max(1, len(cells)))
        except InputError as e:
            raise InputError(str(file), None, None,
                             f"the scenario made from it is not valid: {e.message}") from None
    except InputError as e:
        raise fail_input(e)

    env, facts = environment(data["machine_info"], data.get("version"))
    host = str(env.get("hostname") or "unknown")
    when = data.get("datetime") if isinstance(data.get("datetime"), str) else None
    by_id = {params.cell_id(c): c for c in sc.cells()}
    results = [bench_result(by_id[params.cell_id(cell)], b, env, facts, host, when)
               for cell, b in zip(cells, data["benchmarks"])]
    sha, branch = (commit.get(k) if isinstance(commit.get(k), str)
                   and commit.get(k) not in UNVERSIONED else None for k in ("id", "branch"))
    meta = {"git_sha": sha, "git_branch": branch, "git_dirty": commit.get("dirty") is True,
            "trigger": trigger, "hosts": [host], "tracking_uri": uri,
            "ingested_from": {"file": str(file),
                              "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                              "pytest_benchmark": data.get("version"), "datetime": when,
                              "project": commit.get("project"),
                              "ingested_on": socket.gethostname()}}
    try:
        journal = jr.RunJournal.create(results_dir / "runs", jr.new_run_id(), sc.name, None,
                                       sc.text, sc.cells(), meta)
        for r in results:
            journal.write_cell(r)
    except jr.JournalError as e:
        raise fail_input(e)
    console.print(f"Ingested run [bold]{journal.run_id}[/]: scenario [bold]{escape(sc.name)}[/], "
                  f"{len(results)} benchmark(s) from {escape(str(file))} (measured on "
                  f"{escape(host)}, commit {escape(str(sha)[:10]) if sha else 'unknown'})",
                  highlight=False)
    summary_only = [r["label"] for r in results if not r["samples"]]
    if summary_only:
        err.print(f"[yellow]warning:[/] {escape(str(file))}: {len(summary_only)} of "
                  f"{len(results)} benchmark(s) have summary statistics only, no per-round data "
                  f"(a file saved without --benchmark-save-data): their {METRIC} is one value, "
                  f"which the gate reports but cannot gate", highlight=False)
    finish(journal, uri, SweepOutcome(results=results),
           f"harness run {journal.path / jr.SCENARIO_FILE} --resume {journal.run_id}")


# -- reading the file --------------------------------------------------------------------------


def read_file(path: Path) -> str:
    """The file's text (InputError: missing, too large, not UTF-8: at its line and column)."""
    from harness.sweep.yamldoc import Budget, read_text

    try:
        size = path.stat().st_size
    except OSError:
        size = 0          # read_text says what is wrong with it
    if size > MAX_BYTES:
        raise InputError(str(path), None, None,
                         f"{size / 2**20:.0f} MiB, more than the {MAX_BYTES // 2**20} MiB a "
                         f"pytest-benchmark file is read up to: split the run (pytest -k ...)")
    return read_text(path, "pytest-benchmark JSON", Budget(max_bytes=MAX_BYTES))


def parse(text: str, where: str) -> dict:
    """The file's data, checked to be what pytest-benchmark writes: machine_info and
    commit_info mappings (empty when absent) and a non-empty `benchmarks` list whose entries
    each have a unique `fullname` and `stats` with a `median` and `rounds`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(where, e.lineno, e.colno, f"not valid JSON: {e.msg}") from None
    except RecursionError:
        raise InputError(where, None, None, "not valid JSON: nested too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise InputError(where, None, None, "not pytest-benchmark JSON (no 'benchmarks' list): "
                                            "write it with pytest --benchmark-json=FILE")
    for key in ("machine_info", "commit_info"):
        if data.get(key) is None:
            data[key] = {}
        elif not isinstance(data[key], dict):
            raise InputError(where, None, None, f"'{key}' is {_kind(data[key])}, not an object")
    if not data["benchmarks"]:
        raise InputError(where, None, None, "no benchmarks in it (pytest-benchmark leaves out "
                                            "those that failed): nothing to ingest")
    seen: dict[str, int] = {}
    for i, b in enumerate(data["benchmarks"]):
        what = _check_benchmark(b)
        name = b.get("fullname") if isinstance(b, dict) else None
        at = f"benchmarks[{i}]" + (f" ({str(name)[:200]})" if isinstance(name, str) else "")
        if what:
            raise InputError(where, None, None, f"{at}: {what}")
        if name in seen:
            raise InputError(where, None, None, f"{at}: the same test as benchmarks[{seen[name]}]")
        seen[name] = i
    return data


def _check_benchmark(b) -> str | None:
    """Why `b` is not one benchmark of pytest-benchmark's JSON (None if it is)."""
    if not isinstance(b, dict):
        return f"{_kind(b)}, not a benchmark object"
    name = b.get("fullname")
    if not isinstance(name, str) or not re.fullmatch(r"[^\x00-\x1f\x7f]{1,1000}", name):
        return "'fullname' is not a test id (1 to 1000 characters, no control characters)"
    group = b.get("group")
    if group not in (None, "") and not (isinstance(group, str)
                                        and re.fullmatch(r"[^\x00-\x1f\x7f]{1,1000}", group)):
        return "'group' is not a group name (1 to 1000 characters, no control characters) or null"
    if b.get("params") is not None and not isinstance(b["params"], dict):
        return f"'params' is {_kind(b['params'])}, not an object or null"
    stats = b.get("stats")
    if not isinstance(stats, dict):
        return "no 'stats' object"
    if not _time(stats.get("median")):
        return "stats.median is not a time (a number of seconds >= 0)"
    rounds = stats.get("rounds")
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1):
        return "stats.rounds is not a count >= 1"
    data = stats.get("data")
    if data is not None and not (isinstance(data, list) and data and all(map(_time, data))):
        return "stats.data is not a list of round times (numbers of seconds >= 0)"
    return None


def _time(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)


def _kind(value) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number")


# -- the run -----------------------------------------------------------------------------------


def default_name(commit: dict, file: Path) -> str:
    """`pytest-benchmark.<project>` (the file's stem without a project): a name that is also a
    file name (baseline files are named after their scenario)."""
    project = commit.get("project")
    base = project if isinstance(project, str) and project.strip() else file.stem
    return "pytest-benchmark." + (re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "run")


def params_text(values: dict | None) -> str:
    """`n=64, dtype=float32`: the parametrisation in pytest's order (values as JSON, strings
    bare)."""
    return ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, default=str)}"
                     for k, v in (values or {}).items())


def bench_cell(b: dict) -> dict:
    """The cell's parameters that are not defaults (as the scenario lists them)."""
    cell = {"benchmark": b["fullname"]}
    if b.get("group"):                  # pytest-benchmark's "no group" is null (or "")
        cell["bench_group"] = b["group"]
    text = params_text(b.get("params"))
    if text:
        cell["bench_params"] = text[:1000]
    return {"workload": WORKLOAD, **cell}


def scenario_text(name: str, cells: list[dict], file: Path) -> str:
    """The scenario of these cells: one include entry each, the workload as the default."""
    import yaml

    doc = {"name": name,
           "description": f"pytest-benchmark results ingested from {file} by harness ingest: "
                          f"one cell per benchmark",
           "defaults": {"workload": WORKLOAD},
           "include": [{k: v for k, v in c.items() if k != "workload"} for c in cells]}
    head = ("# Made by `harness ingest` from pytest-benchmark JSON: one cell per benchmark.\n"
            "# Gate a later ingest against this run: harness gate THIS_FILE --baseline "
            "run:RUN_ID --run LATER_RUN_ID\n")
    return head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000,
                                 default_flow_style=None)


def environment(machine: dict, version) -> tuple[dict, dict]:
    """(env, host facts) of a result from pytest-benchmark's machine_info: what the worker's
    environment() records, where machine_info says it, and the machine_info itself as the
    facts; what it does not say is absent."""
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
    env = {"hostname": machine.get("node"),
           "platform": "-".join(str(machine[k]) for k in ("system", "release", "machine")
                                if machine.get(k)) or None,
           "python": machine.get("python_version"),
           "python_implementation": machine.get("python_implementation"),
           "cpu_model": cpu.get("brand_raw"),          # the baseline class of a CPU cell
           "cpu_count": cpu.get("count"),
           "gpu": machine.get("gpu") if isinstance(machine.get("gpu"), str) else None,
           "measured_by": f"pytest-benchmark {version}" if version else "pytest-benchmark"}
    env = {k: v for k, v in env.items() if v not in (None, "")}
    env.setdefault("gpu", None)
    # The CPU's feature flags are a hundred names per cell and explain no noise.
    facts = {"machine_info": {**machine, "cpu": {k: v for k, v in cpu.items() if k != "flags"}}}
    for key in ("cpu_model", "cpu_count"):
        if key in env:
            facts[key] = env[key]
    return env, facts


def samples_of(rounds_us: list[float]) -> list[float]:
    """The rounds, or past MAX_SAMPLES of them the medians of MAX_SAMPLES runs of consecutive
    rounds (sizes differing by at most one)."""
    n = len(rounds_us)
    if n <= MAX_SAMPLES:
        return list(rounds_us)
    bounds = [round(i * n / MAX_SAMPLES) for i in range(MAX_SAMPLES + 1)]
    return [statistics.median(rounds_us[a:b]) for a, b in zip(bounds, bounds[1:])]


def bench_result(cell: dict, b: dict, env: dict, facts: dict, host: str,
                 when: str | None) -> dict:
    """One benchmark as a journaled cell result (the shape a worker's result has)."""
    from harness.gate.noise import mad
    from harness.protocol import params

    stats = b["stats"]
    metrics = {METRIC: stats["median"] * 1e6}
    samples = {}
    if stats.get("data"):
        rounds_us = [v * 1e6 for v in stats["data"]]
        metrics[METRIC + "_spread"] = mad(rounds_us)
        samples[METRIC] = samples_of(rounds_us)
    kept = {k: b.get(k) for k in ("name", "fullname", "group", "params", "param", "extra_info",
                                  "options")}
    kept["stats"] = {k: v for k, v in stats.items() if k != "data"}
    kept["samples"] = ("none: summary statistics only" if not samples else
                       "the rounds" if len(samples[METRIC]) == len(stats["data"]) else
                       f"medians of {MAX_SAMPLES} runs of consecutive rounds")
    return {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
            "status": "ok", "error": None, "metrics": metrics, "samples": samples,
            "env": env, "host_facts": facts, "started_at": when, "host": host,
            "kernels": {}, "pytest_benchmark": kept}
