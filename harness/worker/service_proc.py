"""Bringing a serving engine up with a cell's toggles, on the host the worker runs on.

Three managers (the cell's `service_manager`):
  - setsid: `service_start` plus the cell's `service_flags`, with `service_env` added to the
    environment, started in a session and process group of its own (start_new_session), its
    output to a log file. It outlives the worker that started it, so the next cell — run by
    another worker process on an SSH host — finds it through a state file beside the log
    (`<log>.state.json`: pid and the toggles it was started with) and reuses it when the
    toggles are the same.
    Stopping it kills its whole process group (an engine's tokenizer and scheduler children).
  - systemd: the toggles go into a drop-in of `service_unit` (`Environment=` lines, the flags
    as HARNESS_SERVICE_FLAGS, which the unit's ExecStart expands as `$HARNESS_SERVICE_FLAGS`),
    then `systemctl daemon-reload` and `restart`. An unchanged drop-in is the "same toggles".
  - external: started by someone else; only its readiness is checked.

Readiness is a bounded poll of `service_ready` (HTTP 200). An engine that exits first or is not
ready in time is a failed cell whose one line ends with the last lines of its log.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.protocol.errors import CellRefused

STATE_DIR = Path("~/.cache/specdec-harness/service")
DROPIN_NAME = "harness-toggles.conf"
LOG_LINES = 5                 # of the engine's log, in a failed cell's one line
STOP_GRACE_S = 10.0           # SIGTERM, then SIGKILL of the group


class ServiceError(CellRefused):
    """The engine could not be brought up or measured. One line, no traceback (the fault is
    the engine's or its settings', and the line says which); the next cell still runs."""


def log_tail(path: Path, lines: int = LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    tail = kept[-lines:]
    # A CLI's usage error comes first and its help after it (typer, argparse): the last line
    # naming an error leads, when the tail does not hold it already.
    errors = [line for line in kept[:-lines] if "error" in line.lower()]
    if errors:
        tail = [errors[-1], "..."] + tail
    return " | ".join(tail) if tail else "(empty log)"


def ready(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:       # our own child (a serving worker started it): reap it if it has exited
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(pid: int) -> None:
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)     # the engine leads its own group (start_new_session)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def toggles(cell: dict) -> dict:
    """What the engine was started with: a change restarts it."""
    return {"start": cell["service_start"], "env": shlex.split(cell["service_env"]),
            "flags": shlex.split(cell["service_flags"]), "url": cell["service_url"]}


class SetsidService:
    def __init__(self, cell: dict):
        self.cell = cell
        self.name = cell["service_name"]
        home = STATE_DIR.expanduser()
        self.log = Path(os.path.expanduser(cell["service_log"] or str(home / f"{self.name}.log")))
        self.state_path = self.log.with_name(self.log.name + ".state.json")

    def _state(self) -> dict | None:
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) and isinstance(state.get("pid"), int) else None

    def stop(self) -> None:
        state = self._state()
        if state and _alive(state["pid"]):
            _stop_group(state["pid"])
        self.state_path.unlink(missing_ok=True)

    def ensure(self, ready_url: str, progress) -> dict:
        wanted = toggles(self.cell)
        state = self._state()
        if state and state.get("toggles") == wanted and _alive(state["pid"]) and ready(ready_url):
            return {"restarted": False, "pid": state["pid"]}
        self.stop()
        argv = shlex.split(self.cell["service_start"]) + wanted["flags"]
        env = dict(os.environ)
        env.update(word.split("=", 1) for word in wanted["env"])
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        progress(stage="service-start", command=argv[0])
        with open(self.log, "wb") as log:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
            except OSError as exc:
                raise ServiceError(f"service '{self.name}' did not start: {argv[0]}: "
                                   f"{exc.strerror or exc}") from None
        self.state_path.write_text(json.dumps({"pid": proc.pid, "toggles": wanted}))
        started = time.monotonic()
        deadline = started + self.cell["service_ready_timeout_s"]
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                self.state_path.unlink(missing_ok=True)
                raise ServiceError(f"service '{self.name}' exited with status {code} before it "
                                   f"was ready; its log ({self.log}) ends: {log_tail(self.log)}")
            if ready(ready_url, timeout=2.0):
                return {"restarted": True, "pid": proc.pid,
                        "ready_s": round(time.monotonic() - started, 2)}
            time.sleep(0.25)
        self.stop()
        raise ServiceError(f"service '{self.name}' was not ready at {ready_url} after "
                           f"{self.cell['service_ready_timeout_s']} s (stopped); its log "
                           f"({self.log}) ends: {log_tail(self.log)}")


def dropin_text(cell: dict) -> str:
    """The systemd drop-in holding a cell's toggles (quoted as systemd unquotes them)."""
    def quote(word: str) -> str:
        return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    lines = ["# written by the harness's service workload: this cell's toggles", "[Service]"]
    lines += [f"Environment={quote(word)}" for word in shlex.split(cell["service_env"])]
    flags = " ".join(shlex.split(cell["service_flags"]))
    lines.append(f"Environment={quote('HARNESS_SERVICE_FLAGS=' + flags)}")
    return "\n".join(lines) + "\n"


