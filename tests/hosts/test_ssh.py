"""Remote hosts over SSH, against real OpenSSH servers on 127.0.0.1 (tests/sshd_server.py).

Each test starts the sshd instances it needs (a fraction of a second each) and a client HOME of
its own (~/.ssh/config, known_hosts, key), so nothing here reads or writes /root/.ssh. Cells run
either as root with the project's venv Python (it has torch: real decode cells) or as the
non-root user TEST_USER with the system Python and the `noop` workload, whose processes `ps -u`
can tell apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from cli_process import run_cli
import sweep_in_process
from polling import wait_until

asyncssh = pytest.importorskip("asyncssh", reason="asyncssh (a controller dependency) is not installed")

import sshd_server
from sshd_server import TEST_USER, LoopbackSSH, user_processes

from harness.sweep import runner
from harness.hosts.check import check_all, describe
from harness.hosts.interface import HostBroken, HostUnavailable
from harness.hosts.inventory import parse_hosts

pytestmark = pytest.mark.skipif(sshd_server.available() is not None,
                                reason=str(sshd_server.available()))

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python")
HARNESS = [sys.executable, "-m", "harness.cli"]
NOOP = {"workload": "noop", "timeout_s": 120}
# In the names of this run's work dirs: tells its processes and folders from those of another
# run of these tests (or of tests/bench_ssh.py) on the same machine.
TOKEN = os.urandom(4).hex()
# The controller with a SIGUSR1 handler that prints every thread's and asyncio task's stack:
# what a test that finds it hung reports.
DUMPS_TASKS_ON_SIGUSR1 = """
import asyncio, faulthandler, signal, sys
def dump(*_):
    print("SIGINT handler:", signal.getsignal(signal.SIGINT), file=sys.stderr)
    for status in __import__("glob").glob("/proc/self/task/*/status"):
        print(status, [ln for ln in open(status) if ln.startswith(("Sig", "Shd"))], file=sys.stderr)
    faulthandler.dump_traceback(all_threads=True)
    for task in asyncio.all_tasks():
        task.print_stack(file=sys.stderr)
