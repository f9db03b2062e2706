"""The `harness` command end to end: real worker subprocesses, a real journal, a real MLflow
sqlite store. Scenarios are tiny so the whole file runs in well under a minute."""

from __future__ import annotations

import json
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from cli_process import run_cli

REPO = Path(__file__).resolve().parents[2]
HARNESS = [sys.executable, "-m", "harness.cli"]

SMALL = """\
name: small
defaults:
  model: tiny
  device: cpu
  warmup_steps: 1
  steps: 3
  repeats: 2
  profile_steps: 0
  timeout_s: 120
matrix:
  context_length: [64, 128]
"""


def harness(*args: str, cwd: Path, env: dict | None = None, timeout: int = 240):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env["COLUMNS"] = "160"
    return run_cli(args, cwd=cwd, env=full_env, timeout=timeout)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlflow_children(uri: str, experiment: str):
    import mlflow
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def run_id_from(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("Run "):
            return line.split()[1].rstrip(":")
    raise AssertionError(f"no run id in output:\n{stdout}")


def test_run_journals_and_logs_every_cell(fresh_store, tmp_path):
    sc = write(tmp_path / "small.yaml", SMALL)
    uri = fresh_store(tmp_path)
    out = harness("run", str(sc), "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "tok/s" in out.stdout and "n/a (no GPU)" in out.stdout
    run_id = run_id_from(out.stdout)

    run_dir = tmp_path / "results" / "runs" / run_id
    run = json.loads((run_dir / "run.json").read_text())
    assert len(run["cells"]) == 2
    for entry in run["cells"]:
        cell = json.loads((run_dir / "cells" / f"{entry['cell_id']}.json").read_text())
        assert {"cell", "status", "error", "metrics", "samples", "env"} <= set(cell)
        assert cell["status"] == "ok" and cell["error"] is None
        assert cell["metrics"]["tokens_per_s"] > 0
        assert cell["metrics"]["idle_fraction"] is None      # absent on CPU, never invented
        assert len(cell["samples"]["tokens_per_s"]) == 2

    parents, children = mlflow_children(uri, "small")
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].data.tags["harness.run_id"] == run_id
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert {"tokens_per_s", "accept_len_mean"} <= set(child.data.metrics)
        assert "idle_fraction" not in child.data.metrics
        assert child.data.params["context_length"] in ("64", "128")
        assert child.data.tags["trigger"] == "manual" and child.data.tags["host"] == "local"


def test_failed_cell_does_not_stop_the_sweep_and_resume_finishes_it(fresh_store, tmp_path):
    # One extra cell points at a checkpoint whose config is not a Qwen3 model: its worker
    # fails; the two good cells still run and everything is journaled and logged.
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    sc = write(tmp_path / "mixed.yaml", SMALL.replace("name: small", "name: mixed")
               + "include:\n  - {context_length: 64, checkpoint: ckpt}\n")
    uri = fresh_store(tmp_path)
    out = harness("run", str(sc), "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 1, out.stderr + out.stdout
    run_id = run_id_from(out.stdout)
    cells_dir = tmp_path / "results" / "runs" / run_id / "cells"
    results = [json.loads(p.read_text()) for p in cells_dir.glob("*.json")]
    assert sorted(r["status"] for r in results) == ["failed", "ok", "ok"]
    bad = next(r for r in results if r["status"] == "failed")
    # A refused checkpoint is one line naming its file and field, no traceback.
    assert bad["error"] == (f"CheckpointError: {bad['cell']['checkpoint']}/config.json: "
                            f"model_type is missing: this loader reads Qwen3 checkpoints only "
                            f"(model_type \"qwen3\")"), bad["error"]
    assert f"--resume {run_id}" in out.stderr
    parents, children = mlflow_children(uri, "mixed")
    assert sorted(c.data.tags["status"] for c in children) == ["failed", "ok", "ok"]

    # Fix the checkpoint, resume: only the failed cell runs, and gets a child run of its own.
    from harness.decode.checkpoint import save_target
    from harness.decode.model import Target, TargetConfig, init_random_
    from harness.protocol.presets import PRESETS
    model = Target(TargetConfig(**PRESETS["tiny"]["target"]))
    init_random_(model, 0)
    save_target(model, tmp_path / "ckpt")
    again = harness("run", str(sc), "--tracking-uri", uri, "--resume", run_id, cwd=tmp_path)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "1 of 3 cell(s) to run" in again.stdout
    assert all(json.loads(p.read_text())["status"] == "ok" for p in cells_dir.glob("*.json"))
    parents, children = mlflow_children(uri, "mixed")
    assert len(parents) == 1
    assert sorted(c.data.tags["status"] for c in children).count("ok") == 3


def test_a_run_judges_its_targets_and_report_judges_others(fresh_store, tmp_path):
    """The targets table after the summary: met, not met, and absent where the host cannot
    measure the metric (idle on a CPU); `harness report --targets` judges the run against
    another scenario's."""
    import re
    sc = write(tmp_path / "t.yaml", SMALL + textwrap.dedent("""\
        targets:
          - {name: accepts a token a step, cells: context_length=64 or context_length=128, metric: accept_len_mean, min: 1}
          - {name: a billion tokens a second, cells: context_length=128, metric: tokens_per_s, min: 1000000000}
          - {name: idle under 1 %, cells: context_length=64, metric: idle_fraction, max: 0.01}
        """))
    uri = fresh_store(tmp_path)
    out = harness("run", str(sc), "--tracking-uri", uri, "--json", "out.json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout       # a target never fails a run
    judged = json.loads((tmp_path / "out.json").read_text())["targets"]
    assert [(t["name"], t["verdict"]) for t in judged] == [
        ("accepts a token a step", "met"), ("a billion tokens a second", "not met"), ("idle under 1 %", "absent")]
    assert [m["value"] for m in judged[2]["measured"]] == [None] and judged[2]["why"] == "not measured: 1 of 1"
    table = out.stdout.split("Targets", 1)[1]
    assert re.search(r"accepts a token a step .*accept_len_mean >= 1 .* met", table)
    assert re.search(r"a billion tokens a second .*tokens_per_s >= 1e\+09 .* not met \(1 of 1 outside\)", table)
    assert re.search(r"idle under 1 % .*\? .*idle_fraction <= 0\.01 .* absent \(not measured: 1 of 1\)", table)
    assert "Targets" in (tmp_path / "results" / "runs" / run_id_from(out.stdout) / "report" / "index.html").read_text()

    other = write(tmp_path / "other.yaml", SMALL + textwrap.dedent("""\
        targets:
          - {name: 64 beats 128, cells: context_length=64, per: context_length=128, metric: step_ms_p50, max: 10}
        """))
    again = harness("report", run_id_from(out.stdout), "--targets", str(other), "--no-mlflow", cwd=tmp_path)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "64 beats 128" in again.stdout and "accepts a token" not in again.stdout
    none = harness("report", run_id_from(out.stdout), "--targets", str(write(tmp_path / "n.yaml", SMALL)),
                   cwd=tmp_path)
    assert none.returncode == 2 and none.stderr.strip() == f"error: {tmp_path}/n.yaml: --targets: this scenario has no targets"


def test_unreachable_tracking_server_then_resume_logs_everything(fresh_store, tmp_path):
    sc = write(tmp_path / "small.yaml", SMALL)
    dead = f"http://127.0.0.1:{free_port()}"
    out = harness("run", str(sc), "--tracking-uri", dead, cwd=tmp_path)
    assert out.returncode == 1, out.stderr      # every cell ran, but the run is not logged
    assert "MLflow logging failed" in out.stderr and "--resume" in out.stderr
    run_id = run_id_from(out.stdout)
    # The command it prints names the store it was given, not just the run.
    assert f"harness run {sc} --resume {run_id} --tracking-uri {dead}" in out.stderr
    assert len(list((tmp_path / "results" / "runs" / run_id / "cells").glob("*.json"))) == 2

    uri = fresh_store(tmp_path)
    again = harness("run", str(sc), "--tracking-uri", uri, "--resume", run_id, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "0 of 2 cell(s) to run" in again.stdout
    parents, children = mlflow_children(uri, "small")
    assert len(parents) == 1 and len(children) == 2


BAD_INPUTS = {
    "yaml syntax": ("name: x\nmatrix: [1, 2\n", r"bad\.yaml:\d+:\d+: "),
    "unknown key": ("name: x\nmatrix:\n  contxt_length: [1]\n", r"bad\.yaml:3:3: .*did you mean 'context_length'"),
    "wrong type": ("name: x\nmatrix:\n  context_length: [abc]\n", r"bad\.yaml:3:20: "),
    "empty matrix": ("name: x\nmatrix: {}\n", r"bad\.yaml:2:\d+: "),
    "bad context": ("name: x\nmatrix:\n  context_length: [0]\n", r"bad\.yaml:3:20: "),
    "too long": ("name: x\nmatrix:\n  context_length: [9999999]\n", r"bad\.yaml:3:20: .*exceeds"),
    "verify mode": ("name: x\nmatrix:\n  verify_mode: [fast]\n", r"bad\.yaml:3:17: .*verify_mode"),
    "preset": ("name: x\nmatrix:\n  model: [llama]\n", r"bad\.yaml:3:11: "),
    "checkpoint": ("name: x\ndefaults:\n  checkpoint: /nonexistent/ckpt\nmatrix:\n  seed: [0]\n",
                   r"bad\.yaml:3:15: "),
    "target": ("name: x\nmatrix:\n  seed: [0]\ntargets:\n  - {cells: ctx=999, metric: tokens_per_s, min: 1}\n",
               r"bad\.yaml:5:13: targets\[0\]\.cells 'ctx=999' selects 0 of the scenario's 1 cells"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case, command):
    import re
    text, pattern = BAD_INPUTS[case]
    write(tmp_path / "bad.yaml", text)
    out = harness(command, "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert not (tmp_path / "results").exists()      # nothing ran, nothing journaled


@pytest.mark.parametrize("args,pattern", [
    (["run", "missing.yaml"], r"missing\.yaml: no such scenario file"),
    (["run", "ok.yaml", "--tracking-uri", "htp:/nowhere"], r"malformed tracking URI"),
    (["run", "ok.yaml", "--host", "gpu-z"], r"unknown host 'gpu-z'"),
    (["run", "ok.yaml", "--resume", "20990101-000000-abcdef"], r"20990101-000000-abcdef"),
    (["report", "nope"], r"nope"),
    # Run ids are names inside results/runs, never paths out of it.
    (["report", "../../etc"], r"run id '\.\./\.\./etc' is not a valid name"),
    (["run", "ok.yaml", "--resume", "/tmp"], r"run id '/tmp' is not a valid name"),
])
def test_bad_arguments_exit_2(tmp_path, args, pattern):
    import re
    write(tmp_path / "ok.yaml", SMALL)
    out = harness(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert re.search(pattern, out.stderr), out.stderr


def test_shipped_scenarios_validate(tmp_path):
    for name in ("quickstart", "nightly", "pr"):
        out = harness("validate", str(REPO / "scenarios" / f"{name}.yaml"), cwd=tmp_path)
        assert out.returncode == 0, out.stderr


def test_user_text_is_printed_as_plain_text_not_markup(fresh_store, tmp_path):
    # A scenario name that is valid rich markup's closing tag: it must come out as written,
    # in validate, in the run's lines and in the summary table -- never a MarkupError.
    write(tmp_path / "m.yaml", SMALL.replace("name: small", 'name: "bench[/red]mark"'))
    out = harness("validate", "m.yaml", cwd=tmp_path)
    assert out.returncode == 0 and "scenario bench[/red]mark" in out.stdout, out.stderr
    out = harness("run", "m.yaml", "--tracking-uri", fresh_store(tmp_path, "m.db"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "MarkupError" not in out.stderr
    assert "scenario bench[/red]mark" in out.stdout and "bench[/red]mark — run" in out.stdout


def test_ui_on_a_taken_port_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = harness("ui", "--port", str(port), "--tracking-uri",
                      f"sqlite:///{tmp_path}/m.db", cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert f"127.0.0.1:{port}" in line and "--port" in line and "Traceback" not in out.stderr
