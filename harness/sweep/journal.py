"""The run journal: every cell result on local disk, before anything goes to MLflow.

Layout (a contract, docs/ARCHITECTURE.md):

    <root>/<run_id>/run.json             what the run is: scenario, cells, meta
    <root>/<run_id>/scenario.yaml        the scenario text as it was run
    <root>/<run_id>/cells/<cell_id>.json one worker result per cell, stored verbatim
    <root>/<run_id>/tracking.json        which results are already in MLflow (see tracking.py)

`root` defaults to `results/runs` relative to the working directory. The journal is the
source of truth: MLflow is an upload of it that can fail and be finished later with
`harness run --resume RUN_ID`. Every file is written atomically (temp file in the same
directory, fsync, os.replace), so a crash or Ctrl-C never leaves a half-written JSON behind;
a new run folder is built under a hidden name and renamed into place, so a run folder either
has its run.json or does not exist.

Damaged state is set aside, never fatal: a cell file or tracking.json that is not what this
module writes (truncated, empty, `null`, another cell's result: a copy gone wrong, a disk
repaired by fsck) is renamed to `<name>.damaged-<n>` with a one-line warning naming it, and
its cell counts as not run (re-run by --resume) or its upload state as unknown (MLflow is
searched again). Only run.json cannot be set aside, being the run itself: a damaged one is a
JournalError. A write the disk refuses (full, over quota, read-only) is a JournalFull naming
the file; what was written before is intact.

Nothing secret is recorded: every string of `meta` and of the tracking state goes through
harness.protocol.redact.redact_uri (a tracking URI, the command line that carried it).

Recommended `meta` keys (read by tracking.py): `git_sha`, `git_branch`, `trigger`
(manual|nightly|pr), `hosts` (list of host names), `tracking_uri`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from harness.protocol.files import atomic_write_json, atomic_write_text  # noqa: F401 (the journal's writers)
from harness.protocol.params import cell_id as compute_cell_id
from harness.protocol.params import cell_label
from harness.protocol.redact import redact_uri

DEFAULT_ROOT = Path("results/runs")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

RUN_FILE = "run.json"
SCENARIO_FILE = "scenario.yaml"
TRACKING_FILE = "tracking.json"
CELLS_DIR = "cells"
DAMAGED_SUFFIX = ".damaged-"
# A write refused by the disk rather than by a bug: nothing this process can do but stop.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


class JournalError(Exception):
    """A journal is missing or unreadable; the message is meant for the user as is."""


class JournalFull(JournalError):
    """The disk refused a journal write (full, over quota, read-only); str() names the file.
    Everything written before is intact, so the run can be resumed once there is space."""

    def __init__(self, path: Path, err: OSError):
        super().__init__(f"cannot write {path}: {err.strerror or err}")
        self.path = path


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn the disk's refusal of a write of `path` into JournalFull; other errors pass."""
    try:
        yield
    except OSError as e:
        if e.errno in DISK_ERRNOS:
            raise JournalFull(path, e) from None
        raise


