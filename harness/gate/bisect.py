"""`harness bisect --good A --bad B --cell ID`: find the commit that moved one cell's metric.

1. A temporary `git worktree` (your checkout is never touched) measures the cell at A and at B.
   B must be worse than A by more than the metric's policy threshold, else there is nothing to
   bisect.
2. `git bisect run` then measures each commit it picks, from that worktree, and calls it bad
   when its value is closer to B's than to A's (the midpoint of the two is the cut), good
   otherwise, and skips it (exit 125) when the cell cannot run there (a crash, a knob that
   commit does not know).
3. The first bad commit, and every measured commit with its value, are reported; the worktree
   and its bisect state are removed.

Each bisect step runs `python -m harness.gate.bisect step STATE.json` with this controller's
code on PYTHONPATH and, like the A/B gate, runs the worker from the worktree
(LocalHost.for_code_tree). The step's working directory is the state folder, not the worktree,
so the step itself never imports the commit under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import harness
from harness.gate.abtest import git, repo_root, resolve_commit, worktree
from harness.gate.baselines import samples_of
from harness.gate.policy import Policy
from harness.gate.stats import matters, worse_change
from harness.hosts.local import LocalHost
from harness.protocol import params
from harness.protocol.errors import InputError

SKIP = 125        # git bisect run: this commit cannot be tested
STEPS_FILE = "steps.jsonl"


@dataclass
class BisectResult:
    first_bad: str | None
    subject: str
    good_value: float
    bad_value: float
    steps: list[dict] = field(default_factory=list)   # {sha, value, verdict}
    log: str = ""


def measure_tree(tree: Path, cell: dict, metric: str, python: str = sys.executable) -> tuple[float | None, str | None]:
    """(median of the metric's samples, error) of one worker run of `cell` from `tree`."""
    host = LocalHost(python=python).for_code_tree(tree)
    result = asyncio.run(host.run_cell(cell, 0, lambda _p: None))
    if result.get("status") != "ok":
        return None, ((result.get("error") or "failed").strip().splitlines() or ["failed"])[0]
    values = samples_of([result]).get(metric)
    if not values:
        return None, f"no {metric} measured"
    return statistics.median(values), None


def classify(value: float, state: dict) -> str:
    """'bad' when `value` is on B's side of the midpoint between A's and B's values."""
    mid = (state["good_value"] + state["bad_value"]) / 2
    worse_is_lower = state["direction"] == "higher"
    return "bad" if (value < mid if worse_is_lower else value > mid) else "good"


def bisect(good: str, bad: str, cell: dict, policy: Policy, *, repo: str | Path = ".",
           python: str = sys.executable, log=print) -> BisectResult:
    repo = repo_root(repo)
    good_sha, bad_sha = resolve_commit(repo, good), resolve_commit(repo, bad)
    if good_sha == bad_sha:
        raise InputError(None, None, None, "--good and --bad are the same commit")
    if subprocess.run(["git", "merge-base", "--is-ancestor", good_sha, bad_sha], cwd=repo,
                      capture_output=True).returncode != 0:
        raise InputError(None, None, None, f"--good {good} is not an ancestor of --bad {bad}")
    metric = policy.metric
    with tempfile.TemporaryDirectory(prefix="harness-bisect-") as state_dir, \
            worktree(repo, bad_sha, prefix="harness-bisect-tree-") as tree:
        values = {}
        for name, sha in (("good", good_sha), ("bad", bad_sha)):
            git("checkout", "--quiet", "--detach", sha, cwd=tree)
            value, error = measure_tree(tree, cell, metric, python)
            if value is None:
                raise InputError(None, None, None, f"the cell does not run at --{name} "
                                                   f"{sha[:10]}: {error}")
            values[name] = value
            log(f"  {name} {sha[:10]}: {metric} = {value:.4g}")
        ratio = values["bad"] / values["good"] if values["good"] > 0 and values["bad"] > 0 else None
        worse = worse_change(values["good"], ratio, values["bad"] - values["good"], policy)
        if not matters(*worse, policy):
            raise InputError(None, None, None,
                             f"--bad is not worse than --good on {metric} by more than the "
                             f"threshold ({values['good']:.4g} -> {values['bad']:.4g}): nothing "
                             f"to bisect")
        state = {"cell": cell, "metric": metric, "direction": policy.direction,
                 "good_value": values["good"], "bad_value": values["bad"], "tree": str(tree),
                 "python": python, "steps": str(Path(state_dir) / STEPS_FILE)}
        state_path = Path(state_dir) / "state.json"
        state_path.write_text(json.dumps(state), encoding="utf-8")

        git("bisect", "start", bad_sha, good_sha, cwd=tree)
        controller_root = str(Path(harness.__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (controller_root, os.environ.get("PYTHONPATH")) if p))
        # The step runs from the state folder: `python -m` puts its cwd first on sys.path, and
        # that must not be the worktree (the commit under test has its own `harness`).
        step = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", state_dir, python, "-m",
                "harness.gate.bisect", "step", str(state_path)]
        run = subprocess.run(["git", "bisect", "run", *step], cwd=tree, env=env,
                             capture_output=True, text=True)
        first_bad = git("rev-parse", "--verify", "--quiet", "refs/bisect/bad", cwd=tree, check=False) \
            if run.returncode == 0 else None
        bisect_log = git("bisect", "log", cwd=tree, check=False)
        git("bisect", "reset", "--quiet", cwd=tree, check=False)
        steps = [json.loads(line) for line in Path(state["steps"]).read_text().splitlines()] \
            if Path(state["steps"]).is_file() else []
        subject = git("log", "-1", "--format=%s", first_bad, cwd=repo, check=False) if first_bad else ""
        if run.returncode != 0:
            tail = (run.stdout + run.stderr).strip().splitlines()[-3:]
            log("  git bisect run did not finish: " + " | ".join(tail))
        return BisectResult(first_bad, subject, values["good"], values["bad"], steps, bisect_log)


