"""The workflows users install (ci/*.yml) pass actionlint and zizmor with no finding.

actionlint: the workflow schema, expressions, runner labels (ci/actionlint.yaml names the GPU
runner's), and every `run:` script through shellcheck. zizmor, offline, as its "auditor"
persona (the strictest): template injection, token permissions, credentials left in the
checkout, unpinned actions, self-hosted runners. A finding the workflows accept on purpose is
ignored where it stands, with its reason, by a `# zizmor: ignore[...]` comment.

Each linter is also run on a workflow with known faults, so a linter that silently checks
nothing (shellcheck missing, a wrong flag) fails here instead of passing everything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / "ci").glob("*.yml"))
CONFIG = REPO / "ci" / "actionlint.yaml"

# A pull-request workflow with the faults the linters are there for: a PR title pasted into a
# script, write permissions for every job, an unpinned action that leaves the token in
# .git/config, and a script shellcheck objects to (an unquoted variable).
FAULTY = """\
name: faulty
on: pull_request
permissions: write-all
jobs:
  echo:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: echo "${{ github.event.pull_request.title }}"
      - run: |
          dir=$1
          ls $dir
"""


def tool(name: str) -> str:
    """The linter installed with the dev extras (beside this Python), else one on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    # -shellcheck names the binary: without one on PATH actionlint skips the scripts silently.
    return subprocess.run([tool("actionlint"), "-no-color", "-config-file", str(CONFIG),
                           "-shellcheck", tool("shellcheck"), *map(str, paths)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def zizmor(*paths: Path) -> tuple[int, list[dict]]:
    out = subprocess.run([tool("zizmor"), "--offline", "--persona=auditor", "--format=json",
                          "--no-progress", *map(str, paths)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.strip().startswith("["), out.stderr
    return out.returncode, json.loads(out.stdout)


def test_there_are_workflows_to_lint():
    assert {p.name for p in WORKFLOWS} >= {"pr.yml", "nightly.yml"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(workflow):
    out = actionlint(workflow)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_zizmor_finds_nothing(workflow):
    code, findings = zizmor(workflow)
    summary = [f"{f['ident']}: {f['desc']} at "
               f"{f['locations'][0]['concrete']['location']['start_point']['row'] + 1}"
               for f in findings if not f.get("ignored")]
    assert summary == [] and code == 0, summary


def test_the_linters_catch_a_faulty_workflow(tmp_path):
    faulty = tmp_path / "faulty.yml"
    faulty.write_text(FAULTY)
    out = actionlint(faulty)
    assert out.returncode == 1
    assert "github.event.pull_request.title" in out.stdout and "untrusted" in out.stdout
    assert "SC2086" in out.stdout                  # shellcheck ran on the run: script

    code, findings = zizmor(faulty)
    found = {f["ident"] for f in findings}
    assert code != 0
    assert {"template-injection", "excessive-permissions", "artipacked",
            "unpinned-uses"} <= found, found
