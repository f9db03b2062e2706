"""The decode loop on a GPU in every mode, CUDA graphs included: lossless against plain greedy
decoding, token for token.

Every fast mode (tree build and accept on the host or the device, no graph, the verify forward
as a graph, the whole step as one graph) and the baseline loop decode a batch of two prompts of
different lengths with a drafter that knows the target's greedy continuation, so whole blocks
are accepted and, where the right token is ranked second, the accepted path leaves the
drafter's best chain for a sibling branch (KV compaction). The committed tokens must equal
plain greedy decoding (ARDecoder, default kernels: independent of the kernels under test).
Two kernel sets: the defaults in float64 (no argmax can flip on rounding), and every switch on
(Triton verify, Triton top-k, the CUDA tree build, the fused forward, the Triton accept) in
float32. The oracle
here reads the decoder's lengths on the device, so a full-step graph can capture it
(tests/decode/test_decode.py's OracleDrafter reads them on the host). test_fast_loop.py runs the
graph-free modes on CPU; the loop's speed is the decode workload's (scenarios/decode-modes.yaml).
"""

from __future__ import annotations

import pytest
import torch
from test_decode import OracleDrafter, ar_reference, make_models, prompts_for

from harness.decode.drafter import Drafter
from harness.decode.fast import FastARDecoder, FastSpecDecoder
from harness.decode.kernel_choice import Kernels
from harness.decode.loop import SpecDecoder

LENS = [14, 33]
WRONG_AT = {(6, 2), (13, 0)}
SECOND_AT = {(0, 1), (6, 0), (19, 3)}
STEPS = 8
DEFAULT_KERNELS = Kernels()

MODES = [  # (tree_build, accept, graph_capture) of FastSpecDecoder; the baseline loop: below
    ("cpu", "cpu", "none"), ("cpu", "cpu", "verify"), ("cpu", "gpu", "none"), ("gpu", "cpu", "none"),
    ("gpu", "gpu", "none"), ("gpu", "gpu", "verify"), ("gpu", "gpu", "full")]
KERNELS = {
    "defaults-f64": (DEFAULT_KERNELS, torch.float64),
    "every-switch-f32": (Kernels(verify="triton", topk="triton", tree_build="cuda", fused_ops=True,
                                 accept="triton"), torch.float32),
}


class DeviceOracleDrafter(Drafter):
    """tests/decode/test_decode.py's OracleDrafter with its bookkeeping on the device: the same
    logits, from tensor ops alone (no host read of `lengths`), so a CUDA graph can capture it."""

    def __init__(self, base: Drafter, streams, prompt_lens, wrong_at=(), second_at=()):
        super().__init__(base.cfg, base.target_cfg)
        self.load_state_dict(base.state_dict())
        p = next(base.parameters())
        self.to(device=p.device, dtype=p.dtype)
        dev, D = p.device, base.cfg.block_size - 1
        n = max(len(s) for s in streams)
        self.n = n
        self.stream = torch.zeros(len(streams), n, dtype=torch.long, device=dev)
        for b, s in enumerate(streams):
            self.stream[b, :len(s)] = torch.tensor(s, dtype=torch.long)
        self.stream_len = torch.tensor([len(s) for s in streams], device=dev)
        self.prompt_lens = torch.tensor(prompt_lens, device=dev)
        # [done, i] -> flag, for done = 0 .. n (done >= n drafts past the stream: no boost).
        self.wrong = torch.zeros(n + 1, D, dtype=torch.bool, device=dev)
        self.second = torch.zeros(n + 1, D, dtype=torch.bool, device=dev)
        for table, keys in ((self.wrong, wrong_at), (self.second, second_at)):
            for done, i in keys:
                if done <= n and i < D:
                    table[done, i] = True

    def draft(self, target, cache, bonus, lengths, kv_len, kernels=DEFAULT_KERNELS):
        logits = super().draft(target, cache, bonus, lengths, kv_len, kernels).clone()
        _, D, V = logits.shape
        done = (lengths - self.prompt_lens).clamp(0, self.n)                    # [b]
        k = done[:, None] + 1 + torch.arange(D, device=logits.device)          # [b, D]
        boost = (k < self.stream_len[:, None]) & ~self.wrong[done]
        second = boost & self.second[done]
        right = self.stream.gather(1, k.clamp(max=self.n - 1))
        decoy = (right + 1) % (V - 1)          # as OracleDrafter: (right + 1) % 511 at V = 512
        dt = logits.dtype
        logits.scatter_add_(2, right[..., None], (boost.to(dt) * (1000.0 - 500.0 * second.to(dt)))[..., None])
        logits.scatter_add_(2, decoy[..., None], (second.to(dt) * 1000.0)[..., None])
        return logits


