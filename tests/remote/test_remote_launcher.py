"""harness/remote/launcher.py, the launcher an SSH host runs per cell, on its own (no sshd needed):
its dead man's switch holds from its first instruction on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def alive(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and not line.startswith("Z")]


def test_stdin_closed_before_the_job_line_kills_the_whole_group(tmp_path):
    # A wrapper around the host's python that starts something in the group before the
    # launcher runs (as the SSH tests' shim does): the controller went away before sending the
    # job, so the launcher must take that down too, not just exit.
    marker = f"299.{os.getpid()}{time.monotonic_ns() % 1000}"
    shim = tmp_path / "python-shim"
    shim.write_text(f"#!/bin/sh\nsleep {marker} &\nexec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    done = subprocess.run(["setsid", "-w", str(shim), "-S", "-m", "harness.remote"],
                          cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert done.returncode == -9 or done.returncode == 137, done.stderr
    assert done.stderr.decode().startswith("@@pgid ")
    deadline = time.monotonic() + 10
    while alive(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(f"sleep {marker}")


def test_a_bad_job_line_is_one_clear_line(tmp_path):
    done = subprocess.run([sys.executable, "-S", "-m", "harness.remote"], cwd=REPO,
                          input=b"not json\n", capture_output=True, timeout=60)
    assert done.returncode == 2
    assert "remote: bad job line on stdin" in done.stderr.decode()