signal.signal(signal.SIGUSR1, dump)
sys.argv[0] = "harness"
from harness.cli import main
main()
"""
TINY = {"model": "tiny", "device": "cpu", "warmup_steps": 0, "steps": 2, "repeats": 1,
        "profile_steps": 0, "context_length": 32, "timeout_s": 300}


# -- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sshd_server.ensure_test_user()
    w = LoopbackSSH(tmp_path_factory.mktemp("ssh"))
    yield w
    w.close()
    # The test user's work dirs (bundles, locks) are ours: leave its home as we found it.
    home = Path(pwd.getpwnam(TEST_USER).pw_dir)
    for d in (home / ".cache").glob(f"specdec-harness-test-{TOKEN}-*"):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def public(tmp_path):
    """A folder the test user can read (and write, inside `own/`): tmp_path is root's only."""
    d = Path(tempfile.mkdtemp(prefix=f"specdec-ssh-{TOKEN}-"))
    d.chmod(0o755)
    own = d / "own"
    own.mkdir()
    user = pwd.getpwnam(TEST_USER)
    os.chown(own, user.pw_uid, user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_stray_processes():
    yield
    # Whatever a test did, the test user must have no harness process left afterwards.
    assert wait_until(lambda: not ours("harness"), 15), ours("harness")


def ours(needle: str) -> list[str]:
    """The test user's processes of this test run whose command line contains `needle`."""
    return user_processes(TEST_USER, needle, cwd_contains=TOKEN)


def user_host(name: str, server, python: str = "/usr/bin/python3", **extra) -> str:
    """A hosts.yaml entry logging in as the non-root test user."""
    lines = [f"  {name}:", f"    ssh: {TEST_USER}@127.0.0.1:{server.port}",
             f"    python: {python}", f"    workdir: ~/.cache/specdec-harness-test-{TOKEN}-{name}"]
    lines += [f"    {k}: {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def inventory(text: str):
    return parse_hosts("hosts:\n" + text, "hosts.yaml")


def shim(public: Path, body: str) -> str:
    """A stand-in for the host's Python: a shell script that does `body`, then runs python3."""
    path = public / "python-shim"
    path.write_text(f"#!/bin/sh\n{body}\nexec /usr/bin/python3 \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def sweep(cells, hosts, tmp_path, background: bool = False):
    return sweep_in_process.sweep(cells, hosts, tmp_path, "ssh-test", background)


def harness(*args, home: Path, cwd: Path, env: dict | None = None, timeout: int = 240):
    full = dict(os.environ, HOME=str(home), COLUMNS="200", **(env or {}))
    full.pop("MLFLOW_TRACKING_URI", None)
    return run_cli(args, cwd=cwd, env=full, timeout=timeout)


# -- a sweep over two hosts ----------------------------------------------------------------------

def test_quickstart_sweep_runs_the_shipped_bundle_on_two_ssh_hosts(fresh_store, world, tmp_path):
    a, b = world.start_sshd(), world.start_sshd()
    home = world.home(known=[a, b])
    secret = "s3cr3t-$(touch /tmp/never) ; 'q\"-" + os.urandom(6).hex()
    hosts = "hosts:\n"
    for name, server in (("a", a), ("b", b)):
        hosts += (f"  {name}:\n"
                  f"    ssh: root@127.0.0.1:{server.port}\n"
                  f"    python: {VENV_PYTHON}\n"
                  f"    workdir: {tmp_path}/work-{name}\n"
                  "    labels: {gpu: loopback}\n"
                  '    env: {HARNESS_TEST_TOKEN: "${SPECDEC_TEST_SECRET}"}\n')
    (tmp_path / "hosts.yaml").write_text(hosts)
    (tmp_path / "sweep.yaml").write_text(
        "name: ssh-quickstart\n"
        f"defaults: {json.dumps(TINY)}\n"
        "matrix:\n  tree_budget: [4, 8]\n"
        "hosts: [{gpu: loopback}]\n")

    env = dict(os.environ, HOME=str(home), COLUMNS="200", SPECDEC_TEST_SECRET=secret)
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([*HARNESS, "run", "sweep.yaml", "--tracking-uri",
                             fresh_store(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # While it runs: the secret reaches the workers' environment, and no command line.
    environs, cmdlines = [], []
    while proc.poll() is None:
        for pid in a.worker_pids() + b.worker_pids():
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes())
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, out + err

    assert environs, "never saw a worker running"
    assert all(f"HARNESS_TEST_TOKEN={secret}".encode() in e.split(b"\0") for e in environs)
    assert not any(secret.encode() in c for c in cmdlines)
    run_dir = next((tmp_path / "results" / "runs").iterdir())
    results = [json.loads(p.read_text()) for p in (run_dir / "cells").glob("*.json")]
    assert len(results) == 2 and all(r["status"] == "ok" for r in results)
    assert {r["host"] for r in results} <= {"a", "b"}
    assert all(r["metrics"]["tokens_per_s"] > 0 for r in results)
    # Secrets are never journaled, logged, or stored in MLflow.
    for path in [*tmp_path.joinpath("results").rglob("*"), tmp_path / "mlflow.db"]:
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in out + err

    # The shipped bundle is what ran: one folder per content hash, and Python compiled the
    # bundle's own modules there (not the controller's checkout).
    for name in ("a", "b"):
        [shipped] = (tmp_path / f"work-{name}" / "bundles").iterdir()
        assert len(shipped.name) == 16 and (shipped / ".complete").exists() and (shipped / "harness/kernels/__init__.py").exists()
        assert not (shipped / "harness" / "dashboards").exists()
        if any(r["host"] == name for r in results):
            assert list((shipped / "harness/worker/workloads/__pycache__").glob("decode.*.pyc"))
    assert "a" in out and "b" in out and " done" in out           # a progress line per host


# -- host keys -----------------------------------------------------------------------------------

def test_unknown_or_changed_host_key_is_refused_and_accept_new_is_an_opt_in(world, tmp_path, monkeypatch):
    server, other = world.start_sshd(), world.start_sshd()
    home = world.home(known=[])
    monkeypatch.setenv("HOME", str(home))
    known_hosts = home / ".ssh" / "known_hosts"
    strict = inventory(user_host("c", server))["c"]

    facts = asyncio.run(check_all([strict]))[0]
    ok, line = describe(facts)
    assert not ok and facts["host_key"] == "unknown"
    assert f"ssh-keyscan -p {server.port} 127.0.0.1 >> ~/.ssh/known_hosts" in line
    assert "accept-new" in line and "\n" not in line
    assert known_hosts.read_text() == ""                     # nothing accepted silently
    with pytest.raises(HostBroken, match="is unknown"):
        asyncio.run(strict.prepare())

    # A different key on file for this host: changed, refused, whatever the policy.
    known_hosts.write_text(other.known_hosts_line().replace(str(other.port), str(server.port)))
    lenient = inventory(user_host("c", server, known_hosts="accept-new"))["c"]
    for host in (strict, lenient):
        facts = asyncio.run(check_all([host]))[0]
        assert facts["host_key"] == "changed" and "CHANGED" in facts["error"]
        assert f"ssh-keygen -R '[127.0.0.1]:{server.port}'" in facts["error"]

    # accept-new trusts a key never seen before, and remembers it.
    known_hosts.write_text("")
    facts = asyncio.run(check_all([lenient]))[0]
    assert not facts.get("error") and facts["host_key"] == "accepted-new", facts.get("error")
    assert known_hosts.read_text().split() == server.known_hosts_line().split()
    facts = asyncio.run(check_all([strict]))[0]
    assert not facts.get("error") and facts["host_key"] == "known"

    out = harness("hosts", "check", "--hosts", str(tmp_path / "missing.yaml"), home=home, cwd=tmp_path)
    assert out.returncode == 2 and "no such hosts file" in out.stderr


# -- ssh_config: alias, User, Port, IdentityFile, ProxyJump --------------------------------------

def test_alias_and_proxyjump_from_ssh_config(world, tmp_path, monkeypatch):
    jump, target = world.start_sshd(), world.start_sshd()
    home = world.home(known=[jump, target], config=textwrap.dedent(f"""\
        Host jumpbox
          HostName 127.0.0.1
          Port {jump.port}
          User root
          IdentityFile ~/.ssh/keys/harness
          IdentitiesOnly yes
        Host gpu-behind
          HostName 127.0.0.1
          Port {target.port}
          User {TEST_USER}
          IdentityFile ~/.ssh/keys/harness
          IdentitiesOnly yes
          ProxyJump jumpbox
        """))
    keys = home / ".ssh" / "keys"
    keys.mkdir()
    (home / ".ssh" / "id_ed25519").rename(keys / "harness")    # only IdentityFile finds it
    monkeypatch.setenv("HOME", str(home))
    hosts = inventory("  behind:\n    ssh: gpu-behind\n    python: /usr/bin/python3\n"
                      f"    workdir: ~/.cache/specdec-harness-test-{TOKEN}-proxy\n"
                      "  jumpbox:\n    ssh: jumpbox\n    python: /usr/bin/python3\n"
                      f"    workdir: {tmp_path}/work-jump\n")
    jump_logins = jump.log.read_text().count("Accepted publickey for root")

    outcome, journal, _ = sweep([dict(NOOP, seed=1)], [hosts["behind"]], tmp_path)
    [result] = outcome.results
    assert result["status"] == "ok" and result["host"] == "behind", result["error"]
    assert f"Accepted publickey for {TEST_USER}" in target.log.read_text()
    assert jump.log.read_text().count("Accepted publickey for root") == jump_logins + 1

    facts = asyncio.run(check_all([hosts["jumpbox"]]))[0]     # a plain alias, User from config
    assert not facts.get("error"), facts

    (home / ".ssh" / "known_hosts").write_text(jump.known_hosts_line())   # target unknown
    facts = asyncio.run(check_all([hosts["behind"]]))[0]
    assert facts["host_key"] == "unknown"
    assert f"[127.0.0.1]:{target.port} (or of its ProxyJump host jumpbox) is unknown" in facts["error"]


# -- faults --------------------------------------------------------------------------------------

def test_killed_sshd_mid_cell_retries_on_the_other_host_and_loses_nothing(world, tmp_path, monkeypatch):
    x, y = world.start_sshd(), world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[x, y])))
    monkeypatch.setattr(runner, "BACKOFF_S", (0.2, 0.4, 0.8))
    hosts = inventory(user_host("x", x) + user_host("y", y))
    cells = [dict(NOOP, sleep_s=1.5, seed=i) for i in range(3)]
    thread, box, journal, out = sweep(cells, [hosts["x"], hosts["y"]], tmp_path, background=True)

    assert wait_until(lambda: x.worker_pids(), 60), "no cell ever started on x"
    x.kill_hard()                                  # the host's sshd dies under a running cell
    thread.join(120)
    outcome = box["outcome"]

    results = journal.results()
    assert len(results) == 3 and all(r["status"] == "ok" for r in results.values()), out.getvalue()
    retried = [r for r in results.values() if r.get("infra_retries")]
    assert retried and all(r["host"] == "y" for r in retried)
    assert "connection lost" in retried[0]["infra_retries"][0]
    assert outcome.retries >= 1 and not outcome.interrupted
    # The orphaned launcher on x saw its stdin close and took its worker down with it.
    assert wait_until(lambda: not ours("harness"), 15)


def test_timeout_kills_the_remote_process_group(world, tmp_path, public, monkeypatch):
    server = world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[server])))
    # The "python" leaves a grandchild in the cell's process group: it must die too.
    python = shim(public, 'case "$*" in *harness.remote*) sleep 299.5 & ;; esac')
    host = inventory(user_host("t", server, python=python))["t"]
    thread, box, journal, _ = sweep([dict(NOOP, sleep_s=300, timeout_s=3)], [host], tmp_path,
                                    background=True)
    assert wait_until(lambda: ours("harness.worker")
                      and ours("sleep 299.5"), 60)
    thread.join(120)
    [result] = box["outcome"].results
    assert result["status"] == "failed" and result["error"].startswith("timeout after 3 s")
    assert wait_until(lambda: not ours("harness")
                      and not ours("sleep 299.5"), 15), \
        ours("")


