"""The local host: cells run as worker processes of this machine (the `Host` interface of
harness/hosts/interface.py; harness/hosts/ssh.py is the remote kind).

Every worker speaks the worker protocol (harness/worker/main.py: one cell JSON on stdin, progress
on stderr, one result JSON on stdout). Whatever goes wrong with the process itself (a crash, a timeout, garbage on stdout) becomes a
failed result carrying the stderr tail, so one broken cell never stops a sweep.

`LocalHost(persistent=True)` (what `harness run` uses) keeps one serving worker per slot
(`python -m harness.worker --serve`, started on the slot's first cell) instead of a process per
cell, which saves the interpreter start and the torch import on every cell and lets workloads
keep their models loaded. A cell's failure stays its own all the same: a cell whose worker dies,
hangs past its timeout or answers out of turn (another seq or cell id, not a JSON object, a line
over REPLY_LIMIT) fails with its own stderr tail and the process is killed; so is the process of
a cell that failed inside the workload (a CUDA error may have poisoned it). The slot's next cell
starts a fresh one. A source tree whose worker cannot serve (an older commit: no
SERVE_PROTOCOL in its tree) runs a process per cell, silently.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

from harness.hosts.interface import (
    REPLY_LIMIT,
    STDERR_TAIL_LINES,
    Host,
    ProgressFn,
    failed_result,
    no_result_why,
    parse_result,
    read_tail,
    route_line,
)
from harness.protocol import params
from harness.protocol.wire import CELL_PREFIX, CONTROLLER_PID_ENV, PROGRESS_PREFIX, SERVE_PROTOCOL

CLOSE_WAIT_S = 5.0      # close(): how long an idle serving worker gets to exit on EOF

class LocalHost:
    """Runs cells on this machine, one at a time per slot, as `python -m harness.worker`: a
    process per cell, or with `persistent` one serving process per slot for as long as its
    cells go well (see the module docstring)."""

    def __init__(self, name: str = "local", python: str = sys.executable, gpus: list[int] | None = None,
                 labels: dict | None = None, env: dict | None = None,
                 code_root: str | os.PathLike | None = None, persistent: bool = False):
        self.name = name
        self.python = python
        self.gpus = gpus or []
        self.slots = max(1, len(self.gpus))
        self.labels = labels or {}
        self.env = env or {}
        # A source tree (a checkout or git worktree) whose `harness` the worker runs, instead
        # of the one this controller imports: the A/B gate runs a base and a head this way.
        self.code_root = None if code_root is None else os.path.abspath(code_root)
        self.persistent = persistent
        self._serves: bool | None = None           # the worker's tree can serve (once known)
        self._strict_ids = True                    # that tree computes cell ids as we do
        self._workers: dict[int, _ServingWorker] = {}
        self._killed: list[_ServingWorker] = []    # killed on cancellation, not reaped yet
        self._loop_guard = None                    # closes the workers when their loop ends

    def for_code_tree(self, code_root: str | os.PathLike) -> "LocalHost":
        """The same host, running the worker from the source tree at `code_root`."""
        return LocalHost(self.name, self.python, list(self.gpus), dict(self.labels),
                         dict(self.env), code_root, self.persistent)

    def with_persistent(self, persistent: bool) -> "LocalHost":
        """The same host with (or without) long-lived serving workers."""
        return LocalHost(self.name, self.python, list(self.gpus), dict(self.labels),
                         dict(self.env), self.code_root, persistent)

    def _env(self, slot: int) -> dict:
        """The worker's environment, for either kind of worker."""
        env = dict(os.environ, **self.env, PYTHONUNBUFFERED="1")
        # Its sibling workers (an A/B's other side on the same GPU) are not foreign load.
        env[CONTROLLER_PID_ENV] = str(os.getpid())
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpus[slot])
        if self.code_root:
            # First on the path and the working directory: `python -m` puts the cwd first.
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (self.code_root, env.get("PYTHONPATH")) if p)
        return env

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        if self.persistent and await self._tree_serves():
            return await self._run_served(cell, slot, on_progress)
        return await self._run_fresh(cell, slot, on_progress)

    async def _tree_serves(self) -> bool:
        """Whether the worker's source tree can serve; looked up once (a tree does not change
        under a sweep), with whether it computes cell ids as this controller does (the same
        harness/protocol/params.py: a base commit of the A/B gate may fold other defaults into its ids,
        and its replies are then matched on seq and on the cell's parameters alone)."""
        if self._serves is None:
            tree = Path(self.code_root) if self.code_root else await self._worker_tree()
            self._serves = tree is not None and serves(tree)
            self._strict_ids = tree is not None and _id_sources(tree) == _id_sources(
                Path(params.__file__).parents[2])
        return self._serves

    async def _worker_tree(self) -> Path | None:
        """The source tree of the harness/worker/main.py that `python -m harness.worker` runs when no
        code_root is set: not necessarily this controller's, since `-m` looks in the working
        directory first (a checkout of another commit, say). Asks the interpreter where it
        finds the module, without importing it; None (a process per cell) if it cannot say."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python, "-c", _FIND_WORKER, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                env=self._env(0))
        except OSError:
            return None    # the cell itself will say that this python does not run
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        except asyncio.TimeoutError:
            await _kill_and_reap(proc)
            return None
        origin = Path(out.decode(errors="replace").strip())
        if origin.name == "__init__.py":       # this layout: the package harness/worker/
            origin = origin.parent
        if proc.returncode != 0 or origin.name not in ("worker", "worker.py"):
            return None
        return origin.parent.parent

    async def _run_fresh(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        """The cell in a process of its own."""
        timeout = params.canonical(cell)["timeout_s"]
        t0 = time.perf_counter()
        # A new session makes the worker a process-group leader, so a timeout or Ctrl-C kills
        # it together with anything it started (compiler subprocesses, for instance).
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "harness.worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self._env(slot),
            cwd=self.code_root, start_new_session=True)
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        try:
            stdout = await asyncio.wait_for(
                _communicate(proc, json.dumps(cell).encode(), tail, on_progress), timeout)
        except asyncio.TimeoutError:
            await _kill_and_reap(proc)
            return failed_result(cell, self.name, f"timeout after {timeout} s\n" + "\n".join(tail),
                                 time.perf_counter() - t0)
        except BaseException:
            _kill_group(proc)  # cancelled (Ctrl-C): leave no orphan behind
            raise
        return parse_result(cell, self.name, proc.returncode, stdout, tail, time.perf_counter() - t0)

    async def _run_served(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        """The cell in the slot's serving worker (started if it has none)."""
        timeout = params.canonical(cell)["timeout_s"]
        t0 = time.perf_counter()
        worker = await self._worker(slot)
        seq = worker.begin(on_progress)
        request = json.dumps({"seq": seq, "cell": cell}).encode() + b"\n"
        try:
            line, too_long = await asyncio.wait_for(worker.exchange(request), timeout)
        except asyncio.TimeoutError:
            await self._retire(slot, worker)
            return failed_result(cell, self.name, f"timeout after {timeout} s\n" + worker.tail_text(),
                                 time.perf_counter() - t0)
        except BaseException:
            # Cancelled (Ctrl-C): kill now, like a process per cell; close() reaps it.
            self._workers.pop(slot, None)
            _kill_group(worker.proc)
            self._killed.append(worker)
            raise
        if not line and not too_long:           # EOF: the worker died (crash, signal, OOM killer)
            code = await self._retire(slot, worker, exiting=True)
            return failed_result(cell, self.name, f"{no_result_why(code)}\n{worker.tail_text()}",
                                 time.perf_counter() - t0)
        try:
            if too_long:
                raise BadReply(f"a reply line longer than {REPLY_LIMIT} bytes")
            result = check_reply(line, seq, cell, self._strict_ids)
        except BadReply as why:
            # The stream is out of step (or the worker is confused): nothing it says later can
            # be matched to a cell with confidence.
            await self._retire(slot, worker)
            return failed_result(cell, self.name, f"worker sent a bad reply: {why}\n"
                                 f"{worker.tail_text()}", time.perf_counter() - t0)
        result.pop("seq", None)
        result["host"] = self.name
        if result.get("status") != "ok":
            # The workload raised: an out-of-memory or an illegal memory access may have left
            # the process (its CUDA context, its caches) unfit for the next cell.
            await self._retire(slot, worker)
        return result

    async def _worker(self, slot: int) -> "_ServingWorker":
        loop = asyncio.get_running_loop()
        worker = self._workers.get(slot)
        if worker is not None and worker.loop is not loop:
            # Started under an event loop that has ended (asyncio.run returned without close()):
            # its pipes cannot be awaited from this one. Kill it and start afresh.
            _kill_group(worker.proc)
            worker = None
        if worker is None:
            await self._close_when_loop_ends(loop)
            proc = await asyncio.create_subprocess_exec(
                self.python, "-m", "harness.worker", "--serve", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=self._env(slot), cwd=self.code_root, start_new_session=True,
                limit=REPLY_LIMIT)
            worker = self._workers[slot] = _ServingWorker(proc, loop)
        return worker

    async def _close_when_loop_ends(self, loop) -> None:
        """Make sure close() runs in `loop` before it ends, for callers that never call it (a
        measurement in its own asyncio.run): asyncio.run finalizes the loop's async generators
        on its way out, so a suspended one whose `finally` awaits close() does just that.
        Without it the workers would outlive the loop, holding their GPU memory, until this
        process exits."""
        if self._loop_guard is not None and self._loop_guard[0] is loop:
            return
        async def guard():
            try:
                yield
            finally:
                await self.close()
        agen = guard()
        await agen.__anext__()                   # started here: now `loop` will finalize it
        self._loop_guard = (loop, agen)          # and kept, or collecting it would close early

    async def _retire(self, slot: int, worker: "_ServingWorker", exiting: bool = False) -> int | None:
        """End the slot's worker for good: the next cell starts a fresh one. Returns its exit
        status. `exiting`: it closed its stdout, so it is probably on its way out; give it a
        moment to exit by itself, so its own exit status (not our kill) says what happened."""
        if self._workers.get(slot) is worker:
            del self._workers[slot]
        if exiting:
            try:
                await asyncio.wait_for(asyncio.shield(worker.proc.wait()), 2.0)
            except asyncio.TimeoutError:
                pass
        return await worker.end()

    async def close(self) -> None:
        """End every serving worker: each gets EOF and CLOSE_WAIT_S to exit, then its group is
        killed. Call it in the event loop that ran the cells (the runner does, at the end of a
        sweep); a later run_cell starts fresh workers."""
        workers, self._workers = list(self._workers.values()), {}
        killed, self._killed = self._killed, []
        loop = asyncio.get_running_loop()
        ours = [w for w in workers + killed if w.loop is loop]
        for w in workers + killed:
            if w.loop is not loop:
                _kill_group(w.proc)          # from a loop that has ended: all we can do
        await asyncio.gather(*(w.end(gently=w in workers) for w in ours))


