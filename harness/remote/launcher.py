"""The launcher an SSH host runs for each cell: lock the GPU, check it, start the worker, and make
sure nothing outlives the controller's interest in it.

    cd <bundle> && setsid -w <python> -S -m harness.remote      (one job JSON line on stdin)

The job line: {"cell": {...}, "env": {...}, "gpu": 0 | null, "lock": path | null,
"cache_dir": path, "gpu_busy": "wait" | "noisy", "busy_wait_s": seconds}. Secrets in `env` travel
here, on stdin, never on a command line that `ps` would show.

On stderr, before the worker's own lines:
    @@pgid N               first line: the process group to kill (we run under setsid)
    @@progress {...}       waiting for the GPU lock or for a busy GPU
    @@busy {...}           the GPU had foreign processes and policy `noisy` ran the cell anyway
    @@started              the worker starts now (the controller's cell timeout runs from here)
    @@infra REASON         the cell could not start here (exit 75): run it somewhere else
The worker inherits stdout, so its result JSON goes straight to the controller.

Dead man's switch: the controller keeps our stdin open for the whole cell. EOF on stdin, at any
point from our first instruction on (before the job line came, while waiting for the GPU lock,
while the worker runs), means it is gone (Ctrl-C, a dropped connection, a killed sshd), and we
kill our whole process group, so no worker is left computing for nobody.

Standard library only (it runs under the host's Python with nothing installed).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# The bundle root: this file is <bundle>/harness/remote/launcher.py.
BUNDLE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EX_TEMPFAIL = 75           # sysexits: "try again later" -- the controller retries elsewhere
BUSY_POLL_S = 5.0
LOCK_POLL_S = 0.5


def say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def progress(**fields) -> None:
    say("@@progress " + json.dumps(fields))


def die_with_group() -> None:
    # SIGKILL to the whole group, ourselves included: the worker and anything it started.
    os.killpg(os.getpgrp(), signal.SIGKILL)


def read_job() -> bytes | None:
    """The first line on stdin, or None when stdin closes before a whole line came: the
    controller is gone already (Ctrl-C while this launcher was still starting). Raw reads
    (fd 0), no sys.stdin: the watcher thread below must not hold the buffered reader's lock, or
    the interpreter's exit would wait on it."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


def watch_stdin() -> None:
    """Block until the controller closes our stdin, then take the process group down."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    die_with_group()


def take_lock(path: str):
    """Hold an exclusive flock on `path` (waiting for another sweep if needed); returns the file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = open(path, "a+")
    waited = False
    while True:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not waited:
                lock.seek(0)
                holder = lock.read().strip() or "another sweep"
                progress(stage="waiting for GPU lock", holder=holder[:120])
                waited = True
            time.sleep(LOCK_POLL_S)
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n")
    lock.flush()
    return lock


def foreign_processes(gpu: int) -> list[dict]:
    from harness.remote import probe
    return probe.busy_gpus().get(gpu, [])


def wait_for_gpu(gpu: int, policy: str, busy_wait_s: float) -> list[dict]:
    """Foreign processes on `gpu` that the cell runs beside (policy noisy), or [] when free.

    We hold the GPU's lock, so any process on it belongs to someone else. Policy `wait` waits
    for it to go; after `busy_wait_s` the cell goes back to the controller as not runnable here.
    """
    others = foreign_processes(gpu)
    if not others or policy == "noisy":
        return others
    deadline = time.monotonic() + busy_wait_s
    while others:
        if time.monotonic() > deadline:
            say(f"@@infra GPU {gpu} busy for {busy_wait_s:g} s with foreign processes: "
                + ", ".join(f"pid {p['pid']} {p['name']}" for p in others))
            sys.exit(EX_TEMPFAIL)
        progress(stage="waiting for busy GPU", gpu=gpu,
                 pids=[p["pid"] for p in others][:8])
        time.sleep(BUSY_POLL_S)
        others = foreign_processes(gpu)
    return []


def main() -> int:
    say(f"@@pgid {os.getpgrp()}")
    line = read_job()
    if line is None:
        # Nobody wants this cell any more. Whatever already runs in our group goes too (a
        # wrapper script around the host's python may have started something before us).
        die_with_group()
    try:
        job = json.loads(line)
        cell = job["cell"]
    except (ValueError, KeyError, TypeError) as exc:
        say(f"remote: bad job line on stdin: {exc}")
        return 2
    threading.Thread(target=watch_stdin, daemon=True).start()

    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (job.get("env") or {}).items()})
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = BUNDLE          # this bundle's harness, whatever the host's PYTHONPATH
    if job.get("cache_dir"):
        env["HARNESS_CACHE_DIR"] = job["cache_dir"]
    gpu = job.get("gpu")
    lock = take_lock(job["lock"]) if job.get("lock") else None
    if gpu is not None:
        # nvidia-smi numbers GPUs in PCI bus order; make CUDA agree so `gpus: [3]` is GPU 3.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        others = wait_for_gpu(int(gpu), job.get("gpu_busy", "wait"),
                              float(job.get("busy_wait_s", 600)))
        if others:
            say("@@busy " + json.dumps({"gpu": gpu, "processes": others}))

    say("@@started")
    # The worker holds the lock too (an inherited descriptor of the same open file), so the GPU
    # stays locked for as long as either of us lives.
    worker = subprocess.Popen([sys.executable, "-m", "harness.worker"], stdin=subprocess.PIPE,
                              env=env, pass_fds=(lock.fileno(),) if lock is not None else ())
    try:
        worker.stdin.write(json.dumps(cell).encode())
        worker.stdin.close()
    except BrokenPipeError:
        pass  # it died before reading; its exit status says so
    code = worker.wait()
    if lock is not None:
        lock.close()          # the GPU is free again
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
