"""The Host interface: what every kind of host (local, ssh, slurm) gives the runner, and
the rules every one of them applies to a worker's reply.

A host takes one cell and returns its result dict (`run_cell`); failures of the host itself are
HostUnavailable (retried elsewhere) or HostBroken (the host is given up), and an attempt the
host's infrastructure lost under the cell, the host itself still working, is AttemptLost (the
cell runs again; the host is not held responsible); everything that goes
wrong with a cell is that cell's failed result, carrying the worker's stderr tail. A reply is
never trusted: it must be one JSON object, for the cell sent (`bound_to`), under a size limit
(`read_tail`), or it is that cell's failure.
"""

from __future__ import annotations

import json
import signal
import time
from collections import deque
from typing import Callable, Protocol

from harness.protocol import params
from harness.protocol.wire import PROGRESS_PREFIX

STDERR_TAIL_LINES = 40
# The longest reply line a serving worker may send (results with many samples run to a few
# MiB); beyond it the reply is refused rather than buffered without bound.
REPLY_LIMIT = 64 * 2**20

ProgressFn = Callable[[dict], None]


class HostUnavailable(Exception):
    """The host could not run the cell for reasons of its own, not the cell's: unreachable,
    connection dropped mid-cell, GPU held by someone else for too long. The runner retries the
    cell (bounded, with backoff) on this or another eligible host. The message is one line."""


class HostBroken(HostUnavailable):
    """The host cannot run anything until a person fixes it: its host key is unknown or
    changed, login is refused, its Python is missing. The runner stops using it for the rest of
    the sweep and says why in one line."""


class AttemptLost(HostUnavailable):
    """The cell's attempt was lost to the host's infrastructure while the host as a whole
    works: a cluster node failed under it, a higher-priority job preempted it. The runner runs
    the cell again (bounded, as for any HostUnavailable), without counting it as a failure of
    the host: a 64-task array on a node that dies must not give up the whole cluster."""


class Host(Protocol):
    name: str
    slots: int          # cells this host runs at once (one per GPU)
    labels: dict

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict: ...

    # Optional (the runner uses them when present):
    #   async prepare() -> None    connect / ship code; raises HostUnavailable or HostBroken
    #   async close() -> None      release connections at the end of a sweep
    #   service: HostService       the serving engine its hosts.yaml entry declares
    #                              (harness.hosts.service), set by the inventory


def failed_result(cell: dict, host: str, error: str, wall_s: float | None = None) -> dict:
    """A result for a cell whose worker produced none."""
    cell = params.canonical(cell)
    return {"cell": cell, "cell_id": params.cell_id(cell), "label": params.cell_label(cell),
            "status": "failed", "error": error, "metrics": {}, "samples": {}, "env": {},
            "host": host, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": wall_s}


async def read_tail(stream, limit: int = REPLY_LIMIT) -> bytes:
    """A worker's whole stdout, of which only the last `limit` bytes are kept: the result is its
    last line, and a worker that prints without end must not fill the controller's memory."""
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        kept += chunk
        if len(kept) > 2 * limit:      # trimmed now and then, not on every chunk
            del kept[:-limit]
    return bytes(kept[-limit:])


def route_line(line: str, tail: deque, on_progress: ProgressFn) -> None:
    """A progress line goes to `on_progress`, anything else to the stderr tail."""
    if line.startswith(PROGRESS_PREFIX):
        try:
            on_progress(json.loads(line[len(PROGRESS_PREFIX):]))
            return
        except json.JSONDecodeError:
            pass
    tail.append(line)


def parse_result(cell: dict, host: str, returncode: int | None, stdout: bytes, tail, wall_s: float) -> dict:
    """The worker's result, or a failed result that says why there is none."""
    text = stdout.decode(errors="replace").strip()
    stderr_tail = "\n".join(tail)
    if text:
        try:
            result = json.loads(text.splitlines()[-1])
        except json.JSONDecodeError:
            result = None
        if isinstance(result, dict):
            result["host"] = host
            return result
        if result is not None:
            return failed_result(cell, host, f"the worker's reply is not a result object: "
                                             f"{type(result).__name__}\n{stderr_tail}", wall_s)
    return failed_result(cell, host, f"{no_result_why(returncode)}\n{stderr_tail}", wall_s)


def bound_to(cell: dict, result, host: str) -> dict:
    """The result as the answer to `cell`, the cell this controller sent: a worker's reply that
    is not a result object, or names another cell, is this cell's failure. The journal files
    results under their cell id, so a reply trusted blindly could overwrite another cell's
    result (or, with a crafted id, write outside the run)."""
    expected = params.cell_id(cell)
    if not isinstance(result, dict):
        return failed_result(cell, host, f"the worker's reply is not a result object: "
                                         f"{type(result).__name__}")
    if result.get("cell_id") != expected:
        got = str(result.get("cell_id"))[:80]
        return failed_result(cell, host, f"the worker answered for cell {got!r}, not for "
                                         f"the cell sent ({expected})")
    return result


def no_result_why(returncode: int | None) -> str:
    """Why a worker gave no result, from its exit status."""
    if returncode is not None and returncode < 0:
        try:
            return f"worker killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"worker killed by signal {-returncode}"
    return f"worker exited with code {returncode} and no result"
