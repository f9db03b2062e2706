"""The calibration's spin kernel without a GPU: it compiles for Hopper with the timer read
inside its loop and lane-0 stores, and its host bookkeeping maps launches to stamp slots."""

from __future__ import annotations

import re

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.kernels.calibrate import spin  # noqa: E402


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        mp.setenv("TRITON_DEFAULT_FP_FUSION", "1")     # Triton 3.9 warns when it is unset
        src = ASTSource(fn=spin._spin_kernel,
                        signature={"stamps_ptr": "*i64", "counter_ptr": "*i64",
                                   "capacity": "i32", "duration_ns": "i64"},
                        constexprs={})
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 1})
    assert compiled.asm.get("cubin"), "ptxas produced no cubin"
    return compiled.asm["ptx"]


def test_spin_reads_the_timer_inside_its_loop(ptx):
    body = ptx[ptx.index(".entry"):]
    reads = [m.start() for m in re.finditer(r"mov\.u64\s+%rd\d+, %globaltimer", body)]
    assert len(reads) == 2                       # the start, and one per loop iteration
    loop = re.search(r"(\$L__BB0_\d+):.*?\n(.*?)@%p\d+ bra\s+\1;", body, re.S)
    assert loop and "%globaltimer" in loop.group(2), "timer read hoisted out of the loop"


def test_spin_stores_from_one_lane(ptx):
    stores = re.findall(r"(@%p\d+ )?st\.global\.b64", ptx)
    assert len(stores) == 3 and all(pred for pred in stores)   # counter, start, end


def fake_work(capacity, launches, counted):
    work = spin.SpinWork(50, device="cpu", capacity=capacity)
    work.launch_ns = list(range(launches))
    work.counter.fill_(counted)
    for k in range(launches):                  # what the kernel writes: slot k % capacity
        work.stamp_buf[k % capacity] = torch.tensor([100 * k, 100 * k + 50])
    return work


def test_stamps_map_launches_to_slots():
    work = fake_work(capacity=4, launches=6, counted=6)
    assert work.duration_ns == 50_000 and work.launches() == 6
    assert work.stamps() == [None, None, (200, 250), (300, 350), (400, 450), (500, 550)]


def test_stamps_refuse_a_lost_launch():
    with pytest.raises(RuntimeError, match="ran 5 times for 6 launches"):
        fake_work(capacity=8, launches=6, counted=5).stamps()