def test_the_device_oracle_drafts_what_the_host_oracle_drafts():
    """(On CPU.) Same logits for every kind of position: boosted, wrong, second, past the stream."""
    target, drafter = make_models(11, block=6)
    stream = [list(range(3, 40)), list(range(100, 117))]
    host = OracleDrafter(drafter, stream, LENS, WRONG_AT, SECOND_AT)
    dev = DeviceOracleDrafter(drafter, stream, LENS, WRONG_AT, SECOND_AT)
    cache = drafter.new_cache(2, 128)
    bonus = torch.tensor([5, 7])
    for done in ((0, 0), (6, 13), (19, 12), (13, 30), (40, 5)):
        lengths = torch.tensor([LENS[0] + done[0], LENS[1] + done[1]])
        want = host.draft(target, cache, bonus, lengths, 128)
        assert torch.equal(dev.draft(target, cache, bonus, lengths, 128), want), done


@pytest.fixture(scope="module", params=list(KERNELS))
def case(request, cuda):
    """(kernels, target, drafter, prompts, greedy reference) on the GPU, one per kernel set."""
    kernels, dtype = KERNELS[request.param]
    target, drafter = make_models(11, block=6, dtype=dtype)
    target, drafter = target.to(cuda), drafter.to(cuda)
    prompts = prompts_for(11, LENS)
    ref = ar_reference(target, prompts, 90)               # default kernels, whatever the set
    oracle = DeviceOracleDrafter(drafter, ref, LENS, WRONG_AT, SECOND_AT)
    return kernels, target, oracle, prompts, ref


def assert_lossless(output, ref, steps=STEPS):
    for b in range(2):
        assert len(output[b]) > steps            # whole blocks were accepted along the way
        assert output[b] == ref[b][: len(output[b])], f"sequence {b}"


@pytest.mark.gpu
@pytest.mark.parametrize("tree_build,accept,graph", MODES, ids=["/".join(m) for m in MODES])
def test_every_fast_mode_is_lossless(case, tree_build, accept, graph):
    kernels, target, oracle, prompts, ref = case
    dec = FastSpecDecoder(target, oracle, batch=2, max_len=512, tree_budget=16, kernels=kernels,
                          tree_build=tree_build, accept=accept, graph_capture=graph)
    dec.prefill(prompts)
    for _ in range(STEPS):
        dec.step()
    dec.finish()
    assert_lossless(dec.output, ref)
    assert dec.lengths_host == [n + len(o) for n, o in zip(LENS, dec.output)]
    assert dec.lengths.tolist() == dec.lengths_host
    if graph != "none":
        assert dec.graphs


@pytest.mark.gpu
def test_the_baseline_loop_is_lossless(case):
    kernels, target, oracle, prompts, ref = case
    dec = SpecDecoder(target, oracle, batch=2, max_len=512, tree_budget=16, kernels=kernels)
    dec.prefill(prompts)
    for _ in range(STEPS):
        dec.step()
    assert_lossless(dec.output, ref)


@pytest.mark.gpu
def test_graph_captured_plain_decoding_equals_plain_greedy(case):
    kernels, target, _, prompts, ref = case
    ar = FastARDecoder(target, batch=2, max_len=256, kernels=kernels, graph_capture="full")
    ar.prefill(prompts)
    for _ in range(40):
        ar.step()
    ar.finish()
    assert ar.graphs and ar.output == [r[:40] for r in ref]
