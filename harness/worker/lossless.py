"""The lossless check: greedy speculative decoding must commit exactly the tokens plain greedy
decoding of the target commits.

A decode cell with `check_tokens: N` runs it after its timed windows: its own loop (the mode,
kernels and graphs it was timed with) decodes N tokens per sequence from a fresh random prompt
under greedy acceptance; then the target runs once over prompt + committed tokens on the plain
kernels (SDPA attention, no fused ops: the reference forward) and its argmax at every position
is the token plain greedy decoding emits after that prefix. Teacher-forced like this, all N
tokens are compared, not only those before a first difference.

Two forwards that add the same numbers in different orders (a 65-token tree verify and a
one-token step, Triton and SDPA) round differently, so where the target's two best logits are
nearly equal, either token is plain greedy decoding's within rounding. A difference is a tie
when the reference's logit of the committed token is within `tie_tolerance` of its best; any
other difference fails the cell, naming the sequence, the position and both tokens.
"""

from __future__ import annotations

import torch

from harness.decode import attention
from harness.decode.kernel_choice import Kernels
from harness.decode.loop import prefill
from harness.decode.model import Target

# Units in the last place of the logits' dtype, at the logits' magnitude, that two orders of
# adding the same numbers may differ by (a tie).
TIE_ULPS = 8


def tie_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per row of `logits` [..., V]: how far apart two logits may be and still tie."""
    return TIE_ULPS * torch.finfo(dtype).eps * logits.abs().amax(-1).clamp(min=1.0)


@torch.no_grad()
def reference_next_tokens(target: Target, prompts: list[list[int]], committed: torch.Tensor,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What plain greedy decoding emits after each prefix prompt + committed[:, :j], j < n:
    (tokens [b, n], the reference's logit gap of each committed token to its best [b, n], the
    tie tolerance of each position [b, n]), from one prefill on the plain kernels."""
    b, n = committed.shape
    dev = committed.device
    lens = [len(p) for p in prompts]
    cache = target.new_cache(b, max(lens) + n + 1)
    _, first = prefill(target, cache, prompts, chunk=1024, kernels=Kernels())
    starts = torch.tensor(lens, device=dev)
    pos = starts[:, None] + torch.arange(n - 1, device=dev)
    mask = attention.causal_mask(starts, n - 1, max(lens) + n - 1, kernels=Kernels())
    logits, _ = target(committed[:, :-1], pos, cache, pos, mask)      # [b, n-1, V]: after j+1
    logits = logits.float()
    # Position 0 follows the prompt alone: the prefill's own argmax, its logits not kept, so
    # the first token is compared exactly.
    tokens = torch.cat([first[:, None], logits.argmax(-1)], 1)
    best = logits.amax(-1)
    got = logits.gather(-1, committed[:, 1:, None]).squeeze(-1)
    gap = torch.cat([torch.zeros(b, 1, device=dev), best - got], 1)
    tol = torch.cat([torch.zeros(b, 1, device=dev), tie_tolerance(logits, dtype)], 1)
    return tokens, gap, tol


@torch.no_grad()
def check(decoder, target: Target, prompts: list[list[int]], n: int, dtype: torch.dtype) -> dict:
    """Decode `n` tokens per sequence with `decoder` (greedy acceptance, not yet prefilled) and
    compare them with plain greedy decoding. Returns the metrics {lossless_tokens (compared per
    sequence), lossless_ties}; raises AssertionError at a difference that is not a tie."""
    decoder.prefill(prompts)
    for _ in range(n):                     # every step commits at least its root's token
        decoder.step()
    if hasattr(decoder, "finish"):
        decoder.finish()
    short = [len(out) for out in decoder.output if len(out) < n]
    if short:
        raise AssertionError(f"lossless check: {n} steps committed only {min(short)} tokens")
    dev = target.lm_head.weight.device
    committed = torch.tensor([out[:n] for out in decoder.output], device=dev)
    want, gap, tol = reference_next_tokens(target, prompts, committed, dtype)
    differ = committed != want
    wrong = differ & (gap > tol)
    if wrong.any():
        b, j = (int(i) for i in wrong.nonzero()[0])
        raise AssertionError(
            f"not lossless: sequence {b}, token {j} of {n}: the loop committed "
            f"{int(committed[b, j])}, plain greedy decoding {int(want[b, j])} (its logit "
            f"{float(gap[b, j]):.4g} above the committed one's; a tie is within "
            f"{float(tol[b, j]):.3g})")
    return {"lossless_tokens": float(n), "lossless_ties": float(differ.sum())}
