"""harness/worker/ceilings.py on a host without a GPU: the operand sets a ceiling is measured on.

A worker measures its ceilings beside the model it has loaded, so the sets are allocated together
(each is other memory) but as many as fit: a GPU that runs out after the first still gets a
ceiling, and one that cannot hold even one set says so (the allocation's error). The timing
itself is the GPU test's (test_ceilings_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from harness.worker import ceilings


def allocator(fits: int):
    """make() for _operand_sets that succeeds `fits` times, then runs out of memory."""
    made = []

    def make():
        if len(made) == fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        made.append(object())
        return made[-1]
    return make


def test_all_rounds_of_operands_are_alive_at_once():
    sets = ceilings._operand_sets(allocator(fits=10), rounds=3)
    assert len(sets) == 3 and len({id(s) for s in sets}) == 3


def test_fewer_sets_where_the_memory_runs_out_after_the_first():
    assert len(ceilings._operand_sets(allocator(fits=2), rounds=3)) == 2
    assert len(ceilings._operand_sets(allocator(fits=1), rounds=3)) == 1


def test_no_memory_for_even_one_set_is_the_callers_error():
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ceilings._operand_sets(allocator(fits=0), rounds=3)


def test_a_ceiling_is_measured_once_however_its_call_is_spelled():
    # lru_cache alone keyed copy_rates() and copy_rates(0, 1 << 30, 3) apart: a decode result's
    # ceiling and its two copy ways came from two measurements, which differed.
    runs = []

    @ceilings.measured_once
    def rate(device: int = 0, nbytes: int = 1 << 30, rounds: int = 3) -> float:
        runs.append((device, nbytes, rounds))
        return float(len(runs))
    first = rate()
    assert rate(0) == rate(0, 1 << 30) == rate(device=0, nbytes=1 << 30, rounds=3) == first
    assert runs == [(0, 1 << 30, 3)]
    assert rate(0, nbytes=64) != first and len(runs) == 2      # other arguments: measured
    rate.cache_clear()
    rate()
    assert len(runs) == 3
