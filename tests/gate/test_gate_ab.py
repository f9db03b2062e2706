"""Same-job A/B gate and bisect: interleaving, sequential rounds, budgets, git worktrees, exit codes.

Three levels:
- `abtest.measure` with fake hosts: the exact order of worker runs (A B, B A, ...), rounds
  while a verdict is open, the time budget, one slot per cell.
- `harness gate --base REF` and `harness bisect` end to end in a throwaway git repository
  whose `harness/worker.py` (the flat layout of older commits) is a stub reporting a speed set in the commit: real worktrees, real
  worker subprocesses from each tree, real `git bisect run`; deterministic numbers.
- the real decode worker on the tiny CPU model, in a copy of this repository where the head
  commit lowers the synthetic acceptance: the gate must call accept_len_mean regressed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.gate import abtest
from harness.gate.sequential import Design
from harness.protocol import params

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()

SCENARIO = textwrap.dedent("""\
    name: ab-stub
    defaults: {model: tiny, device: cpu, repeats: 5, profile_steps: 0, timeout_s: 60}
    matrix:
      context_length: [64]
    targets:
      - {name: 95 tok/s or more, cells: context_length=64, metric: tokens_per_s, min: 95}
    """)


# -- the order of worker runs, with fake hosts -------------------------------------------------


class FakeHost:
    def __init__(self, side: str, log: list, slots: int = 1):
        self.name, self.side, self.log, self.slots, self.labels = "fake", side, log, slots, {}

    async def run_cell(self, cell, slot, on_progress):
        self.log.append((params.cell_id(cell), self.side, slot))
        await asyncio.sleep(0)   # let the other slot run in between
        return {"status": "ok", "metrics": {"tokens_per_s": 1.0}, "samples": {}}


def test_rounds_alternate_and_only_open_cells_get_more():
    log: list = []
    cells = [{"context_length": 64}, {"context_length": 128}]
    ids = [params.cell_id(c) for c in cells]
    hosts = {"base": FakeHost("base", log, slots=2), "head": FakeHost("head", log, slots=2)}
    looks = []

    def wants_more(cid, per_side, rounds_done):
        looks.append((cid, rounds_done, len(per_side["head"])))
        return cid == ids[1]
    measured = abtest.measure(cells, hosts, design=Design(2, 4), wants_more=wants_more)
    order = {cid: [side for c, side, _ in log if c == cid] for cid in ids}
    assert order[ids[0]] == ["base", "head", "head", "base"]
    assert order[ids[1]] == ["base", "head", "head", "base", "base", "head", "head", "base"]
    assert measured.rounds == {ids[0]: 2, ids[1]: 4}
    # A look after the first two rounds and after each later one -- not after the last
    # (the final verdict is taken there by the caller).
    assert sorted(looks) == sorted([(ids[0], 2, 2), (ids[1], 2, 2), (ids[1], 3, 3)])
    # Both sides of a cell run on the same slot (GPU); the two cells ran on different slots.
    slots = {cid: {s for c, _, s in log if c == cid} for cid in ids}
    assert all(len(s) == 1 for s in slots.values()) and slots[ids[0]] != slots[ids[1]]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class SlowHost(FakeHost):
    """Every worker run takes 10 s on `clock`."""

    def __init__(self, side, log, clock):
        super().__init__(side, log)
        self.clock = clock

    async def run_cell(self, cell, slot, on_progress):
        self.clock.t += 10.0
        return await super().run_cell(cell, slot, on_progress)


def test_the_budget_stops_extra_rounds_and_shares_time_between_cells():
    log: list = []
    clock = Clock()
    cells = [{"context_length": 64}, {"context_length": 128}]
    ids = [params.cell_id(c) for c in cells]
    hosts = {"base": SlowHost("base", log, clock), "head": SlowHost("head", log, clock)}
    # A round is 20 s. 100 s for two always-open cells: the first may use half of it (50 s:
    # two rounds), the second what is left (60 s: three rounds, its first rounds run regardless).
    measured = abtest.measure(cells, hosts, design=Design(1, 10),
                              wants_more=lambda *a: True, budget_s=100.0, clock=clock)
    assert measured.rounds == {ids[0]: 2, ids[1]: 3}
    assert measured.budget_out == {ids[0], ids[1]}
    assert measured.elapsed_s == pytest.approx(100.0)
    # Without a budget the rounds cap it.
    measured = abtest.measure(cells, hosts, design=Design(1, 3), wants_more=lambda *a: True)
    assert measured.rounds == {ids[0]: 3, ids[1]: 3} and not measured.budget_out


class ClosingHost(FakeHost):
    closed = 0

    async def close(self):
        type(self).closed += 1


def test_persistent_hosts_are_closed_in_the_measuring_loop():
    hosts = {"base": ClosingHost("base", []), "head": ClosingHost("head", [])}
    abtest.measure([{"context_length": 64}], hosts, design=Design(1, 1))
    assert ClosingHost.closed == 2


def test_merge_results_pools_repeats():
    cell = {"context_length": 64}
    runs = [{"status": "ok", "cell_id": "other", "metrics": {"tokens_per_s": 10.0, "step_ms_p50": 2.0},
             "samples": {"tokens_per_s": [9.0, 10.0, 11.0], "accept_len_mean": [2.0, 2.0, 2.0]}},
            {"status": "ok", "metrics": {"tokens_per_s": 20.0, "step_ms_p50": 4.0},
             "samples": {"tokens_per_s": [19.0, 20.0, 21.0], "accept_len_mean": [4.0, 4.0, 4.0]}},
            {"status": "failed", "error": "boom", "metrics": {}, "samples": {}}]
    merged = abtest.merge_results(cell, runs)
    assert merged["cell_id"] == params.cell_id(cell)        # the head's id, whatever a base says
    assert merged["samples"]["tokens_per_s"] == [9.0, 10.0, 11.0, 19.0, 20.0, 21.0]
    assert merged["metrics"]["tokens_per_s"] == 15.0 and merged["metrics"]["accept_len_mean"] == 3.0
    assert merged["metrics"]["step_ms_p50"] == 3.0
    assert merged["runs"] == 2 and merged["failed_runs"] == 1


# -- a throwaway repository with a stub worker -------------------------------------------------

STUB_WORKER = textwrap.dedent("""\
    import json, os, sys
    from harness.speed import SPEED, SIDE, NOISE
    cell = json.load(sys.stdin)
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(SIDE + "\\n")
    n = cell["repeats"]
    import random
    with open(os.environ["STUB_LOG"]) as f:     # seeded by the run's place in the order: the
        runs_so_far = len(f.read().split())      # same noise every time the test runs
    noise = random.Random(f"{SIDE}-{runs_so_far}").gauss if NOISE else (lambda mu, sd: 0.0)
    tps = [SPEED * (1 + 0.001 * ((i * 7) % 5 - 2) + noise(0, NOISE)) for i in range(n)]
    out = {"cell": cell, "cell_id": "stub", "label": "stub", "status": "ok", "error": None,
           "metrics": {"tokens_per_s": sorted(tps)[n // 2], "accept_len_mean": 6.0},
           "samples": {"tokens_per_s": tps, "accept_len_mean": [6.0] * n},
           "env": {"gpu": None}, "wall_s": 0.01}
    print(json.dumps(out))
    """)


def git(*args, cwd):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def speed_file(speed, side: str, noise: float = 0.0) -> str:
    return f"SPEED = {speed!r}\nSIDE = {side!r}\nNOISE = {noise!r}\n"


def commit_speed(repo: Path, speed, side: str, message: str) -> str:
    (repo / "harness" / "speed.py").write_text(speed_file(speed, side))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", message, cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def stub_repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "harness").mkdir(parents=True)
    (repo / "harness" / "__init__.py").write_text("")
    (repo / "harness" / "worker.py").write_text(STUB_WORKER)
    (repo / "s.yaml").write_text(SCENARIO)
    git("init", "-q", "-b", "main", cwd=repo)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("STUB_LOG", str(tmp_path / "order.log"))
    return repo


def gate(*args, results):
    r = runner.invoke(app, ["gate", "s.yaml", *map(str, args), "--results", str(results)],
                      env={"COLUMNS": "200"})
    return r.exit_code, r.output


def test_ab_gate_end_to_end_in_a_throwaway_repo(stub_repo, tmp_path):
    base = commit_speed(stub_repo, 100.0, "base", "base")
    results = tmp_path / "results"

    # A/A: the base commit against the unchanged working tree. A round is one sample (the
    # median of its repeats), so the plan looks first after 7 rounds per side (6 vs 6 cannot
    # reach alpha / K with 15 rounds at most), interleaved A B B A ...
    (stub_repo / "harness" / "speed.py").write_text(speed_file(100.0, "head"))
    code, out = gate("--base", base, results=results)
    assert code == 0, out
    interleaved = ["base", "head", "head", "base"] * 3 + ["base", "head"]
    assert (tmp_path / "order.log").read_text().split() == interleaved
    assert "unchanged (round 7)" in out and "Bonferroni" in out
    # The scenario's target, judged on the head's median over its rounds: beside the verdict.
    # Both sides are journaled runs: each target's numbers base then head.
    assert "Targets, base → head" in out
    assert re.search(r"95 tok/s or more\s*│\s*100\s*│\s*100\s*│\s*tokens_per_s >= 95\s*│\s*met\b", out), out

    # The working tree is 10 % slower: regression, decided at the first look.
    (tmp_path / "order.log").unlink()
    (stub_repo / "harness" / "speed.py").write_text(speed_file(90.0, "head"))
    code, out = gate("--base", base, "--markdown", tmp_path / "pr.md", results=results)
    assert code == 1, out
    assert (tmp_path / "order.log").read_text().split() == interleaved
    md = (tmp_path / "pr.md").read_text()
    assert "❌ regressed (round 7)" in md and "| 7/7 | 100 | 90 | -10.0 % |" in md
    assert "**Targets**" in md
    assert "| 95 tok/s or more | 100 | 90 | tokens_per_s >= 95 | met → ❌ not met (1 of 1 outside) |" in md
    [gate_dir] = [d for d in (results / "gates").iterdir() if "-10.0 %" in (d / "report.md").read_text()]
    report = json.loads((gate_dir / "gate.json").read_text())
    assert report["mode"] == "ab" and report["base"].endswith(base[:10])
    assert report["design"]["first_look"] == 7 and report["design"]["looks"] == 9
    [target], [before] = report["targets"], report["targets_base"]
    assert target["verdict"] == "not met" and target["measured"][0]["value"] == pytest.approx(90, rel=0.01)
    assert before["verdict"] == "met" and before["measured"][0]["value"] == pytest.approx(100, rel=0.01)
    assert sorted(p.name.split(".")[1] for p in (gate_dir / "raw").iterdir()) == ["base"] * 7 + ["head"] * 7
    head_run = json.loads((results / "runs" / report["head_run"] / "run.json").read_text())
    assert head_run["meta"]["git_dirty"] is True and head_run["meta"]["trigger"] == "pr"

    # Two commits, neither the working tree: --head REF.
    head = commit_speed(stub_repo, 100.0, "head", "back to speed")
    code, out = gate("--base", base, "--head", head, results=results)
    assert code == 0, out

    # Every worktree was removed again.
    assert git("worktree", "list", "--porcelain", cwd=stub_repo).count("worktree ") == 1


def test_ab_gate_bad_refs_and_failing_sides_exit_2(stub_repo, tmp_path):
    base = commit_speed(stub_repo, 100.0, "base", "base")
    results = tmp_path / "results"
    code, out = gate("--base", "no-such-branch", results=results)
    assert code == 2 and "unknown git ref 'no-such-branch'" in out
    # The base side crashes: no baseline, exit 2, never a pass.
    (stub_repo / "harness" / "worker.py").write_text("raise SystemExit(3)\n")
    git("commit", "-qam", "broken worker", cwd=stub_repo)
    broken = git("rev-parse", "HEAD", cwd=stub_repo)
    git("checkout", "-q", base, "--", "harness/worker.py", cwd=stub_repo)
    code, out = gate("--base", broken, results=results)
    assert code == 2 and "worker exited with code 3" in out
    # A base commit that is not a harness checkout at all.
    git("checkout", "-q", "--orphan", "empty", cwd=stub_repo)
    git("rm", "-rq", "--cached", ".", cwd=stub_repo)
    (stub_repo / "README").write_text("x")
    git("add", "README", cwd=stub_repo)
    git("commit", "-qm", "empty", cwd=stub_repo)
    empty = git("rev-parse", "HEAD", cwd=stub_repo)
    git("checkout", "-qf", "main", cwd=stub_repo)
    code, out = gate("--base", empty, results=results)
    assert code == 2 and "has no harness worker" in out


def test_gate_against_a_baseline_file_measures_the_head_now(stub_repo, tmp_path):
    from harness.gate.baselines import write_file
    from harness.sweep.journal import RunJournal
    from harness.sweep.scenario import parse_scenario

    commit_speed(stub_repo, 90.0, "head", "slow")
    results = tmp_path / "results"
    sc = parse_scenario(SCENARIO, "s.yaml")
    baseline_run = RunJournal.create(results / "runs", "20260101-000000-000000", sc.name, "s.yaml",
                                     SCENARIO, sc.cells(), {"git_sha": "0" * 40})
    for cell in sc.cells():
        baseline_run.write_cell({"cell": cell, "cell_id": params.cell_id(cell), "label": "stub",
                                 "status": "ok", "metrics": {"tokens_per_s": 100.0},
                                 "samples": {"tokens_per_s": [99.8, 100.1, 100.0, 99.9, 100.2]},
                                 "env": {"gpu": None}})
    write_file(results / "baselines", baseline_run)

    code, out = gate("--baseline", "file", results=results)
    assert code == 1, out
    # One no-op probe for the GPU class, then the head measured twice here (a stored baseline
    # is one run, so its repeats are the samples: 5 against 5 a round reach alpha / K at
    # round 2); no base run.
    assert (tmp_path / "order.log").read_text().split() == ["head", "head", "head"]
    report = json.loads(next((results / "gates").glob("*/gate.json")).read_text())
    tps = report["cells"][0]["metrics"][0]
    assert report["mode"] == "file" and tps["n_base"] == 5 and tps["n_head"] == 10
    assert tps["verdict"] == "regressed" and tps["look"] == 2


def _journal_run(results, run_id, tps, sc_text=SCENARIO):
    from harness.sweep.journal import RunJournal
    from harness.sweep.scenario import parse_scenario

    sc = parse_scenario(sc_text, "s.yaml")
    run = RunJournal.create(results / "runs", run_id, sc.name, "s.yaml", sc_text, sc.cells(),
                            {"git_sha": "0" * 40})
    for cell in sc.cells():
        run.write_cell({"cell": cell, "cell_id": params.cell_id(cell), "label": "stub",
                        "status": "ok", "metrics": {"tokens_per_s": float(sorted(tps)[len(tps) // 2])},
                        "samples": {"tokens_per_s": list(tps)}, "env": {"gpu": None}})
    return run


def test_a_design_that_cannot_reach_alpha_is_refused_before_measuring(stub_repo, tmp_path):
    from harness.gate.baselines import write_file

    commit_speed(stub_repo, 50.0, "head", "half speed")
    results = tmp_path / "results"
    # The case: quickstart-sized runs, 3 repeats each, the head at half speed. 3 vs 3
    # can never be significant at 0.01: exit 2 with what it needs, not "passed".
    _journal_run(results, "20260101-000000-00000a", [100.0, 101.0, 99.0])
    _journal_run(results, "20260101-000000-00000b", [50.0, 50.5, 49.5])
    code, out = gate("--baseline", "run:20260101-000000-00000a", "--run",
                     "20260101-000000-00000b", results=results)
    assert code == 2, out
    assert "can never be significant" in out and "at least 5 samples" in out
    # A one-sample stored baseline cannot be saved by more head rounds: refused, saying how
    # many it needs, before a single cell is measured.
    write_file(results / "baselines", _journal_run(results, "20260101-000000-00000c", [100.0]))
    code, out = gate("--baseline", "file", results=results)
    assert code == 2, out
    assert "a stored baseline needs at least" in out
    assert (tmp_path / "order.log").read_text().split() == ["head"]     # the class probe only
    # A 3-sample one is re-planned: the head gets enough rounds to reach alpha / K.
    write_file(results / "baselines", _journal_run(results, "20260101-000000-00000d",
                                                   [100.0, 101.0, 99.0]))
    code, out = gate("--baseline", "file", results=results)
    assert code == 1, out
    report = json.loads(sorted((results / "gates").glob("*/gate.json"))[-1].read_text())
    first = report["design"]["first_look"]
    assert first == 4        # min p of 3 vs 5r samples first below 0.01 / (15 - r + 1) at r = 4
    assert report["cells"][0]["metrics"][0]["n_head"] == 5 * first


def test_no_baseline_file_at_all_is_reported_before_anything_runs(stub_repo, tmp_path):
    commit_speed(stub_repo, 100.0, "head", "x")
    code, out = gate("--baseline", "file", results=tmp_path / "results")
    assert code == 2 and "no baseline for scenario 'ab-stub'" in out
    assert not (tmp_path / "order.log").exists()


def test_undecided_gate_exits_3_and_says_what_would_decide_it(stub_repo, tmp_path):
    base = commit_speed(stub_repo, 100.0, "base", "base")
    (stub_repo / "harness" / "speed.py").write_text(speed_file(100.0, "head", noise=0.3))
    results = tmp_path / "results"
    code, out = gate("--base", base, "--max-rounds", "8", results=results)
    assert code == 3, out
    # (The stub's noise is random: the estimate says "about N rounds" or, when N is huge,
    # "too noisy to gate"; either way it says what would decide it.)
    assert "undecided: " in out and ("would likely decide it" in out
                                     or "too noisy to gate at this threshold" in out)
    assert "Performance gate undecided" in out
    report = json.loads(next((results / "gates").glob("*/gate.json")).read_text())
    assert report["exit_code"] == 3 and report["cells"][0]["rounds"] == {"base": 8, "head": 8}
    assert report["cells"][0]["warnings"]            # 30 % noise against a 3 % threshold
    code, out = gate("--base", base, "--max-rounds", "8", "--allow-undecided", results=results)
    assert code == 0 and "--allow-undecided" in out


def test_bisect_finds_the_first_slow_commit(stub_repo, tmp_path):
    good = commit_speed(stub_repo, 100.0, "x", "fast")
    commit_speed(stub_repo, 100.5, "x", "still fast")
    culprit = commit_speed(stub_repo, 80.0, "x", "the slow one")
    commit_speed(stub_repo, 80.5, "x", "later")
    bad = commit_speed(stub_repo, 79.5, "x", "latest")
    cell = params.cell_id(params.canonical({"model": "tiny", "device": "cpu", "repeats": 5,
                                            "profile_steps": 0, "timeout_s": 60, "context_length": 64}))
    r = runner.invoke(app, ["bisect", "--good", good, "--bad", bad, "--cell", cell,
                            "--scenario", "s.yaml"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert f"first bad commit: {culprit} the slow one" in r.output
    assert git("worktree", "list", "--porcelain", cwd=stub_repo).count("worktree ") == 1
    assert git("rev-parse", "HEAD", cwd=stub_repo) == bad          # the checkout is untouched

    r = runner.invoke(app, ["bisect", "--good", bad, "--bad", good, "--cell", cell, "--scenario", "s.yaml"])
    assert r.exit_code == 2 and "not an ancestor" in r.output
    r = runner.invoke(app, ["bisect", "--good", good, "--bad", culprit, "--cell", "000000000000",
                            "--scenario", "s.yaml"])
    assert r.exit_code == 2 and "no cell 000000000000" in r.output


# -- the real worker on the tiny model ---------------------------------------------------------

TINY = textwrap.dedent("""\
    name: ab-tiny
    defaults:
      model: tiny
      device: cpu
      dtype: float32
      acceptance: synthetic
      tau: 6.0
      block_size: 8
      tree_budget: 8
      warmup_steps: 1
      steps: 6
      repeats: 5
      profile_steps: 0
      timeout_s: 120
    matrix:
      context_length: [64]
    """)


@pytest.mark.slow
def test_ab_gate_with_the_real_worker_on_the_tiny_model(tmp_path, monkeypatch):
    repo = tmp_path / "copy"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for folder in ("harness", "kernels", "dashboards"):
        shutil.copytree(REPO / folder, repo / folder, ignore=ignore)
    (repo / "s.yaml").write_text(TINY)
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "base", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo)
    # The head commit's drafter "got worse": a third of the accepted length per step.
    loop = repo / "harness" / "decode" / "loop.py"
    text, n = re.subn(r"SyntheticAcceptance\(\s*tau\b", "SyntheticAcceptance(max(1.0, tau / 3)",
                      loop.read_text())
    assert n == 1, "harness/decode/loop.py no longer builds SyntheticAcceptance(tau, ...): update this test"
    loop.write_text(text)
    git("commit", "-qam", "worse drafter", cwd=repo)

    monkeypatch.chdir(repo)
    results = tmp_path / "results"
    # Seven rounds per side before the first look (the plan's), which decides it.
    r = runner.invoke(app, ["gate", "s.yaml", "--base", base,
                            "--results", str(results), "--json", str(tmp_path / "g.json")],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 1, r.output
    report = json.loads((tmp_path / "g.json").read_text())
    metrics = {m["metric"]: m for m in report["cells"][0]["metrics"]}
    accept = metrics["accept_len_mean"]
    assert accept["verdict"] == "regressed" and accept["n_base"] == accept["n_head"] == 7
    assert accept["head_median"] < accept["base_median"] / 2
    assert accept["p_worse"] < 0.001 and accept["look"] == 7
    assert (results / "runs" / report["base_run"] / "cells").is_dir()
    assert git("worktree", "list", "--porcelain", cwd=repo).count("worktree ") == 1


@pytest.mark.parametrize("repeats", [1, 2, 3, 4, 5, 8])
def test_a_half_speed_head_never_passes_whatever_the_repeats(stub_repo, tmp_path, repeats):
    results = tmp_path / "results"
    base = [100.0 + 0.5 * i for i in range(repeats)]
    _journal_run(results, "20260101-000000-00000e", base)
    _journal_run(results, "20260101-000000-00000f", [v * 0.5 for v in base])
    code, out = gate("--baseline", "run:20260101-000000-00000e", "--run",
                     "20260101-000000-00000f", results=results)
    # Refused (2) while the samples cannot reach alpha, a regression (1) once they can.
    assert code == (1 if repeats >= 5 else 2), out
