"""SSHHost: run cells on a remote GPU host over one SSH connection.

Per host: one asyncssh connection (settings from ~/.ssh/config: aliases, User, Port,
IdentityFile, ProxyJump; host keys checked against known_hosts, strictly unless the host opts
in to `accept-new`), at most MAX_CHANNELS channels on it at once (sshd's MaxSessions).

Before the first cell (`prepare`): create `<workdir>/{bundles,locks,cache}`, check the host's
Python, and push the worker bundle (harness/hosts/bundle.py) to `<workdir>/bundles/<hash>/` unless
that hash is already there. Nothing is installed into the host's Python.

Per cell, one channel runs `cd <bundle> && exec setsid -w <python> -S -m harness.remote`; the
job (cell, env, GPU, lock) goes in as one JSON line on stdin -- data, never shell text. The
launcher (harness/remote/launcher.py) takes the GPU's flock, checks the GPU for foreign processes,
reports its process group and starts the worker. A cell timeout or Ctrl-C kills that process
group over a second channel; closing stdin makes the launcher kill it too (the same happens
when the connection drops), so no worker outlives the controller's interest in it.

Failures of the host itself raise HostUnavailable (retried by the runner) or HostBroken (the
host is dropped from the sweep); a cell that fails in its worker is a failed result as usual.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import signal
import time
from collections import deque
from pathlib import Path

import asyncssh

from harness.hosts import bundle as bundlemod
from harness.hosts.interface import (
    STDERR_TAIL_LINES,
    HostBroken,
    HostUnavailable,
    ProgressFn,
    failed_result,
    parse_result,
    read_tail,
    route_line,
)
from harness.protocol import params

MAX_CHANNELS = 10            # sshd's default MaxSessions: at most 9 cells at once per host
KEEPALIVE_S = 15             # a silently dead host is noticed after ~KEEPALIVE_S * 3
KILL_TIMEOUT_S = 10
PGID_WAIT_S = 5              # cancelled before the launcher said its group: how long to wait for it
EX_TEMPFAIL = 75             # harness.remote.launcher: the cell cannot start here, try elsewhere
MIN_PYTHON = (3, 10)


def shell_path(path: str) -> str:
    """`path` as one shell word. `~/x` keeps meaning the login's home: "$HOME"/'x'."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Client(asyncssh.SSHClient):
    """Tells the host when its connection dies (and only about its own connection)."""

    def __init__(self, host: "SSHHost"):
        self._host = host
        self._conn = None

    def connection_made(self, conn):
        self._conn = conn

    def connection_lost(self, exc):
        if self._host._conn is self._conn:
            self._host._connection_lost(exc)


