"""ci/pr.yml's own steps, run end to end on this machine against the CPU quickstart.

A pull request whose drafter got worse (a third of the synthetic accepted length, the plant of
tests/gate/test_gate_ab.py) goes through the workflow's job as a runner would run it
(tests/ci/workflow_job.py): every `run:` script as written, in a clone made the way
actions/checkout makes it, with the job's env, GITHUB_ENV/GITHUB_PATH/step summaries and step
conditions. The gate must call the synthetic cells' accept_len_mean regressed (a
deterministic quantity: no CPU noise can hide it) and the greedy cells' unchanged, fail the job
with exit 1, post one PR comment saying so, and leave its reports where the artifact step
looks for them.

What differs from a GPU runner, and why:
- SCENARIO is scenarios/quickstart.yaml and OPS_SCENARIO a one-cell CPU decode scenario that
  gates accept_len_mean only (ops.yaml times CUDA kernels): the job's env entries a user sets;
- HARNESS_HOME is a temporary folder holding the cached controller venv a previous job would
  have left (its packages are this test's own), so the step takes its cached branch and runs
  its real `pip install --no-deps -e .` of the checkout; a fresh venv would download torch;
- `nvidia-smi` is a stub on PATH printing one CSV row: this machine has no GPU;
- GitHub's API is a local server (GITHUB_API_URL), which records the comment;
- `uses:` steps: checkout is a clone of a local origin at the PR's merge ref with the step's
  fetch-depth and no credentials; upload-artifact is skipped (GitHub's artifact store is
  reachable from GitHub's runners only): the test checks the files it would upload instead.
"""

from __future__ import annotations

import json
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runner_kit import (NO_GPU, REPO, author_repo, cached_controller_venv, git, installed_from,
                        machine_env, plant_worse_drafter, stub_nvidia_smi)
from workflow_job import WorkflowJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

WORKFLOW = REPO / "ci" / "pr.yml"
OWNER_REPO, PR = "owner/repo", 7
TOKEN = "ghs_thisisthejobstoken"

OPS_STAND_IN = """\
name: ops-cpu
defaults: {model: tiny, device: cpu, dtype: float32, acceptance: synthetic, tau: 6.0,
           block_size: 8, tree_budget: 8, warmup_steps: 1, steps: 6, repeats: 3,
           profile_steps: 0, timeout_s: 120}
matrix:
  context_length: [64]
metrics:                      # the gated metrics: CPU timings are noise here, this is not
  accept_len_mean: {direction: higher, threshold_rel: 0.03}
"""


def make_origin(tmp: Path) -> Path:
    """A bare origin: main = this tree, branch `worse-drafter` = the PR, and refs/pull/N/merge
    (GitHub's merge of the PR into main, which a pull_request job checks out)."""
    src, origin = author_repo(tmp / "author"), tmp / "origin.git"
    git("init", "-q", "--bare", str(origin), cwd=tmp)
    git("push", "-q", str(origin), "main", cwd=src)
    git("checkout", "-q", "-b", "worse-drafter", cwd=src)
    plant_worse_drafter(src)
    git("push", "-q", str(origin), f"worse-drafter:refs/pull/{PR}/head", "worse-drafter", cwd=src)
    git("checkout", "-q", "main", cwd=src)
    git("merge", "-q", "--no-ff", "-m", f"Merge {PR} into main", "worse-drafter", cwd=src)
    git("push", "-q", str(origin), f"HEAD:refs/pull/{PR}/merge", cwd=src)
    return origin


