"""Run a sweep: cells onto host slots, results into the journal, progress onto the screen.

Each host slot pulls the next cell from a shared queue, so a sweep spreads over every eligible
host and GPU at once. A result is written to the journal the moment it arrives, before anything
else looks at it; MLflow logging happens afterwards from the journal (tracking.py), so a dead
tracking server never loses a measurement.

Infrastructure failures are not cell failures. A host that cannot be reached is retried with
backoff (1, 2, 4, ... s) and given up after MAX_HOST_FAILURES attempts in a row; a host that
cannot work until a person fixes it (HostBroken: unknown host key, missing Python) is given up
at once; one failure that reaches several slots at once (a job array Slurm refused) counts once.
A cell whose host failed under it (connection dropped mid-cell; a cluster node lost or a job
preempted, AttemptLost: not held against the host) goes back to the queue, for this or another
host, at most MAX_CELL_ATTEMPTS times. A cell that fails in its worker (an
OOM at 65k, a kernel error) is a result like any other: journaled, never retried here.

A result the journal cannot write because the disk refuses it (full, over quota, read-only)
stops the sweep like Ctrl-C does: no cell starts, the running ones are cancelled (killed where
they run), and `SweepOutcome.journal_full` names the file. Every result written before stays,
so `--resume` finishes the run once there is space; going on would only measure cells whose
results are lost.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn,
                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from rich.text import Text

from harness.protocol import params
from harness.hosts import service as host_service
from harness.hosts.interface import (AttemptLost, Host, HostBroken, HostUnavailable, bound_to,
                                     failed_result)
from harness.sweep.journal import JournalFull, RunJournal

MAX_CELL_ATTEMPTS = 3          # infrastructure failures a cell may suffer before it is failed
MAX_HOST_FAILURES = 4          # failed attempts in a row before a host is given up
BACKOFF_S = (1, 2, 4, 8, 16, 30)
SHOWN_PER_HOST = 3             # running cells named on a host's progress line


@dataclass
class SweepOutcome:
    results: list[dict] = field(default_factory=list)
    interrupted: bool = False
    journal_full: str | None = None     # the disk refused a result: which file, and why
    retries: int = 0                                        # cells sent back to the queue
    hosts_lost: dict[str, str] = field(default_factory=dict)   # host -> why it was given up

    @property
    def n_failed(self) -> int:
        return sum(r["status"] != "ok" for r in self.results)


def run_cells(cells: list[dict], hosts: list[Host], journal: RunJournal, console: Console) -> SweepOutcome:
    """Run `cells` on `hosts`, journaling each result. Ctrl-C stops the sweep (killing what
    runs, here and on remote hosts) and keeps what finished; the caller reports how to resume."""
    outcome = SweepOutcome()
    columns = [SpinnerColumn(), TextColumn("[bold]{task.description}"),
               _CellsOnly(BarColumn()), _CellsOnly(MofNCompleteColumn()), _CellsOnly(TextColumn("•")),
               _CellsOnly(TimeElapsedColumn()), _CellsOnly(TextColumn("ETA")),
               _CellsOnly(TimeRemainingColumn()), TextColumn("{task.fields[status]}")]
    with Progress(*columns, console=console, transient=False) as bar:
        try:
            outcome.interrupted = asyncio.run(
                _until_ctrl_c(_Sweep(cells, hosts, journal, bar, outcome).run()))
        except KeyboardInterrupt:  # Ctrl-C outside the loop's own handler (not the main thread)
            outcome.interrupted = True
        except JournalFull:
            pass                  # outcome.journal_full says what; the caller says what next
    return outcome


async def _until_ctrl_c(sweep) -> bool:
    """Run `sweep` until it ends (False) or Ctrl-C cancels it (True).

    The SIGINT handler is the loop's own (`add_signal_handler`): the signal is written to the
    loop's self-pipe and wakes it, whichever thread the kernel hands it to. asyncio.run's
    default handler is a Python-level one, run when the main thread next executes Python code;
    on a loaded machine a Ctrl-C sent while the loop waited on a 300 s SSH cell went unanswered
    for minutes with it (the sweep task was never cancelled)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(sweep)
    interrupted = False

    def on_ctrl_c() -> None:
        nonlocal interrupted
        interrupted = True       # a second Ctrl-C changes nothing: the kills are under way
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    except (NotImplementedError, RuntimeError, ValueError):
        pass                     # no loop handler here (not the main thread): KeyboardInterrupt
    try:
        await task
    except asyncio.CancelledError:
        if not interrupted:
            raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    return interrupted


class _CellsOnly(ProgressColumn):
    """A column shown on the overall `cells` line and left blank on the per-host lines."""

    def __init__(self, column: ProgressColumn):
        super().__init__()
        self.column = column

    def render(self, task):
        return self.column.render(task) if task.fields.get("kind") == "cells" else Text("")


class _SweepDone(Exception):
    """Every cell has a result: stop waiting for hosts or for the queue."""


