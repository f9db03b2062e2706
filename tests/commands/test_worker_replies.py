"""A worker's reply is not trusted: real `harness run`, real worker processes that lie.

The local host's `python` is a wrapper that runs the real worker on the cell it is sent and then
changes what it answers, by the cell's seed: seed 0 answers honestly; seed 1 answers with seed
0's cell id (an overwrite of a good result, if trusted); seed 2 with `../../escaped` (a file
outside the journal); seed 3 prints an extra JSON line after its result; seed 4 prints 80 MB
before an honest result (the controller keeps a bounded tail). Each lie is that cell's failure
and nothing else's; the run finishes, is logged, and says so with exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

LIAR = textwrap.dedent('''\
    #!{python}
    import json, subprocess, sys
    if sys.argv[1:3] != ["-m", "harness.worker"] or len(sys.argv) > 3:
        raise SystemExit(subprocess.call([{python!r}, *sys.argv[1:]]))
    sent = sys.stdin.read()
    seed = json.loads(sent)["seed"]
    done = subprocess.run([{python!r}, "-m", "harness.worker"], input=sent,
                          capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if seed == 1:
        from harness.protocol import params
        result["cell_id"] = params.cell_id(params.canonical({{**result["cell"], "seed": 0}}))
    elif seed == 2:
        result["cell_id"] = "../../escaped"
    elif seed == 4:
        line = "x" * 1023 + "\\n"
        for _ in range(80 * 1024):
            sys.stdout.write(line)
    print(json.dumps(result))
    if seed == 3:
        print(json.dumps({{"extra": "a line after the result"}}))
    sys.stdout.flush()
    raise SystemExit(done.returncode)
''')


def test_lying_workers_fail_only_their_own_cells(tmp_path):
    liar = tmp_path / "liar-python"
    liar.write_text(LIAR.format(python=sys.executable))
    liar.chmod(0o755)
    (tmp_path / "hosts.yaml").write_text(f"hosts:\n  local: {{python: {liar}, persistent: false}}\n")
    (tmp_path / "s.yaml").write_text("name: lies\nmatrix:\n  workload: [noop]\n"
                                     "  seed: [0, 1, 2, 3, 4]\ndefaults: {sleep_s: 0}\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="160")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "s.yaml", "--hosts",
                           "hosts.yaml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr     # some cells failed, the run ran
    assert "Traceback" not in proc.stdout + proc.stderr

    (run,) = (tmp_path / "results" / "runs").iterdir()
    cells = {json.loads(p.read_text())["cell"]["seed"]: json.loads(p.read_text())
             for p in (run / "cells").glob("*.json")}
    assert sorted(cells) == [0, 1, 2, 3, 4]
    assert {seed: r["status"] for seed, r in cells.items()} == \
        {0: "ok", 1: "failed", 2: "failed", 3: "failed", 4: "ok"}
    assert "answered for cell" in cells[1]["error"] and "not for the cell sent" in cells[1]["error"]
    assert "'../../escaped'" in cells[2]["error"]
    assert "answered for cell 'None'" in cells[3]["error"]
    assert not (tmp_path / "results" / "escaped.json").exists()
    assert not any(p.name.startswith("escaped") for p in tmp_path.rglob("*"))
    # The run went on to the end: logged to MLflow, reported.
    assert (run / "tracking.json").exists()
    assert "MLflow: 5 cell run(s) logged" in proc.stdout
    assert (run / "report" / "index.html").exists()
