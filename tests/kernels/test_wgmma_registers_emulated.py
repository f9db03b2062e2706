"""The kernel emulator's rule for a warpgroup MMA's A operand in registers, on a probe kernel
(tests/kernels/emulator/wgmma_registers_probe.cu): the GPU reads those registers asynchronously
until the wait_group that retires the MMA, so a thread that writes them before that wait (a P
tile packed into the registers a P V product still in flight reads) gets NaN for the outputs
its share feeds, and one that writes them after the wait gets the product."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from emulator.emulate import emulated_library

PROBE = Path(__file__).resolve().parent / "emulator" / "wgmma_registers_probe.cu"


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = emulated_library(PROBE, tmp_path_factory.mktemp("wgmma_regs"))
    lib.probe_register_a.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def _run(lib, before: bool, writers: int) -> np.ndarray:
    out = np.full(128, -1.0, dtype=np.float32)
    lib.emu_configure(0, 0)
    try:
        assert lib.probe_register_a(out.ctypes.data, int(before), writers) == 0, lib.emu_last_fault()
    finally:
        lib.emu_clear_fault()
    return out


def test_registers_written_after_the_wait_leave_the_product(probe):
    assert (_run(probe, False, 128) == 0.0).all()


@pytest.mark.parametrize("writers", [1, 37, 128])
def test_registers_written_before_the_wait_make_the_writers_outputs_nan(probe, writers):
    out = _run(probe, True, writers)
    assert np.isnan(out[:writers]).all()
    assert (out[writers:] == 0.0).all()
