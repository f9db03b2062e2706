"""ci/nightly.yml's own steps, run end to end on this machine against a CPU sweep, three
nights in a row, with the embedded (sqlite) MLflow store the runner keeps between nights.

Each night is the workflow's one job as a runner runs it (tests/ci/workflow_job.py): every
`run:` script as written, in a fresh clone of main made the way actions/checkout makes it, with
the job's env, GITHUB_ENV/GITHUB_PATH/outputs/step summaries and step conditions.

- night 1, the first: the sweep is journaled, logged and reported, but there is no baseline
  yet, so the gate errs (exit 2) and the job's verdict fails; the run becomes the baseline;
- night 2, main unchanged: the gate compares with night 1 and passes; the job passes;
- night 3, main got a drafter a third as good (the plant of tests/gate/test_gate_ab.py): the
  gate calls the synthetic cell's accept_len_mean regressed and the greedy one's unchanged
  (exit 1), the job fails, and night 3 becomes the baseline all the same (main moved on).
Every night: the journal, the HTML report, `harness history` over the nights so far (JSON per
metric), and the files the artifact step uploads.

What differs from the GPU runner, and why:
- SCENARIO is a CPU stand-in for scenarios/nightly.yaml (Qwen3-8B on CUDA), committed on main
  like the real one: the tiny model, a greedy and a synthetic cell, 5 repeats (the fewest a
  one-look gate can decide), accept_len_mean the only gated metric (CPU timings are noise, the
  accepted length is not: tau = block_size makes every synthetic step accept all 8);
- HISTORY_METRICS leaves out idle_fraction: it needs a GPU to be measured at all, so its
  history on a CPU host is empty and `harness history` would err on every night;
- MLFLOW_TRACKING_URI is the sqlite store under this test's HARNESS_HOME (the job's default
  form, `sqlite:///` + a file on the runner), HARNESS_HOME a temporary folder with the cached
  controller venv a previous night left (tests/ci/runner_kit.py);
- `nvidia-smi` is a stub on PATH: this machine has no GPU;
- `uses:` steps: checkout is a clone of a local origin's main; upload-artifact is skipped
  (GitHub's artifact store is reachable from GitHub's runners only): the test checks the files
  it would upload instead.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pytest

from runner_kit import (NO_GPU, REPO, author_repo, cached_controller_venv, git, installed_from,
                        machine_env, plant_worse_drafter, stub_nvidia_smi)
from workflow_job import WorkflowJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

WORKFLOW = REPO / "ci" / "nightly.yml"
OWNER_REPO = "owner/repo"
SCENARIO = "scenarios/nightly-cpu.yaml"
NIGHTLY_STAND_IN = """\
name: nightly-cpu
description: CPU stand-in for scenarios/nightly.yaml (tests/ci/test_nightly_workflow_runs.py)
trigger: nightly
defaults: {model: tiny, device: cpu, dtype: float32, tau: 8.0, block_size: 8, tree_budget: 8,
           warmup_steps: 1, steps: 6, repeats: 5, profile_steps: 0, timeout_s: 120}
matrix:
  context_length: [64]
  acceptance: [greedy, synthetic]
metrics:                      # the gated metrics: CPU timings are noise here, this is not
  accept_len_mean: {direction: higher, threshold_rel: 0.03}
targets:                      # judged every night, in the run's summary and the gate's comment
  - {name: the synthetic cell accepts the whole block, cells: acceptance=synthetic,
     metric: accept_len_mean, min: 7.5}
"""
METRICS = ("tokens_per_s", "accept_len_mean")
# The job's steps, in order.
STEPS = ("checkout", "controller", "run", "gate", "mark", "history", "report", "upload", "verdict")


def make_origin(tmp: Path) -> tuple[Path, Path]:
    """A bare origin whose main is this tree plus the CPU nightly scenario; the author's clone
    beside it, to push later nights' commits from."""
    src, origin = author_repo(tmp / "author"), tmp / "origin.git"
    (src / SCENARIO).write_text(NIGHTLY_STAND_IN)
    git("add", SCENARIO, cwd=src)
    git("commit", "-qm", "a nightly sweep this runner can run", cwd=src)
    git("init", "-q", "--bare", str(origin), cwd=tmp)
    git("push", "-q", str(origin), "main", cwd=src)
    return src, origin