class SystemdService:
    def __init__(self, cell: dict, dropin_root: Path = Path("/etc/systemd/system")):
        self.cell = cell
        self.unit = cell["service_unit"]
        self.dropin = dropin_root / f"{self.unit}.d" / DROPIN_NAME

    def _systemctl(self, *args: str) -> None:
        try:
            done = subprocess.run(["systemctl", *args], capture_output=True, text=True,
                                  timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"systemctl {' '.join(args)}: {exc}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise ServiceError(f"systemctl {' '.join(args)} failed ({done.returncode}): "
                               f"{why[-1] if why else 'no output'}")

    def _journal(self) -> str:
        try:
            done = subprocess.run(["journalctl", "-u", self.unit, "-n", str(LOG_LINES),
                                   "--no-pager", "-o", "cat"], capture_output=True, text=True,
                                  timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return "(no journal)"
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return " | ".join(lines) or "(empty journal)"

    def ensure(self, ready_url: str, progress) -> dict:
        text = dropin_text(self.cell)
        try:
            same = self.dropin.read_text() == text
        except OSError:
            same = False
        if same and ready(ready_url):
            return {"restarted": False}
        try:
            self.dropin.parent.mkdir(parents=True, exist_ok=True)
            self.dropin.write_text(text)
        except OSError as exc:
            raise ServiceError(f"cannot write the drop-in {self.dropin}: {exc.strerror}") from None
        progress(stage="service-start", unit=self.unit)
        self._systemctl("daemon-reload")
        self._systemctl("restart", self.unit)
        started = time.monotonic()
        deadline = started + self.cell["service_ready_timeout_s"]
        while time.monotonic() < deadline:
            if ready(ready_url, timeout=2.0):
                return {"restarted": True, "ready_s": round(time.monotonic() - started, 2)}
            time.sleep(0.5)
        raise ServiceError(f"unit {self.unit} was not ready at {ready_url} after "
                           f"{self.cell['service_ready_timeout_s']} s; its journal ends: "
                           f"{self._journal()}")


def ensure(cell: dict, progress) -> dict:
    """Bring the cell's engine up with its toggles (restarting it only when they changed) and
    wait until it is ready; what happened, for the result."""
    ready_url = cell["service_url"].rstrip("/") + cell["service_ready"]
    manager = cell["service_manager"]
    if manager == "setsid":
        return SetsidService(cell).ensure(ready_url, progress)
    if manager == "systemd":
        return SystemdService(cell).ensure(ready_url, progress)
    if not ready(ready_url):
        raise ServiceError(f"service at {ready_url} is not reachable or not ready "
                           f"(service_manager external: nothing here starts it)")
    return {"restarted": False}
