"""Fixtures shared by the test files."""

from __future__ import annotations

import multiprocessing

import pytest


@pytest.fixture(scope="session")
def interp():
    """A child process with TRITON_INTERPRET=1 that runs Triton kernels on CPU tensors, fed
    through a spawn pool (tensors travel through shared memory): `interp.apply(fn, args)`.

    triton.jit reads TRITON_INTERPRET when a kernel (or one of triton's own library functions) is
    defined, i.e. at the first `import triton`; in this process that may already have happened,
    so the interpreter gets a fresh spawned process, one for the whole session.
    """
    pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        pool = multiprocessing.get_context("spawn").Pool(1)
    try:
        from harness.kernels.verify import triton_verify
        assert pool.apply(triton_verify._interpreting), "the child does not interpret"
        yield pool
    finally:
        pool.terminate()
        pool.join()