class _ServingWorker:
    """One `python -m harness.worker --serve` process of a slot, and the reader of its stderr."""

    def __init__(self, proc, loop):
        self.proc = proc
        self.loop = loop                   # its pipes belong to this event loop
        self.seq = 0                       # of the cell now running (or last run)
        self.marked = None                 # seq of the worker's last `@@cell` line
        self.on_progress: ProgressFn = _ignore
        self.tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.stderr_done = asyncio.ensure_future(_read_lines(proc.stderr, self._on_stderr))

    def begin(self, on_progress: ProgressFn) -> int:
        """A new cell: its seq, its progress callback, an empty stderr tail."""
        self.seq += 1
        self.on_progress = on_progress
        self.tail.clear()
        return self.seq

    def _on_stderr(self, line: str) -> None:
        if line.startswith(CELL_PREFIX):
            try:
                self.marked = json.loads(line[len(CELL_PREFIX):]).get("seq")
            except (json.JSONDecodeError, AttributeError):
                self.tail.append(line)
                return
            self.tail.clear()             # what came before belongs to the previous cell
            return
        if line.startswith(PROGRESS_PREFIX) and self.marked != self.seq:
            return                        # the previous cell's, read late: not this cell's progress
        try:
            route_line(line, self.tail, self.on_progress)
        except Exception as exc:          # noqa: BLE001 - this reader must keep draining stderr,
            # or the worker blocks on a full pipe; the display missing one update is harmless
            self.tail.append(f"[progress display failed: {type(exc).__name__}: {exc}]")

    def tail_text(self) -> str:
        return "\n".join(self.tail)

    async def exchange(self, request: bytes) -> tuple[bytes, bool]:
        """Send a request line; (the reply line, b"" at EOF; whether it was over the limit)."""
        try:
            self.proc.stdin.write(request)
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass       # it died; its stdout ends too, and its exit status says why
        try:
            return await self.proc.stdout.readline(), False
        except ValueError:                 # asyncio's "chunk exceeds the limit"
            return b"", True

    async def end(self, gently: bool = False) -> int | None:
        """Stop the process (`gently`: EOF first, then CLOSE_WAIT_S), kill its whole group,
        wait until every member is gone and the stderr reader has read the last lines."""
        if gently and self.proc.returncode is None:
            try:
                self.proc.stdin.close()
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), CLOSE_WAIT_S)
            except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
                pass
        await _kill_and_reap(self.proc)
        if not self.stderr_done.done():   # the last lines of a crash are the ones worth reading
            try:
                await asyncio.wait_for(asyncio.shield(self.stderr_done), 2.0)
            except asyncio.TimeoutError:  # a member that left the group keeps stderr open
                self.stderr_done.cancel()
            except Exception:             # noqa: BLE001 - the reader broke; the tail keeps
                pass                      # what it had read, which is all there is to say
        elif not self.stderr_done.cancelled():   # cancelled: asyncio.run's own cleanup did it
            self.stderr_done.exception()         # retrieved, so asyncio does not log it
        return self.proc.returncode


