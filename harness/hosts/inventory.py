"""The hosts inventory: `hosts.yaml` (docs/ARCHITECTURE.md) -> Host objects, and choosing hosts for a sweep.

    hosts:
      gpu-a:
        ssh: gpu-a                  # an alias from ~/.ssh/config, or [user@]host[:port]
        python: /opt/venv/bin/python
        workdir: ~/.cache/specdec-harness
        gpus: [0, 1]                # one cell per GPU at a time
        labels: {gpu: h200}
        env: {HF_TOKEN: "${HF_TOKEN}"}   # ${VAR}: taken from the controller's environment
        known_hosts: strict         # or accept-new: trust a host key never seen before
        connect_timeout_s: 10
        gpu_busy: wait              # a GPU with a foreign process: wait for it, or run `noisy`
        busy_wait_s: 600

      cluster:
        slurm:                      # a Slurm cluster whose commands work on this machine
          partition: gpu
          account: my-project
          gres: gpu:1               # per cell: each cell is one array task
          time_limit: "02:00:00"    # per task (sbatch --time); default: from the cells' timeout_s
          sbatch: [--qos=high, --constraint=h100]   # more sbatch options, one per item
          max_tasks: 32             # cells queued or running at once
          poll_s: 2                 # how often squeue is asked
        python: /shared/venv/bin/python   # the Python on the nodes
        workdir: /shared/scratch/me/specdec-harness   # a folder this machine and the nodes share

      h200-a:
        ssh: h200-a
        env: {SGLANG_API_KEY: "${SGLANG_API_KEY}"}
        service:                    # the host's serving engine, for the service workload
          manager: systemd          # or setsid (with start: a command line), or external
          unit: sglang.service      # its drop-in receives each cell's toggles
          url: http://127.0.0.1:30000
          ready: /health
          ready_timeout_s: 900
          api_key: ${SGLANG_API_KEY}   # a variable of the worker's environment: give it in env:
          trace_dir: /tmp/sglang-traces
          gpus: [0, 1, 2, 3, 4, 5, 6, 7]   # the engine's GPUs (NVML's numbering)

`local` (this machine) always exists; an entry named `local` (without `ssh`) sets its python,
gpus, labels, env and `persistent` (default true: one serving worker process per GPU for the
whole sweep; false: a fresh process per cell, as `harness run --fresh-workers` does). Every
mistake is an InputError at file:line:column, like scenarios.

Values end up on a remote command line only as single shell words (shlex.quote), and host
names and SSH targets are restricted to characters that need no quoting at all: a hosts file
cannot smuggle shell syntax to a host. `${VAR}` values are resolved here, from the controller's
environment, into the Host object only: they are never journaled, logged or sent to MLflow.

A `service:` block's keys are the service workload's `service_*` parameters without the prefix,
checked as a scenario's are (harness.protocol.deployment says how they meet a cell's values and
how they reach the worker; harness.hosts.service holds them on the Host). Its `api_key` is not
resolved here: like a scenario's `service_api_key` it names a variable of the worker's
environment, which `env:` gives an SSH host.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from harness.hosts.interface import Host
from harness.hosts.local import LocalHost, local_hosts
from harness.hosts.service import HostService
from harness.protocol import deployment
from harness.protocol.errors import InputError
from harness.protocol.workloads import service as service_workload
from harness.sweep.yamldoc import EmptyDocument, Source, read_text, read_yaml, show

DEFAULT_HOSTS_FILE = Path("hosts.yaml")
DEFAULT_WORKDIR = "~/.cache/specdec-harness"
GPU_BUSY_POLICIES = ("wait", "noisy")
KNOWN_HOSTS_POLICIES = ("strict", "accept-new")

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# [user@]host[:port]; host is a name, an IPv4 address or a bracketed IPv6 address.
SSH_TARGET = re.compile(r"(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
                        r"(?P<host>[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])"
                        r"(?::(?P<port>[0-9]{1,5}))?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")

_STRICT = ConfigDict(extra="forbid", strict=True)
_Scalar = str | int | float | bool

# Slurm names as sbatch takes them: partitions (a comma-separated list is a choice of them),
# accounts, and generic resources like gpu, gpu:2, gpu:h100:2, gpu:1,nvme:1.
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
SLURM_PARTITIONS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(,[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
SLURM_GRES = re.compile(r"[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2}(,[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+){0,2})*")
# sbatch options the harness sets itself, or that would break how it follows its jobs.
SBATCH_OWN = {
    "--array": "the harness makes the job arrays", "-a": "the harness makes the job arrays",
    "--output": "the harness keeps each task's log", "-o": "the harness keeps each task's log",
    "--error": "the harness keeps each task's log", "-e": "the harness keeps each task's log",
    "--input": "a task reads its cell from the shared folder", "-i": "a task reads its cell "
                                                                    "from the shared folder",
    "--wrap": "the harness writes the job script", "--parsable": "the harness reads sbatch's answer",
    "--chdir": "a task works in the shared folder", "-D": "a task works in the shared folder",
    "--export": "the host's env: reaches the tasks through sbatch's environment",
    "--test-only": "the harness checks the job with it itself", "--wait": "the harness follows "
                                                                          "the job itself",
    "-W": "the harness follows the job itself", "--hold": "a held job never runs its cells",
    "-H": "a held job never runs its cells",
    "--time": "use time_limit", "-t": "use time_limit", "--partition": "use partition",
    "-p": "use partition", "--account": "use account", "-A": "use account", "--gres": "use gres",
}


class SlurmSpec(BaseModel):
    model_config = _STRICT
    partition: str | None = None
    account: str | None = None
    gres: str | None = None
    time_limit: str | None = None
    sbatch: list[str] = Field(default_factory=list)
    max_tasks: Annotated[int, Field(ge=1, le=1000)] = 32
    poll_s: Annotated[float, Field(ge=0.2, le=600)] = 2.0


_SERVICE_PARAMS = {p.name: p for p in service_workload.PARAMS}


def _service_type(key: str):
    """The YAML type of a `service:` key, from its cell parameter's declaration; patterns are
    matched whole in _build_service (pydantic's `pattern` only searches)."""
    if key == "gpus":               # a YAML list here; the cell parameter is its text, "0,1"
        return Annotated[list[Annotated[int, Field(ge=0, le=999)]],
                         Field(min_length=1, max_length=64)]
    p = _SERVICE_PARAMS[deployment.HOST_KEYS[key]]
    if p.choices:
        return Literal[p.choices]
    if p.type is int:
        return Annotated[int, Field(gt=p.gt, ge=p.ge, le=p.le)]
    return str


# Every key optional: the ones given are what the host declares (model_fields_set).
ServiceSpec = create_model("ServiceSpec", __config__=_STRICT,
                           **{key: (_service_type(key) | None, None) for key in deployment.HOST_KEYS})


class HostSpec(BaseModel):
    model_config = _STRICT
    ssh: str | None = None
    slurm: SlurmSpec | None = None
    service: ServiceSpec | None = None
    python: str | None = None
    workdir: str = DEFAULT_WORKDIR
    gpus: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=16)] | None = None
    labels: dict[str, _Scalar] = Field(default_factory=dict)
    env: dict[str, _Scalar] = Field(default_factory=dict)
    known_hosts: Literal[KNOWN_HOSTS_POLICIES] = "strict"
    connect_timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    gpu_busy: Literal[GPU_BUSY_POLICIES] = "wait"
    busy_wait_s: Annotated[float, Field(ge=0)] = 600.0
    persistent: bool | None = None     # local only; unset means true


