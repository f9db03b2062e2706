"""The kernel emulator's mbarrier and tensor-copy (TMA) model, on its own probe kernels
(tests/kernels/emulator/tma_probe.cu): a box read through a tensor map lands where and as the
hardware puts it (rows one after another, elements outside the tensor zero, the 128-byte swizzle
on absolute shared addresses), a barrier's two phases alternate parity, a read that does not
wait sees the poison, and cuTensorMapEncodeTiled refuses what the driver refuses; a bulk load
lands contiguous bytes and a tensor store writes its box, clipped to the tensor, when its wait
retires it."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emulator.emulate import emulated_library

PROBE = Path(__file__).resolve().parent / "emulator" / "tma_probe.cu"
POISON = 0xFFFF            # shared memory before anything lands (bf16 NaN)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    lib = emulated_library(PROBE, tmp_path_factory.mktemp("tma"))
    lib.probe_two_boxes.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_int] * 8
    lib.probe_encode.argtypes = [ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int]
    return lib


def _boxes(lib, shape, origin, box, swizzle, wait_first=True, early=False, read_swizzled=None):
    d2, d1, d0 = shape
    src = np.arange(d0 * d1 * d2, dtype=np.uint16).reshape(shape) + 1      # no element is 0
    out = np.zeros((2, box[1], box[0]), dtype=np.uint16)
    lib.emu_configure(int(early), 0)
    rc = lib.probe_two_boxes(src.ctypes.data, out.ctypes.data, d0, d1, d2, *origin, box[0], box[1],
                             int(swizzle), int(swizzle if read_swizzled is None else read_swizzled),
                             int(wait_first))
    lib.emu_configure(0, 0)
    return rc, src, out


def _expected(src, origin, box):
    """numpy's box at origin (c0, c1, c2): zeros where it leaves the tensor."""
    c0, c1, c2 = origin
    d2, d1, d0 = src.shape
    want = np.zeros((box[1], box[0]), dtype=np.uint16)
    for r in range(box[1]):
        for c in range(box[0]):
            if 0 <= c2 < d2 and 0 <= c1 + r < d1 and 0 <= c0 + c < d0:
                want[r, c] = src[c2, c1 + r, c0 + c]
    return want


@pytest.mark.parametrize("swizzle", [False, True])
@pytest.mark.parametrize("early", [False, True])
def test_boxes_land_as_the_hardware_puts_them(probe, swizzle, early):
    """64-column boxes of 16 rows, the first reaching past the tensor's last row (zeros there),
    the second in the next plane, through one barrier's phases 0 and 1."""
    shape, origin, box = (2, 40, 64), (0, 32, 0), (64, 16)
    rc, src, out = _boxes(probe, shape, origin, box, swizzle, early=early)
    assert rc == 0
    np.testing.assert_array_equal(out[0], _expected(src, origin, box))
    np.testing.assert_array_equal(out[1], _expected(src, (0, 0, 1), box))
    assert (out[0][8:] == 0).all() and (out[0][:8] != 0).all()


def test_a_box_left_of_the_tensor_is_zero_there(probe):
    rc, src, out = _boxes(probe, (2, 40, 64), (-8, 0, 0), (32, 8), swizzle=False)
    assert rc == 0
    np.testing.assert_array_equal(out[0], _expected(src, (-8, 0, 0), (32, 8)))
    assert (out[0][:, :8] == 0).all()


def test_a_read_that_does_not_wait_sees_the_poison(probe):
    """Copies land at the first wait on their barrier (the latest the rules allow: a waiter
    that sees the phase complete sees the bytes): reads before it see shared memory as it was,
    the poison, so a kernel that skips its wait computes wrong numbers here. Thread 0 issues the
    copy and reads its 8 elements before its own wait."""
    rc, src, out = _boxes(probe, (2, 40, 64), (0, 0, 0), (64, 16), swizzle=True, wait_first=False)
    assert rc == 0
    assert (out[0] == POISON).sum() >= 8
    assert not (out[0] == _expected(src, (0, 0, 0), (64, 16))).all()