class BadReply(Exception):
    """A serving worker's reply that cannot be this cell's result; str() says why."""


def check_reply(line: bytes, seq: int, cell: dict, check_id: bool = True) -> dict:
    """The result in a serving worker's reply `line` to request `seq` for `cell`, or BadReply.

    The reply must be a JSON object with the request's seq and, when `check_id`, the cell id
    this controller computes for `cell`; whatever the ids, each parameter the request set must
    come back unchanged in the result's cell."""
    try:
        reply = json.loads(line)
    except ValueError as exc:             # not JSON, or not UTF-8
        raise BadReply(f"not JSON ({exc}): {_clip(line)}") from None
    if not isinstance(reply, dict):
        raise BadReply(f"not a JSON object: {_clip(line)}")
    if reply.get("seq") != seq:
        raise BadReply(f"seq {reply.get('seq')!r} in the reply to request {seq}")
    if check_id and reply.get("cell_id") != params.cell_id(cell):
        raise BadReply(f"cell id {reply.get('cell_id')!r} in the reply for cell "
                       f"{params.cell_id(cell)}")
    echoed = reply.get("cell")
    if not isinstance(echoed, dict) or any(echoed.get(k, _MISSING) != v for k, v in cell.items()):
        raise BadReply("the reply's cell is not the cell sent")
    return reply


