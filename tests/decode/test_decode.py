"""The baseline decode loop on the tiny model: lossless greedy speculative decoding, full-path
acceptance, synthetic acceptance, batches of different prompt lengths, checkpoint loading."""

from __future__ import annotations

import random

import pytest
import torch

from harness.decode.checkpoint import load_target, save_target
from harness.decode.drafter import Drafter, DrafterConfig
from harness.decode.kernel_choice import Kernels
from harness.decode.loop import ARDecoder, SpecDecoder, SyntheticAcceptance
from harness.decode.model import KVCache, Target, TargetConfig, init_random_, rope_tables
from harness.protocol import presets

TINY = presets.PRESETS["tiny"]


def make_models(seed: int, block: int = 8, dtype=torch.float64):
    # float64: tree verification and one-token decoding add the same numbers in different
    # orders; in float64 no argmax can flip on rounding, so equality is exact.
    target = Target(TargetConfig(**TINY["target"])).to(dtype)
    init_random_(target, seed)
    drafter = Drafter(DrafterConfig(1, (0, 1), block), target.cfg).to(dtype)
    init_random_(drafter, seed + 1)
    return target.eval(), drafter.eval()


def prompts_for(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(511) for _ in range(n)] for n in lengths]


def ar_reference(target, prompts, n_tokens, kernels: Kernels = Kernels()):
    ar = ARDecoder(target, batch=len(prompts), max_len=max(map(len, prompts)) + n_tokens + 4,
                   kernels=kernels)
    ar.prefill(prompts, chunk=64)
    for _ in range(n_tokens):
        ar.step()
    return ar.output


class OracleDrafter(Drafter):
    """Runs the real drafter, then pushes the target's own greedy continuation to rank 0 at
    every drafted position, so whole paths get accepted. Keys are (tokens done, position):
    at `wrong_at` the right token gets no boost (acceptance stops there); at `second_at` a decoy
    is ranked first and the right token second, so the accepted path leaves the drafter's best
    chain for a sibling branch built later in the heap (non-trivial KV compaction)."""

    def __init__(self, base: Drafter, streams, prompt_lens, wrong_at=(), second_at=()):
        super().__init__(base.cfg, base.target_cfg)
        self.load_state_dict(base.state_dict())
        p = next(base.parameters())
        self.to(device=p.device, dtype=p.dtype)
        self.streams, self.prompt_lens = streams, prompt_lens
        self.wrong_at, self.second_at = set(wrong_at), set(second_at)

    def draft(self, target, cache, bonus, lengths, kv_len, kernels=Kernels()):
        logits = super().draft(target, cache, bonus, lengths, kv_len, kernels).clone()
        for b in range(logits.shape[0]):
            done = int(lengths[b]) - self.prompt_lens[b]
            for i in range(logits.shape[1]):
                k = done + 1 + i
                if k >= len(self.streams[b]) or (done, i) in self.wrong_at:
                    continue
                right = self.streams[b][k]
                if (done, i) in self.second_at:
                    logits[b, i, (right + 1) % 511] += 1000.0
                    logits[b, i, right] += 500.0
                else:
                    logits[b, i, right] += 1000.0
        return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_speculative_equals_plain_greedy(seed):
    target, drafter = make_models(seed)
    prompts = prompts_for(seed, [37])
    spec = SpecDecoder(target, drafter, batch=1, max_len=256, tree_budget=16)
    spec.prefill(prompts, chunk=16)  # several chunks: exercises chunked prefill too
    while len(spec.output[0]) < 24:
        spec.step()
    ref = ar_reference(target, prompts, len(spec.output[0]))
    assert spec.output[0] == ref[0]


@pytest.mark.parametrize("seed", [3, 4])
def test_whole_path_accepted_stays_lossless(seed):
    target, drafter = make_models(seed, block=6)
    prompts = prompts_for(seed, [20])
    ref = ar_reference(target, prompts, 60)
    oracle = OracleDrafter(drafter, ref, [20])
    spec = SpecDecoder(target, oracle, batch=1, max_len=256, tree_budget=8)
    spec.prefill(prompts)
    accepted = [spec.step()[0] for _ in range(6)]
    assert accepted == [6] * 6            # every step takes the whole block
    assert spec.output[0] == ref[0][: len(spec.output[0])]


def test_partial_acceptance_and_batch_with_different_lengths():
    target, drafter = make_models(5, block=6)
    prompts = prompts_for(5, [9, 30])
    ref = ar_reference(target, prompts, 60)
    # Sequence-independent corruption: the drafter is wrong at some positions of some steps.
    wrong = {(0, 2), (5, 0), (7, 3), (12, 1), (13, 4)}
    oracle = OracleDrafter(drafter, ref, [9, 30], wrong_at=wrong)
    spec = SpecDecoder(target, oracle, batch=2, max_len=256, tree_budget=12)
    spec.prefill(prompts)
    lens = [spec.step() for _ in range(8)]
    assert any(a < 6 for step in lens for a in step) and any(a == 6 for step in lens for a in step)
    for b in range(2):
        assert spec.output[b] == ref[b][: len(spec.output[b])]