class HostsFile(BaseModel):
    model_config = _STRICT
    hosts: dict[str, HostSpec] = Field(default_factory=dict)


_WHAT = {
    "ssh": "an SSH alias or [user@]host[:port]",
    "python": "a path to Python on the host (absolute, ~/..., or a command name)",
    "workdir": "a path on the host (absolute or ~/...)",
    "gpus": "a non-empty list of GPU indices (integers >= 0)",
    "labels": "a mapping of label -> value",
    "env": "a mapping of variable -> value",
    "known_hosts": "strict or accept-new",
    "connect_timeout_s": "a number of seconds > 0",
    "gpu_busy": "wait or noisy",
    "busy_wait_s": "a number of seconds >= 0",
    "persistent": "true or false",
    "slurm": "a mapping of Slurm settings (partition, account, gres, time_limit, sbatch, "
             "max_tasks, poll_s)",
    "partition": "a Slurm partition name (or a comma-separated list of them)",
    "account": "a Slurm account name",
    "gres": "a Slurm generic resource like gpu:1 or gpu:h100:2",
    "time_limit": "a Slurm time in quotes: \"30\" (minutes), \"02:00:00\", \"1-12:00:00\" or "
                  "\"UNLIMITED\" (unquoted, YAML reads 1:30 as the number 90)",
    "sbatch": "a list of sbatch options, one per item (like --qos=high)",
    "max_tasks": "an integer from 1 to 1000 (cells queued or running at once)",
    "poll_s": "a number of seconds from 0.2 to 600 (how often squeue is asked)",
    "service": "a mapping of the host's serving engine (" + ", ".join(deployment.HOST_KEYS) + ")",
}
# What each `service:` key must be: its cell parameter's own words.
def _one_of(choices: tuple) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


