"""`harness gate`: measure (or load) the head, find its baseline, judge every cell.

Two modes:
- A/B (`--base REF`): base and head measured here, interleaved (harness.gate.abtest).
- against a stored baseline (`--baseline mlflow|file|run:RUN_ID`): the head is measured now on
  the chosen host, or taken from a journaled run (`--run RUN_ID`), and compared with the
  baseline of the same GPU class.

Everything measured is journaled like any run (`results/runs/<gate id>-head`, `-base`), each
worker run of each round is kept under `results/gates/<gate id>/raw/`, and the reports go to
`results/gates/<gate id>/` (harness.gate.report).
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness import gitinfo, params
from harness.errors import InputError
from harness.gate import abtest, baselines
from harness.gate.abtest import BASE, HEAD
from harness.gate.baselines import Side, side_from_results
from harness.gate.judge import CellVerdict, GateResult, judge_cell, needs_remeasure
from harness.gate.policy import Policy
from harness.gate.stats import DEFAULT_SCREEN
from harness.hosts import Host
from harness.journal import RunJournal, new_run_id

DEFAULT_ROUNDS = 1
DEFAULT_REMEASURE = 3


@dataclass
class GateOptions:
    scenario: object                       # harness.scenario.Scenario
    policies: dict[str, Policy]
    host: Host
    base_ref: str | None = None            # A/B mode
    head_ref: str | None = None            # A/B: a commit instead of the working tree
    baseline: str | None = None            # "mlflow" | "file" | "run:RUN_ID"
    head_run: str | None = None            # take the head from this journaled run
    rounds: int = DEFAULT_ROUNDS
    remeasure: int = DEFAULT_REMEASURE
    screen: float = DEFAULT_SCREEN
    results_dir: Path = Path("results")
    baselines_dir: Path | None = None      # default <results_dir>/baselines
    tracking_uri: str | None = None
    allow_missing: bool = False
    fail_on_inconclusive: bool = False
    trigger: str = "pr"
    log: Callable[[str], None] = print     # progress lines
    gate_id: str = field(default_factory=new_run_id)

    @property
    def gate_dir(self) -> Path:
        return self.results_dir / "gates" / self.gate_id

    @property
    def runs_root(self) -> Path:
        return self.results_dir / "runs"


def parse_baseline(value: str | None) -> tuple[str, str | None]:
    """'mlflow' | 'file' | 'run:RUN_ID' -> (mode, run id)."""
    if value in ("mlflow", "file"):
        return value, None
    if value and value.startswith("run:") and len(value) > 4:
        return "run", value[4:]
    raise InputError(None, None, None, f"--baseline must be mlflow, file or run:RUN_ID, "
                                       f"not {value!r}")


def _progress(opts: GateOptions, n: int) -> abtest.OnResult:
    raw = opts.gate_dir / "raw"

    def on_result(i: int, cell: dict, side: str, round_no: int, result: dict) -> None:
        abtest.write_raw(raw, cell, side, round_no, result)
        m = result.get("metrics") or {}
        if result.get("status") == "ok":
            what = (f"{m['tokens_per_s']:.1f} tok/s" if isinstance(m.get("tokens_per_s"), (int, float))
                    else "ok")
        else:
            what = "FAILED " + ((result.get("error") or "").strip().splitlines() or [""])[0][:120]
        opts.log(f"  cell {i}/{n} round {round_no + 1} {side}: {what}  {params.cell_label(cell)}")
    return on_result


def _journal(opts: GateOptions, suffix: str, cells: list[dict], per_cell: dict[str, list[dict]],
             meta: dict) -> RunJournal:
    sc = opts.scenario
    journal = RunJournal.create(opts.runs_root, f"{opts.gate_id}-{suffix}", sc.name, sc.path,
                                sc.text, cells, meta)
    for cell in cells:
        results = per_cell.get(params.cell_id(cell))
        if results:
            journal.write_cell(abtest.merge_results(cell, results))
    return journal


def _meta(opts: GateOptions, git: dict, tree: str) -> dict:
    return {"git_sha": git.get("sha"), "git_branch": git.get("branch"),
            "git_dirty": git.get("dirty"), "trigger": opts.trigger, "hosts": [opts.host.name],
            "gate_id": opts.gate_id, "code_tree": tree, "argv": sys.argv,
            "controller": {"python": platform.python_version(), "platform": platform.platform()}}


# -- A/B ---------------------------------------------------------------------------------------


def gate_ab(opts: GateOptions) -> GateResult:
    repo = abtest.repo_root(Path.cwd())
    base_sha = abtest.resolve_commit(repo, opts.base_ref)
    head_sha = abtest.resolve_commit(repo, opts.head_ref) if opts.head_ref else None
    cells = opts.scenario.cells()
    labels = {params.cell_id(c): params.cell_label(c) for c in cells}

    def needs_more(cid: str, per_side: dict[str, list[dict]]) -> bool:
        head = side_from_results(cid, labels[cid], per_side[HEAD], HEAD)
        base = side_from_results(cid, labels[cid], per_side[BASE], BASE)
        if head.error or base.error or head.gpu_class != base.gpu_class:
            return False
        return needs_remeasure(judge_cell(head, base, opts.policies, with_ci=False), opts.screen)

    with abtest.worktree(repo, base_sha) as base_tree:
        _check_tree(base_tree, opts.base_ref)
        if head_sha:
            with abtest.worktree(repo, head_sha) as head_tree:
                _check_tree(head_tree, opts.head_ref)
                head_git = {"sha": head_sha, "branch": opts.head_ref, "dirty": False}
                measured = _measure_ab(opts, cells, base_tree, head_tree, needs_more)
        else:
            head_git = gitinfo.git_info(repo)
            _check_tree(repo, "the working tree")
            measured = _measure_ab(opts, cells, base_tree, repo, needs_more)

    base_desc = f"{opts.base_ref} @ {base_sha[:10]}"
    head_desc = (f"{opts.head_ref} @ {head_sha[:10]}" if head_sha else
                 f"working tree @ {str(head_git.get('sha'))[:10]}"
                 + (" (uncommitted changes)" if head_git.get("dirty") else ""))
    per_side = {side: {cid: r[side] for cid, r in measured.results.items()} for side in (BASE, HEAD)}
    base_journal = _journal(opts, BASE, cells, per_side[BASE],
                            _meta(opts, {"sha": base_sha, "branch": opts.base_ref}, "worktree"))
    head_journal = _journal(opts, HEAD, cells, per_side[HEAD], _meta(opts, head_git, str(repo)))

    verdicts = []
    for cell in cells:
        cid = params.cell_id(cell)
        runs = measured.results.get(cid)
        if runs is None:
            verdicts.append(CellVerdict(cid, labels[cid], status="error",
                                        message="not measured (interrupted)"))
            continue
        head = side_from_results(cid, labels[cid], runs[HEAD], f"A/B head {head_desc}",
                                 head_git.get("sha"))
        base = side_from_results(cid, labels[cid], runs[BASE], f"A/B base {base_desc}", base_sha)
        cv = judge_cell(head, base, opts.policies)
        cv.remeasured = cid in measured.remeasured
        verdicts.append(cv)
    result = GateResult(opts.scenario.name, "ab", base_desc, head_desc, verdicts, opts.policies,
                        opts.allow_missing, opts.fail_on_inconclusive,
                        extra={"gate_id": opts.gate_id, "base_run": base_journal.run_id,
                               "head_run": head_journal.run_id, "host": opts.host.name,
                               "rounds": opts.rounds, "remeasure": opts.remeasure})
    if base_sha == (head_git.get("sha") or head_sha) and not head_git.get("dirty"):
        result.notes.append("base and head are the same commit: this is an A/A run (noise check)")
    if measured.interrupted:
        result.notes.append("interrupted: cells that did not finish count as errors")
    return result


def _check_tree(tree: Path, what: str) -> None:
    if not (Path(tree) / "harness" / "worker.py").is_file():
        raise InputError(None, None, None, f"{what} has no harness/worker.py: not a "
                                           f"specdec-harness commit")


def _measure_ab(opts, cells, base_tree, head_tree, needs_more) -> abtest.Measured:
    hosts = {BASE: abtest.host_for_tree(opts.host, base_tree),
             HEAD: abtest.host_for_tree(opts.host, head_tree)}
    opts.log(f"A/B gate {opts.gate_id}: {len(cells)} cell(s) x {opts.rounds} round(s) per side "
             f"on {opts.host.name}, interleaved; up to {opts.remeasure} more round(s) for cells "
             f"that look regressed")
    return abtest.measure(cells, hosts, rounds=opts.rounds, remeasure=opts.remeasure,
                          needs_more=needs_more, on_result=_progress(opts, len(cells)))


# -- against a stored baseline -----------------------------------------------------------------


def gate_against(opts: GateOptions) -> GateResult:
    mode, base_run = parse_baseline(opts.baseline)
    sc = opts.scenario
    cells = sc.cells()
    labels = {params.cell_id(c): params.cell_label(c) for c in cells}
    baselines_dir = opts.baselines_dir or opts.results_dir / "baselines"

    loaded: dict[str, dict[str, Side]] = {}        # GPU class -> cell id -> baseline side
    fixed: dict[str, Side] | None = None
    if mode == "run":
        journal, fixed = baselines.from_journal(opts.runs_root, base_run)
        if journal.scenario_name != sc.name:
            raise InputError(None, None, None, f"baseline run {base_run} is of scenario "
                                               f"'{journal.scenario_name}', not '{sc.name}'")

    def baseline_for(cid: str, cls: str | None) -> Side | None:
        if fixed is not None:
            return fixed.get(cid)
        if cls is None:
            return None
        if cls not in loaded:
            loaded[cls] = (baselines.from_file(baselines_dir, sc.name, cls) if mode == "file"
                           else baselines.from_mlflow(opts.tracking_uri, sc.name, cls))
        return loaded[cls].get(cid)

    notes = []
    remeasured: set[str] = set()
    if opts.head_run:
        head_journal, head_sides = baselines.from_journal(opts.runs_root, opts.head_run)
        if head_journal.scenario_name != sc.name:
            raise InputError(None, None, None, f"run {opts.head_run} is of scenario "
                                               f"'{head_journal.scenario_name}', not '{sc.name}'")
        head_desc = f"run {opts.head_run} @ {str(head_journal.meta.get('git_sha'))[:10]}"
        if opts.remeasure:
            notes.append("no re-measure: the head was measured earlier (--run)")
    else:
        def needs_more(cid: str, per_side: dict[str, list[dict]]) -> bool:
            head = side_from_results(cid, labels[cid], per_side[HEAD], HEAD)
            base = baseline_for(cid, head.gpu_class) if not head.error else None
            if base is None or base.error or base.gpu_class != head.gpu_class:
                return False
            return needs_remeasure(judge_cell(head, base, opts.policies, with_ci=False),
                                   opts.screen)

        git = gitinfo.git_info()
        opts.log(f"gate {opts.gate_id}: measuring {len(cells)} cell(s) x {opts.rounds} round(s) "
                 f"on {opts.host.name}; up to {opts.remeasure} more round(s) for cells that "
                 f"look regressed")
        measured = abtest.measure(cells, {HEAD: opts.host}, rounds=opts.rounds,
                                  remeasure=opts.remeasure, needs_more=needs_more,
                                  on_result=_progress(opts, len(cells)))
        remeasured = measured.remeasured
        per_cell = {cid: r[HEAD] for cid, r in measured.results.items()}
        head_journal = _journal(opts, HEAD, cells, per_cell, _meta(opts, git, "."))
        head_sides = {cid: side_from_results(cid, labels[cid], runs, f"head {str(git['sha'])[:10]}",
                                             git["sha"]) for cid, runs in per_cell.items()}
        head_desc = (f"working tree @ {str(git['sha'])[:10]}"
                     + (" (uncommitted changes)" if git.get("dirty") else ""))
        if measured.interrupted:
            notes.append("interrupted: cells that did not finish count as errors")

    verdicts = []
    for cid, label in labels.items():
        head = head_sides.get(cid)
        if head is None:
            verdicts.append(CellVerdict(cid, label, status="error", message="head: not measured"))
            continue
        base = baseline_for(cid, head.gpu_class) if not head.error else None
        cv = judge_cell(head, base, opts.policies)
        cv.remeasured = cid in remeasured
        verdicts.append(cv)
    base_desc = {"mlflow": "MLflow runs tagged baseline=true", "file": f"{baselines_dir}/<gpu>/{sc.name}.json",
                 "run": f"run {base_run}"}[mode]
    classes = sorted({s.gpu_class for s in head_sides.values() if s.gpu_class})
    return GateResult(sc.name, mode, base_desc, head_desc, verdicts, opts.policies,
                      opts.allow_missing, opts.fail_on_inconclusive, notes,
                      extra={"gate_id": opts.gate_id, "head_run": head_journal.run_id,
                             "gpu_classes": classes, "host": opts.host.name})
