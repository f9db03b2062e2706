"""The run journal: layout, atomic writes, reload, and what --resume re-runs."""

from __future__ import annotations

import json
import os
import re

import pytest

from harness.protocol.params import cell_id, cell_label
from harness.sweep import journal as journal_mod
from harness.sweep.journal import (
    JournalError,
    RunJournal,
    atomic_write_text,
    new_run_id,
)

CELLS = [{"context_length": n, "verify_mode": "sdpa"} for n in (256, 512, 1024)]


def make_result(cell: dict, status: str = "ok", tps: float | None = 100.0) -> dict:
    ok = status == "ok"
    return {
        "cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell), "status": status,
        "error": None if ok else "RuntimeError: boom",
        "metrics": {"tokens_per_s": tps, "idle_fraction": None} if ok else {},
        "samples": {"tokens_per_s": [tps, tps]} if ok else {},
        "env": {"device": "cpu", "gpu": None}, "host": "local",
        "started_at": "2026-01-01T00:00:00+00:00", "wall_s": 1.0,
    }


@pytest.fixture
def journal(tmp_path):
    return RunJournal.create(tmp_path / "runs", "20260101-000000-abcdef", "quickstart",
                             "scenarios/quickstart.yaml", "name: quickstart\n", CELLS,
                             {"git_sha": "abc123", "trigger": "manual"})


def test_new_run_id_is_readable_and_sortable():
    a = new_run_id()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", a)
    from datetime import datetime
    early = new_run_id(datetime(2025, 1, 2, 3, 4, 5))
    assert early.startswith("20250102-030405-") and early < a


def test_create_writes_contract_layout(journal, tmp_path):
    run_dir = tmp_path / "runs" / "20260101-000000-abcdef"
    assert journal.path == run_dir
    run = json.loads((run_dir / "run.json").read_text())
    assert {"run_id", "scenario", "scenario_path", "created_at", "cells", "meta"} <= set(run)
    assert run["scenario"] == "quickstart"
    assert [c["cell_id"] for c in run["cells"]] == [cell_id(c) for c in CELLS]
    assert run["cells"][0]["label"] == cell_label(CELLS[0])
    assert run["cells"][0]["cell"] == CELLS[0]
    assert run["meta"]["git_sha"] == "abc123"
    assert (run_dir / "scenario.yaml").read_text() == "name: quickstart\n"
    assert (run_dir / "cells").is_dir()


def test_create_refuses_existing_run(journal, tmp_path):
    with pytest.raises(JournalError, match="already exists"):
        RunJournal.create(tmp_path / "runs", journal.run_id, "q", None, "", CELLS, {})


def test_create_refuses_duplicate_cells(tmp_path):
    with pytest.raises(JournalError, match="duplicate"):
        RunJournal.create(tmp_path, "r", "q", None, "", [CELLS[0], dict(CELLS[0])], {})


def test_open_missing_run_names_it(journal, tmp_path):
    with pytest.raises(JournalError, match="no run 'nope'.*latest: 20260101-000000-abcdef"):
        RunJournal.open(tmp_path / "runs", "nope")


def test_write_cell_reload_and_missing(journal, tmp_path):
    assert journal.missing() == CELLS  # nothing ran yet
    ok = make_result(CELLS[0])
    failed = make_result(CELLS[1], status="failed")
    journal.write_cell(ok)
    journal.write_cell(failed)

    reopened = RunJournal.open(tmp_path / "runs", journal.run_id)
    results = reopened.results()
    assert list(results) == [cell_id(CELLS[0]), cell_id(CELLS[1])]
    assert results[cell_id(CELLS[0])] == ok  # stored verbatim, nulls included
    # A failed cell counts as missing, so --resume retries it.
    assert reopened.missing() == [CELLS[1], CELLS[2]]

    journal.write_cell(make_result(CELLS[1]))
    journal.write_cell(make_result(CELLS[2]))
    assert journal.missing() == []
    # Only the final files remain: no temp files left behind by the atomic writes.
    assert sorted(p.name for p in journal.cells_dir.iterdir()) == sorted(
        f"{cell_id(c)}.json" for c in CELLS)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    atomic_write_text(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(journal_mod.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["x.json"]


def test_update_meta_and_tracking_state(journal, tmp_path):
    journal.update_meta(tracking_uri="sqlite:///x.db", hosts=["local"])
    reopened = RunJournal.open(tmp_path / "runs", journal.run_id)
    assert reopened.meta == {"git_sha": "abc123", "trigger": "manual",
                             "tracking_uri": "sqlite:///x.db", "hosts": ["local"]}

    assert reopened.tracking_state() == {"parent_run_id": None, "tracking_uri": None,
                                         "logged": {}}
    reopened.save_tracking_state({"parent_run_id": "p", "tracking_uri": "u", "logged": {"c": "r"}})
    assert json.loads((journal.path / "tracking.json").read_text())["logged"] == {"c": "r"}
    # The cell files keep exactly the worker's keys: tracking state lives elsewhere.
    assert not any(p.name == "tracking.json" for p in journal.cells_dir.iterdir())


def test_write_cell_requires_id(journal):
    with pytest.raises(ValueError):
        journal.write_cell({"status": "ok"})