_SERVICE_WHAT = {key: (_one_of(_SERVICE_PARAMS[name].choices) if _SERVICE_PARAMS[name].choices
                       else _SERVICE_PARAMS[name].what)
                 for key, name in deployment.HOST_KEYS.items()}
_SERVICE_WHAT["gpus"] = "a non-empty list of NVML GPU indices (integers >= 0)"
_SSH_ONLY_KEYS = ("known_hosts", "connect_timeout_s", "gpu_busy", "busy_wait_s")


def _schema_error(exc: ValidationError, source: Source) -> InputError:
    errors = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        in_service = len(loc) > 3 and loc[2] == "service"
        if err["type"] == "extra_forbidden":
            fields = (SlurmSpec.model_fields if len(loc) > 3 and loc[2] == "slurm" else
                      ServiceSpec.model_fields if in_service else
                      HostSpec.model_fields if len(loc) > 2 else HostsFile.model_fields)
            allowed = ", ".join(fields)
            errors.append(source.error(loc, f"unknown key '{loc[-1]}' (expected one of: {allowed})",
                                       key=True))
            continue
        key = next((part for part in reversed(loc) if part in _WHAT), None)
        if in_service:
            errors.append(source.error(loc, f"service.{loc[3]} must be {_SERVICE_WHAT[loc[3]]}, "
                                            f"got {show(err['input'])}"))
            continue
        if not loc:
            message = f"a hosts file is a mapping with a 'hosts' key, got {show(err['input'])}"
        elif len(loc) == 2 and loc[0] == "hosts":
            message = f"host '{loc[1]}' must be a mapping of settings, got {show(err['input'])}"
        elif key:
            message = f"{key} must be {_WHAT[key]}, got {show(err['input'])}"
        elif loc == ("hosts",):
            message = f"hosts must be a mapping of host name -> settings, got {show(err['input'])}"
        else:
            message = err["msg"]
        errors.append(source.error(loc, message))
    return min(errors, key=lambda e: (e.line or 0, e.column or 0))


def _check_path(source: Source, at: tuple, value: str, what: str, *, command_ok: bool) -> None:
    if not value or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise source.error(at, f"{what} must be a non-empty path without control characters "
                               f"(newlines, tabs), got {show(value)}")
    if value.startswith("/") or value.startswith("~/"):
        return
    if command_ok and COMMAND_NAME.fullmatch(value):
        return
    raise source.error(at, f"{what} {show(value)} must be absolute or start with ~/"
                           + (" (or be a plain command name like python3)" if command_ok else ""))


