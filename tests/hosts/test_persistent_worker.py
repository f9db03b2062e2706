"""Serving workers: LocalHost(persistent=True) runs a slot's cells in one long-lived
`python -m harness.worker --serve` process, and every way that process can go wrong stays the
failure of one cell, with a fresh process for the next one.

Real subprocesses throughout. Where a test needs a workload that misbehaves, the host runs a
stand-in interpreter (a shell script, as in test_hosts.py) whose `-m harness.worker` starts the
real worker with the noop workload swapped for the one in CHATTY, which picks its misbehaviour
by the cell's seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from polling import wait_until

from harness.hosts import local as hosts
from harness.hosts.local import BadReply, LocalHost, _group_alive, check_reply, serves
from harness.protocol import params

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def noop(seed: int, **extra) -> dict:
    return {"workload": "noop", "seed": seed, "timeout_s": 30, **extra}


def run_all(host: LocalHost, cells: list[dict], slot: int = 0) -> list[dict]:
    """Run `cells` one after the other on one slot, then close the host, in one event loop."""
    async def go():
        try:
            return [await host.run_cell(c, slot, lambda _p: None) for c in cells]
        finally:
            await host.close()
    return asyncio.run(go())


def pid_of(result: dict) -> int:
    return result["metrics"]["worker_pid"]


# -- the stand-in worker ----------------------------------------------------------------------

CHATTY = textwrap.dedent('''
    """The real worker, with `noop` replaced by a workload that misbehaves by seed."""
    import ctypes, json, os, sys
    sys.path.insert(0, {repo!r})
    from harness.worker import main as worker, workloads
    def chatty(cell, progress):
        seed = cell["seed"]
        print(f"log of seed {{seed}}", file=sys.stderr, flush=True)
        if seed == 1:           # stray output on every channel a workload (or a library) has
            print("stray print from python", flush=True)
            os.write(1, b"stray write to fd 1\\n")
            libc = ctypes.CDLL(None)
            libc.printf(b"stray printf from C\\n")
            libc.fflush(None)
        if seed == 2:           # the workload raises: a failed cell, from a sound process
            raise RuntimeError("boom in seed 2")
        if seed == 3:           # the process dies under the cell, after some output
            print("stray print before dying", flush=True)
            print("dying in seed 3", file=sys.stderr, flush=True)
            os._exit(3)
        if seed == 6:           # a reply far over the host's limit (set small by the test)
            return {{"metrics": {{"worker_pid": os.getpid()}}, "samples": {{"x": [0.5] * 50000}}}}
        return {{"metrics": {{"worker_pid": os.getpid()}}, "samples": {{}}}}

    workloads.REGISTRY["noop"] = "__main__:chatty"

    # Seeds 4 and 5: the worker answers out of turn (another seq) or for another cell.
    write_line = worker._write_line
    def tampered(fd, reply):
        data = json.loads(reply) if isinstance(reply, str) else dict(reply)
        seed = (data.get("cell") or {{}}).get("seed")
        if seed == 4:
            data["seq"] = (data["seq"] or 0) + 100
        if seed == 5:
            data["cell_id"] = "0123456789ab"
        write_line(fd, json.dumps(data))
    worker._write_line = tampered

    args = sys.argv[1:]
    assert args[:2] == ["-m", "harness.worker"], args
    sys.exit(worker.main(args[2:]))
''')


@pytest.fixture
def chatty_python(tmp_path: Path) -> str:
    script = tmp_path / "chatty_worker.py"
    script.write_text(CHATTY.format(repo=str(REPO)))
    wrapper = tmp_path / "python"
    # `python -m harness.worker ...` runs the stand-in; anything else (the host asking where
    # its interpreter finds harness.worker) the real interpreter.
    wrapper.write_text(f'#!/bin/sh\n[ "$1" = -m ] || exec {sys.executable} "$@"\n'
                       f'exec {sys.executable} {script} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper)


# -- one process for many cells ---------------------------------------------------------------

def test_many_cells_run_in_one_process_in_order():
    cells = [noop(i) for i in range(25)]
    seen: list[tuple[int, dict]] = []
    host = LocalHost(persistent=True)

    async def go():
        try:
            out = []
            for i, c in enumerate(cells):
                out.append(await host.run_cell(c, 0, lambda p, i=i: seen.append((i, p))))
            return out
        finally:
            await host.close()
    results = asyncio.run(go())
    assert [r["status"] for r in results] == ["ok"] * len(cells)
    assert [r["cell_id"] for r in results] == [params.cell_id(c) for c in cells]
    assert [r["cell"]["seed"] for r in results] == list(range(len(cells)))
    assert all(r["host"] == "local" and "seq" not in r for r in results)
    assert len({pid_of(r) for r in results}) == 1 and pid_of(results[0]) != os.getpid()
    # Each cell's progress went to that cell's callback, and only there.
    assert sorted(i for i, p in seen if p.get("stage") == "sleep") == list(range(len(cells)))


def test_each_slot_has_its_own_process():
    host = LocalHost(persistent=True, gpus=[3, 5])

    async def go():
        try:
            return await asyncio.gather(*(host.run_cell(noop(i), i % 2, lambda _p: None)
                                          for i in range(2)))
        finally:
            await host.close()
    first, second = asyncio.run(go())
    assert first["status"] == second["status"] == "ok"
    assert pid_of(first) != pid_of(second)


def test_stray_output_of_a_workload_does_not_corrupt_the_results(chatty_python):
    results = run_all(LocalHost(python=chatty_python, persistent=True), [noop(1), noop(0), noop(1)])
    assert [r["status"] for r in results] == ["ok"] * 3, results[0].get("error")
    assert [r["cell"]["seed"] for r in results] == [1, 0, 1]
    assert len({pid_of(r) for r in results}) == 1


def test_stray_output_goes_to_the_cells_stderr_tail(chatty_python):
    # The cell that dies shows its own stray prints (they went to stderr) and its own log,
    # not the log of the cell before it.
    ok, dead = run_all(LocalHost(python=chatty_python, persistent=True), [noop(0), noop(3)])
    assert ok["status"] == "ok"
    assert dead["status"] == "failed" and dead["error"].startswith("worker exited with code 3")
    assert "stray print before dying" in dead["error"] and "dying in seed 3" in dead["error"]
    assert "log of seed 3" in dead["error"] and "log of seed 0" not in dead["error"]


def test_serve_mode_protocol_errors_end_the_worker():
    import subprocess
    env = dict(os.environ, PYTHONPATH=str(REPO))
    good = json.dumps({"seq": 7, "cell": noop(0)})
    for bad in ("not json", json.dumps({"cell": noop(0)}), json.dumps([1, 2])):
        out = subprocess.run([sys.executable, "-m", "harness.worker", "--serve"],
                             input=f"{good}\n{bad}\n{good}\n", capture_output=True, text=True,
                             env=env, timeout=30)
        assert out.returncode == 2, out.stderr
        first, second = out.stdout.splitlines()          # nothing after the bad line
        assert json.loads(first)["seq"] == 7 and json.loads(first)["status"] == "ok"
        assert json.loads(second)["seq"] is None and json.loads(second)["status"] == "failed"
    out = subprocess.run([sys.executable, "-m", "harness.worker", "--serve"], input="",
                         capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0 and out.stdout == ""      # EOF: a clean exit


# -- a cell's failure stays its own -----------------------------------------------------------

def test_timeout_kills_the_group_and_the_next_cell_gets_a_fresh_process():
    host = LocalHost(persistent=True)

    async def go():
        try:
            before = await host.run_cell(noop(0), 0, lambda _p: None)
            slow = await host.run_cell(noop(1, sleep_s=30, timeout_s=1), 0, lambda _p: None)
            gone = not _group_alive(pid_of(before))      # by the time the result is in
            after = await host.run_cell(noop(2), 0, lambda _p: None)
            return before, slow, gone, after
        finally:
            await host.close()
    before, slow, gone, after = asyncio.run(go())
    assert slow["status"] == "failed" and slow["error"].startswith("timeout after 1 s")
    assert slow["cell_id"] == params.cell_id(noop(1, sleep_s=30, timeout_s=1))
    assert gone
    assert after["status"] == "ok" and pid_of(after) != pid_of(before)


def test_a_worker_killed_mid_cell_fails_that_cell_only():
    host = LocalHost(persistent=True)

    async def go():
        try:
            before = await host.run_cell(noop(0), 0, lambda _p: None)
            sleeping = asyncio.Event()
            task = asyncio.ensure_future(host.run_cell(
                noop(1, sleep_s=30), 0, lambda p: p.get("stage") == "sleep" and sleeping.set()))
            await asyncio.wait_for(sleeping.wait(), 10)
            os.kill(pid_of(before), signal.SIGKILL)     # as the OOM killer would
            killed = await task
            after = await host.run_cell(noop(2), 0, lambda _p: None)
            return before, killed, after
        finally:
            await host.close()
    before, killed, after = asyncio.run(go())
    assert killed["status"] == "failed" and "worker killed by signal SIGKILL" in killed["error"]
    assert killed["cell"]["seed"] == 1
    assert after["status"] == "ok" and pid_of(after) != pid_of(before)


def test_a_failed_cell_recycles_the_process(chatty_python):
    first, failed, after = run_all(LocalHost(python=chatty_python, persistent=True),
                                   [noop(0), noop(2), noop(0)])
    assert failed["status"] == "failed" and "boom in seed 2" in failed["error"]
    assert failed["host"] == "local"
    assert not _group_alive(pid_of(first))
    assert after["status"] == "ok" and pid_of(after) != pid_of(first)


@pytest.mark.parametrize("seed,why", [(4, "seq 101 in the reply to request 1"),
                                      (5, "cell id '0123456789ab' in the reply")])
def test_a_reply_out_of_turn_fails_the_cell_and_ends_the_process(chatty_python, seed, why):
    bad, after = run_all(LocalHost(python=chatty_python, persistent=True), [noop(seed), noop(0)])
    assert bad["status"] == "failed" and bad["error"].startswith("worker sent a bad reply: ")
    assert why in bad["error"] and bad["cell_id"] == params.cell_id(noop(seed))
    assert after["status"] == "ok"


def test_a_reply_over_the_limit_is_refused(chatty_python, monkeypatch):
    monkeypatch.setattr(hosts, "REPLY_LIMIT", 64 * 1024)
    big, after = run_all(LocalHost(python=chatty_python, persistent=True), [noop(6), noop(0)])
    assert big["status"] == "failed" and "longer than 65536 bytes" in big["error"]
    assert after["status"] == "ok"


def test_check_reply_accepts_only_this_cells_reply():
    cell = noop(3)
    good = {"seq": 9, "cell_id": params.cell_id(cell), "cell": params.canonical(cell),
            "status": "ok"}
    assert check_reply(json.dumps(good).encode(), 9, cell)["status"] == "ok"
    wrong_id = dict(good, cell_id=params.cell_id(noop(4)))
    with pytest.raises(BadReply, match="cell id"):
        check_reply(json.dumps(wrong_id).encode(), 9, cell)
    with pytest.raises(BadReply, match="seq 9 in the reply to request 10"):
        check_reply(json.dumps(good).encode(), 10, cell)
    with pytest.raises(BadReply, match="not a JSON object"):
        check_reply(b"[1, 2]\n", 9, cell)
    with pytest.raises(BadReply, match="not JSON"):
        check_reply(b"Traceback (most recent call last):\n", 9, cell)
    # A tree with other ids (the A/B gate's base): the cell's own parameters must come back.
    other_tree = dict(good, cell_id="whatever-its-params-say")
    assert check_reply(json.dumps(other_tree).encode(), 9, cell, check_id=False)
    other_cell = dict(other_tree, cell=params.canonical(noop(4)))
    with pytest.raises(BadReply, match="not the cell sent"):
        check_reply(json.dumps(other_cell).encode(), 9, cell, check_id=False)


# -- ending: close(), Ctrl-C, the end of the event loop ---------------------------------------

def test_close_leaves_no_process_and_a_new_loop_starts_afresh():
    host = LocalHost(persistent=True)
    [first] = run_all(host, [noop(0)])                   # run_all closes the host
    assert first["status"] == "ok" and not _group_alive(pid_of(first))
    [second] = run_all(host, [noop(1)])
    assert second["status"] == "ok" and pid_of(second) != pid_of(first)


def test_the_workers_end_with_their_event_loop_without_close():
    host = LocalHost(persistent=True)
    result = asyncio.run(host.run_cell(noop(0), 0, lambda _p: None))   # nobody calls close()
    assert result["status"] == "ok" and not _group_alive(pid_of(result))


def test_cancelling_a_cell_kills_the_process_group():
    host = LocalHost(persistent=True)

    async def go():
        before = await host.run_cell(noop(0), 0, lambda _p: None)
        sleeping = asyncio.Event()
        task = asyncio.ensure_future(host.run_cell(
            noop(1, sleep_s=30), 0, lambda p: p.get("stage") == "sleep" and sleeping.set()))
        await asyncio.wait_for(sleeping.wait(), 10)
        task.cancel()                                    # what Ctrl-C does to a running cell
        with pytest.raises(asyncio.CancelledError):
            await task
        # The kill is sent before the cancellation goes on: no close() needed for that.
        killed = await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: not _group_alive(pid_of(before)), 5.0)
        await host.close()
        return killed
    assert asyncio.run(go())


# -- trees that cannot serve, and the settings that choose ------------------------------------

def test_a_tree_whose_worker_cannot_serve_runs_a_process_per_cell(tmp_path):
    old = tmp_path / "old-commit"
    shutil.copytree(REPO / "harness", old / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wire = old / "harness" / "protocol" / "wire.py"     # a tree of another serve protocol
    wire.write_text(wire.read_text().replace("SERVE_PROTOCOL = 1", "SERVE_PROTOCOL = 0"))
    assert serves(None) and serves(REPO) and not serves(old) and not serves(tmp_path / "none")
    host = LocalHost(persistent=True).for_code_tree(old)
    assert host.persistent and host.code_root == str(old)
    results = run_all(host, [noop(0), noop(1)])
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert pid_of(results[0]) != pid_of(results[1])


def test_without_a_code_root_the_worker_found_from_the_working_directory_decides(tmp_path,
                                                                                 monkeypatch):
    # `python -m harness.worker` runs the `harness` of the working directory first: here an
    # older checkout's, which cannot serve, though this controller's can.
    old = tmp_path / "old-checkout"
    shutil.copytree(REPO / "harness", old / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wire = old / "harness" / "protocol" / "wire.py"
    wire.write_text(wire.read_text().replace("SERVE_PROTOCOL = 1", "SERVE_PROTOCOL = 0"))
    monkeypatch.chdir(old)
    results = run_all(LocalHost(persistent=True), [noop(0), noop(1)])
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert pid_of(results[0]) != pid_of(results[1])


def test_the_local_host_serves_unless_the_hosts_file_says_not(tmp_path):
    from harness.hosts.inventory import load_hosts, parse_hosts
    from harness.protocol.errors import InputError
    assert hosts.local_hosts()["local"].persistent
    assert parse_hosts("")["local"].persistent
    assert parse_hosts("hosts: {}\n")["local"].persistent
    assert parse_hosts("hosts:\n  local:\n    gpus: [0]\n")["local"].persistent
    assert not parse_hosts("hosts:\n  local:\n    persistent: false\n")["local"].persistent
    with pytest.raises(InputError, match="persistent must be true or false"):
        parse_hosts("hosts:\n  local:\n    persistent: 'no'\n", "hosts.yaml")
    with pytest.raises(InputError, match="local host only") as err:
        parse_hosts("hosts:\n  gpu-a:\n    ssh: gpu-a\n    persistent: false\n", "hosts.yaml")
    assert (err.value.line, err.value.column) == (4, 5)
    missing = tmp_path / "nowhere" / "hosts.yaml"
    with pytest.raises(InputError):
        load_hosts(missing)


def test_fresh_workers_flag_makes_the_local_host_start_a_process_per_cell(fresh_store, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from harness import cli
    from harness.sweep import runner
    chosen = {}

    class Stop(Exception):
        pass

    def fake_run_cells(cells, host_list, journal, console):
        chosen["persistent"] = [h.persistent for h in host_list]
        raise Stop

    monkeypatch.setattr(runner, "run_cells", fake_run_cells)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sc.yaml").write_text("name: t\nmatrix:\n  workload: [noop]\n")
    base = ["run", "sc.yaml", "--tracking-uri", fresh_store(tmp_path, "m.db"),
            "--results", str(tmp_path / "results")]
    for extra, expected in (([], [True]), (["--fresh-workers"], [False])):
        out = CliRunner().invoke(cli.app, base + extra)
        assert isinstance(out.exception, Stop), out.output
        assert chosen["persistent"] == expected
