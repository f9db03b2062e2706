"""The runner's scheduling and fault rules, with stand-in hosts (units; tests/hosts/test_ssh.py runs the
same rules against real sshd instances).

Infrastructure failures (HostUnavailable) are retried on this or another host, bounded; hosts
that cannot work (HostBroken) are given up with one line; cells that fail in their worker are
results, never retried; every result is in the journal.
"""

from __future__ import annotations

import asyncio
import io

import pytest
from rich.console import Console

from harness.hosts.interface import HostBroken, HostUnavailable, failed_result
from harness.protocol.params import canonical, cell_id
from harness.sweep import runner
from harness.sweep.journal import RunJournal

CELLS = [{"workload": "noop", "seed": i} for i in range(4)]


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(runner, "BACKOFF_S", (0.01, 0.02))


class FakeHost:
    """A host whose prepare() and run_cell() follow a script of outcomes."""

    def __init__(self, name, slots=1, prepare=(), run=(), then="ok"):
        self.name, self.slots, self.labels = name, slots, {}
        self.prepare_script = list(prepare)   # exceptions to raise, in order, then succeed
        self.run_script = list(run)           # per run_cell: "ok", "failed" or an exception
        self.then = then                      # what run_cell does once the script is used up
        self.ran: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self.closed = False

    async def prepare(self):
        if self.prepare_script:
            raise self.prepare_script.pop(0)

    async def run_cell(self, cell, slot, on_progress):
        self.ran.append(cell["seed"])
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            on_progress({"stage": "sleep"})
            await asyncio.sleep(0.01)
            what = self.run_script.pop(0) if self.run_script else self.then
            if isinstance(what, Exception):
                raise what
            if what == "failed":
                return failed_result(cell, self.name, "ValueError: the workload broke")
            c = canonical(cell)
            return {"cell": c, "cell_id": cell_id(c), "status": "ok", "error": None,
                    "metrics": {}, "samples": {}, "env": {}, "host": self.name}
        finally:
            self.running -= 1

    async def close(self):
        self.closed = True


def sweep(tmp_path, hosts, cells=CELLS):
    journal = RunJournal.create(tmp_path, "run", "t", None, "", cells, {})
    out = io.StringIO()
    outcome = runner.run_cells(cells, hosts, journal, Console(file=out, width=250))
    return outcome, journal, out.getvalue()


def test_cell_dropped_mid_run_is_retried_on_another_host_and_nothing_is_lost(tmp_path):
    flaky = FakeHost("a", run=[HostUnavailable("host a: connection lost mid-cell")],
                     prepare=[])
    # After dropping its first cell, `a` cannot come back at all.
    flaky.prepare = _prepare_then(flaky, HostBroken("host a: gone for good"))
    steady = FakeHost("b")
    outcome, journal, out = sweep(tmp_path, [flaky, steady])
    results = journal.results()
    assert len(results) == 4 and all(r["status"] == "ok" for r in results.values())
    [retried] = [r for r in results.values() if r.get("infra_retries")]
    assert retried["host"] == "b" and "connection lost" in retried["infra_retries"][0]
    assert outcome.retries == 1 and outcome.hosts_lost == {"a": "host a: gone for good"}
    assert "retry" in out and "host a given up: host a: gone for good" in out
    assert flaky.closed and steady.closed


def _prepare_then(host, error):
    calls = {"n": 0}

    async def prepare():
        calls["n"] += 1
        if calls["n"] > 1:
            raise error
    return prepare


def test_a_failing_cell_is_recorded_and_not_retried(tmp_path):
    host = FakeHost("a", run=["failed"])
    outcome, journal, out = sweep(tmp_path, [host])
    assert sorted(host.ran) == [0, 1, 2, 3]            # each cell ran exactly once
    statuses = sorted(r["status"] for r in journal.results().values())
    assert statuses == ["failed", "ok", "ok", "ok"] and outcome.retries == 0
    assert "the workload broke" in out


def test_broken_host_is_given_up_in_one_line_and_the_others_run_everything(tmp_path):
    broken = FakeHost("a", prepare=[HostBroken("host a: python '/x' not found on the host")])
    good = FakeHost("b")
    outcome, journal, out = sweep(tmp_path, [broken, good])
    assert all(r["status"] == "ok" and r["host"] == "b" for r in journal.results().values())
    assert broken.ran == [] and out.count("host a given up") == 1


def test_no_host_left_fails_the_remaining_cells_with_the_reasons(tmp_path):
    hosts = [FakeHost("a", prepare=[HostBroken("host a: host key unknown")]),
             FakeHost("b", prepare=[HostBroken("host b: login refused")])]
    outcome, journal, out = sweep(tmp_path, hosts)
    results = list(journal.results().values())
    assert len(results) == 4 and all(r["status"] == "failed" for r in results)
    assert all("no host left to run it: host a: host key unknown; host b: login refused"
               in r["error"] for r in results)


