"""SlurmHost: cells as the tasks of Slurm job arrays, behind the same Host interface as the
local and SSH hosts (harness/hosts/interface.py).

The runner gives the host up to `slots` (hosts.yaml `max_tasks`) cells at once, one per slot.
Cells that arrive within GATHER_S of each other go out as one job array, so a sweep's first
`max_tasks` cells are one `sbatch`; later cells go out as they come, in small arrays. Each
array task runs the worker's batch mode on its own cell in a folder of the shared workdir
(harness/hosts/slurm_job.py), and its result is a file there.

One poller per host follows every task in flight: it looks for result files every
FILE_POLL_S (a file system read: cheap), asks `squeue --states=all` every `poll_s` (a question
to slurmctld: rarer) and reads each running task's log for its progress lines. A result is
handed to the runner, and so journaled, the moment its file exists, whatever the other tasks
of its array do; a task is only ever cancelled by its own id (`scancel <job>_<task>`), so one
cell's failure never touches another's result. What a Slurm state means for a cell is
harness/hosts/slurm_states.py: a failed result (TIMEOUT, OUT_OF_MEMORY, ...), a lost attempt
the runner runs again (NODE_FAIL, PREEMPTED, ...), or a host Slurm refuses (HostBroken).

A cell's `timeout_s` runs while its task runs (not while it is queued) and the controller
cancels the task when it is up, as the other hosts kill their worker. The job's own `--time`
(hosts.yaml `time_limit`, else a little over the cells' longest timeout) is what stops a task
when the controller is gone. Ctrl-C cancels every cell of the host with one `scancel`, and
waits (bounded) until Slurm has them out of its queue.

Slurm's commands are used as they are, through `LocalSubmit` (harness/hosts/slurm_submit.py):
sbatch, squeue, scancel, scontrol, sinfo; sacct only for a task squeue no longer knows.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import secrets
import shlex
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from harness.hosts import bundle as bundlemod
from harness.hosts.interface import (
    REPLY_LIMIT,
    STDERR_TAIL_LINES,
    AttemptLost,
    HostBroken,
    HostUnavailable,
    ProgressFn,
    failed_result,
    no_result_why,
    route_line,
)
from harness.hosts.slurm_job import (
    INFRA_PREFIX,
    BatchFolder,
    JobOptions,
    cells_file_text,
    job_script,
    parse_job_id,
    sbatch_argv,
    time_limit_for,
)
from harness.hosts.slurm_states import (
    CELL_FAILED,
    LOST,
    RUNNING,
    WAITING,
    is_transient,
    never_starts,
    rule,
)
from harness.hosts.slurm_submit import LocalSubmit
from harness.protocol import params

GATHER_S = 0.2               # cells that arrive this close together go out as one array
FILE_POLL_S = 0.25           # how often the shared folder is looked at for results and logs
RESULT_GRACE_S = 10.0        # a task ended by itself: how long its result may take to be seen
                             # here (a shared file system's attribute cache lags)
CANCEL_WAIT_S = 20.0         # after scancel: how long to wait for Slurm to end the tasks
SILENT_LIMIT_S = 600.0       # squeue failing this long: the cells in flight are given back
LOG_CHUNK = 1 << 20          # log bytes read per task per look
OLD_BATCH_S = 7 * 86400      # batch folders left behind (a killed controller) go after a week
QUEUE_FORMAT = "--format=%i|%T|%N|%r"   # task id, state, node, reason (last: it has spaces)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def slurm_message(stderr: str) -> str:
    """The gist of a Slurm command's complaint: its last line, without the `sbatch: error:`."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if not lines:
        return "no message"
    return one_line(re.sub(r"^(?:\w+: )?(?:error|fatal|allocation failure): ", "", lines[-1]))


