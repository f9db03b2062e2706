"""Slurm hosts against a real Slurm: munged, slurmctld and slurmd from Debian's packages, one
node (this machine), started for this module (tests/hosts/slurm_cluster.py).

Cells run as root under the project's venv Python (it has torch: the quickstart's decode
cells) or as `noop` cells, which need nothing. The controller runs on this machine, which is
also the submit host and the node; the workdir is a folder of the test's, which "the nodes"
share by being this machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import slurm_cluster
from cli_process import run_cli
import sweep_in_process
from polling import wait_until
from slurm_cluster import NODE, SlurmCluster

pytestmark = pytest.mark.skipif(slurm_cluster.available() is not None,
                                reason=str(slurm_cluster.available()))

from harness.hosts.check import check_all, describe  # noqa: E402
from harness.hosts.inventory import parse_hosts  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")
NOOP = {"workload": "noop", "timeout_s": 120}


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"), scheduler_parameters="batch_sched_delay=0")
    try:
        c.start()
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def slurm_env(cluster, monkeypatch):
    """Slurm's commands (run by the hosts under test) find the test cluster; afterwards no job
    of the test is left in its queue."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    yield
    left = {} if wait_until(lambda: not cluster.live_jobs(), 20) else cluster.live_jobs()
    if left:                       # the next test starts on an empty cluster all the same
        cluster.run("scancel", "--full", "--user", str(os.getuid()))
    cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")   # if a test downed it
    assert not left, left


def slurm_host(name: str, workdir: Path, python: str = VENV_PYTHON, **slurm) -> str:
    """A hosts.yaml entry for the test cluster."""
    settings = {"poll_s": 0.5, **slurm}
    return (f"  {name}:\n    slurm: {json.dumps(settings)}\n    python: {python}\n"
            f"    workdir: {workdir}\n")


def inventory(text: str):
    return parse_hosts("hosts:\n" + text, "hosts.yaml")


def sweep(cells, hosts, tmp_path, background: bool = False):
    return sweep_in_process.sweep(cells, hosts, tmp_path, "slurm-test", background)


def harness(*args, cwd: Path, cluster: SlurmCluster, timeout: int = 240):
    env = dict(cluster.env, COLUMNS="200")
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)     # a task's .pyc files say which code it ran
    return run_cli(args, cwd=cwd, env=env, timeout=timeout)


def running_task(cluster: SlurmCluster, work: Path, wanted) -> str | None:
    """The Slurm id (job_task) of a running task of `work` whose cell `wanted(cell)` picks."""
    for tid, state in cluster.tasks().items():
        if state != "RUNNING":
            continue
        shown = cluster.run("scontrol", "--oneliner", "show", "job", tid).stdout
        command = next((w[len("Command="):] for w in shown.split() if w.startswith("Command=")), "")
        folder = Path(command).parent
        if folder.parent != work / "jobs":
            continue
        cell = json.loads((folder / "cells" / f"{tid.split('_')[1]}.jsonl").read_text())
        if wanted(cell):
            return tid
    return None