def _resolve_env(source: Source, at: tuple, value) -> str:
    """`${VAR}` -> the controller's value of VAR (kept out of every log and record)."""
    text = value if isinstance(value, str) else show(value)

    def lookup(match: re.Match) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise source.error(at, f"{at[-1]} refers to ${{{name}}}, which is not set in the "
                                   f"controller's environment")
        return os.environ[name]
    return ENV_REFERENCE.sub(lookup, text)


def parse_ssh_target(target: str) -> tuple[str | None, str, int | None]:
    """(user, host, port) of `[user@]host[:port]`; an ssh_config alias is just a host."""
    match = SSH_TARGET.fullmatch(target)
    if not match:
        raise ValueError(target)
    host = match.group("host").strip("[]")
    port = match.group("port")
    return match.group("user"), host, int(port) if port else None


def _build(name: str, spec: HostSpec, source: Source) -> Host:
    host = _build_host(name, spec, source)
    if spec.service is not None:
        # The block rides on the host's env: to every worker it starts (harness.protocol.deployment).
        host.service = _build_service(name, spec, source)
        host.env[deployment.DEPLOYMENT_ENV] = deployment.encode(host.service.declared)
    return host


def _build_service(name: str, spec: HostSpec, source: Source) -> HostService:
    """The host's `service:` block as cell parameter -> value, each checked as the scenario
    checks the parameter, with where each key stands in the file."""
    import shlex

    at = ("hosts", name, "service")
    given = spec.service.model_dump(exclude_unset=True)
    declared, marks = {}, {}
    for key, value in given.items():
        param = deployment.HOST_KEYS[key]
        where = at + (key,)
        if key == "gpus":
            if len(set(value)) != len(value):
                raise source.error(where, "service.gpus lists a GPU twice")
            value = ",".join(str(i) for i in value)
        pattern = _SERVICE_PARAMS[param].pattern
        if isinstance(value, str) and pattern and not re.fullmatch(pattern, value):
            raise source.error(where, f"service.{key} must be {_SERVICE_WHAT[key]}, got "
                                      f"{show(value)}")
        declared[param] = value
        marks[param] = _mark(source, where)
    manager = declared.setdefault("service_manager", deployment.DEFAULTS["service_manager"])
    block = _mark(source, at, key=True)
    needs = {"setsid": "start", "systemd": "unit"}.get(manager)
    if needs is not None and needs not in given:
        raise source.error(at, f"service: with manager {manager} needs {needs} ("
                               + ("the command line that starts the engine" if needs == "start"
                                  else "the systemd unit that runs it") + ")", key=True)
    for key in ("start", "unit"):
        if key in given and key != needs:
            raise source.error(at + (key,), f"service.{key} is a setting of manager "
                                            f"{'setsid' if key == 'start' else 'systemd'}; this "
                                            f"service's manager is {manager}", key=True)
    if "start" in given:
        try:
            words = shlex.split(given["start"])
        except ValueError as exc:
            raise source.error(at + ("start",), f"service.start: unbalanced quoting ({exc})") from None
        if not words:
            raise source.error(at + ("start",), "service.start must be a command line, not empty")
    ref = deployment.api_key_variable(given.get("api_key"))
    if ref is not None and spec.ssh is not None and ref not in spec.env:
        raise source.error(at + ("api_key",), f"service.api_key names ${{{ref}}}, a variable of "
                                              f"the worker's environment, which this host's env: "
                                              f"does not give (add {ref}: \"${{{ref}}}\" to env:)")
    return HostService(host=name, declared=declared, path=source.path, block=block, marks=marks)


def _mark(source: Source, at: tuple, *, key: bool = False) -> tuple[int | None, int | None]:
    error = source.error(at, "", key=key)
    return error.line, error.column


