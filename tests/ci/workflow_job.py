"""Run one job of a GitHub Actions workflow file here, step by step, the way a runner does.

    job = WorkflowJob(Path("ci/pr.yml"), "gate", workspace=..., temp=..., context={...},
                      env={...}, actions={"actions/checkout": checkout, ...})
    steps = job.run()        # [StepResult(name, outcome, returncode, log, reason), ...]

What a runner does that the steps rely on, and only that:
- `run:` scripts go to a file run by `bash -e FILE` (a step without `shell:`) or
  `bash --noprofile --norc -eo pipefail FILE` (`shell: bash`), in the workspace;
- env: the runner's own (GITHUB_*, RUNNER_TEMP, CI), then the workflow's, the job's, what
  earlier steps appended to $GITHUB_ENV, and the step's; $GITHUB_PATH entries go before PATH;
  $GITHUB_OUTPUT becomes `steps.<id>.outputs`; every step's $GITHUB_STEP_SUMMARY is kept;
- `${{ ... }}` in env values, `with:` inputs and scripts: a context path (`github.base_ref`,
  `env.RESULTS`: the env a step sees, $GITHUB_ENV included) or `a || 'default'`; anything else
  is an error here, never a silent empty string;
- a step's `if:`: `||` of `&&` of `success()`, `failure()`, `always()`, a context path, or
  `path == 'text'` / `path != 'text'`; without a status function it means `success() && ...`,
  as on GitHub; none at all, only after success; `continue-on-error`; `timeout-minutes`.
`uses:` steps run what the caller gives for that action (a function of the step's evaluated
`with:` returning None when done or a reason when skipped); an action without one is an error,
so a new action in the workflow fails the test until the test says what it does here. The
job's own `if:` is not evaluated: who may run the job is tests/ci/test_workflows_forks.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
SHELLS = {None: ["bash", "-e"], "bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"]}
# Status functions -> whether they hold, given whether the job has failed so far.
STATUS = {"success()": lambda failed: not failed, "failure()": lambda failed: failed,
          "always()": lambda failed: True}
COMPARISON = re.compile(r"(.+?)\s*(==|!=)\s*(.+)")


@dataclass
class StepResult:
    name: str
    outcome: str                 # success | failure | skipped
    returncode: int | None = None
    log: str = ""
    reason: str = ""             # why it was skipped
    outputs: dict = field(default_factory=dict)


def load_workflow(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))   # YAML 1.1 reads the key `on` as true
    return doc


class WorkflowJob:
    def __init__(self, path: Path, job_id: str, *, workspace: Path, temp: Path, context: dict,
                 env: dict, actions: dict[str, Callable[[dict], str | None]],
                 job_env: dict | None = None, step_timeout_s: float = 1800):
        """`context`: the expression contexts (github, secrets, vars...; `runner` and `steps`
        are filled in here); `env`: the runner machine's environment (PATH, HOME, ...);
        `job_env`: values that replace the job's `env:` entries of the same name, as a user
        configuring the workflow would (each must exist in the job)."""
        self.doc = load_workflow(path)
        self.job = self.doc["jobs"][job_id]
        self.workspace, self.temp = workspace, temp
        self.context = {**context, "runner": {"temp": str(temp), "os": "Linux"}, "steps": {}}
        self.machine_env = dict(env)
        self.actions = actions
        self.job_env_overrides = dict(job_env or {})
        unknown = set(self.job_env_overrides) - set(self.job.get("env") or {})
        if unknown:
            raise KeyError(f"the job has no env {sorted(unknown)} to replace")
        self.step_timeout_s = step_timeout_s
        self.added_env: dict[str, str] = {}
        self.added_path: list[str] = []
        self.summaries: list[str] = []

    # -- expressions ---------------------------------------------------------------------------

    def evaluate(self, expr: str):
        for operand in (part.strip() for part in expr.split("||")):
            value = self._operand(operand)
            if value not in (None, "", False, 0):
                return value
        return value

    def _operand(self, operand: str):
        if len(operand) >= 2 and operand[0] == operand[-1] == "'":
            return operand[1:-1].replace("''", "'")
        if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", operand):
            raise ValueError(f"expression {operand!r}: not a context path or a string here")
        value = self.context
        for key in operand.split("."):
            if not isinstance(value, dict) or key not in value:
                if operand.startswith(("vars.", "steps.", "env.")):
                    return ""          # an unset variable or output reads as empty on GitHub
                raise KeyError(f"expression {operand!r}: no {key!r} in the context given")
            value = value[key]
        return value

    def holds(self, condition: str | None, failed: bool, name: str = "") -> bool:
        """Whether a step with `if: condition` runs, the job having `failed` so far."""
        if condition is None:
            return not failed
        text = EXPR.sub(lambda m: m.group(1), str(condition)).strip()
        if not any(fn in text for fn in STATUS):
            text = f"success() && {text}"
        try:
            return any(all(self._term(t.strip(), failed) for t in alt.split("&&"))
                       for alt in text.split("||"))
        except (KeyError, ValueError) as e:
            raise ValueError(f"step {name!r}: condition {condition!r} is not one this runner "
                             f"knows ({e}); teach tests/ci/workflow_job.py") from None

    def _term(self, term: str, failed: bool) -> bool:
        if term in STATUS:
            return STATUS[term](failed)
        match = COMPARISON.fullmatch(term)
        if match:
            left, op, right = match.groups()
            same = str(self._operand(left.strip())) == str(self._operand(right.strip()))
            return same if op == "==" else not same
        return self._operand(term) not in (None, "", False, 0)

    def substitute(self, text) -> str:
        return EXPR.sub(lambda m: str(self.evaluate(m.group(1))), str(text))

    # -- the job -------------------------------------------------------------------------------

    def run(self) -> list[StepResult]:
        env = {**{k: self.substitute(v) for k, v in (self.doc.get("env") or {}).items()}}
        job_env = {**(self.job.get("env") or {}), **self.job_env_overrides}
        env.update({k: self.substitute(v) for k, v in job_env.items()})
        results, failed = [], False
        for i, step in enumerate(self.job["steps"]):
            name = step.get("name") or step.get("uses") or f"step {i + 1}"
            self.context["env"] = {**env, **self.added_env}
            condition = step.get("if")
            if not self.holds(condition, failed, name):
                results.append(StepResult(name, "skipped", reason=f"if: {condition}"))
                if step.get("id"):
                    self.context["steps"][step["id"]] = {"outputs": {}, "outcome": "skipped"}
                continue
            result = self._action(name, step) if "uses" in step else self._script(name, step, env)
            if result.outcome == "failure" and not step.get("continue-on-error"):
                failed = True
            if step.get("id"):
                self.context["steps"][step["id"]] = {"outputs": result.outputs,
                                                     "outcome": result.outcome}
            results.append(result)
        return results

    def _action(self, name: str, step: dict) -> StepResult:
        action = step["uses"].split("@", 1)[0]
        if action not in self.actions:
            raise KeyError(f"step {name!r} uses {action}, which this test does not stand in for")
        inputs = {k: self.substitute(v) for k, v in (step.get("with") or {}).items()}
        reason = self.actions[action](inputs)
        return StepResult(name, "skipped" if reason else "success", reason=reason or "")

    def _script(self, name: str, step: dict, env: dict) -> StepResult:
        shell = step.get("shell")
        if shell not in SHELLS:
            raise ValueError(f"step {name!r}: shell {shell!r} is not one this runner knows")
        files = {key: self.temp / f"_runner_file_commands/{key.lower()}_{len(self.summaries)}"
                 for key in ("GITHUB_ENV", "GITHUB_PATH", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        script = self.temp / f"_step_{len(self.summaries)}.sh"
        script.write_text(self.substitute(step["run"]))
        step_env = {k: self.substitute(v) for k, v in (step.get("env") or {}).items()}
        full = {**self.machine_env, **self._runner_env(), **{k: str(v) for k, v in files.items()},
                **env, **self.added_env, **step_env}
        full["PATH"] = os.pathsep.join([*reversed(self.added_path), full.get("PATH", "")])
        timeout = float(step.get("timeout-minutes", 0)) * 60 or self.step_timeout_s
        cwd = self.workspace / step.get("working-directory", ".")
        proc = subprocess.run([*SHELLS[shell], str(script)], cwd=cwd, env=full,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout)
        self.added_env.update(_env_file(files["GITHUB_ENV"].read_text()))
        self.added_path += [line for line in files["GITHUB_PATH"].read_text().splitlines()
                            if line.strip()]
        self.summaries.append(files["GITHUB_STEP_SUMMARY"].read_text())
        return StepResult(name, "success" if proc.returncode == 0 else "failure",
                          proc.returncode, proc.stdout,
                          outputs=_env_file(files["GITHUB_OUTPUT"].read_text()))

    def _runner_env(self) -> dict[str, str]:
        github = self.context.get("github") or {}
        env = {"CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(self.workspace),
               "RUNNER_TEMP": str(self.temp), "RUNNER_OS": "Linux"}
        for key in ("repository", "base_ref", "head_ref", "ref", "sha", "event_name",
                    "run_id", "run_attempt", "server_url", "api_url", "event_path"):
            if key in github:
                env[f"GITHUB_{key.upper()}"] = str(github[key])
        return env

    @property
    def step_summary(self) -> str:
        return "".join(self.summaries)


def _env_file(text: str) -> dict[str, str]:
    """`NAME=value` lines and `NAME<<DELIMITER` ... `DELIMITER` blocks ($GITHUB_ENV/OUTPUT)."""
    out, lines = {}, iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            block = []
            for body in lines:
                if body == delimiter:
                    break
                block.append(body)
            out[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out
