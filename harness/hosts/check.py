"""`harness hosts check`: one line per host, all hosts probed in parallel.

For each host: reachable, host key known, Python and torch versions, GPUs, driver, and the GPUs
that foreign processes are using right now. It connects and runs harness/remote/probe.py under the
host's Python; it ships nothing and writes nothing on the host.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rich.markup import escape

from harness.hosts.interface import Host
from harness.hosts.local import LocalHost
from harness.remote import probe

CHECK_TIMEOUT_S = 90


async def _check_local(host: LocalHost) -> dict:
    facts = {"name": host.name, "ssh": None, "reachable": True, "host_key": None}
    try:
        proc = await asyncio.create_subprocess_exec(
            host.python, "-", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        facts["error"] = f"host {host.name}: python {host.python!r} does not run: {exc.strerror}"
        return facts
    out, err = await proc.communicate(Path(probe.__file__).read_bytes())
    if proc.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        facts["error"] = f"host {host.name}: python {host.python!r} failed: {last}"
        return facts
    facts.update(json.loads(out.decode().strip().splitlines()[-1]))
    return facts


async def check_host(host: Host) -> dict:
    try:
        if isinstance(host, LocalHost):
            return await asyncio.wait_for(_check_local(host), CHECK_TIMEOUT_S)
        try:
            return await asyncio.wait_for(host.check(), CHECK_TIMEOUT_S)
        finally:
            await host.close()
    except asyncio.TimeoutError:
        return {"name": host.name, "reachable": False,
                "error": f"host {host.name}: no answer within {CHECK_TIMEOUT_S} s"}


async def check_all(hosts: list[Host]) -> list[dict]:
    return list(await asyncio.gather(*(check_host(h) for h in hosts)))


def describe(facts: dict) -> tuple[bool, str]:
    """(usable, one line) for a host's facts. Usable: reachable, its Python runs and has torch."""
    name = facts["name"]
    if facts.get("error"):
        where = "" if facts.get("reachable") else "unreachable — "
        key = facts.get("host_key")
        if key in ("unknown", "changed"):
            where = f"host key {key.upper()} — "
        message = facts["error"]
        prefix = f"host {name}: "
        if message.startswith(prefix):
            message = message[len(prefix):]
        return False, f"{name}: [red]{where}[/]{escape(message)}"
    if "slurm" in facts:
        return _describe_slurm(facts)
    parts = ["reachable"]
    if facts.get("host_key"):
        parts.append(f"host key {facts['host_key']}")
    parts.append(escape(f"python {facts.get('python')}"))
    # Every workload but noop imports torch: without it each cell would fail on its own.
    has_torch = bool(facts.get("torch"))
    parts.append(escape(f"torch {facts['torch']}") if has_torch else
                 "[red]no torch[/] (decode, op, kernel and peer cells need it: install it for "
                 "that python, or point `python:` at one that has it)")
    gpus = facts.get("gpus")
    if gpus:
        names = sorted({g["name"] for g in gpus})
        parts.append(escape(f"{len(gpus)}× {', '.join(names)}, driver {facts.get('driver')}"))
        busy = facts.get("busy") or {}
        if busy:
            shown = "; ".join(f"GPU {idx}: " + ", ".join(f"pid {p['pid']} {p['name']} "
                                                          f"({p['used_mib']} MiB)" for p in procs)
                              for idx, procs in sorted(busy.items()))
            parts.append(f"[yellow]busy GPUs[/] {escape(shown)}")
        else:
            parts.append("no busy GPUs")
    else:
        parts.append("no GPUs (no nvidia-smi)")
    return has_torch, f"{name}: " + ", ".join(parts)


def _describe_slurm(facts: dict) -> tuple[bool, str]:
    """A slurm host's line: its partitions as sinfo sees them, Slurm's verdict on a test
    submission of the host's job, and its Python where this machine can run it."""
    parts = ["Slurm answers"]
    for name, p in facts["slurm"]["partitions"].items():
        nodes = sum(p["nodes"].values())
        states = ", ".join(f"{n} {state}" for state, n in sorted(p["nodes"].items()))
        gres = f"; gres {', '.join(p['gres'])}" if p["gres"] else ""
        parts.append(escape(f"partition {name}{' (default)' if p['default'] else ''} "
                            f"{p['avail']}: {nodes} node(s), {states}{gres}; time limit "
                            f"{p['time_limit']}"))
    parts.append("the host's job is accepted (sbatch --test-only)")
    usable = True
    if facts.get("python_unchecked"):
        parts.append(escape(f"python {facts['python_unchecked']}: checked by the first cell"))
    else:
        parts.append(escape(f"python {facts.get('python')}"))
        usable = bool(facts.get("torch"))
        parts.append(escape(f"torch {facts['torch']}") if usable else
                     "[red]no torch[/] (decode, op, kernel and peer cells need it: install it "
                     "for that python, or point `python:` at one that has it)")
    return usable, f"{facts['name']}: " + ", ".join(parts)
