"""The CUDA kernels compile with nvcc for the GPUs we ship for (sm_90a H100/H200, for wgmma, and
sm_120 RTX PRO 6000 Blackwell), without a GPU: a compile error fails CI here rather than on a
GPU host. Plain sm_90 is not built: kernels/build.py gives every compute-capability-9.0 GPU the
arch-specific sm_90a.

kernels/verify/verify_attention.cu includes no torch headers, so plain nvcc compiles it (host launchers
and device code for every architecture) in one call. On Hopper the kernels must not spill
registers to local memory: that would be a silent slowdown of the hot loop. The same holds for
kernels/tree/tree_build.cu (the DDTree tree build, sm_90a and sm_120), and for
kernels/linear/stream_linear.cu (the verify's weight GEMMs, sm_90a).
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


def nvcc_compile(out_dir: Path, source: Path, archs: tuple[str, ...], threads: int = 3,
                 flags: tuple[str, ...] = ()):
    """nvcc -c of `source` for sm_<arch> of each arch (90, 90a, 120, ...) with ptxas's verbose
    report and any extra `flags`; (completed process, object path). Skips the test when nvcc is
    not installed."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH or $CUDA_HOME/bin): cannot compile the CUDA kernels here")
    out = out_dir / (source.stem + ".o")
    gencodes = [x for a in archs for x in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    cmd = [nvcc, "-c", *build.NVCC_FLAGS, *flags, "--threads", str(threads), "-Xptxas", "-v", *gencodes,
           str(source), "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600), out


def assert_compiled_cleanly(proc, out, archs: tuple[str, ...]) -> None:
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr[-6000:]}"
    assert out.stat().st_size > 0
    assert "warning" not in proc.stderr.lower().replace("-warning", ""), proc.stderr[-4000:]
    for a in archs:
        assert f"'sm_{a}'" in proc.stderr


def spills(stderr: str, archs: tuple[str, ...]) -> list[str]:
    """Kernels that spill registers on any of `archs`. ptxas prints, per kernel: "Compiling
    entry function '<name>' for 'sm_90'" then its "N bytes stack frame, N bytes spill stores,
    N bytes spill loads"."""
    kernel, arch, found = None, None, []
    for line in stderr.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for 'sm_(\w+)'", line)
        if m:
            kernel, arch = m.groups()
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and arch in archs and (int(m.group(1)) or int(m.group(2))):
            found.append(f"{kernel} (sm_{arch}): {line.strip()}")
    return found


VERIFY_ARCHS = ("90a", "120")
TREE_BUILD_ARCHS = ("90a", "120")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return nvcc_compile(tmp_path_factory.mktemp("nvcc"), SOURCE, VERIFY_ARCHS)


def test_compiles_for_sm90a_and_sm120(compiled):
    assert_compiled_cleanly(*compiled, VERIFY_ARCHS)


def test_no_register_spills_on_hopper(compiled):
    proc, _ = compiled
    assert proc.returncode == 0
    # ptxas advisories C75xx: wgmma serialised, or warpgroup.arrive injected around a wgmma loop.
    advisories = [ln for ln in proc.stderr.splitlines() if "(C75" in ln]
    assert not advisories, "\n".join(advisories)[-4000:]
    found = spills(proc.stderr, ("90a",))
    assert not found, "register spills on Hopper:\n" + "\n".join(found)


def test_tree_build_compiles_for_sm90a_and_sm120_without_spills(tmp_path):
    proc, out = nvcc_compile(tmp_path, Path(build.TREE_BUILD_SOURCE), TREE_BUILD_ARCHS, threads=2)
    assert_compiled_cleanly(proc, out, TREE_BUILD_ARCHS)
    found = spills(proc.stderr, TREE_BUILD_ARCHS)
    assert not found, "register spills:\n" + "\n".join(found)


@pytest.mark.parametrize("flags, kernel", [(build.TMA_FLAGS, "gqa_tma_kernel"), (build.WS_FLAGS, "gqa_ws_kernel")],
                         ids=["tensor-copy", "warp-specialised"])
def test_the_opt_in_builds_compile_without_spills_or_serialised_wgmma(tmp_path, flags, kernel):
    """HARNESS_KERNEL_TMA's build (gqa_tma_kernel) and HARNESS_KERNEL_WS's (gqa_ws_kernel:
    setmaxnreg, named barriers, mbarrier releases), kernels/build.py, on Hopper."""
    proc, out = nvcc_compile(tmp_path, SOURCE, ("90a",), threads=2, flags=flags)
    assert_compiled_cleanly(proc, out, ("90a",))
    assert kernel in proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if "(C75" in ln]
    found = spills(proc.stderr, ("90a",))
    assert not found, "register spills on Hopper:\n" + "\n".join(found)


def test_stream_linear_compiles_for_hopper_without_spills_or_serialised_wgmma(tmp_path):
    """kernels/linear/stream_linear.cu (the verify's weight GEMMs): wgmma, tensor copies and
    mbarriers, sm_90a only (the only GPU that takes it: stream_linear.py)."""
    proc, out = nvcc_compile(tmp_path, Path(build.STREAM_LINEAR_SOURCE), ("90a",), threads=2)
    assert_compiled_cleanly(proc, out, ("90a",))
    assert "stream_linear_kernel" in proc.stderr
    assert not [ln for ln in proc.stderr.splitlines() if "(C75" in ln]
    found = spills(proc.stderr, ("90a",))
    assert not found, "register spills on Hopper:\n" + "\n".join(found)
