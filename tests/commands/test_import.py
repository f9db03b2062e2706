"""A batch with no controller, then `harness import`: the real CLI and the real worker.

`harness run --export-cells` writes the cells, `python -m harness.worker --cells --out` runs them
(in a folder of its own, as on a host that has nothing but the worker), and `harness import`
makes a normal run of the results: journal, MLflow (a real sqlite store), report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_process import run_cli

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "name: batch\nmatrix:\n  workload: [noop]\n  seed: [1, 2, 3]\ndefaults: {sleep_s: 0}\n"


def sh(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160")
    env.pop("MLFLOW_TRACKING_URI", None)
    if args[:2] == ("-m", "harness.cli"):        # the controller: tests/cli_process.py
        return run_cli(args[2:], cwd=cwd, env=env, timeout=240)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


def test_export_run_a_batch_and_import_it(fresh_store, tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    export = sh("-m", "harness.cli", "run", "s.yaml", "--export-cells", "cells.jsonl", cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    lines = [json.loads(x) for x in (tmp_path / "cells.jsonl").read_text().splitlines()]
    assert lines[0]["harness_batch"]["scenario"] == "batch" and len(lines) == 4
    assert not (tmp_path / "results").exists()                  # exporting runs nothing

    host = tmp_path / "gpu-host"          # the batch runs elsewhere, from the file alone
    host.mkdir()
    (host / "cells.jsonl").write_text((tmp_path / "cells.jsonl").read_text())
    batch = sh("-m", "harness.worker", "--cells", "cells.jsonl", "--out", "out", cwd=host)
    assert batch.returncode == 0, batch.stderr
    made = sorted((host / "out" / "cells").glob("*.json"))
    assert len(made) == 3
    again = sh("-m", "harness.worker", "--cells", "cells.jsonl", "--out", "out", cwd=host)
    assert again.returncode == 0 and '"skipped": true' in again.stderr    # done cells are kept

    # One result damaged, one foreign file dropped in: set aside, their cells missing.
    made[0].write_text('{"cell": ')
    foreign = json.loads(made[1].read_text())
    foreign["cell_id"] = made[2].stem
    made[1].write_text(json.dumps(foreign))
    uri = fresh_store(tmp_path)
    imported = sh("-m", "harness.cli", "import", str(host / "out"), "--tracking-uri", uri,
                  cwd=tmp_path)
    assert imported.returncode == 1, imported.stdout + imported.stderr   # two cells missing
    assert "Traceback" not in imported.stderr
    assert f"{made[0]}: damaged" in imported.stderr
    assert f"{made[1]}: names cell '{made[2].stem}', not the file's {made[1].stem}" in imported.stderr
    assert "1 of 3 cell(s)" in imported.stdout and "MLflow: 1 cell run(s) logged" in imported.stdout
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert [p.stem for p in (run / "cells").glob("*.json")] == [made[2].stem]
    assert (run / "report" / "index.html").exists()
    meta = json.loads((run / "run.json").read_text())["meta"]
    assert meta["imported_from"]["dir"] == str(host / "out") and meta["hosts"]


def test_what_is_not_a_batch_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    out = sh("-m", "harness.cli", "import", "empty", cwd=tmp_path)
    assert out.returncode == 2 and "empty/batch.json: no such file" in out.stderr
    (tmp_path / "cells.jsonl").write_text('{"harness_batch": {}}\n[1, 2]\n')
    bad = sh("-m", "harness.worker", "--cells", "cells.jsonl", "--out", "o", cwd=tmp_path)
    assert bad.returncode == 2 and "cells.jsonl:2: a cell is a JSON object, got list" in bad.stderr
    alone = sh("-m", "harness.worker", "--cells", "cells.jsonl", cwd=tmp_path)
    assert alone.returncode == 2 and "--cells FILE and --out DIR go together" in alone.stderr


def test_batches_split_over_calls_import_as_one_run(fresh_store, tmp_path):
    """A scenario's cells run as two batches (a device call's time limit splits them) and a
    third that ran one cell again: `harness import A B` is one run of all of them, with the
    derived metrics one run allows; a cell that ran in two batches, another scenario or another
    commit is refused in one line."""
    (tmp_path / "s.yaml").write_text(SCENARIO)
    assert sh("-m", "harness.cli", "run", "s.yaml", "--export-cells", "all.jsonl",
              cwd=tmp_path).returncode == 0
    header, *cells = (tmp_path / "all.jsonl").read_text().splitlines()

    def batch(name, lines, head=header):
        (tmp_path / f"{name}.jsonl").write_text("\n".join([head, *lines]) + "\n")
        out = sh("-m", "harness.worker", "--cells", f"{name}.jsonl", "--out", name, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        return tmp_path / name

    a, b = batch("a", cells[:2]), batch("b", cells[2:])
    uri = fresh_store(tmp_path)
    both = sh("-m", "harness.cli", "import", str(a), str(b), str(a), "--tracking-uri", uri, cwd=tmp_path)
    assert both.returncode == 0, both.stdout + both.stderr
    assert "3 of 3 cell(s)" in both.stdout
    (run,) = (tmp_path / "results" / "runs").iterdir()
    assert len(list((run / "cells").glob("*.json"))) == 3
    meta = json.loads((run / "run.json").read_text())["meta"]
    assert meta["imported_from"]["dirs"] == [str(a), str(b)] and meta["imported_from"]["finished_at"]

    again = batch("again", cells[:1])
    twice = sh("-m", "harness.cli", "import", str(a), str(again), "--tracking-uri", uri, cwd=tmp_path)
    assert twice.returncode == 2 and "Traceback" not in twice.stderr
    stem = sorted((again / "cells").glob("*.json"))[0].stem
    assert f"cell {stem} ran in two batches (also {a}" in twice.stderr

    other = json.loads(header)
    other["harness_batch"]["git_sha"] = "0" * 40
    elsewhere = batch("elsewhere", cells[2:], json.dumps(other))
    mixed = sh("-m", "harness.cli", "import", str(a), str(elsewhere), "--tracking-uri", uri, cwd=tmp_path)
    assert mixed.returncode == 2
    assert f"{elsewhere}/batch.json: another commit than {a}'s" in mixed.stderr
    assert len(list((tmp_path / "results" / "runs").iterdir())) == 1     # nothing half-imported


def test_of_two_results_for_a_cell_the_one_that_ran_is_kept():
    import pytest

    from harness.commands.import_ import _one_result
    from harness.protocol.errors import InputError
    ok, failed = (Path("a/cells/c1.json"), {"status": "ok"}), (Path("b/cells/c1.json"), {"status": "failed"})
    assert _one_result(None, failed) == failed
    assert _one_result(failed, ok) == ok and _one_result(ok, failed) == ok
    assert _one_result(failed, (Path("c/cells/c1.json"), {"status": "failed"})) == failed
    with pytest.raises(InputError, match="ran in two batches"):
        _one_result(ok, (Path("c/cells/c1.json"), {"status": "ok"}))


def test_a_batch_from_another_commit_names_the_commit_that_imports_it(fresh_store, tmp_path):
    """A batch exported at a commit where its scenario was valid (a value since removed) or its
    cells had other ids (a knob since added, which changes every id): the line says at which
    commit it was exported and how to import it there. A batch of no known commit gets the
    plain line, with nothing about commits."""
    batch = tmp_path / "batch"
    (batch / "cells").mkdir(parents=True)

    def header(sha: str, text: str) -> None:
        (batch / "batch.json").write_text(json.dumps({"scenario": "batch", "scenario_text": text,
                                                      "git_sha": sha}))

    def import_batch() -> subprocess.CompletedProcess:
        return sh("-m", "harness.cli", "import", str(batch), "--tracking-uri", fresh_store(tmp_path),
                  cwd=tmp_path)

    removed = SCENARIO.replace("[noop]", "[noop_since_removed]")
    header("ab" * 20, removed)
    out = import_batch()
    assert out.returncode == 2 and "Traceback" not in out.stderr
    line = out.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: {batch}/batch.json (scenario):3:")
    assert line.endswith("(the batch was exported at ababababab and this checkout is at no commit: "
                         "import it with that commit's harness, e.g. from `git worktree add DIR "
                         "ababababab`)"), line
    header("unknown", removed)
    plain = import_batch()
    assert plain.returncode == 2 and f"{batch}/batch.json (scenario):3:" in plain.stderr
    assert "exported at" not in plain.stderr

    # A result whose cell id this checkout does not make from the batch's scenario.
    (batch / "cells" / "abcdef012345.json").write_text(json.dumps(
        {"cell": {"workload": "noop", "seed": 1}, "cell_id": "abcdef012345", "status": "ok"}))
    header("ab" * 20, SCENARIO)
    missing = import_batch()
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert ("abcdef012345.json: not a cell of the batch's scenario; its cell counts as missing "
            "(the batch was exported at ababababab") in " ".join(missing.stderr.split())