def test_ctrl_c_on_the_controller_kills_the_remote_cell(fresh_store, world, tmp_path, public):
    server = world.start_sshd()
    home = world.home(known=[server])
    python = shim(public, 'case "$*" in *harness.remote*) sleep 299.5 & ;; esac')
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + user_host("t", server, python=python))
    (tmp_path / "long.yaml").write_text(
        "name: long\nmatrix:\n  workload: [noop]\n  sleep_s: [300, 301]\nhosts: [t]\n")
    env = dict(os.environ, HOME=str(home))
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-c", DUMPS_TASKS_ON_SIGUSR1, "run", "long.yaml",
                             "--tracking-uri", fresh_store(tmp_path)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_until(lambda: ours("harness.worker")
                      and ours("sleep 299.5"), 60)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:        # a hang: say where the controller is stuck
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the controller did not stop within 120 s of Ctrl-C:\n{err[-6000:]}")
    assert proc.returncode == 130, out + err
    assert "--resume" in err and "Traceback" not in out + err
    # asyncssh's connections closed before the event loop (issue 18: "Exception ignored ...
    # RuntimeError: Event loop is closed" printed at exit)
    assert "Event loop is closed" not in out + err and "Exception ignored" not in out + err
    # Neither the killed cell nor the one still queued is recorded as a result: both are
    # simply missing, for --resume to run.
    [run_dir] = (tmp_path / "results" / "runs").iterdir()
    assert list((run_dir / "cells").glob("*.json")) == []
    assert wait_until(lambda: not ours("harness")
                      and not ours("sleep 299.5"), 15), \
        ours("")