@dataclass
class _Task:
    """One cell's attempt on this host: the array task that runs it, and what was seen of it."""

    cell: dict
    on_progress: ProgressFn
    outcome: asyncio.Future
    timeout_s: float
    batch: "_Batch | None" = None
    index: int = -1                      # its task id in the array
    state: str | None = None             # as squeue said it last
    node: str = ""
    reason: str = ""
    ran_s: float = 0.0                   # time seen running, up to running_since
    running_since: float | None = None
    ended_at: float | None = None        # when it was first seen ended (or gone from the queue)
    infra: str | None = None             # an @@infra line of its job script
    tail: deque = field(default_factory=lambda: deque(maxlen=STDERR_TAIL_LINES))
    log_offset: int = 0
    log_partial: bytes = b""
    settling: bool = False               # its end is being looked up (scontrol, sacct)
    keep_folder: bool = False            # it failed: its batch folder stays, for its log

    @property
    def slurm_id(self) -> str:
        return f"{self.batch.job_id}_{self.index}"

    @property
    def resolved(self) -> bool:
        return self.outcome.done()

    def ran(self, now: float) -> float:
        return self.ran_s + (now - self.running_since if self.running_since is not None else 0)


@dataclass
class _Batch:
    folder: BatchFolder
    tasks: list[_Task]
    submitted: asyncio.Future            # set once sbatch has answered (job id or failure)
    job_id: str | None = None
    time_limit: str = ""                 # its --time


class _LoopState:
    """What the host holds for one event loop (each asyncio.run is a new one)."""

    def __init__(self, loop):
        self.loop = loop
        self.prepare_lock = asyncio.Lock()
        self.ready = False
        self.waiting: list[_Task] = []
        self.gathering: asyncio.Future | None = None
        self.batches: list[_Batch] = []
        self.poller: asyncio.Future | None = None
        self.to_cancel: set[str] = set()
        self.cancelling: asyncio.Future | None = None
        self.background: set[asyncio.Future] = set()
        self.silent_since: float | None = None
        self.last_queue_error = ""


