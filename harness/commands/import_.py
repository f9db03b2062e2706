"""`harness import DIR [DIR ...]`: a batch's results (python -m harness.worker --cells FILE --out
DIR, on a host the controller never reached) become a normal run: journal, MLflow, report, gate.

The batch's header (batch.json, from `harness run --export-cells`) carries the scenario text,
which is validated again here: its cells are the run's cells. Each result file must be a worker
result for one of them (its file name, its cell id and its echoed cell agree); anything else
is set aside with a one-line warning and its cell counts as missing. The run records the commit
the batch was exported at (the code it ran), not this checkout's, and the batch host's
environment; results keep their own `env` and host facts as the worker wrote them.

Several DIRs make one run of their cells together: a scenario's cells split over several
batches (a device call's time limit, a cell that ran out of time and was run again), so that
what a run derives across cells (speedup_vs_ar, speedup_vs_peer) is derived. They must be of
one scenario at one commit; a cell with results in two of them takes the one that ran (ok over
failed), and two that both ran is an error: which one the run holds would be a silent choice.

A batch exported at another commit than this checkout's may name what this one no longer
knows (a variant since removed) or cells whose ids have changed since (a knob since added):
the complaint then names the batch's commit, whose harness imports it.

Exit codes as `harness run`: 0 every cell ok and logged, 1 some failed or missing (or the
upload failed), 2 a DIR that is not a batch, or batches that are not one run.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import (console, err, fail_input, results_option,
                                      tracking_uri_option)
from harness.protocol.errors import InputError


def import_(
    batch_dirs: list[Path] = typer.Argument(..., metavar="DIR",
                                            help="the --out DIR of a worker batch; several: one run of "
                                                 "their cells (one scenario, one commit)"),
    tracking_uri: Optional[str] = tracking_uri_option(
        "MLflow URI (default $MLFLOW_TRACKING_URI or sqlite:///results/mlflow.db)"),
    results_dir: Path = results_option("journal root is RESULTS/runs"),
):
    """Make worker batches' results a run: journal, MLflow, report (as `harness run` ends)."""
    from harness.commands.run import finish
    from harness.protocol import params
    from harness.sweep import journal as jr, tracking
    from harness.sweep.runner import SweepOutcome
    from harness.sweep.scenario import parse_scenario, validate_tracking_uri

    try:
        uri = validate_tracking_uri(tracking_uri or tracking.default_tracking_uri())
        unique = list({d.resolve(): d for d in batch_dirs}.values())    # a DIR named twice: once
        batches = [(d, _read_batch(d)) for d in unique]
        _same_run(batches)
    except InputError as e:
        raise fail_input(e)
    first_dir, first = batches[0]
    try:
        sc = parse_scenario(first["scenario_text"], f"{first_dir}/batch.json (scenario)")
    except InputError as e:
        raise fail_input(InputError(e.path, e.line, e.column, e.message + _other_commit(first)))
    cells = sc.cells()
    selected = set()
    for _, batch in batches:
        ran = batch.get("cell_ids")
        if not (isinstance(ran, list) and ran):   # a whole scenario's batch
            selected = None
            break
        selected |= set(ran)                      # the batch of a selection (-k ... --export-cells)
    if selected is not None:
        cells = [c for c in cells if params.cell_id(c) in selected]
    wanted = {params.cell_id(c): c for c in cells}

    found: dict[str, tuple[Path, dict]] = {}
    other_commit = None           # asked of git once, and only when a result is set aside
    for batch_dir, _ in batches:
        for path in sorted((batch_dir / "cells").glob("*.json")):
            result, why = _read_result(path, wanted)
            if why:
                if other_commit is None:
                    other_commit = _other_commit(first)
                err.print(f"[yellow]warning:[/] {escape(str(path))}: {escape(why)}; its cell counts "
                          f"as missing{escape(other_commit)}", highlight=False)
                continue
            try:
                found[path.stem] = _one_result(found.get(path.stem), (path, result))
            except InputError as e:
                raise fail_input(e)
    results = [result for _, result in found.values()]

    host_of = {}
    for batch_dir, batch in batches:
        env = batch.get("env") if isinstance(batch.get("env"), dict) else {}
        host_of[batch_dir] = str(env.get("hostname") or "batch")
    hosts = list(dict.fromkeys(host_of.values()))
    for path, result in found.values():
        result.setdefault("host", host_of[path.parent.parent])
    starts = [b.get("started_at") for _, b in batches if b.get("started_at")]
    ends = [b.get("finished_at") for _, b in batches]
    meta = {"git_sha": first.get("git_sha"), "git_branch": first.get("git_branch"),
            "git_dirty": first.get("git_dirty"), "trigger": first.get("trigger") or sc.trigger,
            "hosts": hosts, "tracking_uri": uri,
            "imported_from": {"dir": str(first_dir), "started_at": min(starts, default=None),
                              # unfinished when any batch is (a worker stopped mid-batch)
                              "finished_at": None if None in ends else max(ends),
                              "imported_on": socket.gethostname()}}
    if len(batches) > 1:
        meta["imported_from"]["dirs"] = [str(d) for d, _ in batches]
    try:
        journal = jr.RunJournal.create(results_dir / "runs", jr.new_run_id(), sc.name, None,
                                       sc.text, cells, meta)
        for r in results:
            journal.write_cell(r)
    except jr.JournalError as e:
        raise fail_input(e)
    where = " ".join(str(d) for d, _ in batches)
    console.print(f"Imported run [bold]{journal.run_id}[/]: scenario [bold]{escape(sc.name)}[/], "
                  f"{len(results)} of {len(cells)} cell(s) from {escape(where)} "
                  f"(measured on {escape(', '.join(hosts))})", highlight=False)
    finish(journal, uri, SweepOutcome(results=results),
           f"harness import {where} (a new run), or harness run "
           f"{journal.path / jr.SCENARIO_FILE} --resume {journal.run_id}")