def test_accepting_a_sibling_branch_compacts_kv_and_stays_lossless():
    target, drafter = make_models(9, block=6)
    prompts = prompts_for(9, [25])
    ref = ar_reference(target, prompts, 80)
    # Step 1 starts with 0 tokens done: position 1 (depth 2) has the right token second.
    oracle = OracleDrafter(drafter, ref, [25], second_at={(0, 1), (6, 0), (12, 3)})
    spec = SpecDecoder(target, oracle, batch=1, max_len=256, tree_budget=16)
    spec.prefill(prompts)
    accepted = [spec.step()[0] for _ in range(5)]
    assert accepted[:3] == [6, 6, 6]     # the whole block, via a sibling branch each time
    assert spec.output[0] == ref[0][: len(spec.output[0])]


def test_synthetic_acceptance_mean_matches_tau():
    for tau in (1.0, 2.5, 6.5, 15.0):
        acc = SyntheticAcceptance(tau, 16, seed=0)
        mean = sum(acc.weights[a - 1] * a for a in range(1, 17))
        assert abs(mean - tau) < 1e-6
        draws = [acc.draw() for _ in range(4000)]
        assert abs(sum(draws) / len(draws) - tau) < 0.25
    with pytest.raises(ValueError):
        SyntheticAcceptance(17.0, 16, seed=0)


def test_synthetic_acceptance_drives_the_loop():
    target, drafter = make_models(6, block=8, dtype=torch.float32)
    spec = SpecDecoder(target, drafter, batch=1, max_len=2048, tree_budget=32,
                       acceptance="synthetic", tau=4.0, seed=1)
    spec.prefill_random([300], seed=0)
    lens = [spec.step()[0] for _ in range(60)]
    assert 1 <= min(lens) and max(lens) <= 8
    assert 2.5 < sum(lens) / len(lens) < 5.0
    assert spec.lengths[0] == 300 + sum(lens)


def test_checkpoint_round_trip(tmp_path):
    target, _ = make_models(7, dtype=torch.float32)
    save_target(target, tmp_path / "ckpt")
    from harness.decode.checkpoint import read_safetensors
    names = set(read_safetensors(tmp_path / "ckpt" / "model.safetensors"))
    assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
            "model.embed_tokens.weight", "lm_head.weight"} <= names     # HF names on disk
    assert not any("qkv_proj" in n or "gate_up" in n for n in names)
    loaded = load_target(tmp_path / "ckpt", torch.float32, torch.device("cpu"))
    for (n1, p1), (n2, p2) in zip(sorted(target.state_dict().items()),
                                  sorted(loaded.state_dict().items())):
        assert n1 == n2 and torch.equal(p1, p2)
    prompts = prompts_for(7, [12])
    assert ar_reference(target, prompts, 8) == ar_reference(loaded, prompts, 8)


def test_checkpoint_mismatch_is_a_clear_error(tmp_path):
    target, _ = make_models(8, dtype=torch.float32)
    save_target(target, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "config.json").write_text(
        (tmp_path / "ckpt" / "config.json").read_text().replace('"num_hidden_layers": 2',
                                                                 '"num_hidden_layers": 3'))
    with pytest.raises(ValueError, match="does not match"):
        load_target(tmp_path / "ckpt", torch.float32, torch.device("cpu"))


def _cache_rope_equals_rope_tables(device):
    """A cache's precomputed rotary rows are rope_tables' values at those positions, bit for
    bit, so a forward that gathers them computes what one that recomputes them did."""
    for dtype, head_dim, theta in ((torch.bfloat16, 128, 1e6), (torch.float32, 288, 5e4),
                                   (torch.float64, 32, 1e4)):
        cache = KVCache(1, 2, 1, 70000, head_dim, dtype, device, theta)
        gen = torch.Generator().manual_seed(head_dim)
        positions = torch.randint(0, 70000, (3, 65), generator=gen).to(device)
        got, want = cache.rope(positions), rope_tables(positions, head_dim, theta, dtype)
        for g, w in zip(got, want):
            assert g.shape == w.shape == (3, 65, 1, head_dim) and g.dtype == dtype
            assert torch.equal(g, w), (dtype, head_dim)


def test_cache_rope_rows_equal_rope_tables():
    _cache_rope_equals_rope_tables(torch.device("cpu"))


def test_cache_rope_rows_equal_rope_tables_on_the_gpu(cuda):
    _cache_rope_equals_rope_tables(cuda)
