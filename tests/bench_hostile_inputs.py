"""Hostile inputs through the real CLI, timed (printed as a markdown table, not asserted):

    .venv/bin/python tests/bench_hostile_inputs.py > results/hostile-inputs.md

Each row is one input an attacker or an unlucky user could give, the command run on it in a
fresh folder, its exit code, its wall time (interpreter start included) and the first line it
printed on stderr. The tests (tests/sweep/test_input_budgets.py, test_damaged_state.py,
tests/protocol/test_credentials.py, tests/decode/test_checkpoint_loading.py) assert the
behaviour; this shows what a user sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sweep"))
from test_input_budgets import alias_bomb, merge_bomb  # noqa: E402

MILLION = ", ".join(str(v) for v in range(1, 101))
SMALL = "name: s\nmatrix:\n  workload: [noop]\n  seed: [1, 2]\ndefaults: {sleep_s: 0}\n"

SCENARIOS = {
    "alias bomb (9 levels x 9)": alias_bomb(),
    "merge bomb (12 levels)": merge_bomb(),
    "5000-deep flow nesting": "name: s\nmatrix: {workload: [noop]}\nx: " + "[" * 5000 + "]" * 5000,
    "a million-cell matrix": f"name: s\nmatrix:\n  workload: [noop]\n  context_length: "
                             f"[{MILLION}]\n  batch_size: [{MILLION}]\n  seed: [{MILLION}]\n",
    "a 100 kB scenario name": f"name: {'n' * 100_000}\nmatrix: {{workload: [noop]}}\n",
    "seed 10^29": f"name: s\nmatrix:\n  workload: [noop]\n  seed: [{10**29}]\n",
    "rich markup in the name": 'name: "bench[/red]mark"\nmatrix: {workload: [noop]}\n',
}


def cli(*args: str, cwd: Path, env: dict | None = None) -> tuple[int, float, str]:
    full = dict(os.environ, COLUMNS="120", **(env or {}))
    full.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    shown = lines[0] if lines else (proc.stdout.strip().splitlines() or [""])[0]
    return proc.returncode, wall, shown.replace(str(cwd), ".")[:160]


def row(what: str, command: str, result: tuple[int, float, str]) -> str:
    code, wall, line = result
    return f"| {what} | `{command}` | {code} | {wall:.2f} | {line.replace('|', '/')} |"


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for what, text in SCENARIOS.items():
            (d / "s.yaml").write_text(text)
            rows.append(row(what, "harness validate s.yaml", cli("validate", "s.yaml", cwd=d)))
        (d / "s.yaml").write_bytes(b"name: s\nmatrix:\n  workload: [n\xe9oop]\n")
        rows.append(row("a non-UTF-8 byte", "harness validate s.yaml", cli("validate", "s.yaml", cwd=d)))

        (d / "s.yaml").write_text(SMALL)
        rows.append(row("a run id that leaves results/runs", "harness report ../../etc",
                        cli("report", "../../etc", cwd=d)))
        rows.append(row("a password in the tracking URI", "harness run s.yaml --tracking-uri "
                        "http://u:secret@127.0.0.1:1", cli("run", "s.yaml", "--tracking-uri",
                                                           "http://u:secret@127.0.0.1:1", cwd=d)))
        cli("run", "s.yaml", "--tracking-uri", f"sqlite:///{d}/m.db", cwd=d)
        run = max((d / "results" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        cell = next((run / "cells").glob("*.json"))
        cell.write_text('{"cell": ')                                  # truncated
        rows.append(row("a truncated cell file", f"harness report {run.name}",
                        cli("report", run.name, "--tracking-uri", f"sqlite:///{d}/m.db", cwd=d)))
        (run / "tracking.json").write_text("null")
        rows.append(row("a damaged tracking.json, then resume", f"harness run s.yaml --resume {run.name}",
                        cli("run", "s.yaml", "--resume", run.name, "--tracking-uri",
                            f"sqlite:///{d}/m.db", cwd=d)))
        ckpt = d / "ckpt"                     # the tiny model, saved, then given yarn scaling
        from harness.decode.checkpoint import save_target
        from harness.decode.model import Target, TargetConfig
        from harness.protocol.presets import PRESETS
        save_target(Target(TargetConfig(**PRESETS["tiny"]["target"])), ckpt)
        config = json.loads((ckpt / "config.json").read_text())
        config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 32768}
        (ckpt / "config.json").write_text(json.dumps(config))
        (d / "c.yaml").write_text("name: c\nmatrix:\n  context_length: [64]\ndefaults: "
                                  "{model: tiny, device: cpu, checkpoint: ckpt, steps: 2, "
                                  "warmup_steps: 0, repeats: 1, profile_steps: 0}\n")
        code, wall, _ = cli("run", "c.yaml", "--tracking-uri", f"sqlite:///{d}/m.db", cwd=d)
        # the cell's own error, the one line naming the file and the field
        runs = sorted((d / "results" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        err = json.loads(next((runs[-1] / "cells").glob("*.json")).read_text())["error"]
        rows.append(f"| a yarn checkpoint | `harness run c.yaml` | {code} | {wall:.2f} | "
                    f"cell error: {err.replace(str(d), '.')[:160]} |")
    print("| input | command | exit | wall s | first line printed |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