def step(state_path: str) -> int:
    """One `git bisect run` step: measure the worktree's commit; exit 0 good, 1 bad, 125 skip."""
    state = json.loads(Path(state_path).read_text(encoding="utf-8"))
    tree = Path(state["tree"])
    sha = git("rev-parse", "HEAD", cwd=tree)
    value, error = measure_tree(tree, state["cell"], state["metric"], state["python"])
    verdict = "skip" if value is None else classify(value, state)
    with open(state["steps"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"sha": sha, "value": value, "verdict": verdict, "error": error}) + "\n")
    print(f"{sha[:10]}: {state['metric']} = {value if value is None else f'{value:.4g}'} -> {verdict}")
    return {"good": 0, "bad": 1, "skip": SKIP}[verdict]


def find_cell(cell_id: str, *, scenario=None, runs_root: str | Path = "results/runs",
              tracking_uri: str | None = None) -> dict:
    """The parameters of cell `cell_id`: from the scenario if given, else from any journaled
    run, else from any MLflow child run of that id."""
    if scenario is not None:
        for cell in scenario.cells():
            if params.cell_id(cell) == cell_id:
                return cell
        raise InputError(scenario.path, None, None, f"scenario has no cell {cell_id}")
    for run_file in sorted(Path(runs_root).glob("*/run.json"), reverse=True):
        try:
            for c in json.loads(run_file.read_text(encoding="utf-8")).get("cells", []):
                if c.get("cell_id") == cell_id:
                    return c["cell"]
        except (OSError, json.JSONDecodeError, AttributeError):
            continue
    try:
        from harness.gate.baselines import mlflow_client, search_all
        with mlflow_client(tracking_uri) as client:
            exps = [e.experiment_id for e in client.search_experiments()]
            for run in search_all(client, exps, f"tags.`harness.cell_id` = '{cell_id}'"):
                return {k: _param(v) for k, v in run.data.params.items() if k in params.DEFAULTS}
    except InputError:
        pass
    raise InputError(None, None, None, f"cell {cell_id} is in no journaled run and no MLflow "
                                       f"run: give --scenario FILE")


def _param(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "step":
        sys.exit(step(sys.argv[2]))
    print("usage: python -m harness.gate.bisect step STATE.json (run by harness bisect)",
          file=sys.stderr)
    sys.exit(2)