@dataclass
class _HostState:
    name: str
    failures: int = 0              # failed attempts in a row
    retry_at: float = 0.0          # loop time before which the host is left alone
    lost: str | None = None        # why it was given up
    last_cell_failure: HostUnavailable | None = None   # counted already
    done: int = 0
    running: dict[int, str] = field(default_factory=dict)   # slot -> what it runs
    note: str = ""                 # why it is idle (down, retrying)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _Sweep:
    def __init__(self, cells, hosts, journal, bar, outcome):
        self.cells, self.hosts, self.journal, self.bar, self.outcome = cells, hosts, journal, bar, outcome
        self.n = len(cells)
        self.pending = self.n
        self.cells_task = bar.add_task("cells", total=self.n, status="", kind="cells")
        self.host_tasks = {h.name: bar.add_task(f"  {h.name}", total=None, status="", kind="host")
                           for h in hosts}

    async def run(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        for i, cell in enumerate(self.cells, start=1):
            self.queue.put_nowait((i, cell, []))
        self.all_done = asyncio.Event()
        if self.n == 0:
            return
        self.state = {h.name: _HostState(h.name) for h in self.hosts}
        self.live_slots = sum(h.slots for h in self.hosts)
        self.stopping = False
        slots = [asyncio.ensure_future(self._slot(h, s)) for h in self.hosts for s in range(h.slots)]
        try:
            await asyncio.gather(*slots)
        except BaseException:
            # Ctrl-C (the sweep's task is cancelled), a result the disk refused (JournalFull) or
            # a bug in one slot: no cell starts from now on, and the running ones are
            # cancelled, which kills them where they run.
            self.stopping = True
            await _cancel_and_wait(slots)
            raise
        finally:
            # Only now, with every kill sent, may the connections close.
            closers = [h.close() for h in self.hosts if hasattr(h, "close")]
            await asyncio.gather(*closers, return_exceptions=True)

    # -- display ---------------------------------------------------------------------------

    def _show(self, host: Host) -> None:
        st = self.state[host.name]
        if st.lost:
            status = f"{st.done} done · [red]given up[/] (the reason is printed above)"
        else:
            cells = [v for _, v in sorted(st.running.items())]
            if len(cells) > SHOWN_PER_HOST:    # a cluster runs dozens: the line stays one line
                cells = cells[:SHOWN_PER_HOST] + [f"+{len(cells) - SHOWN_PER_HOST} more"]
            running = escape(" | ".join(cells))
            status = f"{st.done} done" + (f" · {running}" if running else "") + \
                (f" · [yellow]{escape(st.note)}[/]" if st.note else "")
        self.bar.update(self.host_tasks[host.name], status=status)

    def _print(self, line: str) -> None:
        self.bar.console.print(line, highlight=False)

    # -- the pieces ------------------------------------------------------------------------

    async def _until_done(self, awaitable):
        """Await `awaitable`, unless every cell gets its result first (then _SweepDone)."""
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self.all_done.wait())
        try:
            finished, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            waiter.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        waiter.cancel()
        if task in finished:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise _SweepDone

    def _give_up(self, host: Host, reason: str) -> None:
        st = self.state[host.name]
        if st.lost is None:
            st.lost = reason
            self.outcome.hosts_lost[host.name] = reason
            self._print(f"  [red]host {host.name} given up:[/] {escape(reason)}")
        self._show(host)

    def _host_failed(self, host: Host, err: HostUnavailable) -> None:
        st = self.state[host.name]
        if isinstance(err, HostBroken):
            self._give_up(host, str(err))
            return
        st.failures += 1
        if st.failures >= MAX_HOST_FAILURES:
            self._give_up(host, f"{err} ({st.failures} attempts in a row)")
            return
        wait = BACKOFF_S[min(st.failures, len(BACKOFF_S)) - 1]
        st.retry_at = asyncio.get_running_loop().time() + wait
        st.note = f"down: {err}; retry in {wait} s"
        self._show(host)

    async def _ready(self, host: Host) -> bool:
        """Wait until `host` is connected and prepared; False once it is given up."""
        st = self.state[host.name]
        loop = asyncio.get_running_loop()
        while st.lost is None:
            delay = st.retry_at - loop.time()
            if delay > 0:
                await self._until_done(asyncio.sleep(delay))
                continue
            async with st.lock:             # one slot reconnects; the others wait for it
                if st.lost is not None or st.retry_at > loop.time():
                    continue
                prepare = getattr(host, "prepare", None)
                try:
                    if prepare is not None:
                        await self._until_done(prepare())
                except HostUnavailable as err:
                    self._host_failed(host, err)
                    continue
                except Exception as err:
                    # A bug rather than the host's fault: still one line, and the sweep goes on.
                    self._give_up(host, f"host {host.name}: cannot prepare it: "
                                        f"{type(err).__name__}: {err}")
                    continue
                st.note = ""      # failures reset only once a cell completes: a host that
                return True       # connects but drops every cell is given up all the same
        return False

    def _finish(self, i: int, host: Host, result: dict) -> None:
        try:
            self.journal.write_cell(result)                  # the journal first, always
        except JournalFull as e:
            # Stop here: raised out of the slot, it cancels the others (see run()).
            self.stopping = True
            self.outcome.journal_full = self.outcome.journal_full or str(e)
            raise
        self.outcome.results.append(result)
        self.pending -= 1
        label = params.cell_label(result.get("cell") or {})
        mark = "[green]ok[/]" if result["status"] == "ok" else "[red]failed[/]"
        if result.get("noisy"):
            mark += " [yellow](noisy: GPU shared with a foreign process)[/]"
        self._print(f"  {mark} cell {i}/{self.n} {escape(label)} on {host.name}"
                    + escape(_headline(result)))
        self.bar.advance(self.cells_task)
        if self.pending == 0:
            self.all_done.set()

    def _requeue(self, i: int, cell: dict, errors: list, host: Host, err: HostUnavailable) -> None:
        errors = errors + [str(err)]
        self.outcome.retries += 1
        if len(errors) >= MAX_CELL_ATTEMPTS:
            why = f"infrastructure failure, gave up after {len(errors)} attempts: " + "; ".join(errors)
            self._finish(i, host, failed_result(cell, host.name, why))
            return
        self._print(f"  [yellow]retry[/] cell {i}/{self.n} ({len(errors)}/{MAX_CELL_ATTEMPTS - 1} "
                    f"retries): {escape(str(err))}")
        self.queue.put_nowait((i, cell, errors))

    def _slot_gone(self) -> None:
        """A slot stopped for good. With none left, the cells still queued cannot run."""
        self.live_slots -= 1
        if self.live_slots > 0 or self.pending == 0 or self.stopping:
            return            # stopping (Ctrl-C, disk full): queued cells stay unrun, for --resume
        reasons = "; ".join(self.outcome.hosts_lost.values()) or "no host left"
        while not self.queue.empty():
            i, cell, errors = self.queue.get_nowait()
            why = f"no host left to run it: {reasons}"
            self._finish(i, self.hosts[0], failed_result(cell, "none", why))

    async def _slot(self, host: Host, slot: int) -> None:
        st = self.state[host.name]
        cancelled = False
        try:
            while True:
                if not await self._ready(host):
                    return
                i, cell, errors = await self._until_done(self.queue.get())
                if self.stopping:
                    return
                if st.lost is not None:
                    # Given up while this slot waited for a cell (a host of many slots: one
                    # slot's cell found it broken): the cell is for another host.
                    self.queue.put_nowait((i, cell, errors))
                    return
                label = params.cell_label(cell)
                st.running[slot] = f"cell {i}/{self.n} {label}"
                self._show(host)

                def on_progress(p: dict, i=i, label=label):
                    stage = p.get("stage", "")
                    rep = f" {p['repeat']}/{p['repeats']}" if "repeat" in p else ""
                    st.running[slot] = f"cell {i}/{self.n} {label} [{stage}{rep}]"
                    self._show(host)

                t0 = time.perf_counter()
                try:
                    result = await host.run_cell(cell, slot, on_progress)
                except HostUnavailable as err:
                    st.running.pop(slot, None)
                    # One failure reaching every slot it hit (the same exception: a job array
                    # Slurm refused) counts once; an attempt lost under a cell, not at all.
                    if not isinstance(err, AttemptLost) and err is not st.last_cell_failure:
                        st.last_cell_failure = err
                        self._host_failed(host, err)
                    self._requeue(i, cell, errors, host, err)
                    continue
                except Exception as err:  # a controller bug: this cell fails, the sweep goes on
                    result = failed_result(cell, host.name, f"controller error running the "
                                           f"cell: {type(err).__name__}: {err}")
                result = bound_to(cell, result, host.name)
                host_service.record(host, result)      # which deployment a service cell measured
                st.running.pop(slot, None)
                result.setdefault("wall_s", round(time.perf_counter() - t0, 3))
                if errors:
                    result["infra_retries"] = errors
                st.done += 1
                st.failures = 0
                self._finish(i, host, result)
                self._show(host)
        except _SweepDone:
            return
        except asyncio.CancelledError:
            cancelled = True      # Ctrl-C: queued cells stay unrun (resumable), not failed
            raise
        finally:
            if not cancelled:
                self._slot_gone()


async def _cancel_and_wait(tasks: list[asyncio.Future]) -> None:
    """Cancel `tasks` and wait until each has finished (its kills sent), even if we are
    cancelled again meanwhile: a second Ctrl-C must not close connections under the kills."""
    for task in tasks:
        task.cancel()
    pending = [t for t in tasks if not t.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            pass
        pending = [t for t in pending if not t.done()]
    for task in tasks:               # retrieved, so asyncio does not log them as never awaited
        if not task.cancelled():
            task.exception()


def _headline(result: dict) -> str:
    m = result.get("metrics") or {}
    if result["status"] != "ok":
        first = (result.get("error") or "").strip().splitlines()
        return f": {first[0][:300]}" if first else ""
    if m.get("tokens_per_s") is None:
        return ""
    return f": {m['tokens_per_s']:.1f} tok/s, accept {m.get('accept_len_mean', 0):.2f}"