def test_the_swizzle_moves_chunks_within_their_row(probe):
    """A swizzled box read back as if plain: each row's 16-byte chunks are permuted within the
    row (chunk c of row r at c ^ (r % 8)), so row 0 reads right and rows 1-7 do not."""
    shape, box = (2, 40, 64), (64, 16)
    rc, src, out = _boxes(probe, shape, (0, 0, 0), box, swizzle=True, read_swizzled=False)
    assert rc == 0
    want = _expected(src, (0, 0, 0), box)
    chunks = lambda a: a.reshape(a.shape[0], -1, 8)        # [row, chunk, 8 bf16]
    for r in range(box[1]):
        assert (chunks(out[0])[r] == chunks(want)[r][np.arange(8) ^ (r % 8)]).all()
    assert (out[0][0] == want[0]).all() and not (out[0][1:8] == want[1:8]).all()


@pytest.mark.parametrize("address, d0, d1, stride1, box0, box1, swizzle, ok", [
    (4096, 64, 40, 128, 64, 16, True, True),
    (4096 + 8, 64, 40, 128, 64, 16, True, False),     # global address not 16-byte aligned
    (4096, 64, 40, 136, 64, 16, True, False),         # row stride not a multiple of 16
    (4096, 64, 40, 128, 64, 257, False, False),       # a box dimension past 256
    (4096, 128, 40, 256, 128, 16, True, False),       # 256-byte rows under the 128-byte swizzle
    (4096, 128, 40, 256, 128, 16, False, True),       # ... fine without it
    (4096, 4, 40, 16, 4, 16, False, False),           # an 8-byte inner box (not 16-byte multiple)
])
def test_encode_refuses_what_the_driver_refuses(probe, address, d0, d1, stride1, box0, box1, swizzle, ok):
    assert (probe.probe_encode(address, d0, d1, stride1, box0, box1, int(swizzle)) == 0) == ok


def _load_then_store(lib, shape, origin, box, overwrite=False):
    d1, d0 = shape
    src = np.arange(box[0] * box[1], dtype=np.uint16) + 1                # no element is 0
    dst = np.zeros(shape, dtype=np.uint16)
    lib.probe_load_then_store.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + \
        [ctypes.c_int] * 6
    lib.emu_configure(0, 0)        # late copies, no skew, whatever another module left set
    rc = lib.probe_load_then_store(src.ctypes.data, dst.ctypes.data, d0, d1, *origin, *box, int(overwrite), 0)
    return rc, src.reshape(box[1], box[0]), dst


@pytest.mark.parametrize("origin", [(8, 4), (40, 30), (0, 0)])
def test_a_tensor_store_writes_its_box_clipped_to_the_tensor(probe, origin):
    """A bulk load lands a contiguous box in shared memory; the tensor store writes it at
    `origin` of a 40 x 64 tensor, dropping what falls outside (the box of 32 x 16 reaches past
    both edges from (40, 30)), and writes nothing else."""
    shape, box = (40, 64), (32, 16)
    rc, box_values, dst = _load_then_store(probe, shape, origin, box)
    assert rc == 0
    want = np.zeros(shape, dtype=np.uint16)
    c0, c1 = origin
    rows, cols = min(box[1], shape[0] - c1), min(box[0], shape[1] - c0)
    want[c1:c1 + rows, c0:c0 + cols] = box_values[:rows, :cols]
    np.testing.assert_array_equal(dst, want)


def test_a_tensor_store_reads_shared_memory_at_its_wait(probe):
    """The store may read its source any time until bulk_wait_read retires it: the emulator reads
    it there, so a kernel that writes the source again before that wait stores the new value."""
    rc, box_values, dst = _load_then_store(probe, (40, 64), (0, 0), (32, 16), overwrite=True)
    assert rc == 0
    assert dst[0, 0] == 0x7777 and dst[0, 1] == box_values[0, 1]


def test_a_thread_that_exits_before_its_stores_read_aborts(probe, tmp_path):
    """Shared memory is freed when the CTA exits: a store whose read was never waited for is an
    error (the process aborts with the emulator's message; run in a child process)."""
    so = Path(probe._name)
    code = (f"import ctypes, numpy as np\nlib = ctypes.CDLL({str(so)!r})\n"
            "src = np.ones(512, np.uint16); dst = np.zeros((40, 64), np.uint16)\n"
            "lib.probe_load_then_store.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 6\n"
            "lib.probe_load_then_store(src.ctypes.data, dst.ctypes.data, 64, 40, 0, 0, 32, 16, 0, 1)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0
    assert "never waited for (bulk_wait_read)" in res.stderr