def checkout(origin: Path, workspace: Path):
    """actions/checkout for a pull_request event: the merge ref, every branch with
    fetch-depth 0 (else that depth), the token kept in .git/config unless told not to."""
    def run(inputs: dict) -> None:
        depth = int(inputs.get("fetch-depth", 1))
        assert str(inputs.get("persist-credentials")).lower() == "false", \
            "the checkout would leave the job's token in .git/config"
        workspace.mkdir(parents=True, exist_ok=True)
        git("init", "-q", cwd=workspace)
        git("remote", "add", "origin", str(origin), cwd=workspace)
        shallow = [f"--depth={depth}"] if depth > 0 else []
        specs = (["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]
                 if depth == 0 else [])
        git("fetch", "-q", *shallow, "origin", *specs,
            f"+refs/pull/{PR}/merge:refs/remotes/pull/{PR}/merge", cwd=workspace)
        git("checkout", "-q", "--detach", f"refs/remotes/pull/{PR}/merge", cwd=workspace)
    return run


@contextmanager
def fake_github():
    """The three issue-comment endpoints harness.gate.github calls, recording every request."""
    calls, comments = [], {}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _call(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            calls.append({"method": self.command, "path": self.path, "body": body,
                          "auth": self.headers.get("Authorization")})
            return body

        def do_GET(self):
            self._call()
            if self.path.startswith(f"/repos/{OWNER_REPO}/issues/{PR}/comments"):
                return self._reply(200, list(comments.values()))
            self._reply(404, {"message": "Not Found"})

        def do_POST(self):
            body = self._call()
            if self.path == f"/repos/{OWNER_REPO}/issues/{PR}/comments":
                cid = len(comments) + 1
                comments[cid] = {"id": cid, "body": body["body"],
                                 "html_url": f"https://github.example/{OWNER_REPO}/pull/{PR}#c{cid}"}
                return self._reply(201, comments[cid])
            self._reply(404, {"message": "Not Found"})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


def gate_verdicts(report: dict) -> dict[tuple[str, str], str]:
    return {(cell["label"], m["metric"]): m["verdict"]
            for cell in report["cells"] for m in cell["metrics"]}


def test_the_pr_workflow_gates_a_worse_drafter_end_to_end(tmp_path):
    origin = make_origin(tmp_path)
    workspace, temp = tmp_path / "work", tmp_path / "runner-temp"
    temp.mkdir()
    harness_home = tmp_path / "harness-home"
    venv_dir = cached_controller_venv(harness_home, (REPO / "pyproject.toml").read_bytes())
    stubs = stub_nvidia_smi(tmp_path / "stub-bin")
    ops = tmp_path / "ops-cpu.yaml"
    ops.write_text(OPS_STAND_IN)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"number": PR, "pull_request": {"number": PR}}))
    uploads = []

    with fake_github() as (api_url, calls):
        job = WorkflowJob(
            WORKFLOW, "gate", workspace=workspace, temp=temp,
            context={"github": {"repository": OWNER_REPO, "base_ref": "main",
                                "head_ref": "worse-drafter", "event_name": "pull_request",
                                "server_url": "https://github.example", "api_url": api_url,
                                "run_id": "4242", "run_attempt": "1", "event_path": str(event),
                                "event": {"pull_request": {"number": PR}}},
                     "secrets": {"GITHUB_TOKEN": TOKEN}},
            env=machine_env(tmp_path, stubs),
            job_env={"HARNESS_HOME": str(harness_home), "PYTHON": sys.executable,
                     "SCENARIO": "scenarios/quickstart.yaml", "OPS_SCENARIO": str(ops)},
            actions={"actions/checkout": checkout(origin, workspace),
                     "actions/upload-artifact": lambda inputs: uploads.append(inputs) or (
                         "GitHub's artifact store is reachable from GitHub's runners only")})
        steps = job.run()

    logs = "\n".join(f"--- {s.name}: {s.outcome} {s.returncode}\n{s.log}" for s in steps)
    # In order: the checkout (stood in for), the controller from the checkout, the gate failing
    # on the regression (exit 1), the ops gate after it all the same (`success() || failure()`),
    # the job summary, the artifact upload (stood in for: skipped).
    assert [(s.outcome, s.returncode) for s in steps] == [
        ("success", None), ("success", 0), ("failure", 1), ("failure", 1), ("success", 0),
        ("skipped", None)], logs

    # `pip install --no-deps -e .` pointed the cached venv at the checkout (it ran that code).
    assert installed_from(venv_dir, tmp_path) == str(workspace / "harness" / "__init__.py")
    assert NO_GPU in steps[1].log                                # the step's nvidia-smi line

    report = json.loads((workspace / "gate.json").read_text())
    verdicts = gate_verdicts(report)
    assert report["exit_code"] == 1 and report["scenario"] == "quickstart"
    synthetic = [label for label, metric in verdicts if "tau=4" in label]
    greedy = [label for label, metric in verdicts if "tau=" not in label]
    assert len(set(synthetic)) == 2 and len(set(greedy)) == 2, verdicts
    assert all(verdicts[(label, "accept_len_mean")] == "regressed" for label in synthetic)
    assert all(verdicts[(label, "accept_len_mean")] == "unchanged" for label in greedy)
    ops_report = json.loads((workspace / "gate-ops.json").read_text())
    assert ops_report["exit_code"] == 1
    assert set(gate_verdicts(ops_report).values()) == {"regressed"}

    # One PR comment, created with the job's token, carrying the marker and the verdicts.
    posts = [c for c in calls if c["method"] == "POST"]
    assert len(posts) == 1 and posts[0]["path"] == f"/repos/{OWNER_REPO}/issues/{PR}/comments"
    assert {c["auth"] for c in calls} == {f"Bearer {TOKEN}"}
    body = posts[0]["body"]["body"]
    assert "<!-- specdec-harness:perf-gate -->" in body and "regressed" in body
    assert "https://github.example/owner/repo/actions/runs/4242" in body   # DETAILS_URL
    assert TOKEN not in logs

    # The job summary holds both reports; the artifact step finds what it uploads.
    md = (workspace / "gate.md").read_text()
    assert md in job.step_summary and (workspace / "gate-ops.md").read_text() in job.step_summary
    (upload,) = uploads
    assert upload["name"] == f"perf-gate-{PR}-1"
    wanted = [line.strip() for line in upload["path"].splitlines() if line.strip()]
    missing = [p for p in wanted if not (workspace / p).exists()]
    assert missing == [], missing
    assert any((temp / "results" / "runs").iterdir())