def test_cancel_before_the_launcher_reported_its_group_leaves_nothing(world, tmp_path, public,
                                                                      monkeypatch):
    # Ctrl-C lands while the cell's channel is still opening (a slow host answers the exec
    # request late): the controller has no job sent and no process group yet, and the host's
    # "python" has already started something in the cell's group.
    server = world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[server])))
    python = shim(public, 'case "$*" in *harness.remote*) sleep 299.5 & ;; esac')
    host = inventory(user_host("slow", server, python=python))["slow"]
    opened = []
    real_create_process = asyncssh.SSHClientConnection.create_process

    async def slow_create_process(self, command, *args, **kwargs):
        proc = await real_create_process(self, command, *args, **kwargs)
        if "harness.remote" in command:                # the cell's channel, not the host check
            opened.append(proc)
            await asyncio.sleep(8)                     # the exec reply that comes late
        return proc

    monkeypatch.setattr(asyncssh.SSHClientConnection, "create_process", slow_create_process)

    async def cancelled_mid_open():
        cell = asyncio.ensure_future(host.run_cell(dict(NOOP, sleep_s=300), 0, lambda p: None))
        while not (opened and ours("sleep 299.5")):
            await asyncio.sleep(0.05)
        cell.cancel()
        await asyncio.gather(cell, return_exceptions=True)
        # The cancelled cell cleaned up after itself: gone while the connection is still open
        # (closing it would end the launcher anyway, and hide a cancellation that did nothing).
        gone = wait_until(lambda: not ours("harness") and not ours("sleep 299.5"), 15)
        leftovers = ours("")
        await host.close()
        return cell.cancelled(), gone, leftovers

    cancelled, gone, leftovers = asyncio.run(cancelled_mid_open())
    assert cancelled and gone, leftovers


