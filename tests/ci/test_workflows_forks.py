"""The GPU runner never runs a fork's code, and every job's token holds only what it uses.

zizmor flags a self-hosted runner but cannot tell whether forks can reach it: that depends on
the triggers and on each job's `if:`, which these checks read. A self-hosted runner keeps
state between jobs (the cached venv, the journals, the MLflow store), so one fork PR run there
could leave code behind for every later job.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "ci").glob("*.yml"))

# Triggers that run a PR author's code or hand it the base repository's token and secrets.
PR_TRIGGERS = {"pull_request", "pull_request_review", "pull_request_review_comment",
               "issue_comment", "merge_group"}
PRIVILEGED_TRIGGERS = {"pull_request_target", "workflow_run"}
SAME_REPO = "github.event.pull_request.head.repo.full_name == github.repository"
# The write scopes each job needs, and why; anything else asked for is a finding.
WRITES = {("pr.yml", "gate"): {"pull-requests"}}   # the one PR comment


def load(path: Path) -> dict:
    return parse(path.read_text())


def parse(text: str) -> dict:
    doc = yaml.safe_load(text)
    doc["on"] = doc.pop(True, doc.get("on"))   # YAML 1.1 reads the key `on` as true
    return doc


def triggers(doc: dict) -> set[str]:
    on = doc["on"]
    return {on} if isinstance(on, str) else set(on)


def self_hosted(job: dict) -> bool:
    runs_on = job.get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    return "self-hosted" in labels


def fork_problems(name: str, doc: dict) -> list[str]:
    problems = [f"{name}: trigger {t} runs with the base repository's token and secrets"
                for t in sorted(triggers(doc) & PRIVILEGED_TRIGGERS)]
    if triggers(doc) & PR_TRIGGERS:
        for job_id, job in doc["jobs"].items():
            if self_hosted(job) and SAME_REPO not in str(job.get("if", "")):
                problems.append(f"{name}: job {job_id} runs on a self-hosted runner for pull "
                                f"requests without `if: {SAME_REPO}`")
    return problems


def permission_problems(name: str, doc: dict) -> list[str]:
    problems = []
    if doc.get("permissions") != {}:
        problems.append(f"{name}: the workflow grants {doc.get('permissions')!r} to every job; "
                        f"want `permissions: {{}}` and each job's own")
    for job_id, job in doc["jobs"].items():
        perms = job.get("permissions")
        if not isinstance(perms, dict):
            problems.append(f"{name}: job {job_id} has no permissions of its own ({perms!r})")
            continue
        writes = {scope for scope, level in perms.items() if level == "write"}
        extra = writes - WRITES.get((name, job_id), set())
        if extra:
            problems.append(f"{name}: job {job_id} asks to write {sorted(extra)}")
    return problems


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_no_fork_reaches_a_self_hosted_runner(workflow):
    assert fork_problems(workflow.name, load(workflow)) == []


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_tokens_hold_only_what_each_job_uses(workflow):
    assert permission_problems(workflow.name, load(workflow)) == []


def test_the_pr_gate_runs_on_the_gpu_runner_for_same_repo_prs():
    """The checks above are about something: the PR workflow does use the self-hosted GPU."""
    doc = load(REPO / "ci" / "pr.yml")
    assert "pull_request" in triggers(doc)
    assert self_hosted(doc["jobs"]["gate"]) and SAME_REPO in doc["jobs"]["gate"]["if"]


def test_the_checks_catch_a_workflow_open_to_forks():
    doc = parse(textwrap.dedent("""\
        on: [pull_request_target, pull_request]
        permissions: write-all
        jobs:
          gate:
            runs-on: [self-hosted, gpu]
            permissions: {contents: write}
            steps: [{run: make}]
          lint:
            runs-on: ubuntu-latest
            steps: [{run: make lint}]
        """))
    assert fork_problems("bad.yml", doc) == [
        "bad.yml: trigger pull_request_target runs with the base repository's token and secrets",
        f"bad.yml: job gate runs on a self-hosted runner for pull requests without "
        f"`if: {SAME_REPO}`"]
    assert permission_problems("bad.yml", doc) == [
        "bad.yml: the workflow grants 'write-all' to every job; want `permissions: {}` and each "
        "job's own",
        "bad.yml: job gate asks to write ['contents']",
        "bad.yml: job lint has no permissions of its own (None)"]

