"""Batch mode: run a file of cells with no controller at all, results in journal form.

    python -m harness.worker --cells cells.jsonl --out DIR

For a GPU host that has torch and nothing else, and that the controller cannot reach (no SSH, a
job queue, a lent machine): `harness run SCENARIO --export-cells cells.jsonl` writes the file
here, the batch runs on the host, DIR comes back, and `harness import DIR` makes it a normal
run (journal, MLflow, report, gate).

The cells file is JSON lines: a header `{"harness_batch": {...}}` (the scenario's name and text,
the commit, the trigger; written by --export-cells), then one cell object per line. DIR gets
`batch.json` (the header plus this host's environment and the batch's start and end) and
`cells/<cell_id>.json`, one worker result per cell, each written atomically as it finishes. A
batch run again on the same DIR skips the cells that already have a result, so a batch cut
short (a time limit, a lost machine) is finished by running it again. Every cell runs in this
process, one after the other, as a serving worker would: models stay built between cells.

Exit status: 0 every cell ok, 1 some failed (their results say why), 2 a bad cells file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from harness.protocol.files import atomic_write_json

BATCH_FILE = "batch.json"
CELLS_DIR = "cells"
HEADER_KEY = "harness_batch"


class BadBatch(Exception):
    """The cells file cannot be run; the message is one line naming the file and line."""


def read_cells(path: Path) -> tuple[dict, list[dict]]:
    """(header, cells) of a cells file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadBatch(f"{path}: cannot be read ({exc})") from None
    header, cells = {}, []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadBatch(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise BadBatch(f"{path}:{number}: a cell is a JSON object, got {type(item).__name__}")
        if HEADER_KEY in item:
            if number != 1 or not isinstance(item[HEADER_KEY], dict):
                raise BadBatch(f"{path}:{number}: the header must be the first line, an object")
            header = item[HEADER_KEY]
        else:
            cells.append(item)
    if not cells:
        raise BadBatch(f"{path}: no cells in it")
    return header, cells


def _has_result(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()), dict)
    except (OSError, ValueError):
        return False             # absent, or damaged by a batch killed mid-write: run it again


def run_batch(cells_file: Path, out: Path) -> int:
    from harness.protocol import params
    from harness.worker.main import environment, progress, run_cell

    try:
        header, cells = read_cells(cells_file)
        canonical = [params.canonical(c) for c in cells]
    except BadBatch as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    except (TypeError, ValueError) as exc:      # a cell canonical() cannot read
        print(f"worker: {cells_file}: {exc}", file=sys.stderr)
        return 2
    (out / CELLS_DIR).mkdir(parents=True, exist_ok=True)
    batch = {**header, "cells_file": str(cells_file), "cell_ids": [params.cell_id(c) for c in canonical],
             "env": environment(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "finished_at": None}
    atomic_write_json(out / BATCH_FILE, batch)
    failed = 0
    for i, cell in enumerate(canonical, start=1):
        path = out / CELLS_DIR / f"{params.cell_id(cell)}.json"
        if _has_result(path):
            progress(stage="batch", cell=i, cells=len(canonical), skipped=True)
            continue
        progress(stage="batch", cell=i, cells=len(canonical), label=params.cell_label(cell))
        result = run_cell(cell)
        failed += result["status"] != "ok"
        atomic_write_json(path, result)
        print(f"[{i}/{len(canonical)}] {result['label']}: {result['status']}", file=sys.stderr,
              flush=True)
    batch["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    atomic_write_json(out / BATCH_FILE, batch)
    return 1 if failed else 0
