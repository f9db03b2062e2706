"""Damaged or full state: cell files, tracking.json and run.json that are not what the journal
wrote, a disk that fills up (or is full, over quota, read-only) before or during a run, and
two sweeps creating one fresh sqlite MLflow store at once.

Real files, real `harness` processes, a real sqlite store; the full disk is a real tmpfs where
this machine lets us mount one (root), and an injected OSError from the journal's writer
everywhere else. The rule checked throughout: one line naming the file, a sensible exit code,
no traceback, no result lost, and `--resume` finishes the run.
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from cli_process import run_cli

from harness.protocol.params import canonical, cell_id, cell_label
from harness.sweep import journal as journal_mod
from harness.sweep import runner
from harness.sweep.journal import JournalError, JournalFull, RunJournal

# mlflow 3.17's sqlalchemy store uses a loader strategy SQLAlchemy 2.1 deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

HARNESS = [sys.executable, "-m", "harness.cli"]
# No-op cells: the whole harness around a cell (worker, journal, upload, report), no model.
NAP = """\
name: nap
defaults: {{workload: noop, sleep_s: {sleep}}}
matrix:
  seed: [{seeds}]
"""


def nap(tmp_path: Path, n: int, sleep: float = 0.01) -> Path:
    path = tmp_path / "nap.yaml"
    path.write_text(NAP.format(sleep=sleep, seeds=", ".join(str(i) for i in range(n))))
    return path


def harness(*args: str, cwd: Path, prelude: str | None = None, timeout: int = 240):
    """The real CLI in a child process (tests/cli_process.py); `prelude` is Python run before
    it (fault injection)."""
    env = dict(os.environ, COLUMNS="160")
    env.pop("MLFLOW_TRACKING_URI", None)
    return run_cli(args, cwd=cwd, env=env, timeout=timeout, prelude=prelude)


def run_id_from(stdout: str) -> str:
    for line in stdout.splitlines():
        if line.startswith("Run "):
            return line.split()[1].rstrip(":")
    raise AssertionError(f"no run id in output:\n{stdout}")


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def cell_files(run_dir: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((run_dir / "cells").glob("*.json"))}


def mlflow_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    return parents, [r for r in runs if "mlflow.parentRunId" in r.data.tags]


@pytest.fixture
def finished_run(fresh_store, tmp_path):
    """A real 5-cell run, journaled and logged to a sqlite store: (run dir, run id, uri)."""
    uri = fresh_store(tmp_path)
    out = harness("run", str(nap(tmp_path, 5)), "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    run_id = run_id_from(out.stdout)
    return tmp_path / "results" / "runs" / run_id, run_id, uri


# -- damaged files ---------------------------------------------------------------------------

DAMAGE = {           # what a cell file may hold after a bad copy, a crash of an editor, fsck
    "empty": ("", "an empty file"),
    "truncated": (None, "not valid JSON"),      # None: the first 20 bytes of the result
    "null": ("null", "null, not a result object"),
    "list": ("[1, 2]", "a list, not a result object"),
}


def damage(path: Path, kind: str, result: dict) -> None:
    text, _ = DAMAGE[kind]
    path.write_text(json.dumps(result, indent=2)[:20] if text is None else text)


def test_damaged_cell_files_are_set_aside_skipped_by_report_and_rerun_by_resume(finished_run):
    run_dir, run_id, uri = finished_run
    cwd = run_dir.parents[2]
    before = cell_files(run_dir)
    intact = sorted(before)[-1]
    victims = dict(zip(sorted(before)[:4], DAMAGE))           # cell id -> kind of damage

    for cid, kind in victims.items():
        damage(run_dir / "cells" / f"{cid}.json", kind, before[cid])
    out = harness("report", run_id, "--no-mlflow", cwd=cwd)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "Traceback" not in out.stderr
    warnings = lines(out.stderr)
    assert len(warnings) == len(victims), out.stderr
    for cid, kind in victims.items():
        (line,) = [w for w in warnings if f"cells/{cid}.json:" in w]
        assert line.startswith("warning: ") and DAMAGE[kind][1] in line
        assert f"set aside as {cid}.json.damaged-1" in line
        assert (run_dir / "cells" / f"{cid}.json.damaged-1").is_file()
    assert "4 of 5 cell(s) have no ok result" in out.stdout
    page = (run_dir / "report" / "index.html").read_text()
    assert page.count("no result") >= 4 and "4 missing" in page

    # Damaged again (the names are free now), then resumed: exactly those cells run again.
    for cid, kind in victims.items():
        damage(run_dir / "cells" / f"{cid}.json", kind, before[cid])
    again = harness("run", str(cwd / "nap.yaml"), "--resume", run_id, "--tracking-uri", uri,
                    cwd=cwd)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "Traceback" not in again.stderr
    assert sum("damaged" in w for w in lines(again.stderr)) == 4
    assert "4 of 5 cell(s) to run" in again.stdout
    after = cell_files(run_dir)
    assert set(after) == set(before)
    assert after[intact] == before[intact]                      # not run again
    for cid in victims:
        assert after[cid]["status"] == "ok"
        assert after[cid]["started_at"] != before[cid]["started_at"]   # a new execution
        assert (run_dir / "cells" / f"{cid}.json.damaged-2").is_file()  # both kept


def test_damaged_tracking_json_is_set_aside_and_the_upload_starts_over(finished_run):
    run_dir, run_id, uri = finished_run
    cwd = run_dir.parents[2]
    state = json.loads((run_dir / "tracking.json").read_text())
    (run_dir / "tracking.json").write_text((run_dir / "tracking.json").read_text()[:30])

    out = harness("run", str(cwd / "nap.yaml"), "--resume", run_id, "--tracking-uri", uri,
                  cwd=cwd)
    assert out.returncode == 0, out.stderr + out.stdout
    (warning,) = lines(out.stderr)
    assert f"{run_id}/tracking.json: damaged (not valid JSON" in warning
    assert "set aside as tracking.json.damaged-1" in warning
    # Found again in MLflow by its tags: nothing logged twice.
    assert "0 cell run(s) logged, 5 already there" in out.stdout
    parents, children = mlflow_runs(uri, "nap")
    assert len(parents) == 1 and len(children) == 5
    assert json.loads((run_dir / "tracking.json").read_text()) == state


@pytest.mark.parametrize("text", ["", "null", '{"run_id": "x"}', '{"run_id": '])
def test_damaged_run_json_is_one_line_and_exit_2(tmp_path, text):
    root = tmp_path / "results" / "runs"
    RunJournal.create(root, "20260101-000000-abcdef", "nap", None, "", [{"workload": "noop"}], {})
    (root / "20260101-000000-abcdef" / "run.json").write_text(text)
    nap(tmp_path, 1)
    for args in (["report", "20260101-000000-abcdef"],
                 ["run", "nap.yaml", "--resume", "20260101-000000-abcdef"]):
        out = harness(*args, cwd=tmp_path)
        assert out.returncode == 2, out.stderr + out.stdout
        (line,) = lines(out.stderr)
        assert "20260101-000000-abcdef/run.json: damaged (" in line, line


def test_journal_reads_around_every_kind_of_damage(tmp_path):
    warned: list[str] = []
    cells = [{"workload": "noop", "seed": i} for i in range(3)]
    j = RunJournal.create(tmp_path, "run", "nap", None, "", cells, {}, warn=warned.append)
    results = [{"cell": canonical(c), "cell_id": cell_id(c), "label": cell_label(c),
                "status": "ok", "metrics": {}} for c in cells]
    for r in results:
        j.write_cell(r)
    wrong = dict(results[1], cell_id=cell_id(cells[2]))     # another cell's result
    j.cell_path(cell_id(cells[1])).write_text(json.dumps(wrong))
    j.cell_path(cell_id(cells[2])).write_bytes(b"\xff\xfe{")
    assert list(j.results()) == [cell_id(cells[0])]
    assert j.missing() == cells[1:]
    assert len(warned) == 2                      # once per file: then it is out of the way
    (mixed_up,) = [w for w in warned if f"cells/{cell_id(cells[1])}.json" in w]
    assert f"it holds cell '{cell_id(cells[2])}', not {cell_id(cells[1])}" in mixed_up
    (binary,) = [w for w in warned if f"cells/{cell_id(cells[2])}.json" in w]
    assert "not UTF-8 text" in binary

    (j.path / "tracking.json").write_text('{"logged": ["not", "a", "mapping"]}')
    assert j.tracking_state() == {"parent_run_id": None, "tracking_uri": None, "logged": {}}
    assert "'logged' is not an object" in warned[2]
    assert (j.path / "tracking.json.damaged-1").is_file()


# -- a full disk: fault injection (runs anywhere) -------------------------------------------


class NapHost:
    """A stand-in host: each cell sleeps, then returns an ok result; it counts what it ran
    and what was cancelled mid-cell (which is how the runner kills a running cell)."""

    def __init__(self, slots: int = 2):
        self.name, self.slots, self.labels = "local", slots, {}
        self.started = self.cancelled = self.running = 0

    async def run_cell(self, cell, slot, on_progress):
        self.started += 1
        self.running += 1
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        c = canonical(cell)
        return {"cell": c, "cell_id": cell_id(c), "label": cell_label(c), "status": "ok",
                "error": None, "metrics": {}, "samples": {}, "env": {}, "host": self.name}


def refuse_after(monkeypatch, n_ok: int, code: int) -> list[Path]:
    """Make the journal's writer refuse cell files after `n_ok` of them, as the disk would;
    returns the paths refused."""
    real, written, refused = journal_mod.atomic_write_json, [], []

    def writer(path, data):
        if path.parent.name == "cells":
            if len(written) >= n_ok:
                refused.append(path)
                raise OSError(code, os.strerror(code))
            written.append(path)
        real(path, data)

    monkeypatch.setattr(journal_mod, "atomic_write_json", writer)
    return refused


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_refused_result_stops_the_sweep_keeps_what_was_written_and_resumes(
        tmp_path, monkeypatch, code):
    cells = [{"workload": "noop", "seed": i} for i in range(8)]
    j = RunJournal.create(tmp_path, "run", "nap", None, "", cells, {})
    refused = refuse_after(monkeypatch, 3, code)
    host = NapHost(slots=2)
    outcome = runner.run_cells(cells, [host], j, Console(file=io.StringIO(), width=200))

    assert refused, "no write was refused"
    assert outcome.journal_full == f"cannot write {refused[0]}: {os.strerror(code)}"
    assert not outcome.interrupted
    assert len(outcome.results) == 3 and len(j.results()) == 3   # what was written stays
    assert host.started < len(cells)                               # dispatch stopped
    assert host.running == 0                                      # nothing left running
    assert not list(j.cells_dir.glob(".*"))                       # no temp file left behind

    monkeypatch.undo()                                            # space again: resume
    again = runner.run_cells(j.missing(), [host], j, Console(file=io.StringIO(), width=200))
    assert again.journal_full is None and j.missing() == []


def test_a_run_folder_the_disk_refuses_is_not_left_half_made(tmp_path, monkeypatch):
    real = journal_mod.atomic_write_json

    def refuse_run_json(path, data):
        if path.name == "run.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(journal_mod, "atomic_write_json", refuse_run_json)
    with pytest.raises(JournalFull, match=r"cannot write .*/runs/r1: No space left on device"):
        RunJournal.create(tmp_path / "runs", "r1", "nap", None, "name: nap\n",
                          [{"workload": "noop"}], {})
    assert list((tmp_path / "runs").iterdir()) == []     # scenario.yaml was written: gone too
    with pytest.raises(JournalError, match="no run 'r1'"):
        RunJournal.open(tmp_path / "runs", "r1")


# `harness run` with the journal's writer refusing the third cell file.
REFUSE_THIRD_CELL = """
import errno, os
from harness.sweep import journal
real, seen = journal.atomic_write_json, []
def refusing(path, data):
    if path.parent.name == "cells":
        seen.append(path)
        if len(seen) == 3:
            raise OSError(errno.{code}, os.strerror(errno.{code}))
    real(path, data)
