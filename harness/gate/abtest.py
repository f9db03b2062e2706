"""Same-job A/B: measure the base commit and the head on one host, interleaved.

The strongest answer to noisy runners and to "which baseline?": both sides run in the same job
on the same GPU, alternating, so whatever the machine does (clocks, thermals, a neighbour's
job) lands on both. The base commit is checked out into a temporary `git worktree`; each side's
worker runs from its own tree (LocalHost.for_code_tree: cwd and PYTHONPATH point at the tree),
while this controller stays the head's.

Per cell, on one host slot (one GPU), the rounds alternate A B, B A, A B, ... (a linear drift
over the cell hits both sides equally), each round one worker run per side of `repeats`
samples. After the design's first rounds the gate looks (harness.gate.sequential) and measures
another round while a gated metric is undecided, within the rounds and the time it may spend.
Different cells may run on different slots at once; the two sides of one cell never do.

With a persistent host (LocalHost(persistent=True)) each side keeps one worker process per
slot for the whole gate: the base tree's and the head tree's, alternating. Built models stay
loaded across cells and rounds, so a round after a cell's first costs about its measurement.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from harness.gate.sequential import Design
from harness.hosts import service as host_service
from harness.hosts.interface import Host
from harness.protocol import params
from harness.protocol.errors import InputError
from harness.sweep.journal import atomic_write_json

BASE, HEAD = "base", "head"


# -- git ---------------------------------------------------------------------------------------


def git(*args: str, cwd: str | Path, check: bool = True) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def repo_root(path: str | Path = ".") -> Path:
    """The top of the git checkout containing `path` (InputError outside one)."""
    try:
        top = git("rev-parse", "--show-toplevel", cwd=path)
    except (RuntimeError, OSError):
        raise InputError(str(path), None, None, "not inside a git checkout: the A/B gate "
                                                "needs the repository to check out the base") from None
    return Path(top)


def resolve_commit(repo: str | Path, ref: str) -> str:
    """The full sha of `ref` (InputError naming the ref if git does not know it)."""
    if not ref or ref.startswith("-"):
        raise InputError(None, None, None, f"bad git ref {ref!r}")
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
    except RuntimeError:
        raise InputError(None, None, None, f"unknown git ref '{ref}' in {repo} (fetch it "
                                           f"first, e.g. git fetch origin main)") from None


@contextmanager
def worktree(repo: str | Path, sha: str, prefix: str = "harness-gate-") -> Iterator[Path]:
    """A detached worktree of `sha` in a temporary folder, removed afterwards (also on error
    or Ctrl-C)."""
    parent = Path(tempfile.mkdtemp(prefix=prefix))
    path = parent / sha[:12]
    try:
        git("worktree", "add", "--detach", "--quiet", str(path), sha, cwd=repo)
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo,
                       capture_output=True, timeout=120)
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True, timeout=120)


def host_for_tree(host: Host, tree: str | Path) -> Host:
    """`host`, running its worker from the source tree `tree`."""
    for_tree = getattr(host, "for_code_tree", None)
    if for_tree is None:
        raise InputError(None, None, None, f"host '{host.name}' cannot run a worker from another "
                                           f"source tree: the A/B gate needs a local host")
    return for_tree(tree)


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Measured:
    """Every worker result, per cell id and side, in the order they ran."""

    results: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    rounds: dict[str, int] = field(default_factory=dict)          # rounds per side, per cell
    round_s: dict[str, list[float]] = field(default_factory=dict)  # wall time of each round
    budget_out: set[str] = field(default_factory=set)  # cells that wanted more, out of time
    interrupted: bool = False
    elapsed_s: float = 0.0


OnResult = Callable[[int, dict, str, int, dict], None]   # (cell no., cell, side, round, result)
# (cell id, results per side, rounds done) -> whether another round could change the verdict
WantsMore = Callable[[str, dict[str, list[dict]], int], bool]


def side_order(sides: list[str], round_no: int) -> list[str]:
    """A B, B A, A B, ...: alternating, so a drift within a cell's rounds cancels out."""
    return list(sides) if round_no % 2 == 0 else list(reversed(sides))


