"""`harness runs`: the journal's runs, newest first, read without touching them; the committed
H200 runs and a journal made here with a failed, a missing and a damaged cell."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_process import run_cli

from harness.protocol import params
from harness.sweep.journal import RunJournal

RESULTS = Path(__file__).resolve().parents[2] / "results" / "h200"


def harness_cli(*args: str, cwd: Path | None = None):
    """The CLI in a child process of its own (tests/cli_process.py): a terminal 200 wide."""
    out = run_cli(list(args), cwd=cwd or Path.cwd(), env=dict(os.environ, COLUMNS="200"))
    return out.returncode, out.stdout + out.stderr


def result(cell: dict, status: str, gpu: str | None = None) -> dict:
    cell = params.canonical(cell)
    return {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
            "status": status, "metrics": {}, "host": "gpu-a", "env": {"gpu": gpu}}


def test_the_h200_runs_newest_first_with_their_gpu_and_commit():
    code, out = harness_cli("runs", "--results", str(RESULTS), "--last", "3")
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert len(lines) == 3 and lines[0] > lines[1] > lines[2]          # run ids sort by time
    # The newest committed run, whichever it is: its id, scenario, cells that finished ok (a
    # run cut short lists the rest as not run), GPU and commit.
    newest = sorted(d for d in (RESULTS / "runs").iterdir() if (d / "run.json").is_file())[-1]
    run = json.loads((newest / "run.json").read_text())
    ok = sum(json.loads(f.read_text()).get("status") == "ok" for f in (newest / "cells").glob("*.json"))
    assert newest.name in lines[0] and run["scenario"] in lines[0]
    assert f"{ok} ok" in lines[0] and "NVIDIA H200" in lines[0]
    if ok < len(run["cells"]):
        assert f"{len(run['cells']) - ok} not run" in lines[0]
    assert run["meta"]["git_sha"][:10] in lines[0]
    assert "older run(s) not shown" in out
    code, only = harness_cli("runs", "--results", str(RESULTS), "--scenario", "verify65")
    verify65 = sum(json.loads((d / "run.json").read_text())["scenario"] == "verify65"
                   for d in (RESULTS / "runs").iterdir() if (d / "run.json").is_file())
    assert code == 0 and verify65 >= 2 and only.count("verify65") == verify65
    assert "tree-build" not in only


def test_failed_missing_and_damaged_cells_are_counted_and_left_alone(tmp_path):
    cells = [{"workload": "noop", "seed": i} for i in range(4)]
    j = RunJournal.create(tmp_path / "runs", "20260101-000000-aaaaaa", "nap", None, "name: nap\n",
                          cells, {"git_sha": "1234567890abcdef", "git_dirty": True, "trigger": "pr"})
    j.write_cell(result(cells[0], "ok"))
    j.write_cell(result(cells[1], "failed"))
    damaged = j.cells_dir / "deadbeef0000.json"
    damaged.write_text("{not json")
    (tmp_path / "runs" / "20260102-000000-bbbbbb").mkdir()
    (tmp_path / "runs" / "20260102-000000-bbbbbb" / "run.json").write_text("[1, 2")
    code, out = harness_cli("runs", "--results", str(tmp_path))
    assert code == 0, out
    assert "1 ok, 1 failed, 1 not run, 1 damaged" in out
    assert "1234567890 (dirty)" in out and "pr" in out and "gpu-a" in out and "cpu" in out
    assert "run.json damaged" in out and "Traceback" not in out
    assert damaged.read_text() == "{not json"                 # listed, never set aside


def test_the_targets_met_are_counted(tmp_path):
    """A run whose scenario states targets: how many its results meet; one without, nothing;
    targets that do not read, a '?'."""
    cells = [{"workload": "noop", "seed": i} for i in range(2)]
    text = ("name: aimed\ntargets:\n  - {cells: workload=noop, metric: work_ms, max: 5}\n"
            "  - {cells: seed=1, metric: work_ms, min: 4}\n")
    j = RunJournal.create(tmp_path / "runs", "20260101-000000-aaaaaa", "aimed", None, text, cells, {})
    for i, cell in enumerate(cells):
        j.write_cell({**result(cell, "ok"), "metrics": {"work_ms": 2.0 + i}})
    bad = RunJournal.create(tmp_path / "runs", "20260102-000000-bbbbbb", "aimed", None,
                            text.replace("max: 5", "maks: 5"), cells, {})
    RunJournal.create(tmp_path / "runs", "20260103-000000-cccccc", "plain", None, "name: plain\n", cells, {})
    code, out = harness_cli("runs", "--results", str(tmp_path))
    assert code == 0, out
    lines = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│")}
    assert "1 / 2 met" in lines[j.run_id]            # 2 and 3 ms <= 5 met; seed 1's 3 ms >= 4 not
    assert "?" in lines[bad.run_id].split("│")[4] and "met" not in lines["20260103-000000-cccccc"]


def test_no_runs_yet_says_how_to_make_one(tmp_path):
    code, out = harness_cli("runs", "--results", str(tmp_path))
    assert code == 0 and "No runs" in out and "harness run SCENARIO" in out


def test_version():
    import harness

    code, out = harness_cli("--version")
    assert code == 0 and out.strip() == f"specdec-harness {harness.__version__}"


def test_shell_completion_completes_the_commands():
    import os
    import subprocess
    import sys

    harness = Path(sys.executable).parent / "harness"             # the installed console script
    # The shell named, not detected: detection reads the process's ancestors, which under
    # make and pytest-xdist may hold no shell it knows (typer's own switch for tests).
    script = subprocess.run([str(harness), "--show-completion", "bash"], capture_output=True,
                            text=True, timeout=60,
                            env=dict(os.environ, _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"))
    assert script.returncode == 0, script.stderr
    assert "_HARNESS_COMPLETE=complete_bash" in script.stdout
    # What the bash function runs on TAB after `harness ru`:
    done = subprocess.run([str(harness)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COMP_WORDS="harness ru", COMP_CWORD="1",
                                   _HARNESS_COMPLETE="complete_bash"))
    assert done.stdout.split() == ["run", "runs"]
