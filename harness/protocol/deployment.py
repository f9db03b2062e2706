"""A host's own serving engine (the `service:` block of hosts.yaml) meeting a cell's service_*
parameters: which values a cell runs with, and when the two disagree.

The scenario says what to toggle and what load to send; the host says which engine answers: how
it is started and stopped (a command under setsid, a systemd unit, or someone else's), where it
listens, how its readiness is checked, the variable holding its key. So one scenario measures
each host's own deployment.

Precedence: a value is declared in one place. A cell on a host with a `service:` takes each
value the block declares for a parameter the cell leaves at its default; a cell that sets a
parameter the block also declares, to another value, is refused: neither silently wins, since a
mix of two deployments (the scenario's URL, the host's command) measures an engine nobody
declared. How the engine is started — service_manager, service_start, service_unit — is one
declaration: on a host with a `service:`, a cell sets none of them (or sets them as the block
does). What the block leaves out, the scenario may set.

"Sets" is what the scenario writes (`given`: harness run has it from the scenario, which knows
each cell's own keys). The worker sees only the canonical cell and takes a value other than the
built-in default as set: the same rule, except for a default written out, which harness run has
already refused where it meets another value.

The controller checks every cell against every chosen host's block before a run starts
(harness.hosts.service). The block reaches the worker as JSON in the host's environment
(DEPLOYMENT_ENV): every kind of host (local, ssh, slurm) already hands its `env:` to each worker
it starts, so no transport changes, and the cell sent — whose id the journal, the retries and
the gate key on — stays the scenario's. The deployment is where a cell ran, like its host:
out of the id, recorded beside the result. The JSON holds no secret: a key appears only as its
`${VAR}` name.
"""

from __future__ import annotations

import json
import re

from harness.protocol.workloads.service import PARAMS

DEPLOYMENT_ENV = "HARNESS_SERVICE_DEPLOYMENT"

# hosts.yaml key -> the cell parameter it declares. Toggles (service_env, service_flags) and the
# load (context, concurrency, ...) are the scenario's alone.
HOST_KEYS = {
    "manager": "service_manager", "start": "service_start", "unit": "service_unit",
    "name": "service_name", "model": "service_model", "url": "service_url",
    "ready": "service_ready", "ready_timeout_s": "service_ready_timeout_s",
    "log": "service_log", "api_key": "service_api_key", "trace_dir": "service_trace_dir",
    "profile_start": "service_profile_start", "profile_stop": "service_profile_stop",
    "metrics": "service_metrics", "gpus": "service_gpus",
}
# Which engine runs: declared whole by the host or whole by the cell.
STARTS = ("service_manager", "service_start", "service_unit")
# What tells one deployment from another when results are compared: how the engine is started,
# which model it serves, where it listens. Routes, timeouts, its log, the key's variable and the
# GPUs watched for idle are how it is reached or observed, not which engine answered.
ENGINE = STARTS + ("service_model", "service_url")
DEFAULTS = {p.name: p.default for p in PARAMS}
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def api_key_variable(ref: str | None) -> str | None:
    """VAR of a `${VAR}` key reference (None: no key, or not such a reference)."""
    match = _VARIABLE.fullmatch(ref) if ref else None
    return match.group(1) if match else None


def _sets(cell: dict, name: str, given) -> bool:
    if given is not None:
        return name in given
    return cell.get(name, DEFAULTS[name]) != DEFAULTS[name]


def conflict(cell: dict, declared: dict, given=None) -> tuple[str, str] | None:
    """(parameter, why) for the first parameter canonical `cell` sets against the host's
    `declared` values (cell parameter -> value), or None when they agree. `given`: the names
    the scenario sets on the cell (None: those away from their default)."""
    for name in STARTS:
        value = cell.get(name, DEFAULTS[name])
        if _sets(cell, name, given) and value != declared.get(name, DEFAULTS[name]):
            return name, (f"the cell sets {name} ({value}), but the host's service: declares how "
                          f"its engine is started")
    for name, value in declared.items():
        mine = cell.get(name, DEFAULTS[name])
        if _sets(cell, name, given) and mine != value:
            return name, (f"the cell sets {name} to {mine}, the host's service: to {value} "
                          f"(a value is declared in one place)")
    return None


def effective(cell: dict, declared: dict | None, given=None) -> dict:
    """The cell the engine runs with: the host's values where the cell sets none."""
    out = dict(cell)
    for name, value in (declared or {}).items():
        if not _sets(cell, name, given):
            out[name] = value
    return out


def engine(result: dict) -> dict | None:
    """The engine a result measured (ENGINE parameter -> value): the host's values as the
    result recorded them (`deployment`, harness.hosts.service) over its cell's own, as
    `effective` ran them; {} for a result of another workload; None when it cannot be told (a
    cell that declares no engine, from a host whose declaration was not recorded)."""
    cell = result.get("cell")
    if not isinstance(cell, dict) or cell.get("workload") != "service":
        return {}
    recorded = result.get("deployment")
    recorded = recorded if isinstance(recorded, dict) else {}
    ran = {name: recorded.get(name, cell.get(name, DEFAULTS[name])) for name in ENGINE}
    if not recorded and not (ran["service_start"] or ran["service_unit"]
                             or ran["service_manager"] == "external"):
        return None
    return ran


def encode(declared: dict) -> str:
    return json.dumps(declared, sort_keys=True, separators=(",", ":"))


def decode(text: str | None) -> dict | None:
    """The declared values in DEPLOYMENT_ENV's text (None: the host declares no service).
    ValueError when it is not what `encode` writes."""
    if not text:
        return None
    declared = json.loads(text)
    if not isinstance(declared, dict) or not set(declared) <= set(HOST_KEYS.values()):
        raise ValueError(f"{DEPLOYMENT_ENV} is not a mapping of service parameters")
    return declared
