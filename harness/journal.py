"""The run journal: every cell result on local disk, before anything goes to MLflow.

Layout (a contract, DESIGN.md):

    <root>/<run_id>/run.json             what the run is: scenario, cells, meta
    <root>/<run_id>/scenario.yaml        the scenario text as it was run
    <root>/<run_id>/cells/<cell_id>.json one worker result per cell, stored verbatim
    <root>/<run_id>/tracking.json        which results are already in MLflow (see tracking.py)

`root` defaults to `results/runs` relative to the working directory. The journal is the
source of truth: MLflow is an upload of it that can fail and be finished later with
`harness run --resume RUN_ID`. Every file is written atomically (temp file in the same
directory, fsync, os.replace), so a crash or Ctrl-C never leaves a half-written JSON behind.

Recommended `meta` keys (read by tracking.py): `git_sha`, `git_branch`, `trigger`
(manual|nightly|pr), `hosts` (list of host names), `tracking_uri`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness.params import cell_id as compute_cell_id
from harness.params import cell_label

DEFAULT_ROOT = Path("results/runs")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

RUN_FILE = "run.json"
SCENARIO_FILE = "scenario.yaml"
TRACKING_FILE = "tracking.json"
CELLS_DIR = "cells"


class JournalError(Exception):
    """A journal is missing or unreadable; the message is meant for the user as is."""


def new_run_id(now: datetime | None = None) -> str:
    """`YYYYmmdd-HHMMSS-<6 hex>`: sorts by time, readable, unique enough for parallel CI jobs."""
    now = now or datetime.now()
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see either the old file or the whole new one.

    The temp file lives in the same directory so os.replace is a rename on one filesystem;
    fsync before the rename so a power loss cannot leave an empty file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # Includes KeyboardInterrupt: never leave temp files lying around in the journal.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise JournalError(f"{path}: not valid JSON ({e})") from None


class RunJournal:
    """One run's folder. Build with `RunJournal.create(...)` or `RunJournal.open(...)`."""

    def __init__(self, path: Path, run: dict):
        self.path = Path(path)
        self.run = run  # the parsed run.json

    # -- construction ------------------------------------------------------------------------

    @staticmethod
    def check_name(kind: str, name: str) -> str:
        """A run id or cell id is a file name inside the journal, never a path: letters,
        digits, '.', '_' and '-', not starting with a dot (so no '..', no '/')."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise JournalError(f"{kind} {str(name)[:80]!r} is not a valid name (letters, digits, "
                               f"'.', '_', '-'; at most 128 characters, no leading dot)")
        return name

    @classmethod
    def create(
        cls,
        root: str | os.PathLike | None,
        run_id: str,
        scenario_name: str,
        scenario_path: str | os.PathLike | None,
        scenario_text: str,
        cells: list[dict],
        meta: dict | None = None,
    ) -> "RunJournal":
        """Start a new run folder. `cells` are the expanded matrix (params dicts)."""
        path = Path(root if root is not None else DEFAULT_ROOT) / cls.check_name("run id", run_id)
        if (path / RUN_FILE).exists():
            raise JournalError(f"run {run_id} already exists at {path}; use --resume {run_id}")
        run = {
            "run_id": run_id,
            "scenario": scenario_name,
            "scenario_path": str(scenario_path) if scenario_path is not None else None,
            "created_at": utc_now_iso(),
            "cells": [
                {"cell_id": compute_cell_id(c), "label": cell_label(c), "cell": c} for c in cells
            ],
            "meta": dict(meta or {}),
        }
        ids = [c["cell_id"] for c in run["cells"]]
        if len(set(ids)) != len(ids):
            # Two matrix points with one id would overwrite each other's result file.
            raise JournalError("the scenario expands to duplicate cells (same parameters twice)")
        (path / CELLS_DIR).mkdir(parents=True, exist_ok=True)
        atomic_write_text(path / SCENARIO_FILE, scenario_text)
        atomic_write_json(path / RUN_FILE, run)
        return cls(path, run)

    @classmethod
    def open(cls, root: str | os.PathLike | None, run_id: str) -> "RunJournal":
        """Open an existing run folder; JournalError naming the path if there is none."""
        root = Path(root if root is not None else DEFAULT_ROOT)
        path = root / cls.check_name("run id", run_id)
        if not (path / RUN_FILE).is_file():
            known = sorted(p.name for p in root.glob("*") if (p / RUN_FILE).is_file())[-3:]
            hint = f" (latest: {', '.join(known)})" if known else ""
            raise JournalError(f"no run {run_id!r} in {root}{hint}")
        return cls(path, _read_json(path / RUN_FILE))

    # -- properties --------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    @property
    def scenario_name(self) -> str:
        return self.run["scenario"]

    @property
    def meta(self) -> dict:
        return self.run["meta"]

    @property
    def cells(self) -> list[dict]:
        """The run's cells as `{cell_id, label, cell}` entries, in matrix order."""
        return self.run["cells"]

    @property
    def scenario_file(self) -> Path:
        return self.path / SCENARIO_FILE

    @property
    def cells_dir(self) -> Path:
        return self.path / CELLS_DIR

    def cell_path(self, cell_id: str) -> Path:
        return self.cells_dir / f"{cell_id}.json"

    # -- results -----------------------------------------------------------------------------

    def write_cell(self, result: dict) -> Path:
        """Store one worker result verbatim (atomically); returns its path."""
        cid = result.get("cell_id")
        if not cid:
            raise ValueError("a cell result needs a cell_id")
        path = self.cell_path(self.check_name("cell id", cid))
        atomic_write_json(path, result)
        return path

    def results(self) -> dict[str, dict]:
        """Every stored result by cell id, in the run's cell order (then any extras)."""
        found = {}
        for p in sorted(self.cells_dir.glob("*.json")):
            found[p.stem] = _read_json(p)
        order = [c["cell_id"] for c in self.cells]
        ordered = {cid: found.pop(cid) for cid in order if cid in found}
        ordered.update(found)
        return ordered

    def missing(self) -> list[dict]:
        """Cells (params dicts) still to run: no result, or a failed one.

        A failed cell counts as missing so that `--resume` retries failures.
        """
        results = self.results()
        return [
            c["cell"]
            for c in self.cells
            if results.get(c["cell_id"], {}).get("status") != "ok"
        ]

    # -- meta and tracking state -------------------------------------------------------------

    def update_meta(self, **kw: Any) -> None:
        self.run["meta"].update(kw)
        atomic_write_json(self.path / RUN_FILE, self.run)

    def tracking_state(self) -> dict:
        """`{"parent_run_id", "tracking_uri", "logged": {cell_id: mlflow_run_id}}`."""
        p = self.path / TRACKING_FILE
        state = _read_json(p) if p.is_file() else {}
        state.setdefault("parent_run_id", None)
        state.setdefault("tracking_uri", None)
        state.setdefault("logged", {})
        return state

    def save_tracking_state(self, state: dict) -> None:
        atomic_write_json(self.path / TRACKING_FILE, state)