def measure(cells: list[dict], hosts: dict[str, Host], *, design: Design,
            wants_more: WantsMore | None = None, budget_s: float | None = None,
            on_result: OnResult | None = None, profile_every_round: bool = True,
            clock: Callable[[], float] = time.monotonic) -> Measured:
    """Run every cell `design.first_look` rounds per side, interleaved, then one round at a
    time while `wants_more` says a verdict is still open, up to `design.max_rounds`.

    The first rounds always run; the extra ones only while the time `budget_s` allows. Each
    cell may spend an equal share of what is left when it starts (what a quick cell leaves
    over goes to the cells after it), so one noisy cell cannot starve the rest. `hosts` maps
    side name -> host; all must be the same machine (slot i of each is the same GPU).
    Persistent hosts are closed at the end, in the loop that started their workers. Ctrl-C
    stops and keeps what finished.

    `profile_every_round=False`: only a cell's first round runs the profiler and the sync
    audit (cell knob `profile`); later rounds measure their timed window and nothing else.
    For a gate that gates no per-run metric, that is what a round needs, at about a second
    less a round."""
    measured = Measured()
    t0 = clock()
    try:
        asyncio.run(_measure(cells, hosts, design, wants_more, budget_s, on_result,
                             profile_every_round, measured, clock))
    except KeyboardInterrupt:
        measured.interrupted = True
    measured.elapsed_s = clock() - t0
    return measured


async def _measure(cells, hosts, design, wants_more, budget_s, on_result, profile_every_round,
                   measured, clock) -> None:
    sides = list(hosts)
    queue: asyncio.Queue = asyncio.Queue()
    for i, cell in enumerate(cells, start=1):
        queue.put_nowait((i, cell))
    slots = min(h.slots for h in hosts.values())
    deadline = None if budget_s is None else clock() + budget_s

    async def one_round(i, cell, slot, cid, per_side, r):
        t = clock()
        sent = cell if r == 0 or profile_every_round else {**cell, "profile": False}
        for side in side_order(sides, r):
            # No id check here: the base tree may compute ids differently (merge_results
            # files every run under the head's id).
            result = await hosts[side].run_cell(sent, slot, lambda _p: None)
            # which engine a service cell measured, as harness run records it: the gate
            # compares only results of one deployment (baselines.other_deployment)
            host_service.record(hosts[side], result)
            per_side[side].append(result)
            if on_result:
                on_result(i, cell, side, r, result)
        measured.round_s[cid].append(clock() - t)
        measured.rounds[cid] = r + 1

    async def slot_loop(slot: int):
        while True:
            try:
                i, cell = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            cid = params.cell_id(cell)
            per_side = {side: [] for side in sides}
            measured.results[cid] = per_side
            measured.round_s[cid] = []
            cells_left = queue.qsize() + 1
            share_end = (None if deadline is None else
                         clock() + max(0.0, deadline - clock()) / math.ceil(cells_left / slots))
            for r in range(design.first_look):
                await one_round(i, cell, slot, cid, per_side, r)
            r = design.first_look
            while (r < design.max_rounds and wants_more is not None
                   and wants_more(cid, per_side, r)):
                typical = statistics.median(measured.round_s[cid])
                if share_end is not None and clock() + typical > share_end:
                    measured.budget_out.add(cid)
                    break
                await one_round(i, cell, slot, cid, per_side, r)
                r += 1

    try:
        await asyncio.gather(*(slot_loop(s) for s in range(slots)))
    finally:
        await asyncio.gather(*(h.close() for h in hosts.values() if hasattr(h, "close")),
                             return_exceptions=True)


def merge_results(cell: dict, results: list[dict]) -> dict:
    """One journal result for a cell measured in several worker runs: per-repeat samples
    concatenated, tokens/s the median of all repeats, acceptance their mean, every other metric
    the median over runs. A cell with no ok run keeps the first failure."""
    ok = [r for r in results if r.get("status") == "ok"]
    if not ok:
        first = dict(results[0]) if results else {"status": "failed", "error": "not measured"}
        first.update(cell_id=params.cell_id(cell), cell=params.canonical(cell))
        return first
    merged = json.loads(json.dumps(ok[0]))
    merged["cell_id"] = params.cell_id(cell)   # the head's id, whatever the base computes
    samples: dict[str, list] = {}
    for r in ok:
        for k, v in (r.get("samples") or {}).items():
            if isinstance(v, list):
                samples.setdefault(k, []).extend(v)
    metrics: dict = {}
    for k in ok[0].get("metrics") or {}:
        values = [r["metrics"].get(k) for r in ok if isinstance(r["metrics"].get(k), (int, float))]
        metrics[k] = statistics.median(values) if values else None
    if samples.get("tokens_per_s"):
        metrics["tokens_per_s"] = statistics.median(samples["tokens_per_s"])
    if samples.get("accept_len_mean"):
        metrics["accept_len_mean"] = statistics.mean(samples["accept_len_mean"])
    merged.update(metrics=metrics, samples=samples, runs=len(ok),
                  failed_runs=len(results) - len(ok),
                  wall_s=sum(float(r.get("wall_s") or 0) for r in results))
    return merged


def write_raw(raw_dir: Path, cell: dict, side: str, round_no: int, result: dict) -> None:
    atomic_write_json(raw_dir / f"{params.cell_id(cell)}.{side}.r{round_no}.json", result)
