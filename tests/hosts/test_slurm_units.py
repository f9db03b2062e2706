"""Slurm hosts without a cluster: hosts.yaml validation (file:line:column), time limits, the
state table, the job script (run by bash, with hostile paths), the sbatch command line, and
how the runner counts a slurm host's failures. tests/hosts/test_slurm.py runs real Slurm."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("asyncssh", reason="asyncssh (a controller dependency) is not installed")

from rich.console import Console  # noqa: E402

from cli_process import run_cli  # noqa: E402
from harness.hosts import slurm_states  # noqa: E402
from harness.hosts.interface import AttemptLost, HostBroken, HostUnavailable, failed_result  # noqa: E402
from harness.hosts.inventory import parse_hosts  # noqa: E402
from harness.hosts.slurm import SlurmHost, _exit_text, slurm_message  # noqa: E402
from harness.hosts.slurm_job import (BatchFolder, JobOptions, job_script, parse_job_id,  # noqa: E402
                                     sbatch_argv, time_limit_for, time_limit_seconds)
from harness.protocol import params  # noqa: E402
from harness.protocol.errors import InputError  # noqa: E402
from harness.sweep import runner  # noqa: E402
from harness.sweep.journal import RunJournal  # noqa: E402


# -- hosts.yaml ----------------------------------------------------------------------------------

def test_a_slurm_entry(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_TOKEN", "tok-9")
    host = parse_hosts(
        "hosts:\n  cluster:\n"
        "    slurm:\n      partition: gpu,gpu-long\n      account: proj-1\n      gres: gpu:h100:2\n"
        "      time_limit: \"02:00:00\"\n      sbatch: [--qos=high, \"--constraint 'h100|a100'\"]\n"
        "      max_tasks: 8\n      poll_s: 5\n"
        "    python: ~/venv/bin/python\n    workdir: /shared/me/harness\n"
        "    labels: {gpu: h100}\n    env: {HF_TOKEN: \"${SPECDEC_TEST_TOKEN}\"}\n",
        "hosts.yaml")["cluster"]
    assert isinstance(host, SlurmHost)
    assert (host.slots, host.poll_s, host.python, host.workdir) == (8, 5.0, "~/venv/bin/python",
                                                                  "/shared/me/harness")
    assert host.options == JobOptions(partition="gpu,gpu-long", account="proj-1", gres="gpu:h100:2",
                                      time_limit="02:00:00",
                                      sbatch=("--qos=high", "--constraint 'h100|a100'"))
    assert host.labels == {"gpu": "h100"} and host.env == {"HF_TOKEN": "tok-9"}
    assert "tok-9" not in repr(host)
    defaults = parse_hosts("hosts:\n  c:\n    slurm: {}\n", "h.yaml")["c"]
    assert (defaults.slots, defaults.poll_s, defaults.python) == (32, 2.0, "python3")
    assert defaults.options == JobOptions()


@pytest.mark.parametrize("text, where, message", [
    ("hosts:\n  c:\n    ssh: c\n    slurm: {}\n", "4:5", "over ssh or through slurm, not both"),
    ("hosts:\n  c:\n    slurm: {}\n    gpus: [0]\n", "4:5", "takes its GPUs from slurm.gres"),
    ("hosts:\n  c:\n    slurm: {}\n    gpu_busy: noisy\n", "4:5", "gpu_busy is a setting of SSH hosts"),
    ("hosts:\n  c:\n    slurm: {}\n    persistent: false\n", "4:5", "persistent is a setting of"),
    ("hosts:\n  local:\n    slurm: {}\n", "3:5", "'local' is this machine: it takes no slurm"),
    ("hosts:\n  c:\n    slurm: yes\n", "3:12", "slurm must be a mapping of Slurm settings"),
    ("hosts:\n  c:\n    slurm: {partion: gpu}\n", "3:13",
     "unknown key 'partion' (expected one of: partition, account, gres, time_limit, sbatch, "
     "max_tasks, poll_s)"),
    ("hosts:\n  c:\n    slurm:\n      partition: 'gpu;reboot'\n", "4:18",
     "partition 'gpu;reboot' is not a Slurm partition name"),
    ("hosts:\n  c:\n    slurm:\n      account: a b\n", "4:16", "account 'a b' is not a Slurm account"),
    ("hosts:\n  c:\n    slurm:\n      gres: gpu 1\n", "4:13", "gres 'gpu 1' is not a Slurm generic"),
    ("hosts:\n  c:\n    slurm:\n      time_limit: 30\n", "4:19",
     'time_limit must be a Slurm time in quotes: "30" (minutes)'),
    ("hosts:\n  c:\n    slurm:\n      time_limit: 1:30\n", "4:19", "got 90"),
    ("hosts:\n  c:\n    slurm:\n      time_limit: 2h\n", "4:19", "got '2h'"),
    ("hosts:\n  c:\n    slurm:\n      time_limit: '0'\n", "4:19", "time_limit 0 would ask for no limit"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: --qos=high\n", "4:15", "sbatch must be a list of sbatch"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [--qos=high, --array=0-9]\n", "4:28",
     "sbatch option --array is not allowed here: the harness makes the job arrays"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [-pgpu]\n", "4:16", "option -p is not allowed here: use partition"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: ['--qos=a --output=/x']\n", "4:16",
     "option --output is not allowed here: the harness keeps each task's log"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [--export=NONE]\n", "4:16",
     "--export is not allowed here: the host's env: reaches the tasks"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [qos=high]\n", "4:16", "must start with - (like --qos=high)"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [\"--qos=a\\nb\"]\n", "4:16", "must be one line of text"),
    ("hosts:\n  c:\n    slurm:\n      sbatch: [\"--comment='x\"]\n", "4:16", "No closing quotation"),
    ("hosts:\n  c:\n    slurm:\n      max_tasks: 0\n", "4:18", "max_tasks must be an integer from 1 to 1000"),
    ("hosts:\n  c:\n    slurm:\n      poll_s: 0.01\n", "4:15", "poll_s must be a number of seconds from 0.2"),
    ("hosts:\n  c:\n    slurm: {}\n    workdir: scratch\n", "4:14", "must be absolute or start with ~/"),
])
def test_slurm_mistakes_are_reported_at_file_line_column(text, where, message):
    with pytest.raises(InputError) as err:
        parse_hosts(text, "hosts.yaml")
    got = str(err.value)
    assert got.startswith(f"hosts.yaml:{where}: ") and message in got, got


def test_a_bad_slurm_entry_is_exit_2_with_one_line_for_run_and_hosts_check(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  c:\n    slurm:\n      gres: 'gpu 1'\n")
    (tmp_path / "one.yaml").write_text("name: one\nmatrix:\n  workload: [noop]\n")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    for args in (["run", "one.yaml", "--host", "c"], ["hosts", "check"]):
        out = run_cli(args, cwd=tmp_path, env=env, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.strip() == ("error: hosts.yaml:4:13: gres 'gpu 1' is not a Slurm generic "
                                      "resource like gpu:1 or gpu:h100:2"), out.stderr
    assert not (tmp_path / "results").exists()


# -- time limits ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("30", 1800), ("0:45", 45), ("1:30", 90), ("02:00:00", 7200), ("1-0", 86400),
    ("1-02:03", 93780), ("1-02:03:04", 93784), ("UNLIMITED", None), ("infinite", None)])
def test_slurm_time_formats(text, seconds):
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "2h", "1:2:3:4", "-5", "1-", "1.5", "30 "])
def test_not_slurm_times(text):
    with pytest.raises(ValueError):
        time_limit_seconds(text)


def test_a_batch_without_a_time_limit_gets_whole_minutes_past_its_longest_cell():
    assert time_limit_for([120]) == "3"                # 120 s + 60 s margin -> 3 minutes
    assert time_limit_for([120, 900, 30]) == "16"
    assert time_limit_for([0.5]) == "2"


# -- what Slurm's words mean ---------------------------------------------------------------------

# squeue(1), "JOB STATE CODES" (Slurm 22.05 to 24.11).
DOCUMENTED_STATES = ["BOOT_FAIL", "CANCELLED", "COMPLETED", "CONFIGURING", "COMPLETING",
                     "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PENDING", "PREEMPTED",
                     "RUNNING", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUED",
                     "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED",
                     "SUSPENDED", "TIMEOUT"]


def test_every_documented_state_has_a_rule_and_the_issue_s_states_the_right_one():
    assert sorted(slurm_states.STATES) == sorted(DOCUMENTED_STATES)
    kind = {s: slurm_states.rule(s).kind for s in DOCUMENTED_STATES}
    assert kind["PENDING"] == slurm_states.WAITING and kind["RUNNING"] == slurm_states.RUNNING
    assert kind["TIMEOUT"] == kind["OUT_OF_MEMORY"] == slurm_states.CELL_FAILED   # not retried
    assert kind["NODE_FAIL"] == kind["PREEMPTED"] == slurm_states.LOST            # retried
    assert kind["COMPLETED"] == kind["FAILED"] == slurm_states.ENDED              # a result
    assert slurm_states.rule("CANCELLED by 1000").kind == slurm_states.CELL_FAILED
    assert slurm_states.rule("SOME_FUTURE_STATE").kind == slurm_states.WAITING
    failing = [s for s, r in slurm_states.STATES.items()
               if r.kind in (slurm_states.CELL_FAILED, slurm_states.LOST)]
    assert all(slurm_states.STATES[s].why and s in slurm_states.STATES[s].why for s in failing)


def test_pending_reasons_and_refusals():
    assert "time limit" in slurm_states.never_starts("PartitionTimeLimit")
    assert slurm_states.never_starts("Resources") is None
    assert slurm_states.never_starts("Priority") is None
    assert slurm_states.is_transient("Batch job submission failed: Socket timed out on send/recv")
    assert slurm_states.is_transient("Unable to contact slurm controller (connect failure)")
    assert not slurm_states.is_transient("Invalid partition name specified")
    assert slurm_message("sbatch: error: invalid partition specified: x\n"
                         "allocation failure: Invalid partition name specified\n") == \
        "Invalid partition name specified"
    assert parse_job_id("1234\n") == "1234" and parse_job_id("99;cluster2") == "99"
    assert parse_job_id("Submitted batch job 5") is None
    assert _exit_text("0:9") == "worker killed by signal SIGKILL"
    assert _exit_text("2:0") == "worker exited with code 2 and no result"
    assert _exit_text(None) == "its exit status is not known"


# -- the job script and the sbatch command -------------------------------------------------------

HOSTILE = "x $(touch PWNED) `touch PWNED` ; 'q\" \\ end"


def fake_python(path: Path) -> Path:
    path.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n'
                    'printf "PYTHONPATH=%s\\n" "$PYTHONPATH"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def run_script(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", **env}, timeout=30)


def test_the_job_script_passes_hostile_paths_as_single_words(tmp_path):
    root = tmp_path / f"work {HOSTILE}"
    folder = BatchFolder(str(root / "jobs" / "b1"))
    bundle = root / "bundles" / "h"
    bundle.mkdir(parents=True)
    python = fake_python(tmp_path / f"py {HOSTILE}")
    (root / "jobs" / "b1" / "out").mkdir(parents=True)        # as the controller makes it
    script = job_script(folder, str(bundle), str(python), str(root / "cache"))
    out = run_script(script, tmp_path, {"SLURM_ARRAY_TASK_ID": "3"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["-m", "harness.worker", "--cells",
                                       folder.cells_file(3), "--out", ".",
                                       f"PYTHONPATH={bundle}"]
    assert (root / "jobs" / "b1" / "out" / "3").is_dir()       # the worker runs in out/3
    assert not list(tmp_path.rglob("PWNED"))

    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    fake_python(home / "venv" / "bin" / "python")
    out = run_script(job_script(folder, str(bundle), "~/venv/bin/python", "/c"), tmp_path,
                     {"SLURM_ARRAY_TASK_ID": "0", "HOME": str(home)})
    assert out.returncode == 0 and out.stdout.startswith("-m\n"), out.stderr   # the node's ~


def test_a_task_whose_batch_folder_is_gone_makes_nothing_again(tmp_path):
    # Ctrl-C: the controller cancelled the batch and removed its folder; a task that starts
    # (or was starting) only now must not make the folder again, and says why in one line.
    folder = BatchFolder(str(tmp_path / "jobs" / "b1"))
    python = fake_python(tmp_path / "py")
    out = run_script(job_script(folder, str(tmp_path), str(python), "/c"), tmp_path,
                     {"SLURM_ARRAY_TASK_ID": "0"})
    assert out.returncode == 75
    assert out.stdout == (f"@@infra the batch folder {folder.root} is gone (a cancelled batch "
                          f"is removed by the controller)\n")
    assert not (tmp_path / "jobs").exists()


def test_the_job_script_says_what_is_wrong_with_the_node_in_one_infra_line(tmp_path):
    folder = BatchFolder(str(tmp_path / "jobs" / "b1"))
    env = {"SLURM_ARRAY_TASK_ID": "0", "SLURMD_NODENAME": "gpu-17"}
    out = run_script(job_script(folder, str(tmp_path / "not-shared"), "python3", "/c"), tmp_path, env)
    assert out.returncode == 75
    assert out.stdout == (f"@@infra the worker code ({tmp_path}/not-shared) is not on node gpu-17: "
                          f"workdir must be a folder the nodes share with the submit host\n")
    out = run_script(job_script(folder, str(tmp_path), "/opt/none/python", "/c"), tmp_path, env)
    assert out.returncode == 75
    assert out.stdout == ("@@infra python '/opt/none/python' not found on node gpu-17 (set "
                          "python: for this host in hosts.yaml)\n")
    out = run_script(job_script(folder, str(tmp_path), "python3", "/c"), tmp_path, {})
    assert out.returncode != 0 and "the harness submits its cells as a job array" in out.stderr


def test_the_sbatch_command():
    folder = BatchFolder("/shared/50%/jobs/b1")
    options = JobOptions(partition="gpu", account="p1", gres="gpu:1",
                         sbatch=("--qos high", "--requeue"))
    argv = sbatch_argv(folder, 3, "harness-c", options, "16")
    assert argv == ["sbatch", "--parsable", "--job-name=harness-c", "--no-requeue", "--time=16",
                    "--partition=gpu", "--account=p1", "--gres=gpu:1", "--qos", "high",
                    "--requeue",                      # after --no-requeue: the user's wins
                    "--array=0-2", "--output=/shared/50%%/jobs/b1/logs/%a.log",
                    "--chdir=/shared/50%/jobs/b1", "/shared/50%/jobs/b1/job.sh"]
    assert JobOptions().argv("3") == ["--no-requeue", "--time=3"]


# -- how the runner counts a cluster's failures --------------------------------------------------

class _Cluster:
    """A host of many slots whose cells fail the way a cluster's do: every cell of a batch
    with the same refusal, or an attempt lost under one cell."""

    def __init__(self, failures):
        self.name, self.slots, self.labels = "cluster", 6, {}
        self.failures = list(failures)       # per call: None (ok), or an exception to raise
        self.calls = 0

    async def run_cell(self, cell, slot, on_progress):
        self.calls += 1
        error = self.failures.pop(0) if self.failures else None
        await asyncio.sleep(0.01)
        if error is not None:
            raise error
        result = failed_result(cell, self.name, "")
        result.update(status="ok", error=None)
        return result


def run_sweep(host, cells, tmp_path):
    journal = RunJournal.create(tmp_path / "runs", f"r{time.monotonic_ns()}", "t", None, "",
                                cells, {})
    return runner.run_cells(cells, [host], journal, Console(file=io.StringIO(), width=200))


def test_one_refusal_reaching_every_slot_counts_once_and_a_lost_attempt_not_at_all(tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setattr(runner, "BACKOFF_S", (0.01,))
    cells = [{"workload": "noop", "seed": i} for i in range(6)]
    refused = HostUnavailable("host cluster: Slurm does not take jobs right now: job submit limit")
    # Six cells refused at once: one failure of the host, not six (MAX_HOST_FAILURES is 4).
    outcome = run_sweep(_Cluster([refused] * 6), cells, tmp_path)
    assert outcome.hosts_lost == {} and outcome.n_failed == 0 and outcome.retries == 6
    # Six nodes failing under six cells: retried, never held against the host.
    lost = [AttemptLost(f"host cluster: Slurm job 7_{i}: its node failed (NODE_FAIL)")
            for i in range(6)]
    outcome = run_sweep(_Cluster(lost), cells, tmp_path)
    assert outcome.hosts_lost == {} and outcome.n_failed == 0
    assert all("NODE_FAIL" in r["infra_retries"][0] for r in outcome.results)
    # Distinct failures still add up, and give the host up.
    outcome = run_sweep(_Cluster([HostUnavailable(f"down {i}") for i in range(40)]), cells,
                        tmp_path)
    assert "cluster" in outcome.hosts_lost and outcome.n_failed == 6


def test_a_host_given_up_runs_no_more_cells_on_its_other_slots(tmp_path):
    """A host of many slots: one cell finds it broken, and the slots still waiting for work
    leave the queue's cells to other hosts (here: none, so they fail saying so)."""
    broken = HostBroken("host cluster: python '/x' not found on node n1")
    host = _Cluster([broken])
    outcome = run_sweep(host, [{"workload": "noop", "seed": i} for i in range(2)], tmp_path)
    assert host.calls == 2                       # each cell once; the broken one not again
    assert outcome.hosts_lost == {"cluster": str(broken)}
    failed = [r for r in outcome.results if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"].startswith("no host left to run it: ")


def test_a_result_is_a_file_the_task_wrote_and_the_host_reads_no_more_than_the_limit(tmp_path,
                                                                                    monkeypatch):
    """The shared folder is trusted no more than a worker's stdout: too large is a failure."""
    from harness.hosts import slurm as slurmmod

    monkeypatch.setattr(slurmmod, "REPLY_LIMIT", 100)
    host = SlurmHost(name="c", python="python3", workdir=str(tmp_path), options=JobOptions())
    cell = params.canonical({"workload": "noop"})

    async def take(data: bytes):
        loop = asyncio.get_running_loop()
        task = slurmmod._Task(cell, lambda p: None, loop.create_future(), 60)
        task.batch = slurmmod._Batch(BatchFolder(str(tmp_path / "b")), [task], loop.create_future(), "5")
        task.index = 0
        path = Path(task.batch.folder.result_file(0, params.cell_id(cell)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        host._state()
        assert host._take_result(task, str(path))
        return task.outcome.result()

    big = asyncio.run(take(b'{"x": "' + b"y" * 200 + b'"}'))
    assert big["status"] == "failed" and "larger than 100 bytes" in big["error"]
    listed = asyncio.run(take(b"[1, 2]"))
    assert listed["status"] == "failed" and "not a result object: list" in listed["error"]
    ok = asyncio.run(take(b'{"cell_id": "abc", "status": "ok"}'))
    assert ok["host"] == "c" and ok["slurm"] == {"job": "5_0", "node": None}