def worker_processes(workdir: Path) -> list[str]:
    """The `harness.worker` processes running cells of `workdir` (their argv names it)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True)
    found = []
    for line in out.stdout.splitlines():
        _pid, stat, args = (line.split(None, 2) + ["", ""])[:3]
        if "harness.worker" in args and str(workdir) in args and not stat.startswith("Z"):
            found.append(line.strip())
    return found


# -- the quickstart, a time limit ----------------------------------------------------------------

def test_quickstart_runs_as_one_job_array_and_a_task_past_its_time_limit_fails_as_timeout(
        cluster, tmp_path, fresh_store):
    work = tmp_path / "work"
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + slurm_host("cluster", work))
    # The quickstart's four decode cells, a cell that outlives its task's time limit and one
    # that fails in its workload.
    quickstart = (REPO / "scenarios" / "quickstart.yaml").read_text()
    broken = tmp_path / "broken-checkpoint"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 64}')
    (tmp_path / "sweep.yaml").write_text(
        quickstart + "include:\n  - {workload: noop, sleep_s: 300, timeout_s: 600}\n"
        f"  - {{checkpoint: {broken}}}\n")
    box = {}
    run = threading.Thread(target=lambda: box.update(out=harness(
        "run", "sweep.yaml", "--host", "cluster", "--tracking-uri", fresh_store(tmp_path),
        cwd=tmp_path, cluster=cluster)))
    run.start()
    # Slurm counts time limits in whole minutes and checks them every 30 s, so a task reaches
    # its limit a minute in at the soonest. The test brings the long task's end time to now,
    # which is what reaching its limit is to slurmctld: its own check then ends it as TIMEOUT.
    def long_one():
        return running_task(cluster, work, lambda cell: cell["workload"] == "noop")
    assert wait_until(lambda: long_one() or not run.is_alive(), 90), cluster.tasks()
    long_task = long_one()
    assert long_task, box["out"].stdout + box["out"].stderr
    moved = cluster.run("scontrol", "update", f"JobId={long_task}", "EndTime=now+1")
    assert moved.returncode == 0, moved.stderr
    run.join(180)
    out = box["out"]
    assert out.returncode == 1, out.stdout + out.stderr          # two cells failed
    [run_dir] = (tmp_path / "results" / "runs").iterdir()
    results = [json.loads(p.read_text()) for p in (run_dir / "cells").glob("*.json")]
    assert len(results) == 6
    decode = [r for r in results if r["cell"]["workload"] == "decode" and not r["cell"]["checkpoint"]]
    [timed_out] = [r for r in results if r["cell"]["workload"] == "noop"]
    [broken] = [r for r in results if r["cell"]["checkpoint"]]
    assert all(r["status"] == "ok" and r["metrics"]["tokens_per_s"] > 0 for r in decode), \
        [r.get("error") for r in decode]
    # One job array for the whole sweep, a task per cell.
    assert {r["slurm"]["job"].split("_")[0] for r in results} == {long_task.split("_")[0]}
    assert sorted(int(r["slurm"]["job"].split("_")[1]) for r in results) == [0, 1, 2, 3, 4, 5]
    # A cell failing in its workload is its worker's result (Slurm: FAILED, the worker's exit 1).
    assert broken["status"] == "failed" and broken["error"].startswith("CheckpointError: ")
    assert "infra_retries" not in broken
    assert wait_until(lambda: cluster.tasks()[broken["slurm"]["job"]] == "FAILED", 15)
    assert {r["host"] for r in results} == {"cluster"} and {r["slurm"]["node"] for r in results} == {NODE}
    assert timed_out["status"] == "failed" and "infra_retries" not in timed_out   # not retried
    assert timed_out["error"].startswith("Slurm stopped the task at its time limit (TIMEOUT"), \
        timed_out["error"]
    assert f"Slurm job {long_task} on {NODE}" in timed_out["error"]
    assert cluster.tasks()[long_task] == "TIMEOUT"
    assert "ok cell" in out.stdout and "cluster" in out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    # The array's folder stays for the failed cell's log; the shipped bundle is what ran.
    [batch] = (work / "jobs").iterdir()
    assert (batch / "logs").is_dir() and (batch / "job.sh").is_file()
    [shipped] = (work / "bundles").iterdir()
    assert (shipped / ".complete").exists()
    assert list((shipped / "harness/worker/workloads/__pycache__").glob("decode.*.pyc"))


# -- the controller's own timeout, progress, Ctrl-C ----------------------------------------------

def test_a_cell_past_its_timeout_is_cancelled_and_progress_streams_from_its_log(cluster, tmp_path):
    work = tmp_path / "work"
    host = inventory(slurm_host("c", work, gres="gpu:1"))["c"]
    seen: list[dict] = []

    async def two():
        try:
            return await asyncio.gather(
                host.run_cell(dict(NOOP, sleep_s=300, timeout_s=2, seed=1), 0, seen.append),
                host.run_cell(dict(NOOP, sleep_s=0.5, seed=2), 1, lambda p: None))
        finally:
            await host.close()

    t0 = time.monotonic()
    slow, quick = asyncio.run(two())
    assert time.monotonic() - t0 < 30
    assert quick["status"] == "ok" and quick["slurm"]["node"] == NODE, quick["error"]
    assert slow["status"] == "failed" and slow["error"].startswith("timeout after 2 s (Slurm job ")
    assert cluster.tasks()[slow["slurm"]["job"]] == "CANCELLED"
    stages = [p.get("stage", "") for p in seen]
    assert stages[0].startswith("queued as Slurm job ") and f"running on {NODE}" in stages
    assert "sleep" in stages                       # the worker's own progress, from its log
    assert wait_until(lambda: not worker_processes(work), 15), worker_processes(work)


def test_ctrl_c_cancels_every_task_and_leaves_no_job_behind(cluster, tmp_path, fresh_store):
    work = tmp_path / "work"
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + slurm_host("cluster", work))
    (tmp_path / "long.yaml").write_text(
        "name: long\nmatrix:\n  workload: [noop]\n  sleep_s: [300, 301, 302]\nhosts: [cluster]\n")
    env = dict(cluster.env)
    env.pop("MLFLOW_TRACKING_URI", None)
    before = set(cluster.tasks())
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", "long.yaml",
                             "--tracking-uri", fresh_store(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: len(worker_processes(work)) == 3, 90), \
            (cluster.tasks(), worker_processes(work))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "--resume" in err and "Traceback" not in out + err
    # By the time the controller has exited, Slurm runs nothing of it, and no worker is left.
    assert cluster.live_jobs() == {}
    ours = {tid: state for tid, state in cluster.tasks().items() if tid not in before}
    # Each task ended by the cancel: CANCELLED, or FAILED for one Slurm cancelled as it
    # started (its worker then finds its batch folder removed); none ran to an end of its own.
    assert len(ours) == 3 and "CANCELLED" in ours.values() \
        and set(ours.values()) <= {"CANCELLED", "FAILED"}, \
        [cluster.run("scontrol", "-o", "show", "job", t).stdout for t in ours] + [out, err]
    assert wait_until(lambda: not worker_processes(work), 15), worker_processes(work)
    [run_dir] = (tmp_path / "results" / "runs").iterdir()
    assert list((run_dir / "cells").glob("*.json")) == []          # missing, for --resume
    assert list((work / "jobs").iterdir()) == []                   # nothing failed: no folder


# -- infrastructure failures are retried, cell failures are not ---------------------------------

def test_node_failed_and_preempted_tasks_run_again_and_no_other_result_is_lost(cluster, tmp_path):
    work = tmp_path / "work"
    host = inventory(slurm_host("c", work, gres="gpu:1", max_tasks=2))["c"]
    cells = [dict(NOOP, sleep_s=0, seed=1),              # done before anything fails
             dict(NOOP, sleep_s=4, seed=2), dict(NOOP, sleep_s=4, seed=3)]
    thread, box, journal, out = sweep(cells, [host], tmp_path, background=True)

    def sleepers() -> list[str]:
        found = [running_task(cluster, work, lambda c, s=s: c.get("seed") == s) for s in (2, 3)]
        return [t for t in found if t]

    # Both sleepers run (and hold the node's two GPUs): the node goes down under them.
    assert wait_until(lambda: len(sleepers()) == 2, 60), cluster.tasks()
    assert cluster.run("scontrol", "update", f"NodeName={NODE}", "State=DOWN",
                       "Reason=test").returncode == 0
    assert wait_until(lambda: list(cluster.tasks().values()).count("NODE_FAIL") == 2, 30), \
        cluster.tasks()
    cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
    # Run again, both: an urgent job's GPU comes from one of them.
    assert wait_until(lambda: len(sleepers()) == 2, 60), cluster.tasks()
    urgent = cluster.run("sbatch", "--parsable", "--partition=urgent", "--gres=gpu:1",
                         "--output=/dev/null", "--wrap=sleep 1")
    assert urgent.returncode == 0, urgent.stderr
    thread.join(120)
    outcome = box["outcome"]

    results = {r["cell"]["seed"]: r for r in journal.results().values()}
    assert sorted(results) == [1, 2, 3], out.getvalue()
    assert all(r["status"] == "ok" for r in results.values()), [r.get("error") for r in results.values()]
    assert "infra_retries" not in results[1]
    assert all("NODE_FAIL" in r["infra_retries"][0] for r in (results[2], results[3]))
    retries = [r["infra_retries"] for r in (results[2], results[3])]
    assert sorted(len(r) for r in retries) == [1, 2], retries
    assert "PREEMPTED" in max(retries, key=len)[1], retries
    assert outcome.hosts_lost == {} and outcome.retries == 3       # the host was never given up


# -- a host Slurm refuses ------------------------------------------------------------------------

def test_a_host_slurm_refuses_is_one_line_for_run_and_for_hosts_check(cluster, tmp_path, fresh_store):
    work = tmp_path / "work"
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n" + slurm_host("nopart", work, partition="no-such-partition")
        + slurm_host("nopython", work, python="/nonexistent/python3")
        + slurm_host("good", work))
    (tmp_path / "one.yaml").write_text("name: one\nmatrix:\n  workload: [noop]\n")

    out = harness("run", "one.yaml", "--host", "nopart", "--tracking-uri",
                  fresh_store(tmp_path), cwd=tmp_path, cluster=cluster)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    [line] = [ln.strip() for ln in text.splitlines() if "host nopart given up:" in ln]
    assert line == ("host nopart given up: host nopart: Slurm refuses the job as hosts.yaml "
                    "sets it up: Invalid partition name specified"), line
    assert "Traceback" not in text

    # A Python the nodes do not have: the job script says so, once, for the host.
    hosts = parse_hosts((tmp_path / "hosts.yaml").read_text(), "hosts.yaml")
    outcome, _, printed = sweep([dict(NOOP, seed=1), dict(NOOP, seed=2)], [hosts["nopython"]],
                                tmp_path)
    [line] = [ln.strip() for ln in printed.splitlines() if "host nopython given up:" in ln]
    assert line == (f"host nopython given up: host nopython: python '/nonexistent/python3' "
                    f"not found on node {NODE} (set python: for this host in hosts.yaml)"), line
    assert outcome.n_failed == 2 and all("no host left to run it" in r["error"]
                                         for r in outcome.results), outcome.results

    check = harness("hosts", "check", "nopart", "good", cwd=tmp_path, cluster=cluster)
    assert check.returncode == 1, check.stdout + check.stderr
    nopart, good = check.stdout.strip().splitlines()
    assert nopart == "nopart: partition 'no-such-partition' does not exist", nopart
    assert good.startswith("good: Slurm answers, partition debug (default) up: 1 node(s)"), good
    assert "gres gpu:2" in good and "sbatch --test-only" in good and "torch 2." in good, good
    assert harness("hosts", "check", "good", cwd=tmp_path, cluster=cluster).returncode == 0


def test_hosts_check_without_slurm_on_the_path_says_so(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    host = inventory(slurm_host("c", tmp_path / "work"))["c"]
    facts = asyncio.run(check_all([host]))[0]
    ok, line = describe(facts)
    assert not ok and line == ("c: [red]unreachable — [/]sinfo not found on this machine "
                               "(Slurm's commands must be on the PATH where the controller runs)")
