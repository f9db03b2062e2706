"""LocalHost: the worker protocol over a real subprocess, and every way a worker can fail."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from harness.hosts.local import LocalHost, _group_alive

CELL = {"context_length": 32, "steps": 2, "repeats": 1, "warmup_steps": 0, "profile_steps": 0,
        "device": "cpu", "timeout_s": 120}


def run(host, cell=CELL):
    seen = []
    result = asyncio.run(host.run_cell(cell, 0, seen.append))
    return result, seen


def fake_python(tmp_path: Path, body: str) -> str:
    """A stand-in interpreter: a shell script that misbehaves as told."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_real_worker_streams_progress_and_returns_a_result():
    result, seen = run(LocalHost())
    assert result["status"] == "ok", result["error"]
    assert result["host"] == "local"
    assert [p["stage"] for p in seen][:2] == ["build", "prefill"]
    assert result["metrics"]["tokens_per_s"] > 0


def test_a_cell_without_torch_is_fingerprinted_without_importing_it():
    import torch

    probe = ("import json, sys\nfrom harness.worker.main import run_cell\n"
             "r = run_cell({'workload': 'noop'})\n"
             "print(json.dumps([r['status'], r['env'], 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    status, env, imported = __import__("json").loads(out.stdout.splitlines()[-1])
    assert status == "ok" and not imported
    assert (env["torch"], env["cuda"]) == (torch.__version__, torch.version.cuda)
    assert "threads" not in env                    # torch's own figure: absent, not guessed
    decoded, _ = run(LocalHost())                  # a decode cell: torch's facts, from torch
    assert decoded["env"]["torch"] == torch.__version__ and decoded["env"]["threads"] >= 1


def test_failure_inside_the_workload_is_reported_with_its_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 64}')
    result, _ = run(LocalHost(), dict(CELL, checkpoint=str(tmp_path)))
    assert result["status"] == "failed"
    assert result["error"].startswith(f"CheckpointError: {tmp_path}/config.json: required key(s) "
                                      f"missing: ") and "num_attention_heads" in result["error"]
    assert "Traceback" not in result["error"]


def test_worker_exit_without_result_keeps_stderr_tail(tmp_path):
    host = LocalHost(python=fake_python(tmp_path, "echo 'CUDA error: out of memory' >&2; exit 3"))
    result, _ = run(host)
    assert result["status"] == "failed"
    assert "exited with code 3" in result["error"] and "out of memory" in result["error"]
    assert result["cell_id"] and result["metrics"] == {}


def test_worker_killed_by_signal(tmp_path):
    host = LocalHost(python=fake_python(tmp_path, "echo dying >&2; kill -9 $$"))
    result, _ = run(host)
    assert result["status"] == "failed" and "SIGKILL" in result["error"]


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    # The "worker" starts a grandchild and hangs; both must be gone after the timeout.
    host = LocalHost(python=fake_python(tmp_path, f"sleep 300 & echo $! > {pidfile}; wait"))
    result, _ = run(host, dict(CELL, timeout_s=1))
    assert result["status"] == "failed" and result["error"].startswith("timeout after 1 s")
    # Gone by the time the result is in: the next cell may take the GPU slot at once.
    assert not _alive(int(pidfile.read_text()))


def _alive(pid: int) -> bool:
    """Running, not merely a zombie waiting for its new parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def test_garbage_on_stdout_is_a_failed_cell(tmp_path):
    host = LocalHost(python=fake_python(tmp_path, "cat >/dev/null; echo 'not json'"))
    result, _ = run(host)
    assert result["status"] == "failed" and "no result" in result["error"]


def test_a_group_is_alive_while_a_member_runs_and_not_when_only_zombies_remain():
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert _group_alive(live.pid)
    finally:
        live.kill()
        live.wait()
    assert not _group_alive(live.pid)                    # reaped: no such group
    # A leader that exited but is not reaped yet is a zombie: the group holds nothing any more.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(zombie.pid, 0)                             # the kernel still lists the group
    assert not _group_alive(zombie.pid)
    zombie.wait()
