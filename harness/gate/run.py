"""`harness gate`: plan, measure (or load) the head, find its baseline, judge every cell.

Two modes:
- A/B (`--base REF`): base and head measured here, interleaved (harness.gate.abtest), each
  side by its own long-lived worker.
- against a stored baseline (`--baseline mlflow|file|run:RUN_ID`): the head is measured now on
  the chosen host, or taken from a journaled run (`--run RUN_ID`), and compared with the
  baseline of the same GPU class.

In both, nothing is measured before the design is known to be able to decide
(harness.gate.sequential): baselines are loaded and counted first, and a design that could never
fail is re-planned or refused. Then the gate looks after each round and measures on while a
gated metric is undecided, within `--max-rounds` and `--budget-s`.

Everything measured is journaled like any run (`results/runs/<gate id>-head`, `-base`), each
worker run of each round is kept under `results/gates/<gate id>/raw/`, and the reports go to
`results/gates/<gate id>/` (harness.gate.report).
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from harness.sweep import gitinfo

from harness.protocol import params
from harness.protocol.errors import InputError
from harness.gate import abtest, baselines, noise
from harness.gate.abtest import BASE, HEAD
from harness.gate.baselines import RUN, Side, side_from_results
from harness.gate.judge import CellVerdict, GateResult, judge_cell, settled, wants_more
from harness.gate.policy import PER_RUN, Policy
from harness.gate.sequential import (DEFAULT_MAX_ROUNDS, Design, check_fixed, per_round,
                                     plan_ab, plan_stored, rounds_to_decide)
from harness.gate.stats import Comparison
from harness.hosts.interface import Host, HostUnavailable
from harness.hosts.local import serves, worker_file
from harness.sweep.journal import RunJournal, new_run_id

# A PR job's worth: long enough for a small GPU scenario to settle its quiet cells, short
# enough that nobody switches the gate off. Undecided cells say how much more they need.
DEFAULT_BUDGET_S = 600.0


@dataclass
class GateOptions:
    scenario: object                       # harness.sweep.scenario.Scenario
    policies: dict[str, Policy]
    host: Host
    base_ref: str | None = None            # A/B mode
    head_ref: str | None = None            # A/B: a commit instead of the working tree
    baseline: str | None = None            # "mlflow" | "file" | "run:RUN_ID"
    head_run: str | None = None            # take the head from this journaled run
    rounds: int = 1                        # rounds per side before the first look, at least
    max_rounds: int = DEFAULT_MAX_ROUNDS
    budget_s: float | None = DEFAULT_BUDGET_S
    results_dir: Path = Path("results")
    baselines_dir: Path | None = None      # default <results_dir>/baselines
    tracking_uri: str | None = None
    allow_missing: bool = False
    allow_undecided: bool = False
    trigger: str = "pr"
    log: Callable[[str], None] = print     # progress lines
    gate_id: str = field(default_factory=new_run_id)
    cells: list[dict] | None = None        # the scenario's cells to gate (None: all; -k picks)

    def gated_cells(self) -> list[dict]:
        return self.cells if self.cells is not None else self.scenario.cells()

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


class _Looks:
    """The verdicts each cell has reached so far, look by look: a metric decided once keeps
    its verdict (the design spent that look's share of alpha on it)."""

    def __init__(self, policies: dict[str, Policy], design: Design):
        self.policies, self.design = policies, design
        self.decided: dict[str, dict[str, Comparison]] = {}

    def judge(self, head: Side | None, base: Side | None, cid: str, round_no: int) -> CellVerdict:
        cv = judge_cell(head, base, self.policies, self.design, round_no, self.decided.get(cid))
        self.decided[cid] = settled(cv)
        return cv


def _describe(cv: CellVerdict, per_side: dict[str, list[dict]], policies: dict[str, Policy],
              design: Design, measured: abtest.Measured | None, repeats: int) -> CellVerdict:
    """Add to a cell's verdict what the reader needs to trust it: rounds, noise per side and
    metric, host facts, and for an undecided metric about how many rounds would decide it.
    `repeats`: the samples a round gives a per-repeat metric (1 where the round is the sample)."""
    cv.rounds = {side: len(results) for side, results in per_side.items()}
    for side, results in per_side.items():
        for policy in policies.values():
            n = noise.side_noise(results, policy, side)
            if n is not None:
                cv.noise.append(n)
        cv.host_notes += [f"{side}: {line}" for line in noise.host_notes(results)]
    cv.warnings = noise.warnings(cv.noise, policies, cv.label, per_round=repeats == 1)
    cv.warnings += [f"{cv.label}: {line}" for line in noise.graph_state_notes(per_side)]
    cv.warnings += [f"{cv.label}: {line}" for line in noise.kernel_build_notes(per_side)]
    if measured is not None:
        cv.budget_out = cv.cell_id in measured.budget_out
    done = max(cv.rounds.get(HEAD, 0), 1)
    for c in cv.undecided:
        cv.to_decide[c.metric] = rounds_to_decide(c, design, per_round(c.policy, repeats), done)
    return cv


# -- A/B ---------------------------------------------------------------------------------------


def gate_ab(opts: GateOptions) -> GateResult:
    repo = abtest.repo_root(Path.cwd())
    base_sha = abtest.resolve_commit(repo, opts.base_ref)
    head_sha = abtest.resolve_commit(repo, opts.head_ref) if opts.head_ref else None
    cells = opts.gated_cells()
    labels = {params.cell_id(c): params.cell_label(c) for c in cells}
    # The unit of an A/B sample is a round (one worker run, the median of its repeats): runs
    # differ by more than repeats do (baselines.samples_of), so one sample a round per metric.
    design = plan_ab(opts.policies, 1, opts.max_rounds, opts.rounds)
    looks = _Looks(opts.policies, design)

    def sides(cid: str, per_side: dict[str, list[dict]], head_desc="head", base_desc="base",
              head_git=None, base_git=None) -> tuple[Side, Side]:
        return (side_from_results(cid, labels[cid], per_side[HEAD], head_desc, head_git, RUN),
                side_from_results(cid, labels[cid], per_side[BASE], base_desc, base_git, RUN))

    def more(cid: str, per_side: dict[str, list[dict]], rounds_done: int) -> bool:
        head, base = sides(cid, per_side)
        if head.error or base.error or head.gpu_class != base.gpu_class:
            return False
        return wants_more(looks.judge(head, base, cid, rounds_done))

    with abtest.worktree(repo, base_sha) as base_tree:
        _check_tree(base_tree, opts.base_ref)
        if head_sha:
            with abtest.worktree(repo, head_sha) as head_tree:
                _check_tree(head_tree, opts.head_ref)
                head_git = {"sha": head_sha, "branch": opts.head_ref, "dirty": False}
                measured = _measure_ab(opts, cells, base_tree, head_tree, design, more)
        else:
            head_git = gitinfo.git_info(repo)
            _check_tree(repo, "the working tree")
            measured = _measure_ab(opts, cells, base_tree, repo, design, more)

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
        head, base = sides(cid, runs, f"A/B head {head_desc}", f"A/B base {base_desc}",
                           head_git.get("sha"), base_sha)
        cv = looks.judge(head, base, cid, measured.rounds.get(cid, 0))
        verdicts.append(_describe(cv, runs, opts.policies, design, measured, 1))
    result = GateResult(opts.scenario.name, "ab", base_desc, head_desc, verdicts, opts.policies,
                        design, opts.allow_missing, opts.allow_undecided,
                        extra=_extra(opts, measured, base_run=base_journal.run_id,
                                     head_run=head_journal.run_id))
    _judge_targets(result, opts, head_journal, base_journal)
    if base_sha == (head_git.get("sha") or head_sha) and not head_git.get("dirty"):
        result.notes.append("base and head are the same commit: this is an A/A run (noise check)")
    _budget_note(result, measured, opts)
    return result


def _judge_targets(result: GateResult, opts: GateOptions, head: RunJournal,
                   base: RunJournal | None = None) -> None:
    """The scenario's targets judged on the head's numbers as journaled (each cell's median over
    its rounds), for the reports beside the verdict, and on the base's where it is a journaled
    run (A/B, --baseline run:ID), so the reports say what the change moved. A target about none
    of the gated cells (-k left them out, or its `per` cell) is not judged absent: a note
    counts it."""
    from harness.sweep import targets

    cells = opts.gated_cells()
    wanted, left_out = targets.among(opts.scenario.targets, cells)
    gated = {params.cell_id(c) for c in cells}

    def judged(journal: RunJournal) -> list:
        results = [r for cid, r in journal.results().items() if cid in gated]
        return targets.judge_run(journal, results, wanted) if wanted else []

    result.targets = judged(head)
    if base is not None and wanted:
        result.targets_base = judged(base)
    if left_out:
        result.notes.append(f"{len(left_out)} of the scenario's {len(opts.scenario.targets)} "
                            f"target(s) not judged: the cells they bound are not in this gate")


def _extra(opts: GateOptions, measured: abtest.Measured | None, **more) -> dict:
    extra = {"gate_id": opts.gate_id, "host": opts.host.name, "budget_s": opts.budget_s, **more}
    if measured is not None:
        extra.update(elapsed_s=round(measured.elapsed_s, 1), rounds=measured.rounds,
                     round_s={cid: [round(t, 3) for t in ts] for cid, ts in measured.round_s.items()},
                     round_overhead_s=round_overheads(measured))
    return extra


def round_overheads(measured: abtest.Measured) -> dict:
    """What a round costs beyond its measurement, per worker run, after each cell's first
    round: the round's wall time (as the controller saw it) less the timed windows its worker
    runs report (`timing.window_s`). Absent where the workload reports no timing."""
    per_cell = {}
    for cid, per_side in measured.results.items():
        costs = []
        for r, wall in enumerate(measured.round_s.get(cid, [])):
            if r == 0:
                continue
            runs = [results[r] for results in per_side.values() if len(results) > r]
            windows = [(x.get("timing") or {}).get("window_s") for x in runs]
            if runs and all(isinstance(w, (int, float)) for w in windows):
                costs.append((wall - sum(windows)) / len(runs))
        if costs:
            per_cell[cid] = {"median": round(statistics.median(costs), 3),
                             "max": round(max(costs), 3), "n": len(costs)}
    every = [c["median"] for c in per_cell.values()]
    return {"cells": per_cell,
            "median": round(statistics.median(every), 3) if every else None,
            "max": round(max(c["max"] for c in per_cell.values()), 3) if per_cell else None}


def _budget_note(result: GateResult, measured: abtest.Measured, opts: GateOptions) -> None:
    if measured.interrupted:
        result.notes.append("interrupted: cells that did not finish count as errors")
    if measured.budget_out:
        result.notes.append(f"the time budget ({opts.budget_s:g} s) ran out before "
                            f"{len(measured.budget_out)} cell(s) were decided (--budget-s)")


def _check_tree(tree: Path, what: str) -> None:
    if worker_file(tree) is None:
        raise InputError(None, None, None, f"{what} has no harness worker (harness/worker/ or "
                                           f"harness/worker.py): not a specdec-harness commit")


def _measure_ab(opts, cells, base_tree, head_tree, design, more) -> abtest.Measured:
    hosts = {BASE: abtest.host_for_tree(opts.host, base_tree),
             HEAD: abtest.host_for_tree(opts.host, head_tree)}
    # Both sides keep a long-lived worker or neither does: a warm head (models and graphs
    # kept) against a base that starts cold every round would tilt the comparison.
    if not all(serves(tree) for tree in (base_tree, head_tree)):
        for side, host in hosts.items():
            if getattr(host, "persistent", False):
                hosts[side] = host.with_persistent(False)
        opts.log("note: one side's worker cannot serve many cells (an older commit): both "
                 "sides start a worker per round")
    budget = f"{opts.budget_s:g} s" if opts.budget_s is not None else "no limit"
    opts.log(f"A/B gate {opts.gate_id}: {len(cells)} cell(s) on {opts.host.name}, interleaved; "
             f"{design.first_look} round(s) per side, then one more while a gated metric is "
             f"undecided, up to {design.max_rounds} ({design.looks} look(s), Bonferroni); "
             f"budget {budget}")
    return abtest.measure(cells, hosts, design=design, wants_more=more, budget_s=opts.budget_s,
                          on_result=_progress(opts, len(cells)),
                          profile_every_round=_profiles_gated(opts.policies))


def _profiles_gated(policies: dict[str, Policy]) -> bool:
    """Whether a gated metric comes from the profiled window (one sample a run): then every
    round must profile; otherwise only a cell's first round does (its idle fraction is reported)."""
    return any(p.gate and p.per == PER_RUN for p in policies.values())


# -- against a stored baseline -----------------------------------------------------------------


PROBE_CELL = params.canonical({"workload": "noop", "sleep_s": 0.0, "timeout_s": 300})


def probe_class(host: Host) -> str:
    """The baseline class of what `host` measures, from one no-op cell's environment: known
    before any real cell runs, so a missing baseline is reported before anything is measured."""
    async def run() -> dict:
        try:
            return await host.run_cell(dict(PROBE_CELL), 0, lambda _p: None)
        finally:
            if hasattr(host, "close"):
                await host.close()
    try:
        result = asyncio.run(run())
    except HostUnavailable as e:       # unreachable, broken: before anything was measured
        raise InputError(None, None, None, f"host {host.name}: {e}") from None
    if result.get("status") != "ok":
        first = ((result.get("error") or "").strip().splitlines() or ["no result"])[0]
        raise InputError(None, None, None, f"host {host.name}: cannot tell its GPU class "
                                           f"(a no-op cell failed: {first[:200]})")
    return baselines.result_gpu_class(result)


def _demote_single_samples(policies: dict[str, Policy], base_sides: dict[str, Side],
                           head_sides: dict[str, Side] | None,
                           labels: dict[str, str]) -> tuple[dict[str, Policy], list[str]]:
    """Gated metrics that some cell's stored baseline (or journaled head) holds as a single
    value become reported-only, with a note naming them."""
    out, notes = dict(policies), []
    for name, policy in policies.items():
        if not policy.gate:
            continue
        single = [cid for cid in labels
                  for sides in (base_sides, head_sides or {})
                  if cid in sides and len(sides[cid].samples.get(name) or []) == 1]
        if single:
            out[name] = replace(policy, gate=False)
            notes.append(f"`{name}` is stored as one value per run for {len(set(single))} "
                         f"cell(s) (no per-repeat samples): reported, not gated")
    return out, notes


def gate_against(opts: GateOptions) -> GateResult:
    mode, base_run = parse_baseline(opts.baseline)
    sc = opts.scenario
    cells = opts.gated_cells()
    labels = {params.cell_id(c): params.cell_label(c) for c in cells}
    repeats = {params.cell_id(c): params.canonical(c)["repeats"] for c in cells}
    baselines_dir = opts.baselines_dir or opts.results_dir / "baselines"
    base_desc = {"mlflow": "MLflow runs tagged baseline=true",
                 "file": f"{baselines_dir}/<class>/{sc.name}.json", "run": f"run {base_run}"}[mode]

    head_sides: dict[str, Side] | None = None
    head_journal = None
    if opts.head_run:
        head_journal, head_sides = baselines.from_journal(opts.runs_root, opts.head_run)
        if head_journal.scenario_name != sc.name:
            raise InputError(None, None, None, f"run {opts.head_run} is of scenario "
                                               f"'{head_journal.scenario_name}', not '{sc.name}'")

    # 1. Every baseline, before anything is measured.
    if mode == "file" and not any(Path(baselines_dir).glob(f"*/{sc.name}.json")):
        raise InputError(str(baselines_dir), None, None,
                         f"no baseline for scenario '{sc.name}' in any class; make one with: "
                         f"harness baseline mark RUN --file")
    base_journal = None           # a journaled baseline run (the targets are judged on it too)
    if mode == "run":
        journal, base_sides = baselines.from_journal(opts.runs_root, base_run)
        base_journal = journal
        if journal.scenario_name != sc.name:
            raise InputError(None, None, None, f"baseline run {base_run} is of scenario "
                                               f"'{journal.scenario_name}', not '{sc.name}'")
        classes = None
    else:
        if head_sides is not None:
            classes = sorted({s.gpu_class for s in head_sides.values() if s.gpu_class})
        else:
            opts.log(f"gate {opts.gate_id}: probing {opts.host.name} for its GPU class")
            classes = [probe_class(opts.host)]
        base_sides = {}
        for cls in classes:
            found = (baselines.from_file(baselines_dir, sc.name, cls) if mode == "file"
                     else baselines.from_mlflow(opts.tracking_uri, sc.name, cls))
            for cid, side in found.items():
                base_sides.setdefault(cid, side)
    # (A head cell that failed is reported as the error it is, not as a missing baseline.)
    wanted = [cid for cid in labels
              if head_sides is None or (cid in head_sides and not head_sides[cid].error)]
    missing = [cid for cid in wanted if cid not in base_sides or base_sides[cid].error]
    if missing and not opts.allow_missing:
        names = ", ".join(labels[c] for c in missing[:3]) + (" …" if len(missing) > 3 else "")
        raise InputError(None, None, None,
                         f"{len(missing)} of {len(labels)} cell(s) have no baseline in "
                         f"{base_desc}: {names} (mark a run with `harness baseline mark RUN`, or "
                         f"--allow-missing)")

    # 2. A design that can decide with those baselines. A metric stored as one value per run
    # (no per-repeat samples: an older worker, a per-run metric) can never be decided from one
    # run a side: it is reported, not gated, and the report says so.
    policies, notes = _demote_single_samples(opts.policies, base_sides, head_sides, labels)
    if not any(p.gate and any(p.metric in b.samples for b in base_sides.values())
               for p in policies.values()):
        policies, notes = opts.policies, []    # nothing left to gate: refuse, saying why below
    if head_sides is not None:
        counts = {cid: {m: (len(base_sides[cid].samples[m]), len(head_sides[cid].samples[m]))
                        for m in policies
                        if m in base_sides[cid].samples and m in head_sides[cid].samples}
                  for cid in labels if cid in base_sides and cid in head_sides}
        design = check_fixed(policies, counts, labels,
                             f"run {opts.head_run} against {base_desc}")
    else:
        base_counts = {cid: {m: len(v) for m, v in base_sides[cid].samples.items()}
                       for cid in labels if cid in base_sides and not base_sides[cid].error}
        design = plan_stored(policies, base_counts, repeats, labels, base_desc,
                             opts.max_rounds, opts.rounds)
    looks = _Looks(policies, design)

    # 3. The head: measured now, looking after each round, or taken from its journal.
    measured = None
    per_cell: dict[str, list[dict]] = {}
    if head_sides is not None:
        head_desc = f"run {opts.head_run} @ {str(head_journal.meta.get('git_sha'))[:10]}"
        per_cell = {cid: [r] for cid, r in head_journal.results().items()}
        notes.append("the head was measured earlier (--run): one look, no more rounds")
    else:
        def more(cid: str, per_side: dict[str, list[dict]], rounds_done: int) -> bool:
            head = side_from_results(cid, labels[cid], per_side[HEAD], HEAD)
            base = base_sides.get(cid)
            if head.error or base is None or base.error or base.gpu_class != head.gpu_class:
                return False
            return wants_more(looks.judge(head, base, cid, rounds_done))

        git = gitinfo.git_info()
        budget = f"{opts.budget_s:g} s" if opts.budget_s is not None else "no limit"
        opts.log(f"gate {opts.gate_id}: {len(cells)} cell(s) on {opts.host.name}; "
                 f"{design.first_look} round(s), then one more while a gated metric is "
                 f"undecided, up to {design.max_rounds} ({design.looks} look(s), Bonferroni); "
                 f"budget {budget}")
        measured = abtest.measure(cells, {HEAD: opts.host}, design=design, wants_more=more,
                                  budget_s=opts.budget_s, on_result=_progress(opts, len(cells)),
                                  profile_every_round=_profiles_gated(policies))
        per_cell = {cid: r[HEAD] for cid, r in measured.results.items()}
        head_journal = _journal(opts, HEAD, cells, per_cell, _meta(opts, git, "."))
        head_sides = {cid: side_from_results(cid, labels[cid], runs, f"head {str(git['sha'])[:10]}",
                                             git["sha"]) for cid, runs in per_cell.items()}
        head_desc = (f"working tree @ {str(git['sha'])[:10]}"
                     + (" (uncommitted changes)" if git.get("dirty") else ""))

    # 4. The verdicts.
    verdicts = []
    for cid, label in labels.items():
        head = head_sides.get(cid)
        if head is None:
            verdicts.append(CellVerdict(cid, label, status="error", message="head: not measured"))
            continue
        base = base_sides.get(cid) if not head.error else None
        rounds_done = measured.rounds.get(cid, 0) if measured else 1
        cv = looks.judge(head, base, cid, rounds_done)
        verdicts.append(_describe(cv, {HEAD: per_cell.get(cid, [])}, policies, design,
                                  measured, repeats[cid]))
    classes = sorted({s.gpu_class for s in head_sides.values() if s.gpu_class})
    result = GateResult(sc.name, mode, base_desc, head_desc, verdicts, policies, design,
                        opts.allow_missing, opts.allow_undecided, notes,
                        extra=_extra(opts, measured, head_run=head_journal.run_id,
                                     gpu_classes=classes))
    _judge_targets(result, opts, head_journal, base_journal)
    if measured is not None:
        _budget_note(result, measured, opts)
    return result
