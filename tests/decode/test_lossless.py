"""The lossless check of a decode cell (harness/worker/lossless.py): every committed token is
compared with plain greedy decoding, teacher-forced, and a difference that is not a rounding
tie fails the cell with its sequence, position and both tokens."""

from __future__ import annotations

import pytest
import torch

from harness.decode.fast import FastSpecDecoder
from harness.worker import lossless
from harness.worker import main as worker

from test_decode import ar_reference, make_models, prompts_for

CELL = {"model": "tiny", "context_length": 40, "batch_size": 2, "steps": 2, "repeats": 1,
        "warmup_steps": 0, "profile_steps": 0, "device": "cpu", "check_tokens": 24}


@pytest.mark.parametrize("mode", [{"tree_build": "cpu", "accept": "cpu"},
                                  {"tree_build": "gpu", "accept": "gpu"}], ids=["cpu", "gpu"])
def test_a_cell_compares_every_checked_token(mode):
    r = worker.run_cell({**CELL, **mode, "acceptance": "synthetic", "tau": 3.0})
    assert r["status"] == "ok", r["error"]
    assert r["metrics"]["lossless_tokens"] == 24.0 and r["metrics"]["lossless_ties"] == 0.0
    # The check does not change what the cell is, nor what it measured.
    assert r["cell_id"] == worker.run_cell({**CELL, **mode, "acceptance": "synthetic",
                                            "tau": 3.0, "check_tokens": 0})["cell_id"]


class _Replay:
    """A 'decoder' that commits given tokens: what a broken loop would."""

    def __init__(self, tokens):
        self.output, self.tokens = [], tokens

    def prefill(self, prompts):
        self.output = [list(t) for t in self.tokens]

    def step(self):
        return [0] * len(self.tokens)


def test_plain_greedy_tokens_pass_and_one_wrong_token_fails_by_name():
    target, _ = make_models(5, dtype=torch.float64)
    prompts = prompts_for(5, [9, 17])
    ref = ar_reference(target, prompts, 12)
    assert lossless.check(_Replay(ref), target, prompts, 12, torch.float64) == {
        "lossless_tokens": 12.0, "lossless_ties": 0.0}
    bad = [list(ref[0]), list(ref[1])]
    bad[1][7] = (bad[1][7] + 1) % 500
    with pytest.raises(AssertionError, match=r"not lossless: sequence 1, token 7 of 12: the "
                                             r"loop committed \d+, plain greedy decoding \d+"):
        lossless.check(_Replay(bad), target, prompts, 12, torch.float64)
    with pytest.raises(AssertionError, match="12 steps committed only 5 tokens"):
        lossless.check(_Replay([r[:5] for r in ref]), target, prompts, 12, torch.float64)


def test_the_fast_loop_with_sibling_branches_passes():
    """Long accepted paths and KV compaction (the oracle drafter of tests/decode), checked."""
    from test_decode import OracleDrafter
    target, drafter = make_models(21, block=6)
    prompts = prompts_for(21, [12, 30])
    ref = ar_reference(target, prompts, 60)
    oracle = OracleDrafter(drafter, ref, [12, 30], wrong_at={(6, 2)}, second_at={(0, 1), (9, 0)})
    dec = FastSpecDecoder(target, oracle, batch=2, max_len=256, tree_budget=8,
                          tree_build="gpu", accept="gpu")
    assert lossless.check(dec, target, prompts, 40, torch.float64)["lossless_tokens"] == 40.0
    assert min(len(o) for o in dec.output) > 40          # whole blocks accepted on the way


def test_plain_decoding_has_nothing_to_check():
    from harness.protocol.errors import InputError
    from harness.sweep.scenario import parse_scenario
    with pytest.raises(InputError, match=r"s.yaml:3:18: check_tokens compares speculative "
                                         r"decoding with plain greedy decoding"):
        parse_scenario("name: x\nmatrix:\n  check_tokens: [16]\n  speculation: [none]\n", "s.yaml")