_MISSING = object()


def _clip(line: bytes, n: int = 200) -> str:
    text = line.decode(errors="replace").strip()
    return text if len(text) <= n else text[:n] + "..."


def _ignore(_progress: dict) -> None:
    pass


# `-c` puts the working directory first on sys.path, as `-m` does. find_spec of a submodule
# imports its package (harness/__init__.py) but not the module itself.
_FIND_WORKER = ("import importlib.util as u; s = u.find_spec('harness.worker'); "
                "print(s.origin if s and s.origin else '')")

_SERVE_PROTOCOL_LINE = re.compile(rb"^SERVE_PROTOCOL\s*=\s*(\d+)", re.MULTILINE)


# Where a source tree keeps its worker and its cell parameters: this layout, then the flat one
# of older commits (which the A/B gate still measures as a base).
WORKER_FILES = ("harness/worker/main.py", "harness/worker.py")
PARAMS_FILES = ("harness/protocol/params.py", "harness/params.py")
SERVE_PROTOCOL_FILES = ("harness/protocol/wire.py", "harness/worker.py")


def worker_file(tree: str | os.PathLike) -> Path | None:
    """The worker module of the source tree at `tree`, in either layout (None: it has none)."""
    return next((Path(tree) / f for f in WORKER_FILES if (Path(tree) / f).is_file()), None)


