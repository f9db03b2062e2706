"""A cell's kernels under Nsight Compute: the `ncu` knob of kernel and op cells.

Nsight Compute replays each kernel many times (17 passes for the sections kept here) to read its
hardware counters, so it never runs inside a timed cell: after the cell's timing, `profile`
starts `ncu` on a second process (harness/worker/ncu_target.py) that builds the cell's call the
way its workload's runner does (`profile_call`), warms it up, and makes one call between
cudaProfilerStart and Stop; ncu records only that call's kernels. Its report is exported as CSV
and read by harness/worker/counters.py.

Clocks are left as the GPU runs them (`--clock-control none`), so a counter-run duration is
comparable with the cell's `kernel_us`; `sm_ghz` says what they were. Caches are flushed before
each pass (`--cache-control all`): the call reads its inputs from HBM, as the timing's rotated
input sets do.

A host without ncu, a non-CUDA device, counters the driver does not let this user read
(ERR_NVGPUCTRPERM) or a profile that does not finish in TIMEOUT_S: `Unavailable` with the
reason, which the cell records; its timed metrics stand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.worker import counters

# Where a CUDA toolkit puts ncu when it is not on PATH.
_CANDIDATES = ("/usr/local/cuda/bin/ncu",)
# One profile took 10-20 s on an H200 (a process start, the warm-up calls, 17 passes a kernel);
# the cap keeps a hung one from taking the cell's whole timeout_s, and its timing with it.
TIMEOUT_S = 120.0
_REPO = Path(__file__).resolve().parents[2]   # what the target process imports harness from


class Unavailable(RuntimeError):
    """No counters for this call, and why (one line)."""


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for path in _CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


def counters_for(cell: dict, modes: list[str], own: str, device,
                 progress) -> tuple[dict[str, float], dict[str, str]]:
    """Each mode's call under Nsight Compute: (`ncu.<kernel>.<counter>` for the cell's own
    mode and `<mode>.ncu.<kernel>.<counter>` for another, {mode: why it has none})."""
    found: dict[str, float] = {}
    errors: dict[str, str] = {}
    for mode in modes:
        if device.type != "cuda":
            errors[mode] = f"ncu profiles CUDA kernels; this cell ran on {device}"
            continue
        progress(stage="ncu", mode=mode)
        try:
            measured = profile(cell, mode)
        except Unavailable as e:
            errors[mode] = str(e)
            continue
        prefix = "" if mode == own else f"{mode}."
        found.update({prefix + k: v for k, v in measured.items()})
    return found, errors


def profile(cell: dict, mode: str, *, timeout: float = TIMEOUT_S,
            exe: str | None = None) -> dict[str, float]:
    """`ncu.<kernel>.<counter>` for one call of `mode` (a kernel cell's verify mode, an op
    cell's op) at the cell's point; raises Unavailable."""
    exe = exe or find_ncu()
    if exe is None:
        raise Unavailable("ncu (Nsight Compute's command line) is not on PATH nor in /usr/local/cuda/bin")
    with tempfile.TemporaryDirectory(prefix="harness-ncu-") as tmp:
        cell_file = Path(tmp) / "cell.json"
        cell_file.write_text(json.dumps(cell), encoding="utf-8")
        report = Path(tmp) / "profile"
        target = [sys.executable, "-m", "harness.worker.ncu_target", str(cell_file), mode]
        sections = [a for s in counters.SECTIONS for a in ("--section", s)]
        sections += ["--metrics", ",".join(counters.RAW)]
        done = _run([exe, "--profile-from-start", "off", "--target-processes", "all",
                     "--clock-control", "none", "--cache-control", "all", *sections,
                     "--export", str(report), "--force-overwrite", *target], timeout)
        rep = report.with_suffix(".ncu-rep")
        if done.returncode != 0 or not rep.exists():
            raise Unavailable(_why(done, "ncu wrote no report"))
        details = _run([exe, "--import", str(rep), "--csv", "--page", "details"], 60.0)
        raw = _run([exe, "--import", str(rep), "--csv", "--page", "raw"], 60.0)
        try:        # the time by opcode is extra: a version without the page keeps the rest
            source = _run([exe, "--import", str(rep), "--csv", "--page", "source", "--print-source", "sass"],
                          60.0)
        except Unavailable:
            source = None
    if details.returncode != 0:
        raise Unavailable(_why(details, "ncu could not export its report"))
    try:
        pages = counters.parse(details.stdout, raw.stdout if raw.returncode == 0 else "")
    except ValueError as e:
        raise Unavailable(str(e)) from None
    if not pages.kernels:
        raise Unavailable("ncu profiled no kernel of the call")
    if source is not None and source.returncode == 0:
        counters.add_source(pages, counters.parse_source(source.stdout))
    return counters.flatten(pages)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{Path(cmd[0]).name} did not finish within {timeout:g} s") from None
    except OSError as e:
        raise Unavailable(f"could not start {cmd[0]}: {e.strerror or e}") from None


def _why(done: subprocess.CompletedProcess, default: str) -> str:
    """The line that says what went wrong: ncu's first ==ERROR==, else the target's last words."""
    text = (done.stdout or "") + "\n" + (done.stderr or "")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("==ERROR==")]
    if errors:
        return errors[0].removeprefix("==ERROR==").strip()[:300]
    last = [ln for ln in lines if not ln.startswith("==")]
    return f"{default} (exit {done.returncode}): {last[-1][:300]}" if last else \
        f"{default} (exit {done.returncode})"
