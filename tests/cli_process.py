"""The `harness` CLI in a real child process, started from a fork server that has imported the
CLI's heavy third-party dependencies once (MLflow alone is ~2.7 s of CPU per process).

    run_cli(["run", "s.yaml"], cwd=tmp_path, env={...}, timeout=240) -> CompletedProcess

What the tests get is what `python -m harness.cli ARGS` gives: a process of its own with the
given working directory, environment, stdin, stdout and stderr (files, read back as text), its
own exit status (sys.exit's code; 1 and a traceback on stderr for an uncaught exception), and
signals of its own; the workers it starts are real subprocesses. The only difference is that
mlflow, sqlalchemy, matplotlib, rich, typer, asyncssh, ... are already imported when its
`main()` starts. harness itself is not preloaded: it is imported in each child, under the
child's own environment (COLUMNS and the like are read at import).

`prelude` is Python run in the child before `main()` (fault injection). A test about the
interpreter's own start (signals at startup, `python -m` itself) starts a plain subprocess.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOAD = ["mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store", "sqlalchemy",
           "alembic", "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg",
           "rich.console", "rich.progress", "typer", "asyncssh", "yaml", "requests", "numpy"]

_context = None


def _forkserver():
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([m for m in PRELOAD if _importable(m)])
        _context = ctx
    return _context


def _importable(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _child(argv: list[str], cwd: str, env: dict, stdin: str, stdout: str, stderr: str,
           prelude: str | None) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY),
                            (2, stderr, os.O_WRONLY)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as a fresh interpreter has it
    sys.argv = ["harness", *argv]
    try:
        if prelude:
            exec(compile(prelude, "<prelude>", "exec"), {"__name__": "__prelude__"})
        from harness.cli import main
        main()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_cli(argv: list[str], *, cwd: Path, env: dict | None = None, timeout: float = 240,
            input: str = "", prelude: str | None = None) -> subprocess.CompletedProcess:
    """Run `harness ARGV` as a child process; raises subprocess.TimeoutExpired (after killing
    it) when it takes longer than `timeout` seconds."""
    argv = [str(a) for a in argv]
    with tempfile.TemporaryDirectory(prefix="harness-cli-") as tmp:
        paths = [os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")]
        Path(paths[0]).write_text(input, encoding="utf-8")
        for p in paths[1:]:
            Path(p).touch()
        proc = _forkserver().Process(target=_child, args=(
            argv, str(cwd), dict(os.environ if env is None else env), *paths, prelude))
        proc.start()
        proc.join(timeout)
        out, err = (Path(p).read_text(encoding="utf-8", errors="replace") for p in paths[1:])
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["harness", *argv], timeout, out, err)
    return subprocess.CompletedProcess(["harness", *argv], proc.exitcode, out, err)