journal.atomic_write_json = refusing
"""


@pytest.mark.parametrize("code", ["ENOSPC"])   # EROFS and EDQUOT: the unit above
def test_cli_refused_result_is_one_line_exit_1_and_resume_finishes(tmp_path, code):
    sc = nap(tmp_path, 6)
    uri = f"sqlite:///{tmp_path}/mlflow.db"      # not made before the run has logged
    out = harness("run", str(sc), "--tracking-uri", uri, cwd=tmp_path,
                  prelude=REFUSE_THIRD_CELL.format(code=code))
    assert out.returncode == 1, out.stderr + out.stdout
    assert "Traceback" not in out.stderr
    run_id = run_id_from(out.stdout)
    (line,) = lines(out.stderr)
    assert f"runs/{run_id}/cells/" in line and os.strerror(getattr(errno, code)) in line
    assert line.endswith(f"--resume {run_id} --tracking-uri {uri}")
    run_dir = tmp_path / "results" / "runs" / run_id
    assert len(cell_files(run_dir)) == 2
    assert "MLflow:" not in out.stdout and not (tmp_path / "mlflow.db").exists()

    again = harness("run", str(sc), "--resume", run_id, "--tracking-uri", uri, cwd=tmp_path)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "4 of 6 cell(s) to run" in again.stdout
    assert len(cell_files(run_dir)) == 6


# -- a full disk: a real tmpfs ---------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs at tmp_path/disk (needs root: skipped where it cannot be mounted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(made.stderr or made.stdout).strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses one more byte; removing it frees the space."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return filler


def test_disk_full_mid_run_stops_cleanly_and_resume_finishes(fresh_store, tmp_path, small_disk):
    sc = nap(tmp_path, 6, sleep=0.5)
    uri = fresh_store(tmp_path)          # not on the small disk
    results = small_disk / "results"
    cells_dir = None
    env = dict(os.environ, COLUMNS="160")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([*HARNESS, "run", str(sc), "--results", str(results),
                             "--tracking-uri", uri], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(results.glob("runs/*/cells/*.json"))
            if found:                             # the first result is in: now fill the disk
                cells_dir = found[0].parent
                filler = fill(small_disk)
                break
            time.sleep(0.01)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert cells_dir is not None, stdout + stderr

    assert proc.returncode == 1, stdout + stderr
    assert "Traceback" not in stderr
    run_id = cells_dir.parent.name
    (line,) = lines(stderr)
    assert f"cannot write {cells_dir}/" in line and "No space left on device" in line, line
    assert line.endswith(f"--resume {run_id} --tracking-uri {uri}")
    written = cell_files(cells_dir.parent)
    assert 1 <= len(written) < 6
    assert all(r["status"] == "ok" for r in written.values())
    assert not list(cells_dir.glob(".*"))        # no temp file left behind

    filler.unlink()
    again = harness("run", str(sc), "--results", str(results), "--resume", run_id,
                    "--tracking-uri", uri, cwd=tmp_path)
    assert again.returncode == 0, again.stderr + again.stdout
    assert f"{6 - len(written)} of 6 cell(s) to run" in again.stdout
    final = cell_files(cells_dir.parent)
    assert len(final) == 6 and all(final[cid] == r for cid, r in written.items())


def test_disk_full_at_start_leaves_no_run_folder(tmp_path, small_disk):
    sc = nap(tmp_path, 2)
    results = small_disk / "results"
    (results / "runs").mkdir(parents=True)
    fill(small_disk)
    out = harness("run", str(sc), "--results", str(results), cwd=tmp_path)
    assert out.returncode == 2, out.stderr + out.stdout
    assert "Traceback" not in out.stderr
    (line,) = lines(out.stderr)
    assert f"cannot write {results}/runs/" in line and "No space left on device" in line, line
    assert list((results / "runs").iterdir()) == []


# -- two sweeps creating one sqlite store -----------------------------------------------------

UPLOAD = """
import sys, time
from pathlib import Path
import mlflow  # noqa: F401 - the slow import before the start line, so the uploads meet
from harness.sweep.journal import RunJournal
from harness.sweep.tracking import log_run
root, run_id, uri, ready, go = sys.argv[1:]
journal = RunJournal.open(root, run_id)
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.002)
print(log_run(journal, uri))
"""


def test_two_processes_creating_one_fresh_sqlite_store_are_both_logged(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    root = tmp_path / "runs"
    run_ids = [f"20260101-00000{i}-abcdef" for i in range(3)]
    for run_id in run_ids:
        cells = [{"workload": "noop", "seed": i} for i in range(2)]
        j = RunJournal.create(root, run_id, "together", None, "", cells, {})
        for c in cells:
            j.write_cell({"cell": canonical(c), "cell_id": cell_id(c), "label": cell_label(c),
                          "status": "ok", "metrics": {"slept_s": 0.0}, "env": {}})
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", UPLOAD, str(root), run_id, uri,
                               str(tmp_path / f"ready-{run_id}"), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for run_id in run_ids]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready-{r}").exists() for r in run_ids):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()                                   # all three create the store at once
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0 and "2 cell run(s) logged" in stdout, stdout + stderr

    parents, children = mlflow_runs(uri, "together")
    assert sorted(p.data.tags["harness.run_id"] for p in parents) == run_ids
    assert len(children) == 6
