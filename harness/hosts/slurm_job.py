"""One batch of cells as one Slurm job array: its folder in the shared workdir, its job script
and the sbatch command line that submits it.

    <workdir>/jobs/<batch>/
        job.sh            what every array task runs (the worker on its own cell)
        sbatch.txt        the sbatch command, to resubmit by hand
        cells/<k>.jsonl   task k's cell, as a one-cell batch file (harness/worker/batch.py)
        out/<k>/          task k's --out folder: batch.json and cells/<cell_id>.json
        logs/<k>.log      task k's stdout and stderr (progress lines included)

Task k runs `python -m harness.worker --cells cells/<k>.jsonl --out out/<k>`, so its result
lands the way a batch's results do: one JSON file, written atomically, readable the moment it
exists. Before that the script checks what a cluster gets wrong most: the worker code (the
shipped bundle) must be visible on the node, and the node must have the host's Python; either
missing is an `@@infra` line in the log and exit 75, which the controller turns into one line
about the host, not a failed cell per task.

Everything the user wrote in hosts.yaml reaches sbatch as separate argv words (no shell in
between) and the job script only as shlex-quoted words.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

INFRA_PREFIX = "@@infra "
EX_TEMPFAIL = 75
# Slurm's own time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds.
TIME_LIMIT = re.compile(r"(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                        r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)")
UNLIMITED = ("UNLIMITED", "INFINITE")
# A task needs a little longer than its cell: bash, the step's set-up, and the controller's
# poll interval (it cancels a cell at timeout_s as seen on its clock, which lags the task's).
TIME_LIMIT_MARGIN_S = 60


def time_limit_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit (None: unlimited); ValueError if it is not one."""
    if text.upper() in UNLIMITED:
        return None
    match = TIME_LIMIT.fullmatch(text)
    if not match:
        raise ValueError(text)
    g = {k: int(v) if v is not None else 0 for k, v in match.groupdict().items()}
    if match.group("days") is not None:
        return ((g["days"] * 24 + g["dh"]) * 60 + g["dm"]) * 60 + g["ds"]
    if match.group("c") is not None:          # hours:minutes:seconds
        return (g["a"] * 60 + g["b"]) * 60 + g["c"]
    return g["a"] * 60 + g["b"]               # minutes[:seconds]


def time_limit_for(timeouts_s: list[float]) -> str:
    """The --time for a batch whose cells may run `timeouts_s`: whole minutes (Slurm's unit)
    past the longest. The controller cancels a cell at its timeout; this limit is what stops
    it when the controller is gone (killed, or its machine lost)."""
    return str(math.ceil((max(timeouts_s) + TIME_LIMIT_MARGIN_S) / 60))


@dataclass(frozen=True)
class JobOptions:
    """The sbatch options of a slurm host (hosts.yaml), as validated by the inventory."""

    partition: str | None = None
    account: str | None = None
    gres: str | None = None
    time_limit: str | None = None            # None: derived from the cells' timeout_s
    sbatch: tuple[str, ...] = ()             # extra options, one option (and value) each

    def argv(self, time_limit: str) -> list[str]:
        """The options as sbatch arguments (the harness's own structural ones not included)."""
        args = ["--no-requeue", f"--time={time_limit}"]
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.account:
            args.append(f"--account={self.account}")
        if self.gres:
            args.append(f"--gres={self.gres}")
        for line in self.sbatch:              # after ours: `--requeue` there wins
            args += shlex.split(line)
        return args


@dataclass(frozen=True)
class BatchFolder:
    """Where one batch's files are, as paths on the submit host (which the nodes share)."""

    root: str

    def path(self, *parts: str) -> str:
        return str(PurePosixPath(self.root, *parts))

    @property
    def script(self) -> str:
        return self.path("job.sh")

    def cells_file(self, task: int) -> str:
        return self.path("cells", f"{task}.jsonl")

    def result_dir(self, task: int) -> str:
        return self.path("out", str(task), "cells")

    def result_file(self, task: int, cell_id: str) -> str:
        return self.path("out", str(task), "cells", f"{cell_id}.json")

    def log(self, task: int) -> str:
        return self.path("logs", f"{task}.log")


def cells_file_text(cell: dict) -> str:
    """Task k's batch file: just its cell (no header: the controller keeps the run's facts)."""
    return json.dumps(cell) + "\n"


def job_script(folder: BatchFolder, bundle_dir: str, python: str, cache_dir: str) -> str:
    """What every array task runs: checks, then the worker on the task's own cell."""
    from harness.hosts.ssh import shell_path      # `~/venv/bin/python` stays the node's home

    return f"""#!/bin/bash
# specdec-harness: array task $SLURM_ARRAY_TASK_ID runs the worker on cells/<task>.jsonl and
# leaves its result in out/<task>/cells/ (harness/hosts/slurm_job.py).
bundle={shlex.quote(bundle_dir)}
folder={shlex.quote(folder.root)}
python={shell_path(python)}
task=${{SLURM_ARRAY_TASK_ID:?the harness submits its cells as a job array}}
if ! cd "$bundle" 2>/dev/null; then
    echo "{INFRA_PREFIX}the worker code ($bundle) is not on node ${{SLURMD_NODENAME:-$(hostname)}}: workdir must be a folder the nodes share with the submit host"
    exit {EX_TEMPFAIL}
fi
if ! command -v "$python" >/dev/null 2>&1; then
    echo "{INFRA_PREFIX}python '$python' not found on node ${{SLURMD_NODENAME:-$(hostname)}} (set python: for this host in hosts.yaml)"
    exit {EX_TEMPFAIL}
fi
export PYTHONPATH="$bundle" PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR={shlex.quote(cache_dir)}
# The worker writes into out/$task, made and entered here: once the controller has removed a
# cancelled batch's folder, a worker that was still starting fails to write instead of making
# the whole path again (a relative --out in a deleted folder cannot be created).
if ! cd "$folder/out" 2>/dev/null || ! mkdir -p "$task" || ! cd "$task"; then
    echo "{INFRA_PREFIX}the batch folder $folder is gone (a cancelled batch is removed by the controller)"
    exit {EX_TEMPFAIL}
fi
exec "$python" -m harness.worker --cells "$folder/cells/$task.jsonl" --out .
"""


def sbatch_argv(folder: BatchFolder, n_tasks: int, job_name: str, options: JobOptions,
                time_limit: str) -> list[str]:
    """The sbatch command that submits the batch as an array of `n_tasks` tasks."""
    return ["sbatch", "--parsable", f"--job-name={job_name}", *options.argv(time_limit),
            # `%` in a path would be one of sbatch's patterns: %% is a plain one
            f"--array=0-{n_tasks - 1}", f"--output={folder.path('logs').replace('%', '%%')}/%a.log",
            f"--chdir={folder.root}", folder.script]


def parse_job_id(stdout: str) -> str | None:
    """The job id `sbatch --parsable` printed (`123` or `123;cluster`), or None."""
    first = stdout.strip().splitlines()[-1:] or [""]
    job = first[0].split(";")[0].strip()
    return job if job.isdigit() else None
