"""Hosts: where cells run. An executor takes one cell and returns its result dict.

Every executor speaks the worker protocol (one cell JSON on stdin, progress on stderr, one
result JSON on stdout). `LocalHost` runs the worker as a subprocess of this machine;
`harness.ssh.SSHHost` (remote GPU hosts) and, later, a Slurm executor implement the same `Host`
interface. Hosts raise HostUnavailable / HostBroken for failures of the host itself (the runner
retries those elsewhere); everything that goes wrong with a cell is a result.

Whatever goes wrong with the process itself (a crash, a timeout, garbage on stdout) becomes a
failed result carrying the stderr tail, so one broken cell never stops a sweep.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Protocol

from harness import params

PROGRESS_PREFIX = "@@progress "
STDERR_TAIL_LINES = 40

ProgressFn = Callable[[dict], None]


class HostUnavailable(Exception):
    """The host could not run the cell for reasons of its own, not the cell's: unreachable,
    connection dropped mid-cell, GPU held by someone else for too long. The runner retries the
    cell (bounded, with backoff) on this or another eligible host. The message is one line."""


class HostBroken(HostUnavailable):
    """The host cannot run anything until a person fixes it: its host key is unknown or
    changed, login is refused, its Python is missing. The runner stops using it for the rest of
    the sweep and says why in one line."""


class Host(Protocol):
    name: str
    slots: int          # cells this host runs at once (one per GPU)
    labels: dict

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict: ...

    # Optional (the runner uses them when present):
    #   async prepare() -> None    connect / ship code; raises HostUnavailable or HostBroken
    #   async close() -> None      release connections at the end of a sweep


def failed_result(cell: dict, host: str, error: str, wall_s: float | None = None) -> dict:
    """A result for a cell whose worker produced none."""
    cell = params.canonical(cell)
    return {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
            "status": "failed", "error": error, "metrics": {}, "samples": {}, "env": {},
            "host": host, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": wall_s}


class LocalHost:
    """Runs cells on this machine, one at a time per slot, as `python -m harness.worker`."""

    def __init__(self, name: str = "local", python: str = sys.executable, gpus: list[int] | None = None,
                 labels: dict | None = None, env: dict | None = None,
                 code_root: str | os.PathLike | None = None):
        self.name = name
        self.python = python
        self.gpus = gpus or []
        self.slots = max(1, len(self.gpus))
        self.labels = labels or {}
        self.env = env or {}
        # A source tree (a checkout or git worktree) whose `harness` the worker runs, instead
        # of the one this controller imports: the A/B gate runs a base and a head this way.
        self.code_root = None if code_root is None else os.path.abspath(code_root)

    def for_code_tree(self, code_root: str | os.PathLike) -> "LocalHost":
        """The same host, running the worker from the source tree at `code_root`."""
        return LocalHost(self.name, self.python, list(self.gpus), dict(self.labels),
                         dict(self.env), code_root)

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        env = dict(os.environ, **self.env, PYTHONUNBUFFERED="1")
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpus[slot])
        if self.code_root:
            # First on the path and the working directory: `python -m` puts the cwd first.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.code_root, env.get("PYTHONPATH")) if p)
        timeout = params.canonical(cell)["timeout_s"]
        t0 = time.perf_counter()
        # A new session makes the worker a process-group leader, so a timeout or Ctrl-C kills
        # it together with anything it started (compiler subprocesses, for instance).
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "harness.worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
            cwd=self.code_root, start_new_session=True)
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        try:
            stdout = await asyncio.wait_for(
                _communicate(proc, json.dumps(cell).encode(), tail, on_progress), timeout)
        except asyncio.TimeoutError:
            _kill_group(proc)
            await proc.wait()
            # The next cell may take this GPU slot at once: not while a killed member of this
            # group still holds a CUDA context (SIGKILL to a group returns before they are gone).
            await _group_gone(proc.pid)
            return failed_result(cell, self.name, f"timeout after {timeout} s\n" + "\n".join(tail),
                                 time.perf_counter() - t0)
        except BaseException:
            _kill_group(proc)  # cancelled (Ctrl-C): leave no orphan behind
            raise
        return parse_result(cell, self.name, proc.returncode, stdout, tail, time.perf_counter() - t0)


async def _communicate(proc, data: bytes, tail: deque, on_progress: ProgressFn) -> bytes:
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the worker died before reading its cell; its exit status tells the rest

    async def pump_stderr():
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(PROGRESS_PREFIX):
                try:
                    on_progress(json.loads(line[len(PROGRESS_PREFIX):]))
                except json.JSONDecodeError:
                    tail.append(line)
            else:
                tail.append(line)

    stdout, _ = await asyncio.gather(proc.stdout.read(), pump_stderr())
    await proc.wait()
    return stdout


def parse_result(cell: dict, host: str, returncode: int | None, stdout: bytes, tail, wall_s: float) -> dict:
    """The worker's result, or a failed result that says why there is none."""
    text = stdout.decode(errors="replace").strip()
    stderr_tail = "\n".join(tail)
    if text:
        try:
            result = json.loads(text.splitlines()[-1])
            result["host"] = host
            return result
        except (json.JSONDecodeError, IndexError):
            pass
    if returncode is not None and returncode < 0:
        why = f"worker killed by signal {signal.Signals(-returncode).name}"
    else:
        why = f"worker exited with code {returncode} and no result"
    return failed_result(cell, host, f"{why}\n{stderr_tail}", wall_s)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a member that is not a zombie (a zombie holds no
    resources; reparented ones wait for init to reap them, which may never come in a container)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():      # no /proc (macOS): a member exists, zombie or not
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue           # gone meanwhile
        if int(pgrp) == pgid and state not in ("Z", "X"):
            return True
    return False


async def _group_gone(pgid: int, limit_s: float = 10.0) -> None:
    """Wait (bounded) until every member of a killed process group has died."""
    deadline = time.monotonic() + limit_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def local_hosts() -> dict[str, Host]:
    """The inventory without a hosts file: just this machine."""
    return {"local": LocalHost()}
