"""The kernel emulator's thread block clusters, on a probe kernel (tests/kernels/emulator/
cluster_probe.cu): a cluster's blocks run together, so each reads what the next wrote to its
shared memory once both have passed the cluster barrier, and reads the poison without it; ranks
count within a cluster; threads that exit are not awaited; a cluster size that does not divide
the grid is refused as the runtime refuses it."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from emulator.emulate import emulated_library

PROBE = Path(__file__).resolve().parent / "emulator" / "cluster_probe.cu"
INVALID_VALUE = 1        # cudaErrorInvalidValue


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = emulated_library(PROBE, tmp_path_factory.mktemp("cluster"))
    lib.probe_next_block.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 5
    return lib


def _run(lib, blocks, threads, cluster, sync_first=True, exit_early=0, reverse=False):
    out = np.full((blocks, threads), -1.0, dtype=np.float32)
    ranks = np.full((blocks, 2), -1, dtype=np.int32)
    lib.emu_reverse_blocks.argtypes = [ctypes.c_int]
    # The schedule these cases rely on: no skew (the emulator's statics are shared by every
    # emulated library a test process has loaded, so another module's setting could remain).
    lib.emu_configure(0, 0)
    lib.emu_reverse_blocks(int(reverse))
    try:
        rc = lib.probe_next_block(out.ctypes.data, ranks.ctypes.data, blocks, threads, cluster, int(sync_first),
                                  exit_early)
    finally:
        lib.emu_reverse_blocks(0)
        lib.emu_clear_fault()      # a refused launch's message stays until cleared
    return rc, out, ranks


@pytest.mark.parametrize("cluster", [1, 2, 4])
@pytest.mark.parametrize("reverse", [False, True])
def test_each_block_reads_what_the_next_one_wrote(probe, cluster, reverse):
    """8 blocks of 64 threads in clusters of 1, 2 or 4 (in either launch order): block b reads
    the shared memory of the next block of its own cluster, after the barrier."""
    rc, out, ranks = _run(probe, 8, 64, cluster, reverse=reverse)
    assert rc == 0
    for b in range(8):
        first = b - b % cluster
        nxt = first + (b - first + 1) % cluster
        np.testing.assert_array_equal(out[b], 1000 * nxt + np.arange(64))
        assert tuple(ranks[b]) == (b % cluster, cluster)


def test_without_the_barrier_a_block_reads_the_poison(probe):
    """Threads run round-robin, block after block, between barriers: block 0's threads read block
    1's shared memory before block 1 has written it, so they see the poison (NaN), as a kernel
    without the cluster barrier may on the GPU."""
    rc, out, _ = _run(probe, 2, 64, 2, sync_first=False)
    assert rc == 0
    assert np.isnan(out[0]).all()


def test_threads_that_exit_are_not_awaited(probe):
    """Threads 32-63 of every block exit before the barriers: the others' waits return once every
    thread still running has arrived."""
    rc, out, _ = _run(probe, 4, 64, 2, exit_early=32)
    assert rc == 0
    for b in range(4):
        nxt = b ^ 1
        np.testing.assert_array_equal(out[b, :32], 1000 * nxt + np.arange(32))
        assert (out[b, 32:] == -1.0).all()


@pytest.mark.parametrize("blocks, cluster", [(6, 4), (16, 16), (4, 0)])
def test_a_cluster_that_does_not_fit_is_refused(probe, blocks, cluster):
    """A cluster size must divide the grid's x and be at most 8 (the portable size): otherwise
    cudaErrorInvalidValue and nothing runs."""
    rc, out, _ = _run(probe, blocks, 64, cluster)
    assert rc == INVALID_VALUE
    assert (out == -1.0).all()