def checkout(origin: Path, workspace: Path):
    """actions/checkout of `ref: main` on a schedule: a shallow fetch of main, checked out as
    the local branch main (what the history's --branch main finds), no token kept."""
    def run(inputs: dict) -> None:
        assert inputs.get("ref") == "main", inputs
        assert str(inputs.get("persist-credentials")).lower() == "false", \
            "the checkout would leave the job's token in .git/config"
        workspace.mkdir(parents=True)
        git("init", "-q", cwd=workspace)
        git("remote", "add", "origin", str(origin), cwd=workspace)
        git("fetch", "-q", f"--depth={int(inputs.get('fetch-depth', 1))}", "origin",
            "+refs/heads/main:refs/remotes/origin/main", cwd=workspace)
        git("checkout", "-q", "--force", "-B", "main", "refs/remotes/origin/main", cwd=workspace)
    return run


def night(tmp: Path, n: int, origin: Path, harness_home: Path, stubs: Path):
    """Night `n`: the job in a fresh workspace (a checkout cleans what the last night left)."""
    workspace, temp = tmp / f"work-{n}", tmp / f"runner-temp-{n}"
    temp.mkdir()
    uploads = []
    job = WorkflowJob(
        WORKFLOW, "nightly", workspace=workspace, temp=temp,
        context={"github": {"repository": OWNER_REPO, "event_name": "schedule",
                            "ref": "refs/heads/main", "server_url": "https://github.example",
                            "run_id": f"900{n}", "run_attempt": "1"},
                 "vars": {}},
        env=machine_env(tmp, stubs),
        job_env={"HARNESS_HOME": str(harness_home), "PYTHON": sys.executable,
                 "SCENARIO": SCENARIO, "HISTORY_METRICS": " ".join(METRICS),
                 "MLFLOW_TRACKING_URI": f"sqlite:///{harness_home / 'mlflow.db'}"},
        actions={"actions/checkout": checkout(origin, workspace),
                 "actions/upload-artifact": lambda inputs: uploads.append(inputs) or (
                     "GitHub's artifact store is reachable from GitHub's runners only")})
    steps = job.run()
    assert len(steps) == len(STEPS), [s.name for s in steps]
    return job, dict(zip(STEPS, steps)), workspace, uploads


def outcomes(steps: dict) -> dict:
    return {k: (s.outcome, s.returncode) for k, s in steps.items()}


def logs(steps: dict) -> str:
    return "\n".join(f"--- {s.name}: {s.outcome} {s.returncode}\n{s.log}" for s in steps.values())


def verdicts(report: dict) -> dict[str, str]:
    """acceptance word -> the cell's accept_len_mean verdict."""
    return {("synthetic" if "synthetic" in cell["label"] else "greedy"): m["verdict"]
            for cell in report["cells"] for m in cell["metrics"] if m["metric"] == "accept_len_mean"}


def check_night(steps, workspace: Path, results: Path, uploads: list, sha: str):
    """What every night leaves: a journaled run of main's commit with both cells ok, its HTML
    report, each metric's history, and the artifact step's paths. (run id, paths found)."""
    run_id = steps["run"].outputs["run_id"]
    run_dir = results / "runs" / run_id
    journal = json.loads((run_dir / "run.json").read_text())
    meta = journal["meta"]
    assert journal["scenario"] == "nightly-cpu" and meta["trigger"] == "nightly"
    assert meta["git_sha"] == sha and meta["git_branch"] == "main"
    cells = [json.loads(p.read_text()) for p in (run_dir / "cells").glob("*.json")]
    assert sorted(c["status"] for c in cells) == ["ok", "ok"]
    assert {c["label"].split()[-1] for c in cells} == {"greedy", "tau=8"}
    assert (run_dir / "report" / "index.html").is_file()
    assert f"run {run_id} finished with exit code 0" in steps["run"].log
    for metric in METRICS:
        history = json.loads((workspace / f"history-{metric}.json").read_text())
        assert history["scenario"] == "nightly-cpu" and history["metric"] == metric
    (upload,) = uploads
    assert upload["name"].startswith("nightly-report-900")
    wanted = [line.strip() for line in upload["path"].splitlines() if line.strip()]
    assert wanted[0] == str(run_dir)
    found = [p for p in wanted if glob.glob(p if p.startswith("/") else str(workspace / p))]
    return run_id, found


