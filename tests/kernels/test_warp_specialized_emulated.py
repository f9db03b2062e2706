"""The kernel emulator's named barriers and setmaxnreg, with its mbarriers and tensor copies, on
a probe kernel in FlashAttention-3's warp-specialised shape (tests/kernels/emulator/
warp_specialized_probe.cu): a producer warpgroup copying tiles into a ring of two stages,
two consumer warpgroups reading every tile and taking turns through two named barriers. The
pieces a producer / consumer verify kernel needs, checked before any kernel uses them."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from emulator.emulate import emulated_library

PROBE = Path(__file__).resolve().parent / "emulator" / "warp_specialized_probe.cu"
ROWS, COLS = 8, 64


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = emulated_library(PROBE, tmp_path_factory.mktemp("ws"))
    lib.probe_producer_consumer.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    return lib


def _run(lib, tiles=7, *, consumer_waits=1, producer_regs=40, consumer_regs=232, skew=4242, early=False):
    rng = np.random.default_rng(tiles)
    values = rng.integers(-8, 9, size=(tiles * ROWS, COLS)).astype(np.float32)
    src = (values.view(np.uint32) >> 16).astype(np.uint16)        # exact in bf16
    sums = np.zeros((2, tiles), dtype=np.float32)
    turns = np.full(2 * tiles, -1, dtype=np.int32)
    lib.emu_configure(int(early), skew)
    lib.emu_clear_fault()
    rc = lib.probe_producer_consumer(src.ctypes.data, sums.ctypes.data, turns.ctypes.data, tiles,
                                     int(consumer_waits), producer_regs, consumer_regs)
    want = np.stack([values.reshape(tiles, ROWS, COLS)[:, :, c::2].sum((1, 2)) for c in (0, 1)])
    return rc, sums, turns, want


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("skew", [0, 4242, 777])
def test_consumers_see_every_tile_and_take_turns(probe, skew, early):
    rc, sums, turns, want = _run(probe, skew=skew, early=early)
    assert rc == 0, probe.emu_last_fault().decode()
    np.testing.assert_array_equal(sums, want)
    tiles = sums.shape[1]
    assert turns.tolist() == [c * 1000 + t for t in range(tiles) for c in (0, 1)]


def test_a_consumer_that_reads_before_its_wait_misses_the_copy(probe):
    """Reading the stage before waiting on its full barrier (then waiting) reads it before the
    tile lands: the poison, or the tile two before."""
    rc, sums, _, want = _run(probe, consumer_waits=0)
    assert rc == 0
    assert not np.array_equal(sums, want)


@pytest.mark.parametrize("skew", [0, 4242])
def test_a_consumer_that_releases_before_it_reads_reads_the_next_copy(probe, skew):
    """Releasing a stage (its empty barrier) before reading it lets the producer refill it
    first: the emulator switches threads at a release, and with copies landing at issue the
    read sees the tile a ring later (what a warp-specialised kernel's releases after its MMAs
    retire must avoid; session 21's verify kernel did, kernels/NOTES.md)."""
    rc, sums, _, want = _run(probe, consumer_waits=2, early=True, skew=skew)
    assert rc == 0
    assert not np.array_equal(sums, want)


def test_registers_past_64k_are_refused(probe):
    """24 + 2 x 256 registers a thread over three warpgroups: 68,608 > 65,536."""
    rc, *_ = _run(probe, producer_regs=24, consumer_regs=256)
    assert rc != 0 and "64 K" in probe.emu_last_fault().decode()
    rc, *_ = _run(probe, producer_regs=24, consumer_regs=232)       # 62,464: fits
    assert rc == 0, probe.emu_last_fault().decode()
