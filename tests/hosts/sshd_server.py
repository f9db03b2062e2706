"""Real OpenSSH servers on 127.0.0.1 for the SSH tests and the SSH benchmark.

`LoopbackSSH(root)` makes a throwaway world under `root`: a client key, `start_sshd()` runs
`/usr/sbin/sshd -D` on a free port with a throwaway host key, accepting that client key for
every user (one shared AuthorizedKeysFile), and `home(...)` makes a client HOME with its own
~/.ssh/{id_ed25519, config, known_hosts} (the controller runs with HOME pointing there, so
/root/.ssh is never touched).

Logins go either to root (whose Python is the project venv, which has torch) or to a non-root
test user (`TEST_USER`, created when missing): the processes a cell leaves behind are easiest
to see, and to kill, under a user of their own, and sshd refuses some signals to root logins.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
TEST_USER = "specdec-ssh"


def available() -> str | None:
    """Why real-sshd tests cannot run here, or None if they can."""
    if not (os.path.exists(SSHD) and shutil.which("ssh-keygen")):
        return "OpenSSH server not installed (apt-get install openssh-server; .ci/run does)"
    if os.geteuid() != 0:
        return "needs root to run sshd for other users"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_test_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        # '*': no password, but not a locked account (sshd refuses locked accounts even
        # for public-key logins).
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*",
                        TEST_USER], check=True, capture_output=True)
        return pwd.getpwnam(TEST_USER)


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specdec-test",
                    "-f", str(path)], check=True)


@dataclass
class Sshd:
    port: int
    proc: subprocess.Popen
    host_key: Path
    log: Path

    def known_hosts_line(self) -> str:
        key = Path(str(self.host_key) + ".pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {key[0]} {key[1]}\n"

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes forked by this listener (not the user's commands)."""
        return [pid for pid in _descendants(self.proc.pid) if _comm(pid).startswith("sshd")]

    def worker_pids(self) -> list[int]:
        """Cell workers (`python -m harness.worker`) running under this sshd."""
        return [pid for pid in _descendants(self.proc.pid) if "harness.worker" in _cmdline(pid)]

    def kill_hard(self) -> None:
        """Like a host going away: SIGKILL the listener and every sshd process under it."""
        victims = [self.proc.pid] + self.session_pids()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill_hard()


class LoopbackSSH:
    def __init__(self, root: Path):
        self.root = root
        self.client_key = root / "id_ed25519"
        keygen(self.client_key)
        # sshd reads authorized keys as the user logging in: keep them where a non-root user
        # can read them (pytest's tmp dirs are root's only).
        self.public = Path(tempfile.mkdtemp(prefix="specdec-sshd-"))
        self.public.chmod(0o755)
        self.authorized = self.public / "authorized_keys"
        shutil.copy(str(self.client_key) + ".pub", self.authorized)
        self.authorized.chmod(0o644)
        self.servers: list[Sshd] = []
        self._homes = 0

    def start_sshd(self) -> Sshd:
        """A new sshd on a free port, with a host key of its own."""
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
        port = free_port()
        d = self.root / f"sshd-{port}"
        d.mkdir()
        host_key = d / "host_ed25519"
        keygen(host_key)
        config = d / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {self.authorized}\nPidFile none\nUsePAM no\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nMaxSessions 10\n"
            "MaxStartups 100\nLogLevel VERBOSE\nPrintMotd no\n")
        log = d / "sshd.log"
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        server = Sshd(port, proc, host_key, log)
        self.servers.append(server)
        _wait_listening(port, proc, log)
        return server

    def home(self, known: list[Sshd] = (), config: str = "") -> Path:
        """A fresh client HOME: the client key, `config` as ~/.ssh/config, and the host keys
        of `known` in ~/.ssh/known_hosts. Point HOME at it for the controller."""
        self._homes += 1
        home = self.root / f"home-{self._homes}"
        ssh = home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(self.client_key, ssh / "id_ed25519")
        shutil.copy(str(self.client_key) + ".pub", ssh / "id_ed25519.pub")
        (ssh / "id_ed25519").chmod(0o600)
        (ssh / "config").write_text(config)
        (ssh / "known_hosts").write_text("".join(s.known_hosts_line() for s in known))
        return home

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.public, ignore_errors=True)


def _wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on port {port} did not start: {log.read_text()[-2000:]}")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def user_processes(user: str, needle: str, cwd_contains: str | None = None) -> list[str]:
    """Command lines of `user`'s live processes that contain `needle` (what `ps -u` shows),
    optionally only those whose working directory contains `cwd_contains` (a cell's processes
    run in their bundle folder: that tells one test's processes from another's)."""
    out = subprocess.run(["ps", "-u", user, "-o", "pid=,stat=,args="], capture_output=True,
                         text=True)
    found = []
    for line in out.stdout.splitlines():
        pid, stat, args = (line.split(None, 2) + ["", ""])[:3]
        if needle not in args or stat.startswith("Z"):
            continue
        if cwd_contains is not None:
            try:
                if cwd_contains not in os.readlink(f"/proc/{pid}/cwd"):
                    continue
            except OSError:
                continue
        found.append(line.strip())
    return found