class SlurmHost:
    """A Slurm cluster reached from this machine. See the module docstring."""

    def __init__(self, *, name: str, python: str, workdir: str, options: JobOptions,
                 max_tasks: int = 32, poll_s: float = 2.0, labels: dict | None = None,
                 env: dict | None = None, submit: LocalSubmit | None = None,
                 result_grace_s: float = RESULT_GRACE_S):
        self.name = name
        self.python = python
        self.workdir = workdir
        self.options = options
        self.slots = max_tasks
        self.poll_s = poll_s
        self.labels = labels or {}
        self.env = env or {}                 # resolved secrets included: never log this
        self.submit = submit or LocalSubmit()
        self.result_grace_s = result_grace_s
        self.job_name = f"harness-{name}"
        self.root: str | None = None         # the workdir, absolute, as the submit host has it
        self.bundle_dir: str | None = None
        self._st: _LoopState | None = None

    def __repr__(self) -> str:
        return f"SlurmHost({self.name!r}, partition={self.options.partition!r}, " \
               f"max_tasks={self.slots})"

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._st is None or self._st.loop is not loop:
            self._st = _LoopState(loop)
        return self._st

    # -- preparing -------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Check that Slurm takes the job as configured, and ship the worker code to the
        workdir (once per content hash). HostBroken for what a person must fix."""
        st = self._state()
        async with st.prepare_lock:
            if st.ready:
                return
            await self._check_commands()
            self.root = self.submit.expand(self.workdir)
            try:
                for sub in ("bundles", "jobs", "cache"):
                    self.submit.makedirs(f"{self.root}/{sub}")
                current = bundlemod.current_bundle()
                final = f"{self.root}/bundles/{current.hash}"
                self.submit.unpack(current.tarball, final)
            except OSError as exc:
                raise HostBroken(f"host {self.name}: cannot set up workdir {self.workdir!r} on "
                                 f"{self.submit.where}: {exc.strerror or exc}") from None
            self.bundle_dir = final
            refused = await self._test_submission()
            if refused:
                raise refused
            self.submit.remove_older_than(f"{self.root}/jobs", OLD_BATCH_S)
            st.ready = True

    async def _check_commands(self) -> None:
        problem = self._config_problem()
        if problem:
            raise HostBroken(problem)
        done = await self.submit.run(["sbatch", "--version"], timeout=60)
        if done.returncode == 127:
            raise HostBroken(f"host {self.name}: sbatch not found on {self.submit.where} "
                             f"(Slurm's commands must be on the PATH where the controller runs)")
        if done.returncode != 0:
            message = slurm_message(done.stderr)
            error = HostUnavailable if is_transient(message) else HostBroken
            raise error(f"host {self.name}: Slurm's commands do not work on "
                        f"{self.submit.where}: {message}")

    def _config_problem(self) -> str | None:
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.isfile(conf):
            # Slurm's commands would retry reading it for a minute, then fail.
            return f"host {self.name}: SLURM_CONF is {conf}, which does not exist"
        return None

    def _default_time_limit(self) -> str:
        return self.options.time_limit or time_limit_for([params.canonical({})["timeout_s"]])

    async def _test_submission(self) -> HostUnavailable | None:
        """`sbatch --test-only` with this host's options: Slurm's own verdict on the partition,
        account, gres, time limit and extra lines, before any cell is queued. The refusal
        (HostBroken, or HostUnavailable when Slurm does not answer), or None."""
        argv = ["sbatch", "--test-only", f"--job-name={self.job_name}",
                *self.options.argv(self._default_time_limit()), "--output=/dev/null",
                "--wrap=true"]
        done = await self.submit.run(argv, env=self._sbatch_env(), timeout=60)
        if done.returncode == 0:
            return None
        return self._refusal(done.stderr)

    def _refusal(self, stderr: str) -> HostUnavailable:
        message = slurm_message(stderr)
        if is_transient(message):
            return HostUnavailable(f"host {self.name}: Slurm does not take jobs right now: "
                                   f"{message}")
        return HostBroken(f"host {self.name}: Slurm refuses the job as hosts.yaml sets it up: "
                          f"{message}")

    def _sbatch_env(self) -> dict:
        """sbatch's environment, which the tasks inherit (Slurm's default --export=ALL): the
        host's `env` (secrets stay off every command line), without the SLURM_ variables of a
        job the controller itself may run in, which would leak into the new job's settings."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        env.update({str(k): str(v) for k, v in self.env.items()})
        return env

    # -- running a cell --------------------------------------------------------------------

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        await self.prepare()
        st = self._state()
        task = _Task(cell, on_progress, st.loop.create_future(),
                     float(params.canonical(cell)["timeout_s"]))
        st.waiting.append(task)
        if st.gathering is None:
            st.gathering = self._spawn(self._submit_after_gathering())
        try:
            return await asyncio.shield(task.outcome)
        except asyncio.CancelledError:
            if not task.outcome.done():           # Ctrl-C: the cell's task goes too
                await self._shielded(self._abandon(task))
            raise

    def _spawn(self, coro) -> asyncio.Future:
        """A background task of this host, awaited by close()."""
        st = self._state()
        fut = asyncio.ensure_future(coro)
        st.background.add(fut)
        fut.add_done_callback(st.background.discard)
        return fut

    async def _shielded(self, coro) -> None:
        """Run `coro` to the end even if the caller is cancelled again meanwhile."""
        await asyncio.shield(self._spawn(coro))

    async def _submit_after_gathering(self) -> None:
        st = self._state()
        await asyncio.sleep(GATHER_S)
        tasks, st.waiting, st.gathering = st.waiting, [], None
        tasks = [t for t in tasks if not t.resolved]      # abandoned while gathering
        if not tasks:
            return
        token = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        batch = _Batch(BatchFolder(f"{self.root}/jobs/{token}"), tasks, st.loop.create_future())
        for index, task in enumerate(tasks):
            task.batch, task.index = batch, index
        try:
            await self._submit(batch)
        except Exception as exc:   # noqa: BLE001 - a bug here must not leave cells waiting
            self._fail_batch(batch, HostUnavailable(f"host {self.name}: controller error "
                                                    f"submitting: {type(exc).__name__}: {exc}"))
        finally:
            if not batch.submitted.done():
                batch.submitted.set_result(None)

    async def _submit(self, batch: _Batch) -> None:
        st = self._state()
        folder = batch.folder
        batch.time_limit = self.options.time_limit or time_limit_for([t.timeout_s for t in batch.tasks])
        argv = sbatch_argv(folder, len(batch.tasks), self.job_name, self.options, batch.time_limit)
        try:
            for sub in ("cells", "out", "logs"):
                self.submit.makedirs(folder.path(sub))
            for task in batch.tasks:
                self.submit.write(folder.cells_file(task.index),
                                  cells_file_text(params.canonical(task.cell)).encode())
            self.submit.write(folder.script, job_script(folder, self.bundle_dir, self.python,
                                                        f"{self.root}/cache").encode(), 0o755)
            self.submit.write(folder.path("sbatch.txt"), (shlex.join(argv) + "\n").encode())
        except OSError as exc:
            self._fail_batch(batch, HostUnavailable(
                f"host {self.name}: cannot write the job to {folder.root}: {exc.strerror or exc}"))
            return
        done = await self.submit.run(argv, env=self._sbatch_env(), timeout=120)
        job = parse_job_id(done.stdout) if done.returncode == 0 else None
        if job is None:
            error = (self._refusal(done.stderr) if done.returncode != 0 else
                     HostUnavailable(f"host {self.name}: sbatch printed no job id: "
                                     f"{one_line(done.stdout)}"))
            self._fail_batch(batch, error)
            return
        batch.job_id = job
        batch.submitted.set_result(job)
        st.batches.append(batch)
        for task in batch.tasks:
            if not task.resolved:
                task.on_progress({"stage": f"queued as Slurm job {task.slurm_id}"})
        if st.poller is None or st.poller.done():
            st.poller = self._spawn(self._poll())

    def _fail_batch(self, batch: _Batch, error: HostUnavailable) -> None:
        for task in batch.tasks:
            self._resolve(task, error=error)
        self.submit.remove_tree(batch.folder.root)

    def _resolve(self, task: _Task, result: dict | None = None,
                 error: BaseException | None = None) -> None:
        if task.resolved:
            return
        if error is not None:
            task.outcome.set_exception(error)
            task.outcome.exception()              # retrieved: an abandoned one is not awaited
        else:
            task.keep_folder = result.get("status") != "ok"
            task.outcome.set_result(result)

    def _failed(self, task: _Task, why: str) -> dict:
        """A failed result for `task`, with its log's tail and where the whole log is."""
        self._follow_log(task, until_end=True)
        where = f"(Slurm job {task.slurm_id}" + (f" on {task.node}" if task.node else "") + \
                f"; its log: {task.batch.folder.log(task.index)})"
        tail = "\n".join(task.tail)
        result = failed_result(task.cell, self.name, f"{why} {where}" + (f"\n{tail}" if tail else ""),
                               round(task.ran(self._state().loop.time()), 3))
        result["slurm"] = {"job": task.slurm_id, "node": task.node or None}
        return result

    # -- following the tasks ---------------------------------------------------------------

    async def _poll(self) -> None:
        st = self._state()
        last_queue = -math.inf
        try:
            while st.batches:
                self._collect_results()
                now = st.loop.time()
                if now - last_queue >= self.poll_s:
                    await self._read_queue()
                    last_queue = st.loop.time()
                for task in self._in_flight():
                    self._follow_log(task)
                self._enforce_timeouts()
                self._settle_ended()
                self._retire_batches()
                if st.batches:
                    await asyncio.sleep(FILE_POLL_S)
        except Exception as exc:      # noqa: BLE001 - a bug here must not leave cells waiting
            error = HostUnavailable(f"host {self.name}: controller error following the Slurm "
                                    f"jobs: {type(exc).__name__}: {exc}")
            lost = self._in_flight()
            for task in lost:
                self._resolve(task, error=error)
            st.batches.clear()
            await self._cancel([t.slurm_id for t in lost])

    def _in_flight(self) -> list[_Task]:
        return [t for b in self._state().batches for t in b.tasks if not t.resolved]

    def _collect_results(self) -> None:
        for task in self._in_flight():
            path = task.batch.folder.result_file(task.index, params.cell_id(task.cell))
            self._take_result(task, path)

    def _take_result(self, task: _Task, path: str) -> bool:
        """Resolve `task` with the result file at `path` if it is there."""
        try:
            data = self.submit.read(path, REPLY_LIMIT)
        except OverflowError:
            self._resolve(task, self._failed(task, f"its result is larger than {REPLY_LIMIT} "
                                                   f"bytes"))
            return True
        except OSError as exc:
            self._resolve(task, self._failed(task, f"its result cannot be read: {exc}"))
            return True
        if data is None:
            return False
        try:
            result = json.loads(data)
        except ValueError as exc:
            result = self._failed(task, f"its result is not JSON ({exc})")
        if not isinstance(result, dict):
            result = self._failed(task, f"its result is not a result object: "
                                        f"{type(result).__name__}")
        result["host"] = self.name
        result["slurm"] = {"job": task.slurm_id, "node": task.node or None}
        self._resolve(task, result)
        return True

    async def _read_queue(self) -> None:
        st = self._state()
        # What this answer is about: a batch submitted while squeue runs is not in it.
        asked = self._in_flight()
        jobs = sorted({t.batch.job_id for t in asked})
        done = await self.submit.run(["squeue", "--noheader", "--array", "--states=all",
                                      f"--jobs={','.join(jobs)}", QUEUE_FORMAT], timeout=60)
        now = st.loop.time()
        if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
            st.silent_since = st.silent_since or now
            st.last_queue_error = slurm_message(done.stderr)
            for task in asked:
                task.on_progress({"stage": f"Slurm does not answer: {st.last_queue_error}"})
            if now - st.silent_since > SILENT_LIMIT_S:
                await self._give_back(HostUnavailable(
                    f"host {self.name}: squeue has failed for {SILENT_LIMIT_S:g} s: "
                    f"{st.last_queue_error}"))
            return
        st.silent_since = None
        seen: dict[str, tuple[str, str, str]] = {}
        for line in done.stdout.splitlines():
            parts = line.strip().split("|", 3)
            if len(parts) == 4:
                seen[parts[0]] = (parts[1], parts[2], parts[3])
        for task in asked:
            if task.resolved:
                continue
            if task.slurm_id in seen:
                self._observe(task, *seen[task.slurm_id], now)
            else:
                self._observe_gone(task, now)

    def _observe(self, task: _Task, state: str, node: str, reason: str, now: float) -> None:
        previous, previous_reason = task.state, task.reason
        if task.running_since is not None:
            task.ran_s += now - task.running_since
            task.running_since = None
        task.state, task.reason = state, reason
        if node and node not in ("(null)", "n/a"):
            task.node = node
        kind = rule(state).kind
        if kind == RUNNING:
            task.running_since = now
            if previous != state:
                task.on_progress({"stage": f"running on {task.node}" if task.node else "running"})
        elif kind == WAITING:
            why = never_starts(reason)
            if why:
                self._resolve(task, error=HostBroken(
                    f"host {self.name}: Slurm will never start job {task.slurm_id} as "
                    f"submitted: pending ({reason}): {why}"))
                self._request_cancel(task)
            elif (previous, previous_reason) != (state, reason):
                shown = state.lower() + (f" ({reason})" if reason and reason != "None" else "")
                task.on_progress({"stage": shown})
        else:
            if task.ended_at is None:
                task.ended_at = now
            self._settle(task, now)

    def _observe_gone(self, task: _Task, now: float) -> None:
        """squeue no longer lists the task: it ended longer ago than slurmctld keeps jobs
        (MinJobAge), or it was purged. Settled like an ended task, on its last known state."""
        if task.running_since is not None:
            task.ran_s += now - task.running_since
            task.running_since = None
        if task.state is not None and rule(task.state).kind in (WAITING, RUNNING):
            task.state = None              # it ended, but how is not known (yet)
        if task.ended_at is None:
            task.ended_at = now
        self._settle(task, now)

    def _enforce_timeouts(self) -> None:
        now = self._state().loop.time()
        for task in self._in_flight():
            if task.running_since is not None and task.ran(now) > task.timeout_s:
                self._resolve(task, self._failed(task, f"timeout after {task.timeout_s:g} s"))
                self._request_cancel(task)

    def _settle_ended(self) -> None:
        now = self._state().loop.time()
        for task in self._in_flight():
            if task.ended_at is not None:
                self._settle(task, now)

    def _settle(self, task: _Task, now: float) -> None:
        """Decide a task that has ended (or left the queue) and has no result yet."""
        if task.resolved or task.settling:
            return
        self._follow_log(task, until_end=True)
        if self._look_for_any_result(task):
            return
        if task.infra:                     # its job script found the node unfit: the host is
            self._resolve(task, error=HostBroken(f"host {self.name}: {task.infra}"))
            return
        kind = rule(task.state).kind if task.state else None
        if kind == CELL_FAILED:
            why = rule(task.state).why
            if task.state == "TIMEOUT":
                why += f" (submitted with --time={task.batch.time_limit})"
            self._resolve(task, self._failed(task, why))
            return
        if kind == LOST:
            self._resolve(task, error=AttemptLost(
                f"host {self.name}: Slurm job {task.slurm_id}"
                + (f" on {task.node}" if task.node else "") + f": {rule(task.state).why}"))
            return
        if now - task.ended_at < self.result_grace_s:
            return                         # its result may still be on its way here
        task.settling = True
        self._spawn(self._settle_without_result(task))

    async def _settle_without_result(self, task: _Task) -> None:
        """A task that ended by itself (or left the queue) and left no result: why, from
        scontrol (its exit status) or, for a task squeue forgot, sacct."""
        if task.state is None:
            state, exit_code, node = await self._accounted(task)
        else:
            state, node = task.state, task.node
            exit_code = await self._exit_code(task)
        if task.resolved or self._look_for_any_result(task):
            return
        if state is None:
            self._resolve(task, error=AttemptLost(
                f"host {self.name}: Slurm job {task.slurm_id} left the queue without a result "
                f"(and sacct does not know it)"))
            return
        task.state, task.node, task.settling = state, node or task.node, False
        if rule(state).kind in (CELL_FAILED, LOST):
            self._settle(task, self._state().loop.time())
            return
        self._resolve(task, self._failed(task, f"the task ended {state} without a result: "
                                               f"{_exit_text(exit_code)}"))

    async def _exit_code(self, task: _Task) -> str | None:
        done = await self.submit.run(["scontrol", "--oneliner", "show", "job", task.slurm_id],
                                     timeout=60)
        match = re.search(r"\bExitCode=(\d+:\d+)", done.stdout) if done.returncode == 0 else None
        return match.group(1) if match else None

    async def _accounted(self, task: _Task) -> tuple[str | None, str | None, str | None]:
        """(state, exit code, node) of a task from sacct; Nones where accounting is off."""
        done = await self.submit.run(["sacct", "--noheader", "--parsable2", "--allocations",
                                      f"--jobs={task.slurm_id}", "--format=State,ExitCode,NodeList"],
                                     timeout=60)
        rows = [ln.split("|") for ln in done.stdout.splitlines() if ln.count("|") == 2] \
            if done.returncode == 0 else []
        if not rows:
            return None, None, None
        state, exit_code, node = rows[0]
        return (state.split()[0] or None), exit_code, node

    def _look_for_any_result(self, task: _Task) -> bool:
        """The task's result under any name (a worker that answered for another cell id is
        still an answer: the runner's check says what is wrong with it)."""
        folder = task.batch.folder
        if self._take_result(task, folder.result_file(task.index, params.cell_id(task.cell))):
            return True
        names = [n for n in self.submit.listdir(folder.result_dir(task.index)) if n.endswith(".json")]
        return bool(names) and self._take_result(task, f"{folder.result_dir(task.index)}/{names[0]}")

    def _follow_log(self, task: _Task, until_end: bool = False) -> None:
        """Feed the task's new log lines to its progress and its tail."""
        if task.batch is None or task.batch.job_id is None:
            return
        path = task.batch.folder.log(task.index)
        while True:
            try:
                chunk = self.submit.read_from(path, task.log_offset, LOG_CHUNK)
            except OSError:
                return
            if not chunk:
                return
            task.log_offset += len(chunk)
            lines = (task.log_partial + chunk).split(b"\n")
            task.log_partial = lines.pop()
            for raw in lines:
                line = raw.decode(errors="replace").rstrip("\r")
                if line.startswith(INFRA_PREFIX):
                    task.infra = line[len(INFRA_PREFIX):]
                try:
                    route_line(line, task.tail, task.on_progress)
                except Exception as exc:   # noqa: BLE001 - a display error loses one update
                    task.tail.append(f"[progress display failed: {type(exc).__name__}: {exc}]")
            if not until_end or len(chunk) < LOG_CHUNK:
                return

    def _retire_batches(self) -> None:
        """Batches whose every cell is resolved leave the poller, and their folder goes unless
        a cell failed there (its full log stays; old folders go in prepare())."""
        st = self._state()
        for batch in [b for b in st.batches if all(t.resolved for t in b.tasks)]:
            st.batches.remove(batch)
            if not any(t.keep_folder for t in batch.tasks):
                self.submit.remove_tree(batch.folder.root)

    async def _give_back(self, error: HostUnavailable) -> None:
        """Hand every cell in flight back to the runner (to be run again) and cancel them."""
        lost = self._in_flight()
        for task in lost:
            self._resolve(task, error=error)
        await self._cancel([t.slurm_id for t in lost])

    # -- cancelling ------------------------------------------------------------------------

    async def _abandon(self, task: _Task) -> None:
        """The runner no longer wants `task` (Ctrl-C): cancel its Slurm task, if it has one."""
        st = self._state()
        if not task.outcome.done():
            task.outcome.cancel()
        if task in st.waiting:
            st.waiting.remove(task)
            return
        if task.batch is None:
            return
        await task.batch.submitted          # sbatch was under way: its job must go too
        if task.batch.job_id is not None:
            await self._cancel([task.slurm_id])

    def _request_cancel(self, task: _Task) -> None:
        """Cancel without waiting (a timed-out cell): close() waits for it."""
        self._spawn(self._cancel([task.slurm_id]))

    async def _cancel(self, ids: list[str]) -> None:
        """scancel `ids` together with whatever else is being cancelled now, and wait until
        Slurm no longer runs any of them (bounded by CANCEL_WAIT_S)."""
        if not ids:
            return
        st = self._state()
        st.to_cancel.update(ids)
        if st.cancelling is None or st.cancelling.done():
            st.cancelling = self._spawn(self._flush_cancels())
        await asyncio.shield(st.cancelling)

    async def _flush_cancels(self) -> None:
        st = self._state()
        await asyncio.sleep(0.05)          # the other cells cancelled by the same Ctrl-C join
        while st.to_cancel:
            ids = sorted(st.to_cancel)
            st.to_cancel.clear()
            done = await self.submit.run(["scancel", *ids], timeout=60)
            if done.returncode != 0:
                print(f"host {self.name}: scancel {' '.join(ids)} failed: "
                      f"{slurm_message(done.stderr)}; they may still run", file=sys.stderr)
                continue
            deadline = st.loop.time() + CANCEL_WAIT_S
            while st.loop.time() < deadline and await self._still_live(ids):
                await asyncio.sleep(0.25)

    async def _still_live(self, ids: list[str]) -> bool:
        jobs = sorted({i.split("_")[0] for i in ids})
        done = await self.submit.run(["squeue", "--noheader", "--array", f"--jobs={','.join(jobs)}",
                                      "--format=%i"], timeout=60)
        if done.returncode != 0:
            return False                   # gone (invalid job id) or no answer: stop waiting
        live = set(done.stdout.split())
        return any(i in live for i in ids)

    async def close(self) -> None:
        """Cancel what is still in flight (nothing, after a sweep that ended normally), wait
        for every cancellation, stop the poller. Call it in the loop that ran the cells."""
        st = self._st
        if st is None or st.loop is not asyncio.get_running_loop():
            return
        for task in st.waiting:
            task.outcome.cancel()
        if st.gathering is not None:       # a submission under way: its job must be known
            await asyncio.gather(st.gathering, return_exceptions=True)
        await self._give_back(HostUnavailable(f"host {self.name}: closed with the cell in flight"))
        for batch in st.batches:           # cancelled ones (Ctrl-C) too: no log worth keeping
            if not any(t.keep_folder for t in batch.tasks):
                self.submit.remove_tree(batch.folder.root)
        st.batches.clear()                 # the poller ends after the query it may be in
        for _ in range(3):                 # a cancellation may start another task of its own
            if not st.background:
                break
            await asyncio.wait(set(st.background), timeout=CANCEL_WAIT_S + 60)
        st.batches.clear()
        st.ready = False

    # -- `harness hosts check` -------------------------------------------------------------

    async def check(self) -> dict:
        """What `harness hosts check` prints for a slurm host: the partition as sinfo sees
        it, Slurm's verdict on a test submission, and the Python (where this machine sees it)."""
        facts = {"name": self.name, "ssh": None, "reachable": False, "host_key": None,
                 "slurm": {"partition": self.options.partition}}
        problem = self._config_problem()
        if problem:
            facts["error"] = problem
            return facts
        argv = ["sinfo", "--noheader", "--format=%P|%a|%l|%D|%T|%G"]
        if self.options.partition:
            argv.insert(2, f"--partition={self.options.partition}")
        info = await self.submit.run(argv, timeout=60)
        if info.returncode == 127:
            facts["error"] = (f"host {self.name}: sinfo not found on {self.submit.where} "
                              f"(Slurm's commands must be on the PATH where the controller runs)")
            return facts
        if info.returncode != 0:
            facts["error"] = f"host {self.name}: Slurm does not answer: {slurm_message(info.stderr)}"
            return facts
        facts["reachable"] = True
        partitions = _partitions(info.stdout)
        if not partitions:
            facts["error"] = (f"host {self.name}: partition {self.options.partition!r} does not "
                              f"exist" if self.options.partition else
                              f"host {self.name}: Slurm lists no partition")
            return facts
        facts["slurm"]["partitions"] = partitions
        self.root = self.submit.expand(self.workdir)
        refused = await self._test_submission()
        if refused is not None:
            facts["error"] = str(refused)
            return facts
        facts.update(await self._probe_python())
        return facts

    async def _probe_python(self) -> dict:
        """Python and torch versions of `python`, run here: the nodes' Python is usually on
        the shared file system this machine sees too. Where it is not, nothing is claimed."""
        from harness.remote import probe
        if not (self.python.startswith("/") or self.python.startswith("~/")):
            return {"python_unchecked": f"{self.python} (a command on the nodes' PATH)"}
        path = self.submit.expand(self.python)
        if not os.access(path, os.X_OK):
            return {"python_unchecked": f"{self.python} (not on this machine)"}
        proc = await asyncio.create_subprocess_exec(
            path, "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(Path(probe.__file__).read_bytes())
        if proc.returncode != 0:
            return {"error": f"host {self.name}: python {self.python!r} failed: "
                             f"{slurm_message(err.decode(errors='replace'))}"}
        found = json.loads(out.decode().strip().splitlines()[-1])
        return {"python": found.get("python"), "torch": found.get("torch")}


def _exit_text(exit_code: str | None) -> str:
    """What Slurm's `N:S` exit code says about a worker that left no result."""
    if not exit_code or ":" not in exit_code:
        return "its exit status is not known"
    code, sig = (int(x) for x in exit_code.split(":"))
    if sig:
        return no_result_why(-sig)
    if code == 0:
        return "the worker exited 0 without writing one"
    return no_result_why(code)


def _partitions(sinfo: str) -> dict[str, dict]:
    """sinfo's rows (one per partition and node state) -> partition -> its summary."""
    out: dict[str, dict] = {}
    for line in sinfo.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, avail, limit, count, state, gres = parts
        entry = out.setdefault(name.rstrip("*"), {"default": name.endswith("*"), "avail": avail,
                                                  "time_limit": limit, "nodes": {}, "gres": []})
        entry["nodes"][state] = entry["nodes"].get(state, 0) + int(count or 0)
        if gres and gres != "(null)" and gres not in entry["gres"]:
            entry["gres"].append(gres)
    return out