def warn_stderr(line: str) -> None:
    """The default way a journal tells the user it set a damaged file aside."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def new_run_id(now: datetime | None = None) -> str:
    """`YYYYmmdd-HHMMSS-<6 hex>`: sorts by time, readable, unique enough for parallel CI jobs."""
    now = now or datetime.now()
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _load(path: Path) -> tuple[Any, str | None]:
    """(the parsed JSON file, None), or (None, why it cannot be read or parsed)."""
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, "an empty file" if not text.strip() else f"not valid JSON: {e}"
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except OSError as e:
        return None, f"cannot read it: {e.strerror or e}"


def _kind(value: Any) -> str:
    """What a JSON value is, in words: `null`, a list, ..."""
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number")


def _scrubbed(value: Any) -> Any:
    """`value` with the secrets of any URI in its strings redacted (meta, tracking state)."""
    if isinstance(value, str):
        return redact_uri(value)
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def _run_problem(run: Any) -> str | None:
    """Why a parsed run.json is not a run record (None if it is one)."""
    if not isinstance(run, dict):
        return f"{_kind(run)}, not a run object"
    for key, kind in (("run_id", str), ("scenario", str), ("cells", list), ("meta", dict)):
        if not isinstance(run.get(key), kind):
            return f"no {key!r}"
    for entry in run["cells"]:
        if not (isinstance(entry, dict) and isinstance(entry.get("cell_id"), str)
                and isinstance(entry.get("cell"), dict)):
            return "a cell entry without cell_id and cell"
    return None


def _result_problem(result: Any, cell_id: str) -> str | None:
    """Why a parsed cell file is not the result of cell `cell_id` (None if it is)."""
    if not isinstance(result, dict):
        return f"{_kind(result)}, not a result object"
    if result.get("cell_id") != cell_id:
        return f"it holds cell {str(result.get('cell_id'))[:80]!r}, not {cell_id}"
    if not isinstance(result.get("status"), str) or not isinstance(result.get("cell"), dict):
        return "no 'status' or 'cell'"
    if not isinstance(result.get("metrics", {}), dict):
        return "its metrics are not an object"
    return None


def _tracking_problem(state: Any) -> str | None:
    """Why a parsed tracking.json is not upload state (None if it is)."""
    if not isinstance(state, dict):
        return f"{_kind(state)}, not an object"
    if not isinstance(state.get("logged", {}), dict):
        return "'logged' is not an object"
    for key in ("parent_run_id", "tracking_uri"):
        if not isinstance(state.get(key), (str, type(None))):
            return f"{key!r} is not a string"
    return None


class RunJournal:
    """One run's folder. Build with `RunJournal.create(...)` or `RunJournal.open(...)`.

    `warn` receives the one-line warning for each damaged file set aside (default: stderr).
    """

    def __init__(self, path: Path, run: dict, warn: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.run = run  # the parsed run.json
        self.warn = warn or warn_stderr

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
        warn: Callable[[str], None] | None = None,
    ) -> "RunJournal":
        """Start a new run folder. `cells` are the expanded matrix (params dicts).

        The folder is built under a hidden temporary name beside it and renamed into place
        once complete: a full disk or a crash on the way leaves no half-made run behind
        (JournalFull / JournalError naming what could not be written).
        """
        root = Path(root if root is not None else DEFAULT_ROOT)
        path = root / cls.check_name("run id", run_id)
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
            "meta": _scrubbed(dict(meta or {})),
        }
        ids = [c["cell_id"] for c in run["cells"]]
        if len(set(ids)) != len(ids):
            # Two matrix points with one id would overwrite each other's result file.
            raise JournalError("the scenario expands to duplicate cells (same parameters twice)")
        building = root / f".{run_id}.creating-{secrets.token_hex(4)}"
        try:
            with _writing(path):
                root.mkdir(parents=True, exist_ok=True)
                building.mkdir()
                (building / CELLS_DIR).mkdir()
                atomic_write_text(building / SCENARIO_FILE, scenario_text)
                atomic_write_json(building / RUN_FILE, run)
                os.rename(building, path)
        except OSError as e:
            # Not the disk's refusal (that is JournalFull): permissions, a folder of that name
            # already there, ...; one line all the same.
            raise JournalError(f"cannot create the run folder {path}: {e.strerror or e}") from None
        finally:
            shutil.rmtree(building, ignore_errors=True)   # already gone once renamed
        return cls(path, run, warn)

    @classmethod
    def open(cls, root: str | os.PathLike | None, run_id: str,
             warn: Callable[[str], None] | None = None) -> "RunJournal":
        """Open an existing run folder; JournalError naming the path if there is none, or if
        its run.json is damaged (the run's cells and scenario are unknown without it)."""
        root = Path(root if root is not None else DEFAULT_ROOT)
        path = root / cls.check_name("run id", run_id)
        if not (path / RUN_FILE).is_file():
            known = sorted(p.name for p in root.glob("*") if (p / RUN_FILE).is_file())[-3:]
            hint = f" (latest: {', '.join(known)})" if known else ""
            raise JournalError(f"no run {run_id!r} in {root}{hint}")
        run, problem = _load(path / RUN_FILE)
        problem = problem or _run_problem(run)
        if problem:
            raise JournalError(f"{path / RUN_FILE}: damaged ({problem}): run {run_id} cannot "
                               f"be resumed or reported")
        return cls(path, run, warn)

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
        """Store one worker result verbatim (atomically); returns its path. JournalFull when
        the disk refuses it."""
        cid = result.get("cell_id")
        if not cid:
            raise ValueError("a cell result needs a cell_id")
        path = self.cell_path(self.check_name("cell id", cid))
        with _writing(path):
            atomic_write_json(path, result)
        return path

    def results(self) -> dict[str, dict]:
        """Every stored result by cell id, in the run's cell order (then any extras). A
        damaged cell file is set aside (see the module docstring): its cell has no result."""
        found = {}
        for p in sorted(self.cells_dir.glob("*.json")):
            result, problem = _load(p)
            problem = problem or _result_problem(result, p.stem)
            if problem:
                self._set_aside(p, problem, "the cell counts as not run (harness run "
                                            "--resume runs it again)")
                continue
            found[p.stem] = result
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
        self.run["meta"].update(_scrubbed(kw))
        with _writing(self.path / RUN_FILE):
            atomic_write_json(self.path / RUN_FILE, self.run)

    def tracking_state(self) -> dict:
        """`{"parent_run_id", "tracking_uri", "logged": {cell_id: mlflow_run_id}}`; a damaged
        tracking.json is set aside and the state starts empty (tracking.py then finds what is
        already in MLflow by its tags, so nothing is logged twice)."""
        p = self.path / TRACKING_FILE
        state = {}
        if p.is_file():
            state, problem = _load(p)
            problem = problem or _tracking_problem(state)
            if problem:
                self._set_aside(p, problem, "the MLflow upload starts over (runs already in "
                                            "MLflow are found by their tags, not logged twice)")
                state = {}
        state.setdefault("parent_run_id", None)
        state.setdefault("tracking_uri", None)
        state.setdefault("logged", {})
        return state

    def save_tracking_state(self, state: dict) -> None:
        with _writing(self.path / TRACKING_FILE):
            atomic_write_json(self.path / TRACKING_FILE, _scrubbed(state))

    # -- damaged files -----------------------------------------------------------------------

    def _set_aside(self, path: Path, problem: str, consequence: str) -> None:
        """Rename a damaged file to `<name>.damaged-<n>` (kept for a post-mortem, out of every
        glob the journal reads) and say so in one line."""
        n = 1
        while (aside := path.with_name(f"{path.name}{DAMAGED_SUFFIX}{n}")).exists():
            n += 1
        try:
            os.rename(path, aside)
            where = f"set aside as {aside.name}"
        except FileNotFoundError:
            return            # another process set it aside (and said so) a moment ago
        except OSError as e:  # a read-only or full disk: the file stays, skipped all the same
            where = f"left in place (cannot rename it: {e.strerror or e})"
        self.warn(f"{path}: damaged ({problem}); {where}; {consequence}")