def _id_sources(tree: str | os.PathLike) -> list[bytes] | None:
    """The files that decide how the tree at `tree` computes cell ids (its params and, in this
    layout, its workload declarations), read; None where it has none. Two trees with the same
    sources compute the same ids, so their replies can be held to this controller's ids."""
    root = Path(tree)
    params_file = next((root / f for f in PARAMS_FILES if (root / f).is_file()), None)
    if params_file is None:
        return None
    files = [params_file, *sorted((root / "harness/protocol/workloads").glob("*.py"))]
    try:
        return [f.read_bytes() for f in files]
    except OSError:
        return None


def serves(code_root: str | os.PathLike | None) -> bool:
    """Whether the worker of the source tree at `code_root` (None: this package) speaks this
    controller's serve protocol. An older commit's worker has no SERVE_PROTOCOL.
    (LocalHost without a code_root asks its interpreter which tree that is: see _worker_tree.)"""
    if code_root is None:
        return True
    found = next((Path(code_root) / f for f in SERVE_PROTOCOL_FILES
                  if (Path(code_root) / f).is_file()), None)
    try:
        source = found.read_bytes() if found else b""
    except OSError:
        return False
    match = _SERVE_PROTOCOL_LINE.search(source)
    return match is not None and int(match.group(1)) == SERVE_PROTOCOL


async def _communicate(proc, data: bytes, tail: deque, on_progress: ProgressFn) -> bytes:
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the worker died before reading its cell; its exit status tells the rest

    stdout, _ = await asyncio.gather(
        read_tail(proc.stdout), _read_lines(proc.stderr, lambda line: route_line(line, tail, on_progress)))
    await proc.wait()
    return stdout


async def _read_lines(stream, handle: Callable[[str], None]) -> None:
    """Feed each line of a worker's stderr to `handle` until EOF."""
    while True:
        try:
            raw = await stream.readline()
        except ValueError:       # a line over the reader's limit: asyncio dropped it
            handle("[a stderr line too long to keep]")
            continue
        if not raw:
            return
        handle(raw.decode(errors="replace").rstrip("\n"))


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


async def _kill_and_reap(proc) -> None:
    """Kill a worker's process group and wait until the leader is reaped and every member is
    gone: the next cell may take this GPU slot at once, but not while a killed member still
    holds a CUDA context (SIGKILL to a group returns before they are gone)."""
    _kill_group(proc)
    await proc.wait()
    await _group_gone(proc.pid)


async def _group_gone(pgid: int, limit_s: float = 10.0) -> None:
    """Wait (bounded) until every member of a killed process group has died."""
    deadline = time.monotonic() + limit_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def local_hosts() -> dict[str, Host]:
    """The inventory without a hosts file: just this machine, with serving workers."""
    return {"local": LocalHost(persistent=True)}
