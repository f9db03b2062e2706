"""`-k EXPR` (harness/sweep/cellfilter.py): words in labels, key=value on canonical parameters,
and / or / not / parentheses, and one line for every way an expression can be wrong; then the
CLI: validate, run --dry-run and run -k --export-cells."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_process import run_cli

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.cellfilter import select

CELLS = [{"context_length": c, "verify_mode": v} for c in (4096, 65536) for v in ("sdpa", "triton")] + \
    [{"workload": "kernel", "verify_mode": "custom", "tree_tokens": 65}]


def picked(expr: str) -> list[str]:
    return [params.cell_label(c) for c in select(CELLS, expr)]


@pytest.mark.parametrize("expr,count", [
    ("triton", 2), ("TRITON", 2), ("ctx=4096", 2),          # a word: in the label
    ("context_length=4096", 2), ("context_length=256", 1),  # the kernel cell's default context ("verify_mode=triton", 2), ("workload=kernel", 1),
    ("triton and not context_length=65536", 1), ("sdpa or custom", 3),
    ("not (workload=kernel or verify_mode=sdpa)", 2), ("tree_tokens=65", 1),
])
def test_expressions_select(expr, count):
    assert len(picked(expr)) == count, picked(expr)


def test_no_expression_is_every_cell_in_order():
    assert select(CELLS, None) == CELLS


@pytest.mark.parametrize("expr,why", [
    ("", "is empty"), ("triton and", "ends where a word"), ("(triton", "never closed"),
    ("triton )", "unexpected ')' at column 8"), ("or triton", "'or' at column 1"),
    ("contxt_length=4096", "selects none of the 5 cell(s) (contxt_length: not a cell parameter"),
    ("flashinfer", "selects none of the 5 cell(s)"),
])
def test_a_bad_expression_is_one_line_naming_it(expr, why):
    with pytest.raises(InputError) as info:
        select(CELLS, expr)
    assert why in str(info.value) and f"-k {expr!r}" in str(info.value)


SCENARIO = "name: k\nmatrix:\n  workload: [noop]\n  seed: [1, 2, 3]\n  sleep_s: [0, 0.5]\n"


def cli(*args: str, cwd: Path | None = None):
    """The CLI in a child process of its own (tests/cli_process.py): a terminal 200 wide."""
    out = run_cli(list(args), cwd=cwd or Path.cwd(), env=dict(os.environ, COLUMNS="200"))
    return out.returncode, out.stdout + out.stderr


def test_validate_and_dry_run_show_the_selection_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.yaml").write_text(SCENARIO)
    code, out = cli("validate", "k.yaml", "-k", "seed=2")
    assert code == 0 and "6 cell(s) (2 of 6 selected by -k)" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("  ")]) == 2      # the two listed
    code, out = cli("run", "k.yaml", "-k", "seed=2 and sleep_s=0.5", "--dry-run")
    assert code == 0, out
    assert "would run 1 cell(s) on local" in out and "nothing was run" in out
    assert not (tmp_path / "results").exists()
    code, out = cli("run", "k.yaml", "-k", "seed=9")
    assert code == 2 and "selects none of the 6 cell(s)" in out
    assert not (tmp_path / "results").exists()


def test_an_exported_selection_is_the_batch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.yaml").write_text(SCENARIO)
    code, out = cli("run", "k.yaml", "-k", "not seed=3", "--export-cells", "cells.jsonl")
    assert code == 0, out
    header, *cells = [json.loads(line) for line in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert header["harness_batch"]["cells"] == 4 == len(cells)
    assert {c["seed"] for c in cells} == {1, 2}


def test_a_gate_judges_only_the_selected_cells(tmp_path, monkeypatch):
    # Two real H200 runs (the CUDA tree build before and after a 5 % speed-up, and three cells
    # that did not change): -k keeps the gate to the tree build.
    import shutil
    from pathlib import Path

    h200 = Path(__file__).resolve().parents[2] / "results" / "h200" / "runs"
    base, head = "20261201-205334-dfe5a3", "20261201-205343-755b9a"
    for run in (base, head):
        shutil.copytree(h200 / run, tmp_path / "runs" / run)
    monkeypatch.chdir(tmp_path)
    args = ["gate", f"runs/{head}/scenario.yaml", "--baseline", f"run:{base}", "--run", head,
            "--results", str(tmp_path)]
    code, out = cli(*args, "-k", "tree_build")
    assert code == 0, out
    assert "2 improved (2 cell(s))" in out and "topk" not in out.split("passed")[-1]
    code, out = cli(*args, "-k", "flashinfer")
    assert code == 2 and "selects none of the 5 cell(s)" in out


def test_run_json_says_what_a_script_needs(tmp_path, monkeypatch, fresh_store):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.yaml").write_text(SCENARIO)
    code, out = cli("run", "k.yaml", "-k", "sleep_s=0 and not seed=3", "--json", "out.json",
                    "--tracking-uri", fresh_store(tmp_path))
    assert code == 0, out
    outcome = json.loads((tmp_path / "out.json").read_text())
    assert outcome["logged"] is True and outcome["interrupted"] is False
    assert outcome["not_run"] == [] and len(outcome["cells"]) == 2
    assert {c["status"] for c in outcome["cells"]} == {"ok"}
    assert (tmp_path / outcome["journal"] / "run.json").is_file()
    assert outcome["resume"].startswith("harness run k.yaml --resume " + outcome["run_id"])


def test_resuming_a_finished_run_with_k_only_logs(tmp_path, monkeypatch, fresh_store):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.yaml").write_text(SCENARIO)
    uri = fresh_store(tmp_path)
    code, out = cli("run", "k.yaml", "-k", "seed=1 and sleep_s=0", "--json", "out.json",
                    "--tracking-uri", uri)
    assert code == 0, out
    run_id = json.loads((tmp_path / "out.json").read_text())["run_id"]
    code, out = cli("run", "k.yaml", "--resume", run_id, "-k", "seed=1", "--tracking-uri", uri)
    assert code == 0 and "0 of 1 cell(s) to run" in out, out
