"""What a host has: Python, torch, GPUs, driver, and which GPUs foreign processes are using.

Standard library only, and self-contained (no harness imports): `harness hosts check` sends this
file's source to a host's Python on stdin (`python -`) before any bundle is there, and the
remote launcher (harness.remote.launcher) imports it to check a GPU before a cell runs on it.

GPU facts come from `nvidia-smi` queries; a host without it simply reports no GPUs.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys


def _nvidia_smi(query: str, fields: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi --query-<query>=<fields>`, or None without a working nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}={fields}",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines()
            if line.strip()]


def gpus() -> list[dict] | None:
    rows = _nvidia_smi("gpu", "index,uuid,name,driver_version,memory.total")
    if rows is None:
        return None
    return [{"index": int(r[0]), "uuid": r[1], "name": r[2], "driver": r[3],
             "memory_mib": _number(r[4])} for r in rows if len(r) >= 5]


def compute_apps() -> list[dict] | None:
    """Every process holding a CUDA context, with the GPU it is on."""
    rows = _nvidia_smi("compute-apps", "gpu_uuid,pid,process_name,used_memory")
    if rows is None:
        return None
    return [{"gpu_uuid": r[0], "pid": _number(r[1]), "name": r[2], "used_mib": _number(r[3])}
            for r in rows if len(r) >= 4]


def busy_gpus() -> dict[int, list[dict]]:
    """GPU index -> the processes running on it (GPUs without any are left out)."""
    devices = gpus() or []
    apps = compute_apps() or []
    by_uuid = {d["uuid"]: d["index"] for d in devices}
    busy: dict[int, list[dict]] = {}
    for app in apps:
        index = by_uuid.get(app["gpu_uuid"])
        if index is not None:
            busy.setdefault(index, []).append(
                {"pid": app["pid"], "name": app["name"], "used_mib": app["used_mib"]})
    return busy


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def _torch_version() -> str | None:
    # The distribution's metadata: no `import torch` (seconds, and it may initialise CUDA).
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("torch")
    except PackageNotFoundError:
        return None
    except Exception:  # a broken environment: report no torch rather than crash the probe
        return None


def report() -> dict:
    devices = gpus()
    return {"python": platform.python_version(), "executable": sys.executable,
            "torch": _torch_version(), "gpus": devices,
            "driver": devices[0]["driver"] if devices else None,
            "busy": {str(k): v for k, v in busy_gpus().items()} if devices else {}}


if __name__ == "__main__":
    print(json.dumps(report()))