def _other_commit(batch: dict) -> str:
    """What to add to a complaint about the batch's scenario or cells when it was exported at
    another commit than this checkout's: they may be valid only there (a knob value since
    removed, a knob since added, which changes every cell's id). Empty otherwise."""
    from harness.sweep import gitinfo

    sha = batch.get("git_sha")
    if not isinstance(sha, str) or not sha or sha == "unknown":
        return ""
    here = gitinfo.head_sha()
    if here == sha:
        return ""
    here = "no commit" if here == "unknown" else here[:10]
    return (f" (the batch was exported at {sha[:10]} and this checkout is at {here}: import it "
            f"with that commit's harness, e.g. from `git worktree add DIR {sha[:10]}`)")


def _same_run(batches: list[tuple[Path, dict]]) -> None:
    """Batches make one run only when they are one scenario at one commit."""
    first_dir, first = batches[0]
    for batch_dir, batch in batches[1:]:
        for key, what in (("scenario_text", "scenario"), ("git_sha", "commit"), ("git_dirty", "tree state")):
            if batch.get(key) != first.get(key):
                raise InputError(f"{batch_dir}/batch.json", None, None,
                                 f"another {what} than {first_dir}'s: batches of one run are one "
                                 f"scenario at one commit (import them as separate runs)")


def _one_result(held: tuple[Path, dict] | None, new: tuple[Path, dict]) -> tuple[Path, dict]:
    """Of two batches' results for one cell, the one that ran; both ran: an error."""
    if held is None:
        return new
    ok_held, ok_new = held[1]["status"] == "ok", new[1]["status"] == "ok"
    if ok_held and ok_new:
        raise InputError(str(new[0]), None, None,
                         f"cell {new[0].stem} ran in two batches (also {held[0]}): import one of "
                         f"them, or each as its own run")
    return new if ok_new and not ok_held else held


def _read_batch(batch_dir: Path) -> dict:
    path = batch_dir / "batch.json"
    try:
        batch = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(str(path), None, None, "no such file: not the --out DIR of a worker "
                                                "batch (python -m harness.worker --cells FILE "
                                                "--out DIR)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(str(path), None, None, f"damaged ({e})") from None
    if not isinstance(batch, dict) or not isinstance(batch.get("scenario_text"), str):
        raise InputError(str(path), None, None, "has no scenario: export the cells with "
                                                "`harness run SCENARIO --export-cells FILE`")
    return batch


def _read_result(path: Path, wanted: dict[str, dict]) -> tuple[dict | None, str | None]:
    """(the result in the file at `path`, None), or (None, why it is not the result of one of
    the `wanted` cells)."""
    from harness.protocol import params

    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, f"damaged ({e})"
    if not isinstance(result, dict) or not isinstance(result.get("cell"), dict) \
            or result.get("status") not in ("ok", "failed"):
        return None, "not a worker result"
    if path.stem not in wanted:
        return None, "not a cell of the batch's scenario"
    try:
        echoed = params.cell_id(params.canonical(result["cell"]))
    except (TypeError, ValueError):
        echoed = None
    if result.get("cell_id") != path.stem or echoed != path.stem:
        return None, f"names cell {str(result.get('cell_id'))[:40]!r}, not the file's {path.stem}"
    return result, None