class SSHHost:
    """A GPU host reached over SSH. See the module docstring for what happens where."""

    def __init__(self, *, name: str, ssh: str, user: str | None, address: str, port: int | None,
                 python: str, workdir: str, gpus: list[int], labels: dict, env: dict,
                 known_hosts: str = "strict", connect_timeout_s: float = 10.0,
                 gpu_busy: str = "wait", busy_wait_s: float = 600.0):
        self.name = name
        self.ssh = ssh                      # as written in hosts.yaml
        self.user, self.address, self.port = user, address, port
        self.python = python
        self.workdir = workdir
        self.gpus = list(gpus)
        self.slots = len(self.gpus)
        self.labels = labels
        self.env = env                      # resolved secrets included: never log this
        self.known_hosts_policy = known_hosts
        self.connect_timeout_s = connect_timeout_s
        self.gpu_busy = gpu_busy
        self.busy_wait_s = busy_wait_s

        self._conn: asyncssh.SSHClientConnection | None = None
        self._ready = False                 # connected, checked and bundle in place
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prepare_lock: asyncio.Lock | None = None
        self._channels: asyncio.Semaphore | None = None
        self._kill_lock: asyncio.Lock | None = None
        self._kills: set[asyncio.Future] = set()   # kills under way: close() waits for them
        self.remote_workdir: str | None = None     # absolute, as the host sees it
        self.remote_python: str | None = None
        self.python_version: str | None = None
        self.bundle_dir: str | None = None
        self._bundle_present = False
        self.bundle_pushed = False          # this controller pushed it (vs found it cached)
        self.accepted_new_key = False
        self.host_key: str | None = None    # after connect(): known | unknown | changed | accepted-new

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r}, ssh={self.ssh!r}, gpus={self.gpus})"

    # -- connection ------------------------------------------------------------------------

    def _locks(self):
        # Made for the event loop that runs the sweep (each asyncio.run is a new loop, and a
        # connection of an old loop cannot be used from a new one).
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._prepare_lock = asyncio.Lock()
            self._channels = asyncio.Semaphore(MAX_CHANNELS - 1)   # one kept for kills
            self._kill_lock = asyncio.Lock()        # ... and kills take turns on it
            self._kills = set()
            self._connection_lost(None)
        return self._prepare_lock, self._channels

    def _connection_lost(self, exc) -> None:
        """The connection is gone (asyncssh says so, or a channel on it died): the next
        prepare() reconnects. Cells still running on the old one finish or fail on their own."""
        self._conn = None
        self._ready = False

    def _drop(self) -> None:
        """Close a connection that stopped answering while preparing the host."""
        conn = self._conn
        self._connection_lost(None)
        if conn is not None:
            conn.close()

    def _connect_args(self) -> dict:
        args = {"host": self.address, "config": (), "connect_timeout": self.connect_timeout_s,
                "keepalive_interval": KEEPALIVE_S, "keepalive_count_max": 3,
                "client_factory": lambda: _Client(self)}
        if self.port is not None:
            args["port"] = self.port
        if self.user is not None:
            args["username"] = self.user
        return args

    async def _resolved(self) -> asyncssh.SSHClientConnectionOptions:
        """The connection options ~/.ssh/config gives this target (host, port, known_hosts)."""
        args = {k: v for k, v in self._connect_args().items() if k != "client_factory"}
        return await asyncssh.SSHClientConnectionOptions.construct(**args)

    async def connect(self) -> asyncssh.SSHClientConnection:
        """Open the connection, or raise HostBroken / HostUnavailable with a one-line reason."""
        self._locks()
        if self._conn is not None:
            return self._conn
        self.host_key = None
        try:
            self._conn = await asyncssh.connect(**self._connect_args())
            self.host_key = "known"
        except asyncssh.HostKeyNotVerifiable:
            state, where = await self._host_key_state()
            self.host_key = state
            if state == "unknown" and self.known_hosts_policy == "accept-new":
                self._conn = await self._connect_accepting_new_key(where)
                self.host_key = "accepted-new"
            else:
                raise HostBroken(await self._host_key_message(state, where)) from None
        except asyncssh.PermissionDenied:
            self.host_key = "known"
            opts = await self._resolved()
            raise HostBroken(f"host {self.name}: login as '{opts.username}' to "
                             f"{opts.host}:{opts.port} refused (no accepted key: check User and "
                             f"IdentityFile in ~/.ssh/config, and the host's "
                             f"authorized_keys)") from None
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise HostUnavailable(f"host {self.name}: cannot connect to {self.ssh}: "
                                  f"{_describe(exc)}") from None
        except ValueError as exc:   # asyncssh: a bad setting in ~/.ssh/config, a bad key file
            raise HostBroken(f"host {self.name}: cannot use the SSH settings for {self.ssh}: "
                             f"{one_line(exc)}") from None
        return self._conn

    async def _host_key_state(self) -> tuple[str, dict]:
        """('unknown' | 'changed', facts for the message) after a host key was refused."""
        opts = await self._resolved()
        host = opts.host_key_alias or opts.host
        files = opts.known_hosts if isinstance(opts.known_hosts, list) and opts.known_hosts \
            else [str(Path("~/.ssh/known_hosts").expanduser())]
        port = opts.port if opts.port != 22 else None
        known = False
        for path in files:
            path = os.path.expanduser(str(path))
            if not os.path.isfile(path):
                continue
            try:
                trusted = asyncssh.read_known_hosts(path).match(host, "", port)[0]
            except (OSError, ValueError):
                continue
            known = known or bool(trusted)
        pattern = f"[{host}]:{opts.port}" if port else host
        jump = opts.tunnel if isinstance(opts.tunnel, str) else None
        return ("changed" if known else "unknown"), {"host": host, "port": opts.port,
                                                     "pattern": pattern, "files": files,
                                                     "jump": jump}

    async def _host_key_message(self, state: str, where: dict) -> str:
        files = ", ".join(where["files"])
        of = where["pattern"] + (f" (or of its ProxyJump host {where['jump']})"
                                 if where["jump"] else "")
        if state == "changed":
            return (f"host {self.name}: the host key of {of} has CHANGED (it does "
                    f"not match {files}); refusing to connect. This can be a man-in-the-middle "
                    f"attack. If the host was reinstalled, verify the new key's fingerprint, "
                    f"then remove the old one with: ssh-keygen -R '{where['pattern']}'")
        keyscan = (f"ssh-keyscan -p {where['port']} {where['host']}" if where["port"] != 22
                   else f"ssh-keyscan {where['host']}")
        login = self.address if self.user is None else f"{self.user}@{self.address}"
        ssh = f"ssh -p {self.port} {login}" if self.port is not None else f"ssh {login}"
        return (f"host {self.name}: the host key of {of} is unknown (not in "
                f"{files}); refusing to connect. Verify its fingerprint, then add it with: "
                f"{keyscan} >> ~/.ssh/known_hosts (or run `{ssh}` once), or opt in "
                f"with `known_hosts: accept-new` for this host in hosts.yaml")

    async def _connect_accepting_new_key(self, where: dict) -> asyncssh.SSHClientConnection:
        """accept-new: connect without a known key, then remember the key it presented."""
        try:
            conn = await asyncssh.connect(**self._connect_args(), known_hosts=None)
        except asyncssh.PermissionDenied:
            raise HostBroken(f"host {self.name}: login to {self.ssh} refused") from None
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            raise HostUnavailable(f"host {self.name}: cannot connect to {self.ssh}: "
                                  f"{_describe(exc)}") from None
        key = conn.get_server_host_key()
        if key is not None:
            path = Path(os.path.expanduser(where["files"][0]))
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            line = key.export_public_key("openssh").decode().split()
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{where['pattern']} {line[0]} {line[1]}\n")
            self.accepted_new_key = True
        return conn

    # -- preparing the host ----------------------------------------------------------------

    async def prepare(self) -> None:
        """Connect, check the workdir and Python, ship the bundle (once per content hash)."""
        prepare_lock, _ = self._locks()
        async with prepare_lock:
            if self._ready and self._conn is not None:
                return
            conn = await self.connect()
            current = bundlemod.current_bundle()
            await self._probe(conn, current.hash)
            if not self._bundle_present:
                await self._push(conn, current)
            self.bundle_dir = f"{self.remote_workdir}/bundles/{current.hash}"
            self._ready = True

    async def _run(self, conn, command: str, *, input: bytes | None = None,
                   timeout: float = 120) -> asyncssh.SSHCompletedProcess:
        _, channels = self._locks()
        try:
            async with channels:
                return await asyncio.wait_for(
                    conn.run(command, input=input, encoding=None, check=False), timeout)
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            self._drop()
            raise HostUnavailable(f"host {self.name}: {_describe(exc)}") from None

    async def _probe(self, conn, bundle_hash: str) -> None:
        workdir, python = shell_path(self.workdir), shell_path(self.python)
        version = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
        script = "\n".join([
            f"mkdir -p {workdir}/bundles {workdir}/locks {workdir}/cache || exit 10",
            f"cd {workdir} || exit 10",
            "pwd",
            f"command -v {python} || exit 11",
            f"{python} -c {shlex.quote(version)} || exit 12",
            f"if test -e {shlex.quote(f'bundles/{bundle_hash}/.complete')}; "
            "then echo have; else echo need; fi",
        ])
        done = await self._run(conn, script)
        # One value per line (paths may hold spaces; hosts.yaml rejects newlines in them).
        out = (done.stdout or b"").decode(errors="replace").splitlines()
        err = one_line((done.stderr or b"").decode(errors="replace"))
        if done.exit_status == 10:
            raise HostBroken(f"host {self.name}: cannot create workdir {self.workdir!r} there: {err}")
        if done.exit_status == 11:
            raise HostBroken(f"host {self.name}: python {self.python!r} not found on the host "
                             f"(set `python:` for this host in hosts.yaml)")
        if done.exit_status == 12:
            raise HostBroken(f"host {self.name}: python {self.python!r} does not run: {err}")
        if done.exit_status != 0 or len(out) < 4:
            raise HostUnavailable(f"host {self.name}: host check failed "
                                  f"(exit {done.exit_status}): {err}")
        self.remote_workdir, self.remote_python, self.python_version = out[0], out[1], out[2]
        self._bundle_present = out[3] == "have"
        try:
            major_minor = tuple(int(x) for x in self.python_version.split(".")[:2])
        except ValueError:
            raise HostBroken(f"host {self.name}: python {self.python!r} reports version "
                             f"{self.python_version!r}") from None
        if major_minor < MIN_PYTHON:
            raise HostBroken(f"host {self.name}: python {self.python!r} is {self.python_version}; "
                             f"the worker needs Python {'.'.join(map(str, MIN_PYTHON))} or newer")

    async def _push(self, conn, current: bundlemod.Bundle) -> None:
        final = f"{self.remote_workdir}/bundles/{current.hash}"
        incoming = f"{self.remote_workdir}/bundles/.incoming-{current.hash}-{secrets.token_hex(4)}"
        q_final, q_in = shlex.quote(final), shlex.quote(incoming)
        # Unpack beside the final folder, then rename: a bundle folder is complete or absent.
        # Another controller may have won the race; then its copy is as good as ours.
        # Leftovers of pushes cut short (Ctrl-C, a dropped connection) go after an hour.
        bundles = shlex.quote(f"{self.remote_workdir}/bundles")
        script = (f"find {bundles} -maxdepth 1 -name '.incoming-*' -mmin +60 "
                  f"-exec rm -rf {{}} + 2>/dev/null; "
                  f"mkdir -p {q_in} && tar -xzf - -C {q_in} && touch {q_in}/.complete && "
                  f"{{ mv -T {q_in} {q_final} 2>/dev/null || "
                  f"{{ rm -rf {q_in}; test -e {q_final}/.complete; }}; }}")
        done = await self._run(conn, script, input=current.tarball)
        if done.exit_status != 0:
            err = one_line((done.stderr or b"").decode(errors="replace"))
            raise HostBroken(f"host {self.name}: could not unpack the worker bundle in "
                             f"{final}: {err}")
        self.bundle_pushed = True

    # -- running a cell --------------------------------------------------------------------

    def _launch_command(self) -> str:
        # -S: the launcher needs only the standard library and the bundle (the working
        # directory, which -m puts on sys.path); the worker it starts gets the full site.
        return (f"cd {shlex.quote(self.bundle_dir)} && exec "
                + shlex.join(["setsid", "-w", self.remote_python, "-S", "-m", "harness.remote"]))

    def _job(self, cell: dict, slot: int) -> dict:
        gpu = self.gpus[slot]
        return {"cell": cell, "env": self.env, "gpu": gpu,
                "lock": f"{self.remote_workdir}/locks/gpu{gpu}.lock",
                "cache_dir": f"{self.remote_workdir}/cache",
                "gpu_busy": self.gpu_busy, "busy_wait_s": self.busy_wait_s}

    async def run_cell(self, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        await self.prepare()
        conn = self._conn
        if conn is None:
            raise HostUnavailable(f"host {self.name}: connection lost")
        _, channels = self._locks()
        async with channels:
            opening = asyncio.ensure_future(conn.create_process(self._launch_command(),
                                                                encoding=None))
            try:
                proc = await asyncio.shield(opening)
            except asyncio.CancelledError:
                # Ctrl-C while the channel opens: the launcher may run on the host already.
                await self._shielded_kill(self._abandon(opening))
                raise
            except (OSError, asyncssh.Error) as exc:
                if not isinstance(exc, asyncssh.ChannelOpenError):   # that one: a busy sshd
                    self._connection_lost(exc)
                raise HostUnavailable(f"host {self.name}: cannot start the cell: "
                                      f"{_describe(exc)}") from None
            return await self._drive(proc, cell, slot, on_progress)

    async def _drive(self, proc, cell: dict, slot: int, on_progress: ProgressFn) -> dict:
        """Feed the job to the launcher, follow its output, enforce the timeout."""
        timeout = params.canonical(cell)["timeout_s"]
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        state = _LaunchState()
        t0 = time.perf_counter()
        helpers: list[asyncio.Future] = []
        try:
            proc.stdin.write(json.dumps(self._job(cell, slot)).encode() + b"\n")
            stdout = asyncio.ensure_future(read_tail(proc.stdout))
            stderr = asyncio.ensure_future(_pump_stderr(proc.stderr, tail, on_progress, state))
            finished = asyncio.ensure_future(asyncio.gather(stdout, stderr))
            started = asyncio.ensure_future(state.started.wait())
            helpers = [stdout, stderr, finished, started]
            # The timeout runs from the worker's start, not while the GPU lock is awaited.
            await asyncio.wait({finished, started}, return_when=asyncio.FIRST_COMPLETED)
            try:
                await asyncio.wait_for(asyncio.shield(finished), timeout)
            except asyncio.TimeoutError:
                await self._kill(proc, state)
                return failed_result(cell, self.name, f"timeout after {timeout} s\n"
                                     + "\n".join(tail), time.perf_counter() - t0)
            await proc.wait()
        except asyncio.CancelledError:
            await self._shielded_kill(self._kill(proc, state))    # Ctrl-C: leave no orphan
            raise
        except (OSError, asyncssh.Error) as exc:
            self._connection_lost(exc)
            raise HostUnavailable(f"host {self.name}: connection lost mid-cell: "
                                  f"{_describe(exc)}") from None
        finally:
            for helper in helpers:
                helper.cancel()
        wall = time.perf_counter() - t0

        if proc.exit_status is None and proc.exit_signal is None:
            self._connection_lost(None)
            raise HostUnavailable(f"host {self.name}: connection lost mid-cell")
        code = proc.exit_status
        if code == EX_TEMPFAIL and state.infra:
            raise HostUnavailable(f"host {self.name}: {state.infra}")
        if proc.exit_signal is not None:
            code = -getattr(signal, f"SIG{proc.exit_signal[0]}", signal.SIGKILL)
        elif code is not None and code > 128 and (code - 128) in signal.valid_signals():
            code = -(code - 128)         # the launcher exits 128+N for a worker killed by N
        result = parse_result(cell, self.name, code, stdout.result(), tail, wall)
        if state.busy:
            result["noisy"] = True
            result.setdefault("env", {})["foreign_gpu_processes"] = state.busy["processes"]
        return result

    async def _shielded_kill(self, kill) -> None:
        """Run `kill` to the end even if the cell's task is cancelled again meanwhile; close()
        waits for it too, so the connection never closes before the kill went out."""
        task = asyncio.ensure_future(kill)
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        await asyncio.shield(task)

    async def _kill(self, proc, state: "_LaunchState") -> None:
        """Kill the cell's remote process group over a second channel, and close its stdin
        (the launcher's dead man's switch: it kills its group itself on EOF).

        The launcher reports its group first thing, but on a loaded host it may not have run
        that far yet: then we close its stdin at once (whenever it starts, it finds EOF and
        kills its group) and wait a little for the group, to kill it from outside as well."""
        if state.pgid is None:
            self._close_stdin(proc)
            await _first_of([state.pgid_known.wait(), proc.wait_closed()], PGID_WAIT_S)
        launcher_gone = proc.exit_status is not None or proc.exit_signal is not None
        if state.pgid is not None and not launcher_gone:
            await self._kill_group(state.pgid)
        self._close_stdin(proc)
        try:
            await asyncio.wait_for(proc.wait_closed(), KILL_TIMEOUT_S)
        except (asyncio.TimeoutError, OSError, asyncssh.Error):
            proc.close()

    async def _kill_group(self, pgid: int) -> None:
        """`kill -KILL -- -pgid` on the host, on a channel of its own. The kills of one host take
        turns: with every cell cancelled at once they would otherwise need more sessions than
        sshd allows (the one channel kept free is theirs)."""
        conn = self._conn
        if conn is None:
            return     # the connection is gone: the launcher saw EOF and killed the group itself
        async with self._locks_kill():
            try:
                await asyncio.wait_for(conn.run(shlex.join(["kill", "-KILL", "--", f"-{pgid}"]),
                                                check=False), KILL_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError, asyncssh.Error):
                pass   # as above: no connection, no launcher either

    def _locks_kill(self) -> asyncio.Lock:
        self._locks()
        return self._kill_lock

    async def _abandon(self, opening: asyncio.Future) -> None:
        """A cell cancelled while its channel was opening: let it open, then kill what runs."""
        try:
            proc = await asyncio.wait_for(opening, KILL_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.CancelledError, OSError, asyncssh.Error):
            return     # never opened (or the connection went): nothing runs for it
        state = _LaunchState()
        pump = asyncio.ensure_future(_pump_stderr(proc.stderr, deque(maxlen=1),
                                                  lambda p: None, state))
        try:
            await self._kill(proc, state)
        finally:
            pump.cancel()

    @staticmethod
    def _close_stdin(proc) -> None:
        try:
            proc.stdin.write_eof()
        except (OSError, asyncssh.Error):
            pass

    async def close(self) -> None:
        if self._kills:      # kills still under way need the connection: let them go out first
            await asyncio.wait(set(self._kills), timeout=PGID_WAIT_S + 2 * KILL_TIMEOUT_S)
        conn, self._conn, self._ready = self._conn, None, False
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except asyncio.TimeoutError:
                pass

    # -- `harness hosts check` -------------------------------------------------------------

    async def check(self) -> dict:
        """Connect and probe without shipping anything: what `harness hosts check` prints."""
        from harness.remote import probe
        facts = {"name": self.name, "ssh": self.ssh, "reachable": False, "host_key": None}
        try:
            conn = await self.connect()
        except HostUnavailable as exc:      # HostBroken included
            facts.update(reachable=self.host_key is not None, host_key=self.host_key,
                         error=str(exc))
            return facts
        facts.update(reachable=True, host_key=self.host_key)
        python = shell_path(self.python)
        try:
            # The interpreter first, on its own: a missing one ends the remote command at once,
            # and a probe sent to its stdin would then race the channel's close ("Channel not
            # open for sending") instead of reporting exit 127.
            done = await self._run(conn, f"command -v {python} >/dev/null || exit 127", timeout=60)
            if done.exit_status == 0:
                done = await self._run(conn, f"{python} -", input=Path(probe.__file__).read_bytes(),
                                       timeout=60)
        except HostUnavailable as exc:      # connected, then lost or no answer: one line too
            facts["error"] = str(exc)
            return facts
        if done.exit_status != 0:
            err = one_line((done.stderr or b"").decode(errors="replace"))
            facts["error"] = (f"host {self.name}: python {self.python!r} not found on the host"
                              if done.exit_status == 127 else
                              f"host {self.name}: python {self.python!r} failed: {err}")
            return facts
        facts.update(json.loads(done.stdout.decode().strip().splitlines()[-1]))
        return facts


class _LaunchState:
    """What the launcher told us on stderr about the cell's process."""

    def __init__(self):
        self.pgid: int | None = None
        self.pgid_known = asyncio.Event()
        self.started = asyncio.Event()
        self.busy: dict | None = None
        self.infra: str | None = None


async def _pump_stderr(stream, tail: deque, on_progress: ProgressFn, state: _LaunchState) -> None:
    async for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("@@pgid "):
            state.pgid = int(line.split()[1])
            state.pgid_known.set()
        elif line == "@@started":
            state.started.set()
        elif line.startswith("@@busy "):
            state.busy = json.loads(line[len("@@busy "):])
        elif line.startswith("@@infra "):
            state.infra = line[len("@@infra "):]
        else:                       # the worker's own lines: progress, or the stderr tail
            route_line(line, tail, on_progress)


async def _first_of(awaitables, timeout: float) -> None:
    """Wait until one of `awaitables` is done, or `timeout` seconds; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, asyncssh.Error) and getattr(exc, "reason", None):
        return one_line(exc.reason)
    return one_line(str(exc) or type(exc).__name__)
