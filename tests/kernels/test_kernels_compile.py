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
# gqa_pipelined_kernel<128, 4, contiguous>: wgmma_pv's, and with the sum-checked softmax
PIPELINED = "_ZN3tva20gqa_pipelined_kernelILi128ELi4ELb0ELb0EEEvNS_10AttnParamsE"
SUMCHECK = "_ZN3tva20gqa_pipelined_kernelILi128ELi4ELb0ELb1EEEvNS_10AttnParamsE"
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


def test_the_tensor_copy_build_compiles_without_spills_or_serialised_wgmma(tmp_path):
    """HARNESS_KERNEL_TMA's build (gqa_tma_kernel, with and without the sum-checked softmax, and
    MLA's mla_tma_kernel), kernels/build.py, on Hopper."""
    proc, out = nvcc_compile(tmp_path, SOURCE, ("90a",), threads=2, flags=build.TMA_FLAGS)
    assert_compiled_cleanly(proc, out, ("90a",))
    for kernel in ("gqa_tma_kernelILi128ELi4ELb0E", "gqa_tma_kernelILi128ELi4ELb1E", "mla_tma_kernel"):
        assert kernel in proc.stderr, kernel
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


# ------------------------------------------------------------------------------------------
# What the SASS keeps of a kernel's schedule. The point of the pipelined kernels is where their
# warpgroup waits fall in the loop, and ptxas decides that (it has moved a wait above the
# softmax it was written to overlap, and serialised every wgmma over one read; kernels/NOTES.md):
# a new nvcc that does so again changes no result, only the time, so it is checked here.
# cuobjdump and nvdisasm come from their nvidia-cuda-* wheels (the dev extras), or the toolkit.
# ------------------------------------------------------------------------------------------

