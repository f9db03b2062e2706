"""The fast loop (device-resident state, GPU tree build and accept) on CPU tensors: token for
token the same output as plain greedy decoding and as the baseline loop, in every mode that
runs without CUDA graphs. (Graph capture itself needs a GPU: test_fast_loop_gpu.py, run by
`pytest -m gpu`.)"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from harness.decode.fast import IN_FLIGHT, FastARDecoder, FastSpecDecoder
from harness.decode.loop import SpecDecoder
from test_decode import OracleDrafter, ar_reference, make_models, prompts_for

HAS_TREE_GPU = importlib.util.find_spec("harness.decode.tree_gpu") is not None
MODES = [("cpu", "cpu"), ("cpu", "gpu")] + ([("gpu", "cpu"), ("gpu", "gpu")] if HAS_TREE_GPU else [])


def run_fast(target, drafter, prompts, steps, **kw):
    dec = FastSpecDecoder(target, drafter, batch=len(prompts), max_len=512, **kw)
    dec.prefill(prompts)
    for _ in range(steps):
        dec.step()
    dec.finish()
    return dec


@pytest.mark.parametrize("tree_build,accept", MODES)
def test_fast_modes_are_lossless_with_sibling_branches_and_batches(tree_build, accept):
    target, drafter = make_models(11, block=6)
    prompts = prompts_for(11, [14, 33])
    ref = ar_reference(target, prompts, 90)
    oracle = OracleDrafter(drafter, ref, [14, 33], wrong_at={(6, 2), (13, 0)},
                           second_at={(0, 1), (6, 0), (19, 3)})
    dec = run_fast(target, oracle, prompts, 8, tree_budget=16, tree_build=tree_build, accept=accept)
    for b in range(2):
        assert len(dec.output[b]) > 8           # whole blocks were accepted along the way
        assert dec.output[b] == ref[b][: len(dec.output[b])]
        assert dec.lengths_host[b] == len(prompts[b]) + len(dec.output[b])
    assert dec.lengths.tolist() == dec.lengths_host


@pytest.mark.parametrize("tree_build,accept", MODES)
def test_fast_equals_baseline_with_a_random_drafter(tree_build, accept):
    target, drafter = make_models(12, block=8)
    prompts = prompts_for(12, [40])
    base = SpecDecoder(target, drafter, batch=1, max_len=512, tree_budget=16)
    base.prefill(prompts)
    for _ in range(10):
        base.step()
    fast = run_fast(target, drafter, prompts, 10, tree_budget=16, tree_build=tree_build, accept=accept)
    assert fast.output == base.output


@pytest.mark.parametrize("tree_build,accept", MODES)
def test_synthetic_acceptance_matches_the_baseline_draws(tree_build, accept):
    target, drafter = make_models(13, block=8, dtype=torch.float32)
    kw = dict(tree_budget=32, acceptance="synthetic", tau=4.0, seed=3)
    base = SpecDecoder(target, drafter, batch=1, max_len=1024, **kw)
    base.prefill_random([200], seed=0)
    lens = [base.step()[0] for _ in range(12)]
    fast = FastSpecDecoder(target, drafter, batch=1, max_len=1024, tree_build=tree_build,
                           accept=accept, **kw)
    fast.prefill_random([200], seed=0)
    got = [fast.step()[0] for _ in range(12)]
    # Each step's record is read IN_FLIGHT steps later; finish reads the last ones at once.
    assert got[:IN_FLIGHT] == [0] * IN_FLIGHT and got[IN_FLIGHT:] == lens[:-IN_FLIGHT]
    assert fast.finish() == [sum(lens[-IN_FLIGHT:])]
    assert fast.lengths_host[0] == 200 + sum(lens)


def test_fast_ar_matches_plain_greedy():
    target, _ = make_models(14)
    prompts = prompts_for(14, [9, 21])
    ref = ar_reference(target, prompts, 12)
    ar = FastARDecoder(target, batch=2, max_len=128)
    ar.prefill(prompts)
    for _ in range(12):
        ar.step()
    ar.finish()
    assert ar.output == ref


def test_full_graph_needs_gpu_tree_and_accept():
    target, drafter = make_models(15)
    with pytest.raises(ValueError, match="needs tree_build gpu"):
        FastSpecDecoder(target, drafter, batch=1, max_len=64, tree_budget=8,
                        tree_build="cpu", accept="gpu", graph_capture="full")


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_reads_any_steps_behind_give_the_same_tokens(in_flight):
    """How many steps the host lets the GPU run ahead changes when it learns the tokens, never
    which tokens: every depth of the ring decodes what plain greedy decoding does."""
    target, drafter = make_models(15, block=6, dtype=torch.float32)
    prompts = prompts_for(15, [11, 26])
    ref = ar_reference(target, prompts, 30)
    dec = FastSpecDecoder(target, drafter, batch=2, max_len=256, tree_budget=8,
                          tree_build="gpu", accept="gpu", in_flight=in_flight)
    assert dec.in_flight == in_flight and len(dec.host_record) == in_flight + 1
    dec.prefill(prompts)
    reported = [0, 0]
    for _ in range(12):
        reported = [a + b for a, b in zip(reported, dec.step())]
    reported = [a + b for a, b in zip(reported, dec.finish())]
    assert reported == [len(o) for o in dec.output] and min(reported) >= 12
    for out, want in zip(dec.output, ref):
        assert out == want[:len(out)]
