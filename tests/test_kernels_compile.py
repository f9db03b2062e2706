"""The CUDA kernels compile with nvcc for the GPUs we ship for (sm_90 / sm_90a H100/H200 — the
H200 build is sm_90a, for wgmma — and sm_120 RTX PRO 6000 Blackwell), without a GPU: a compile
error fails CI here rather than on a GPU host.

kernels/verify_attention.cu includes no torch headers, so plain nvcc compiles it (host launchers
and device code for every architecture) in one call. On Hopper the kernels must not spill
registers to local memory: that would be a silent slowdown of the hot loop. The same holds for
kernels/tree_build.cu (the DDTree tree build, sm_90 and sm_120).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.kernels import build

SOURCE = Path(build.SOURCE)


def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH or $CUDA_HOME/bin): cannot compile the CUDA kernels here")
    out = tmp_path_factory.mktemp("nvcc") / "verify_attention.o"
    cmd = [nvcc, "-c", *build.NVCC_FLAGS, "--threads", "3", "-Xptxas", "-v",
           "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_90a,code=sm_90a",
           "-gencode", "arch=compute_120,code=sm_120", str(SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc, out


def test_compiles_for_sm90_sm90a_and_sm120(compiled):
    proc, out = compiled
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr[-6000:]}"
    assert out.stat().st_size > 0
    assert "warning" not in proc.stderr.lower().replace("-warning", ""), proc.stderr[-4000:]


def test_no_register_spills_on_hopper(compiled):
    proc, _ = compiled
    assert proc.returncode == 0
    # ptxas advisories C75xx: wgmma serialised, or warpgroup.arrive injected around a wgmma loop.
    advisories = [ln for ln in proc.stderr.splitlines() if "(C75" in ln]
    assert not advisories, "\n".join(advisories)[-4000:]
    # ptxas prints, per kernel: "Compiling entry function '<name>' for 'sm_90'" then its
    # "N bytes stack frame, N bytes spill stores, N bytes spill loads".
    kernel, arch, spills = None, None, []
    for line in proc.stderr.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            kernel, arch = m.groups()
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and arch in ("sm_90", "sm_90a") and (int(m.group(1)) or int(m.group(2))):
            spills.append(f"{kernel}: {line.strip()}")
    assert "'sm_90a'" in proc.stderr and "'sm_90'" in proc.stderr
    assert not spills, "register spills on Hopper:\n" + "\n".join(spills)


@pytest.fixture(scope="module")
def compiled_tree_build(tmp_path_factory):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH or $CUDA_HOME/bin): cannot compile the CUDA kernels here")
    out = tmp_path_factory.mktemp("nvcc") / "tree_build.o"
    cmd = [nvcc, "-c", *build.NVCC_FLAGS, "--threads", "2", "-Xptxas", "-v",
           "-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_120,code=sm_120",
           str(build.TREE_BUILD_SOURCE), "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), out


def test_tree_build_compiles_for_sm90_and_sm120_without_spills(compiled_tree_build):
    proc, out = compiled_tree_build
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr[-6000:]}"
    assert out.stat().st_size > 0
    assert "warning" not in proc.stderr.lower().replace("-warning", ""), proc.stderr[-4000:]
    assert "'sm_90'" in proc.stderr and "'sm_120'" in proc.stderr
    spills = [ln for ln in proc.stderr.splitlines()
              if (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ln)) and
              (int(m.group(1)) or int(m.group(2)))]
    assert not spills, "register spills:\n" + "\n".join(spills)