def test_remote_python_missing_is_one_clear_line(fresh_store, world, tmp_path):
    server = world.start_sshd()
    home = world.home(known=[server])
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + user_host("nopy", server, python="/nonexistent/python3"))
    (tmp_path / "one.yaml").write_text("name: one\nmatrix:\n  workload: [noop]\nhosts: [nopy]\n")
    uri = fresh_store(tmp_path)
    out = harness("run", "one.yaml", "--tracking-uri", uri, home=home, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    want = "python '/nonexistent/python3' not found on the host (set `python:` for this host in hosts.yaml)"
    lines = [line for line in text.splitlines() if "host nopy given up:" in line]
    assert len(lines) == 1 and lines[0].strip() == f"host nopy given up: host nopy: {want}"
    assert "Traceback" not in text

    check = harness("hosts", "check", "nopy", home=home, cwd=tmp_path)
    assert check.returncode == 1, check.stdout + check.stderr
    assert check.stdout.strip() == "nopy: python '/nonexistent/python3' not found on the host", \
        check.stderr

    # Fixed: --resume runs what is missing, on the same run.
    run_id = next(line.split()[1].rstrip(":") for line in out.stdout.splitlines()
                  if line.startswith("Run "))
    (tmp_path / "hosts.yaml").write_text("hosts:\n" + user_host("nopy", server))
    again = harness("run", "one.yaml", "--resume", run_id, "--tracking-uri", uri,
                    home=home, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    [cell] = (tmp_path / "results" / "runs" / run_id / "cells").glob("*.json")
    assert json.loads(cell.read_text())["status"] == "ok"


# -- hostile values ------------------------------------------------------------------------------

def test_hostile_values_reach_the_worker_as_data(world, tmp_path, public, monkeypatch):
    server = world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[server])))
    user_home = Path(pwd.getpwnam(TEST_USER).pw_dir)
    canary = user_home / "canary"
    canary.write_text("still here")
    pwned = public / "pwned"
    hostile = f"x; rm -rf ~/canary; touch {pwned} $(touch {pwned}) `touch {pwned}` 'q\" \\ \n end"
    workdir = f"{public}/own/w $(touch {pwned}) ; 'q\" x"
    host = parse_hosts(
        "hosts:\n  h:\n"
        f"    ssh: {TEST_USER}@127.0.0.1:{server.port}\n    python: /usr/bin/python3\n"
        f"    workdir: {json.dumps(workdir)}\n"
        f"    env: {{HOSTILE: {json.dumps(hostile)}}}\n", "hosts.yaml")["h"]
    checkpoint = tmp_path / hostile.replace("/", "_")   # a file name is a string like any other
    cell = dict(NOOP, sleep_s=1.0, checkpoint=str(checkpoint))
    thread, box, journal, _ = sweep([cell], [host], tmp_path, background=True)
    environs = []
    while thread.is_alive():
        for pid in server.worker_pids():
            try:
                environs.append(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
            except OSError:
                pass
        time.sleep(0.05)
    [result] = box["outcome"].results
    assert result["status"] == "ok", result["error"]
    assert result["cell"]["checkpoint"] == str(checkpoint)           # arrived verbatim
    assert environs and all(f"HOSTILE={hostile}".encode() in e for e in environs)
    [shipped] = Path(workdir, "bundles").iterdir()
    assert (shipped / ".complete").exists()
    assert not pwned.exists() and canary.read_text() == "still here"


# -- exclusivity ---------------------------------------------------------------------------------

def test_gpu_lock_keeps_two_sweeps_off_one_gpu(world, tmp_path, monkeypatch):
    server = world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[server])))
    text = user_host("g", server)
    first, second = inventory(text)["g"], inventory(text)["g"]   # two controllers, one GPU
    seen = {"first": [], "second": []}

    async def both():
        one = asyncio.ensure_future(first.run_cell(dict(NOOP, sleep_s=2.0), 0, seen["first"].append))
        while not seen["first"]:
            await asyncio.sleep(0.02)              # the first cell holds the lock and runs
        two = await second.run_cell(dict(NOOP, seed=1), 0, seen["second"].append)
        results = [await one, two]
        await first.close()
        await second.close()
        return results

    r1, r2 = asyncio.run(both())
    assert r1["status"] == r2["status"] == "ok"
    waits = [p for p in seen["second"] if p.get("stage") == "waiting for GPU lock"]
    assert waits and "pid" in waits[0]["holder"]
    assert seen["second"][-1]["stage"] == "sleep"   # ran once the first had finished