def test_unreachable_host_is_retried_with_backoff_then_given_up(tmp_path):
    down = [HostUnavailable("host a: cannot connect to a: connection refused")] * 10
    recovering = FakeHost("a", prepare=down[:2])        # back after two refusals
    outcome, journal, _ = sweep(tmp_path, [recovering])
    assert all(r["status"] == "ok" for r in journal.results().values())

    gone = FakeHost("a", prepare=down)
    outcome, journal, out = sweep(tmp_path / "2", [gone])
    assert gone.prepare_script == down[runner.MAX_HOST_FAILURES:]   # bounded attempts
    assert "(4 attempts in a row)" in outcome.hosts_lost["a"]
    assert all(r["status"] == "failed" for r in journal.results().values())


def test_cell_retries_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "MAX_HOST_FAILURES", 100)
    host = FakeHost("a", then=HostUnavailable("host a: connection lost mid-cell"))
    outcome, journal, _ = sweep(tmp_path, [host], CELLS[:1])
    [result] = journal.results().values()
    assert result["status"] == "failed" and host.ran == [0] * runner.MAX_CELL_ATTEMPTS
    assert result["error"].startswith(
        f"infrastructure failure, gave up after {runner.MAX_CELL_ATTEMPTS} attempts")


def test_cells_spread_over_every_slot_at_once(tmp_path):
    wide, narrow = FakeHost("a", slots=3), FakeHost("b")
    cells = [{"workload": "noop", "seed": i} for i in range(12)]
    outcome, journal, out = sweep(tmp_path, [wide, narrow], cells)
    assert len(journal.results()) == 12
    assert wide.most_at_once == 3 and wide.ran and narrow.ran
    assert "a" in out and "b" in out and "done" in out          # one progress line per host


def test_messages_with_brackets_are_printed_verbatim(tmp_path):
    # Errors quote paths and addresses: "[Errno 2]", "[fe80::1]:22", "[/tmp/x]" are text, not
    # console markup (rich would swallow the first two and raise on the last).
    broken = FakeHost("a", prepare=[HostBroken("host a: [fe80::1]:22 refused [/tmp/x]")])
    failing = FakeHost("b", run=[HostUnavailable("host b: [Errno 104] reset [/y]")], then="ok")
    outcome, journal, out = sweep(tmp_path, [broken, failing], CELLS[:1])
    assert "host a given up: host a: [fe80::1]:22 refused [/tmp/x]" in out
    assert "host b: [Errno 104] reset [/y]" in out


class LyingHost(FakeHost):
    """Answers the first cell with another cell's id, the second with a path, the third with
    something that is not a result at all."""

    async def run_cell(self, cell, slot, on_progress):
        good = await super().run_cell(cell, slot, on_progress)
        lie = {0: {**good, "cell_id": cell_id(canonical(CELLS[3]))},
               1: {**good, "cell_id": "../../escaped"},
               2: ["not", "a", "result"]}
        return lie.get(cell["seed"], good)


def test_a_reply_for_another_cell_is_this_cells_failure(tmp_path):
    outcome, journal, out = sweep(tmp_path, [LyingHost("liar")])
    results = journal.results()
    ids = [cell_id(canonical(c)) for c in CELLS]
    # Every cell has exactly its own result: the lies are failures of the cells they answered,
    # the honest fourth cell's result is not overwritten, nothing is written outside the run.
    assert set(results) == set(ids)
    assert [results[i]["status"] for i in ids] == ["failed", "failed", "failed", "ok"]
    assert "answered for cell" in results[ids[0]]["error"]
    assert "'../../escaped'" in results[ids[1]]["error"]
    assert "not a result object" in results[ids[2]]["error"]
    assert not (tmp_path.parent / "escaped.json").exists() and outcome.n_failed == 3


def test_run_and_cell_ids_are_names_not_paths(tmp_path):
    from harness.sweep.journal import JournalError

    for bad in ("../x", "/etc", "a/b", ".hidden", "", "x" * 200):
        with pytest.raises(JournalError, match="not a valid name"):
            RunJournal.open(tmp_path, bad)
        with pytest.raises(JournalError, match="not a valid name"):
            RunJournal.create(tmp_path, bad, "t", None, "", CELLS, {})
    journal = RunJournal.create(tmp_path, "20260101-000000-abcdef", "t", None, "", CELLS, {})
    with pytest.raises(JournalError, match="cell id"):
        journal.write_cell({"cell_id": "../../../tmp/x", "status": "ok"})