def _build_host(name: str, spec: HostSpec, source: Source) -> Host:
    at = ("hosts", name)
    if not HOST_NAME.fullmatch(name):
        raise source.error(at, f"host name {show(name)} may use only letters, digits, '.', '_' "
                               f"and '-' (and start with a letter or digit)", key=True)
    if spec.gpus is not None and len(set(spec.gpus)) != len(spec.gpus):
        raise source.error(at + ("gpus",), "gpus lists a GPU twice")
    for key in spec.env:
        if not ENV_NAME.fullmatch(key):
            raise source.error(at + ("env", key), f"env name {show(key)} is not a valid "
                                                  f"variable name", key=True)
    env = {key: _resolve_env(source, at + ("env", key), value) for key, value in spec.env.items()}
    if spec.python is not None:
        _check_path(source, at + ("python",), spec.python, "python", command_ok=True)
    _check_path(source, at + ("workdir",), spec.workdir, "workdir", command_ok=False)

    if spec.slurm is not None:
        return _build_slurm(name, spec, source, env)
    if name == "local":
        if spec.ssh is not None:
            raise source.error(at + ("ssh",), "'local' is this machine: it takes no ssh target "
                                              "(name the remote host differently)")
        return LocalHost(name="local", python=os.path.expanduser(spec.python or sys.executable),
                         gpus=spec.gpus, labels=dict(spec.labels), env=env,
                         persistent=spec.persistent is not False)
    if spec.persistent is not None:
        raise source.error(at + ("persistent",), "persistent is a setting of the local host only "
                                                 "(an SSH host starts a worker per cell)", key=True)
    if spec.ssh is None:
        raise source.error(at, f"host '{name}' needs an ssh target (an alias from ~/.ssh/config "
                               f"or [user@]host[:port])")
    try:
        user, host, port = parse_ssh_target(spec.ssh)
    except ValueError:
        raise source.error(at + ("ssh",), f"ssh target {show(spec.ssh)} is not an alias or "
                                          f"[user@]host[:port]") from None
    if port is not None and not 0 < port < 65536:
        raise source.error(at + ("ssh",), f"ssh port {port} is out of range")

    from harness.hosts.ssh import SSHHost
    return SSHHost(name=name, ssh=spec.ssh, user=user, address=host, port=port,
                   python=spec.python or "python3", workdir=spec.workdir,
                   gpus=spec.gpus or [0], labels=dict(spec.labels), env=env,
                   known_hosts=spec.known_hosts, connect_timeout_s=spec.connect_timeout_s,
                   gpu_busy=spec.gpu_busy, busy_wait_s=spec.busy_wait_s)


def _build_slurm(name: str, spec: HostSpec, source: Source, env: dict) -> Host:
    at = ("hosts", name)
    slurm = spec.slurm
    if name == "local":
        raise source.error(at + ("slurm",), "'local' is this machine: it takes no slurm "
                                            "settings (name the cluster differently)", key=True)
    if spec.ssh is not None:
        raise source.error(at + ("slurm",), "a host runs its cells over ssh or through slurm, "
                                            "not both (give the cluster an entry of its own)",
                           key=True)
    if spec.gpus is not None:
        raise source.error(at + ("gpus",), "a slurm host takes its GPUs from slurm.gres (per "
                                           "cell), not gpus", key=True)
    for key in ("persistent", *_SSH_ONLY_KEYS):
        if key in spec.model_fields_set:
            raise source.error(at + (key,), f"{key} is a setting of SSH hosts (a slurm host "
                                             f"leaves its nodes to Slurm)", key=True)
    where = at + ("slurm",)
    if slurm.partition is not None and not SLURM_PARTITIONS.fullmatch(slurm.partition):
        raise source.error(where + ("partition",), f"partition {show(slurm.partition)} is not "
                                                   f"a Slurm partition name (or a comma-separated "
                                                   f"list of them)")
    if slurm.account is not None and not SLURM_NAME.fullmatch(slurm.account):
        raise source.error(where + ("account",), f"account {show(slurm.account)} is not a "
                                                 f"Slurm account name")
    if slurm.gres is not None and not SLURM_GRES.fullmatch(slurm.gres):
        raise source.error(where + ("gres",), f"gres {show(slurm.gres)} is not a Slurm generic "
                                              f"resource like gpu:1 or gpu:h100:2")
    from harness.hosts.slurm import SlurmHost
    from harness.hosts.slurm_job import JobOptions, time_limit_seconds
    if slurm.time_limit is not None:
        try:
            seconds = time_limit_seconds(slurm.time_limit)
        except ValueError:
            raise source.error(where + ("time_limit",), f"time_limit must be {_WHAT['time_limit']}"
                                                        f", got {show(slurm.time_limit)}") from None
        if seconds == 0:
            raise source.error(where + ("time_limit",), "time_limit 0 would ask for no limit: "
                                                        "write \"UNLIMITED\" if that is meant")
    lines = []
    for i, line in enumerate(slurm.sbatch):
        lines.append(_check_sbatch_line(source, where + ("sbatch", i), line))
    return SlurmHost(name=name, python=spec.python or "python3", workdir=spec.workdir,
                     options=JobOptions(partition=slurm.partition, account=slurm.account,
                                        gres=slurm.gres, time_limit=slurm.time_limit,
                                        sbatch=tuple(lines)),
                     max_tasks=slurm.max_tasks, poll_s=slurm.poll_s, labels=dict(spec.labels),
                     env=env)


