"""Build a kernels/*.cu file against the CPU emulator (cuda_emulation.h) and open it.

    from emulator.emulate import emulated_library      # tests/ is on sys.path under pytest
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def emulated_library(source: str | Path, out_dir: Path, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """kernels/<source> (or `source` itself, an absolute path) compiled with -DTVA_EMULATE into
    out_dir, with the emulator's own entry points declared (skips the test when no C++ compiler
    is installed).

    -fsanitize=alignment: every typed load/store of the kernels is checked for the alignment of
    its type and reported to the emulator, which fails the launch with
    cudaErrorMisalignedAddress like the GPU does."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build the kernel emulator")
    so = out_dir / (Path(source).stem + "".join(f"_{d.lower()}" for d in defines) + "_emu.so")
    cmd = [cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-DTVA_EMULATE", "-fsanitize=alignment",
           *(f"-D{d}" for d in defines),
           f"-I{Path(__file__).resolve().parent}", "-Wno-unknown-pragmas", "-x", "c++",
           str(Path(source) if Path(source).is_absolute() else ROOT / "kernels" / source), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    lib.emu_configure.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
    lib.emu_last_fault.restype = ctypes.c_char_p
    lib.emu_clear_fault.restype = None
    lib.emu_dry_run.argtypes = [ctypes.c_int]
    lib.emu_dry_run.restype = None
    lib.emu_launch_count.restype = ctypes.c_long
    lib.emu_tensor_copy_count.restype = ctypes.c_long
    lib.emu_skew_bits.argtypes = [ctypes.c_int]
    lib.emu_slow_rank.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_int]
    return lib
