"""A real `mlflow server` for a test: `with mlflow_server(backend_uri, folder) as port: ...`.

On a free port of 127.0.0.1, in a session of its own (the server and its uvicorn worker are
stopped together), its log in FOLDER/server.log; the test fails with the log's tail when the
server does not answer /health within two minutes. Job execution is off: the tests use none,
and it is one process fewer to start."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(backend_uri: str, folder: Path, artifacts: Path | None = None):
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / "server.log"
    extra = ["--artifacts-destination", str(artifacts)] if artifacts is not None else []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend_uri, *extra,
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok:
                        break
                except requests.RequestException:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.25)
            yield port
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