def test_gpu_with_a_foreign_process_runs_noisy_or_goes_elsewhere(world, tmp_path, public, monkeypatch):
    server = world.start_sshd()
    monkeypatch.setenv("HOME", str(world.home(known=[server])))
    bin_dir = public / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$1" in
          --query-gpu=*) echo "0, GPU-aaaa, NVIDIA H200, 570.86, 143771" ;;
          --query-compute-apps=*) echo "GPU-aaaa, 4242, someone-elses-job, 2048" ;;
        esac
        """))
    fake.chmod(0o755)
    python = shim(public, f'PATH="{bin_dir}:$PATH"; export PATH')
    hosts = inventory(user_host("noisy", server, python=python, gpu_busy="noisy")
                      + user_host("waits", server, python=python, busy_wait_s=0))

    async def one(host):
        try:
            return await host.run_cell(dict(NOOP), 0, lambda p: None)
        finally:
            await host.close()

    result = asyncio.run(one(hosts["noisy"]))
    assert result["status"] == "ok" and result["noisy"] is True
    assert result["env"]["foreign_gpu_processes"][0]["pid"] == 4242
    with pytest.raises(HostUnavailable, match="GPU 0 busy .* pid 4242 someone-elses-job"):
        asyncio.run(one(hosts["waits"]))

    facts = asyncio.run(check_all([hosts["noisy"]]))[0]
    ok, line = describe(facts)
    assert "1× NVIDIA H200, driver 570.86" in line and "pid 4242" in line
    # The test user's python has no torch: reachable, but no decode cell could run there.
    assert not ok and "no torch" in line and "\n" not in line