def _cuda_tool(name: str) -> str | None:
    """`name` on PATH, in $CUDA_HOME/bin, or in a wheel's nvidia/cu*/bin."""
    found = shutil.which(name) or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)
    if os.path.isfile(found) and os.access(found, os.X_OK):
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", ()):
        for candidate in sorted(Path(root).glob(f"*/bin/{name}")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def sass(obj: Path, function: str) -> list[tuple[int, str]]:
    """`function`'s sm_90a SASS in `obj` as (address, instruction) pairs."""
    tool, disasm = _cuda_tool("cuobjdump"), _cuda_tool("nvdisasm")
    if tool is None or disasm is None:
        pytest.skip("cuobjdump or nvdisasm not found (the nvidia-cuda-cuobjdump and -nvdisasm wheels, "
                    "or $CUDA_HOME/bin)")
    proc = subprocess.run([tool, "-sass", "-arch", "sm_90a", "-fun", function, str(obj)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NVDISASM_PATH": str(Path(disasm).parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    code = [(int(m.group(1), 16), m.group(2).strip()) for m in
            re.finditer(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*);", proc.stdout)]
    assert code, f"no SASS for {function}"
    return code


def _event(ins: str) -> str | None:
    if "HGMMA.64x64x16" in ins:
        return "S"
    if "HGMMA.64x128x16" in ins:
        return "PV"
    if (w := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", ins)):
        return f"wait {int(w.group(1), 16)}"
    return "EX2" if "MUFU.EX2" in ins else None


def main_loop(code: list[tuple[int, str]]) -> tuple[int, int]:
    """The main loop's (first, last) address: the shortest span of a backward branch that holds
    both an S product and a softmax (barrier spin loops hold neither, and branches back from
    code laid out after the loop hold more)."""
    def events(start: int, end: int) -> set[str]:
        return {e for at, ins in code if start <= at <= end and (e := _event(ins))}

    back = [(int(t.group(1), 16), at) for at, ins in code
            if (t := re.search(r"\bBRA (0x[0-9a-f]+)", ins)) and int(t.group(1), 16) < at]
    loops = [span for span in back if {"S", "EX2"} <= events(*span)]
    assert loops, "no loop with S and a softmax"
    return min(loops, key=lambda span: span[1] - span[0])


def loop_events(obj: Path, function: str) -> list[str]:
    """The main loop of `function` (main_loop) as its schedule's events in order: S (an HGMMA
    64x64), PV (64x128), a warpgroup wait `wait N` (WARPGROUP.DEPBAR.LE gsb0, N: at most N
    groups left in flight) and EX2 (the softmax's MUFU.EX2)."""
    code = sass(obj, function)
    start, end = main_loop(code)
    return [e for at, ins in code if start <= at <= end and (e := _event(ins))]


def shortest_paths_to_vote(obj: Path, function: str) -> list[list[str]]:
    """For each wait for S in the main loop (`wait 1`: only P V left in flight), the opcodes on
    the shortest path (in instructions, through branches taken or not) from it to the softmax's
    vote: the way a tile with nothing to mask and nothing to rescale goes."""
    code = sass(obj, function)
    start, end = main_loop(code)
    index = {at: i for i, (at, _) in enumerate(code)}

    def successors(i: int) -> list[int]:
        ins = code[i][1]
        target = re.search(r"\bBRA (0x[0-9a-f]+)", ins)
        nxt = [i + 1] if i + 1 < len(code) and not (target and not ins.startswith("@")) else []
        return nxt + ([index[int(target.group(1), 16)]] if target else [])

    paths = []
    for i, (at, ins) in enumerate(code):
        if not (start <= at <= end and _event(ins) == "wait 1"):
            continue
        came_from, frontier, found = {i: None}, [i], None
        while frontier and found is None:          # breadth-first: each edge one instruction
            step = []
            for j in frontier:
                if "VOTE" in code[j][1]:
                    found = j
                    break
                for k in successors(j):
                    if k not in came_from:
                        came_from[k] = j
                        step.append(k)
            frontier = step
        assert found is not None, f"no vote after the wait at {at:#x}"
        path, j = [], found
        while j is not None:
            ins = code[j][1]
            path.append((ins.split()[1] if ins.startswith("@") else ins.split()[0]).split(".")[0])
            j = came_from[j]
        paths.append(path[::-1])
    return paths


def waits_before_softmax(events: list[str]) -> list[list[str]]:
    """For each tile of the loop, the warpgroup waits between its S MMAs and its softmax."""
    tiles, i = [], 0
    while i < len(events):
        if events[i] != "S":
            i += 1
            continue
        while i < len(events) and events[i] in ("S", "PV"):
            i += 1
        waits = []
        while i < len(events) and events[i] != "EX2":
            if events[i].startswith("wait"):
                waits.append(events[i])
            i += 1
        tiles.append(waits)
        while i < len(events) and events[i] != "S":
            i += 1
    return tiles


def test_the_pipelined_kernel_keeps_p_v_in_flight_under_the_softmax(compiled):
    """gqa_pipelined_kernel (custom_impl wgmma_pv): in each of its loop's two tiles (they run in
    pairs) the waits between the S and P V issues and the softmax include one that retires S_{j+1}
    and leaves one group in flight, P_j V_j, to run under that softmax (the last tile's branch,
    laid out in between, waits for all)."""
    _, obj = compiled
    pipelined = waits_before_softmax(loop_events(obj, PIPELINED))
    assert len(pipelined) == 2 and all("wait 1" in w for w in pipelined), pipelined


def test_the_sum_checked_softmax_has_no_max_on_its_fast_path(compiled):
    """gqa_pipelined_kernel<..., SUMCHECK> (custom_impl wgmma_sumcheck): from the wait for S to
    the vote, a tile with nothing to mask runs the exponentials straight from S's registers and
    their row sums: no max tree, no shuffle, no copy of S (a copy before the mask branch once
    cost a move a score). The plain pipelined kernel's same path has the max tree and its
    shuffles, which this check tells apart."""
    _, obj = compiled
    for path in shortest_paths_to_vote(obj, SUMCHECK):
        # 32 exponentials and the two rows' 16-term sum trees (15 adds each)
        assert path.count("MUFU") == 32 and path.count("FADD") == 30, path
        assert not {"SHFL", "FMNMX"} & set(path), path
        assert path.count("IMAD") <= 2 and len(path) <= 115, (len(path), path)
    for path in shortest_paths_to_vote(obj, PIPELINED):
        assert path.count("SHFL") == 4 and path.count("FMNMX") >= 30, path