def test_three_nights_of_the_nightly_workflow(tmp_path):
    src, origin = make_origin(tmp_path)
    harness_home = tmp_path / "harness-home"
    venv_dir = cached_controller_venv(harness_home, (src / "pyproject.toml").read_bytes())
    stubs = stub_nvidia_smi(tmp_path / "stub-bin")
    results = harness_home / "results"
    shas = []

    # Night 1: no baseline yet. The gate cannot compare (exit 2, continue-on-error), so the
    # verdict fails the job; everything else ran, and the run is the baseline from now on.
    shas.append(git("rev-parse", "HEAD", cwd=src))
    job, steps, workspace, uploads = night(tmp_path, 1, origin, harness_home, stubs)
    assert outcomes(steps) == {
        "checkout": ("success", None), "controller": ("success", 0), "run": ("success", 0),
        "gate": ("failure", 2), "mark": ("success", 0), "history": ("success", 0),
        "report": ("success", 0), "upload": ("skipped", None), "verdict": ("failure", 1),
    }, logs(steps)
    assert installed_from(venv_dir, tmp_path) == str(workspace / "harness" / "__init__.py")
    assert NO_GPU in steps["controller"].log                     # the step's nvidia-smi line
    assert "no run tagged baseline=true" in " ".join(steps["gate"].log.split())
    assert not (workspace / "gate.json").exists()
    assert "run exit 0, gate failure, history success" in steps["verdict"].log
    first, found = check_night(steps, workspace, results, uploads, shas[-1])
    # no gate.* (the gate could not compare): those the upload ignores (if-no-files-found)
    assert found == [str(results / "runs" / first), "history-*.json", "history-plots"]
    assert "tagged baseline=true" in steps["mark"].log
    assert "accept_len_mean >= 7.5 │ met" in steps["run"].log     # the run judged its target

    # Night 2: main unchanged. Compared with night 1: unchanged, the job passes.
    job, steps, workspace, uploads = night(tmp_path, 2, origin, harness_home, stubs)
    assert {k: o for k, (o, _) in outcomes(steps).items()} == {
        **{k: "success" for k in STEPS}, "upload": "skipped"}, logs(steps)
    gate = json.loads((workspace / "gate.json").read_text())
    assert gate["exit_code"] == 0 and verdicts(gate) == {"greedy": "unchanged",
                                                         "synthetic": "unchanged"}
    assert first in json.dumps(gate)                             # the baseline it used
    second, found = check_night(steps, workspace, results, uploads, shas[-1])
    assert found[1:] == ["gate.md", "gate.json", "gate-junit.xml", "history-*.json",
                         "history-plots"]
    assert (workspace / "gate.md").read_text() in job.step_summary
    assert "| the synthetic cell accepts the whole block | 8 | accept_len_mean >= 7.5 | ✅ met |" \
        in job.step_summary
    assert "HTML report: artifact nightly-report" in job.step_summary

    # Night 3: a worse drafter on main. The gate names the regression (exit 1) and fails the
    # job; the run is marked the baseline all the same.
    plant_worse_drafter(src)
    git("push", "-q", str(origin), "main", cwd=src)
    shas.append(git("rev-parse", "HEAD", cwd=src))
    job, steps, workspace, uploads = night(tmp_path, 3, origin, harness_home, stubs)
    assert outcomes(steps)["gate"] == ("failure", 1), logs(steps)
    assert outcomes(steps)["verdict"] == ("failure", 1) and outcomes(steps)["mark"] == ("success", 0)
    gate = json.loads((workspace / "gate.json").read_text())
    assert gate["exit_code"] == 1 and verdicts(gate) == {"greedy": "unchanged",
                                                         "synthetic": "regressed"}
    assert second in json.dumps(gate)
    assert "regressed" in (workspace / "gate.md").read_text()
    assert "accept_len_mean >= 7.5 | ❌ not met (1 of 1 outside) |" in (workspace / "gate.md").read_text()
    third, _ = check_night(steps, workspace, results, uploads, shas[-1])

    # The history holds the three nights, oldest first, with their commits; three points are
    # too few for a step (--min-size 3 on each side), so none is claimed.
    history = json.loads((workspace / "history-accept_len_mean.json").read_text())
    by_word = {("synthetic" if "synthetic" in s["label"] else "greedy"): s
               for s in history["series"]}
    assert [p["sha"][:12] for p in by_word["synthetic"]["points"]] == [
        s[:12] for s in (shas[0], shas[0], shas[1])]
    assert [p["value"] for p in by_word["synthetic"]["points"]][:2] == [8.0, 8.0]
    assert by_word["synthetic"]["points"][2]["value"] < 4
    assert all(s["steps"] == [] for s in history["series"])

    # The baseline the next night compares with is night 3's.
    from harness.gate import baselines
    sides = baselines.from_mlflow(f"sqlite:///{harness_home / 'mlflow.db'}", "nightly-cpu", None)
    assert len(sides) == 2 and all(third in side.source for side in sides.values())
