"""A real single-node Slurm cluster for the Slurm tests and the Slurm benchmark: munged,
`slurmctld -D` and `slurmd -D` from Debian's packages (slurm-wlm, munge), with a slurm.conf
written for the occasion.

`SlurmCluster(root)` puts everything under `root` (a munge key and socket, the controller's
state, the node's spool, logs), on free ports of 127.0.0.1, so it touches neither /etc/slurm
nor /etc/munge and leaves another cluster on this machine alone. Slurm's commands find it
through `SLURM_CONF` (`cluster.env`).

The node is this machine. It claims at least NODE_CPUS CPUs whatever the machine has
(`SlurmdParameters=config_overrides`): the tests' tasks mostly sleep, and one that sleeps
until its time limit must not hold back the quickstart's four cells on a two-core machine. It
has two fake GPUs (`gres: gpu:1` gives a task a CUDA_VISIBLE_DEVICES of its own), whose device
files are character devices like /dev/null. Two partitions: `debug` (the default) and
`urgent`, whose jobs preempt `debug` jobs (PreemptMode=CANCEL: a preempted task ends as
PREEMPTED).

What the configuration must say on a machine like this one (a container without cgroups or
systemd): `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`, root as SlurmUser.
There is no slurmdbd, so `sacct` says "accounting storage is disabled"; job states come from
`squeue`/`scontrol`, which keep a finished job for MinJobAge (300 s) after it ended.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")
NODE = "node1"
NODE_CPUS = 8
FAKE_GPUS = 2
START_TIMEOUT_S = 30


def available() -> str | None:
    """Why a real Slurm cluster cannot run here, or None if it can."""
    missing = [p for p in DAEMONS if not os.access(p, os.X_OK)]
    missing += [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (f"Slurm or munge is not installed (missing {', '.join(missing)}): "
                f"apt-get install slurm-wlm munge (.ci/run does)")
    if os.geteuid() != 0:
        return "needs root: slurmd runs jobs as their user, and slurmctld as SlurmUser root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One slurmctld and one slurmd (node NODE) with their own munged, under `root`."""

    def __init__(self, root: Path, scheduler_parameters: str | None = None,
                 cpus: int = NODE_CPUS):
        self.root = Path(root)
        self.cpus = max(cpus, os.cpu_count() or 1)
        # Slurm's default batch_sched_delay=3 holds a new batch job back up to 3 s before it
        # is scheduled; the tests set it to 0 (a busy site may raise it: that is its latency).
        self.scheduler_parameters = scheduler_parameters
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.logs = self.root / "log"
        self._procs: dict[str, subprocess.Popen] = {}

    # -- starting and stopping ------------------------------------------------------------------

    def start(self) -> "SlurmCluster":
        for sub in ("munge", "state", "spool", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))       # a munge key is random bytes, nothing more
        key.chmod(0o600)
        self.munge_socket = self.root / "munge" / "munge.socket"
        self._spawn("munged", ["/usr/sbin/munged", "--foreground", "--force",
                               f"--key-file={key}", f"--socket={self.munge_socket}",
                               f"--pid-file={self.root}/munge/munged.pid",
                               f"--log-file={self.logs}/munged.log",
                               f"--seed-file={self.root}/munge/munged.seed"])
        self._wait(lambda: self.munge_socket.exists(), "munged to create its socket", "munged")
        self.gpu_devices = True
        for i in range(FAKE_GPUS):
            # Character devices like /dev/null (1, 3): slurmd takes nothing else as a GPU.
            try:
                os.mknod(self.root / "dev" / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            except OSError:     # a mount without device nodes: GPUs Slurm counts, binds none
                self.gpu_devices = False
        self._write_config()
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D"])
        self._wait(self._controller_answers, "slurmctld to answer", "slurmctld")
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D", "-N", NODE])
        self._wait(self._node_idle, f"node {NODE} to come up idle", "slurmd")
        return self

    def _write_config(self) -> None:
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(f"""\
ClusterName=harnesstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.logs}/slurmctld.log
SlurmdLogFile={self.logs}/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 Gres=gpu:{FAKE_GPUS} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE PriorityTier=1 State=UP
PartitionName=urgent Nodes=ALL MaxTime=INFINITE PriorityTier=10 State=UP
""" + (f"SchedulerParameters={self.scheduler_parameters}\n" if self.scheduler_parameters
       else ""))
        devices = (f"File={self.root}/dev/nvidia[0-{FAKE_GPUS - 1}]" if self.gpu_devices
                   else f"Count={FAKE_GPUS}")
        (self.root / "gres.conf").write_text(f"AutoDetect=off\nNodeName={NODE} Name=gpu {devices}\n")

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.out", "wb")
        # A session of its own, like a daemon's: a Ctrl-C at the terminal running the tests
        # (or one a test sends the controller's group) never reaches the jobs' processes.
        self._procs[name] = subprocess.Popen(argv, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        log.close()

    def _wait(self, condition, what: str, daemon: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            proc = self._procs[daemon]
            if proc.poll() is not None:
                raise RuntimeError(f"{daemon} exited ({proc.returncode}) before {what}:\n"
                                   f"{self.log(daemon)}")
            if condition():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.log(daemon)}")

    def _controller_answers(self) -> bool:
        return self.run("scontrol", "ping").returncode == 0

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "--nodes", NODE, "--format=%T")
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def stop(self) -> None:
        """Cancel every job, wait for them to go, then stop the daemons."""
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", str(os.getuid()))
            deadline = time.monotonic() + 15
            while self.live_jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- looking at it ------------------------------------------------------------------------

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def tasks(self) -> dict[str, str]:
        """Every job (array task) slurmctld knows, finished ones included: id -> state."""
        out = self.run("squeue", "--noheader", "--array", "--states=all", "--format=%i|%T")
        return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)

    def live_jobs(self) -> dict[str, str]:
        """The jobs that are not finished (pending, running, completing ...): id -> state."""
        out = self.run("squeue", "--noheader", "--array", "--format=%i|%T")
        return dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)

    def log(self, daemon: str, chars: int = 3000) -> str:
        try:
            return (self.logs / f"{daemon}.out").read_text(errors="replace")[-chars:]
        except OSError:
            return ""