def _check_sbatch_line(source: Source, at: tuple, line: str) -> str:
    """One extra sbatch option (and its value), as an #SBATCH line would hold it."""
    import shlex

    if not line.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in line):
        raise source.error(at, f"an sbatch option must be one line of text, got {show(line)}")
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise source.error(at, f"sbatch option {show(line)}: {exc}") from None
    if not words or not words[0].startswith("-"):
        raise source.error(at, f"sbatch option {show(line)} must start with - (like --qos=high)")
    for word in (w for w in words if w.startswith("-")):     # "--qos=a --array=1": both
        option = word.split("=", 1)[0]
        if len(option) > 2 and not option.startswith("--"):  # -pgpu: a short one with its value
            option = option[:2]
        if option in SBATCH_OWN:
            raise source.error(at, f"sbatch option {option} is not allowed here: "
                                   f"{SBATCH_OWN[option]}")
    return line


def parse_hosts(text: str, path: str | os.PathLike | None = None) -> dict[str, Host]:
    """Validate hosts YAML `text` into name -> Host (with `local` always present)."""
    shown = None if path is None else str(path)
    try:
        source = read_yaml(text, shown)
    except EmptyDocument:                            # an empty hosts file: just `local`
        return local_hosts()
    try:
        spec = HostsFile.model_validate(source.data)
    except ValidationError as exc:
        raise _schema_error(exc, source) from None
    inventory: dict[str, Host] = local_hosts()
    for name, host_spec in spec.hosts.items():
        inventory[name] = _build(name, host_spec, source)
    return inventory


def load_hosts(path: str | os.PathLike | None = None) -> dict[str, Host]:
    """The inventory from `path`; with no path, from ./hosts.yaml if it exists, else just local."""
    if path is None:
        if not DEFAULT_HOSTS_FILE.is_file():
            return local_hosts()
        path = DEFAULT_HOSTS_FILE
    return parse_hosts(read_text(path, "hosts"), str(path))


def select_hosts(inventory: dict[str, Host], wanted: list, where: str = "--host") -> list[Host]:
    """The hosts named (or matched by label filters like {gpu: h200}) in `wanted`, in order,
    without duplicates. Unknown names and filters that match nothing are InputErrors."""
    chosen: dict[str, Host] = {}
    for entry in wanted:
        if isinstance(entry, dict):
            matched = [h for h in inventory.values()
                       if all(h.labels.get(k) == v for k, v in entry.items())]
            if not matched:
                shown = ", ".join(f"{k}: {show(v)}" for k, v in entry.items())
                raise InputError(where, None, None, f"no host in the inventory has labels "
                                                    f"{{{shown}}}")
            for h in matched:
                chosen.setdefault(h.name, h)
        else:
            if entry not in inventory:
                raise InputError(where, None, None, f"unknown host {show(entry)} (known: "
                                                    f"{', '.join(sorted(inventory))})")
            chosen.setdefault(entry, inventory[entry])
    return list(chosen.values())
