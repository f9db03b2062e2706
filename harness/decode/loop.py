"""The decode loops: DFlash + DDTree speculative decoding, and plain greedy decoding.

One speculative step (docs/ARCHITECTURE.md, "The decode loop"):
  draft   block drafter: [bonus, MASK x (B-1)] -> per-position logits
  tree    DDTree best-first heap over the per-position top-k (here on the host: the baseline)
  verify  target forward over 1+N tree tokens at positions len+depth, tree mask
  accept  greedy walk along the target's argmax (or a synthetic accepted length)
  commit  move the accepted KV to the front of the window, append tokens, feed the drafter

This is the baseline loop: host-side tree build and accept with `.tolist()` syncs, eager
launches. It is kept deliberately plain, like gpt-fast's: the fast paths are measured against it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from typing import Callable, ContextManager

import torch

from harness.decode import attention, tree as ddtree
from harness.decode.drafter import Drafter
from harness.decode.kernel_choice import Kernels
from harness.decode.model import Target

PhaseFn = Callable[[str], ContextManager]


def no_phase(name: str) -> ContextManager:
    return contextlib.nullcontext()


class SyntheticAcceptance:
    """Accepted length per step drawn from a seeded truncated geometric distribution on
    1 .. max_len with mean `tau`, so random-weight models take realistic step counts."""

    def __init__(self, tau: float, max_len: int, seed: int):
        if not 1.0 <= tau <= max_len:
            raise ValueError(f"tau {tau} must lie in [1, {max_len}]")
        self.max_len = max_len
        self.rng = random.Random(seed)
        self.weights = self._weights_with_mean(tau, max_len)

    @staticmethod
    def _weights_with_mean(tau: float, n: int) -> list[float]:
        # P(a) ∝ r^(a-1); the mean grows monotonically with r, so bisect on log r.
        def weights(log_r):
            w = [math.exp(log_r * (a - 1)) for a in range(1, n + 1)]
            s = sum(w)
            return [x / s for x in w]

        def mean(log_r):
            return sum(p * a for a, p in enumerate(weights(log_r), start=1))

        lo, hi = -30.0, 30.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mean(mid) < tau else (lo, mid)
        return weights((lo + hi) / 2)

    def draw(self) -> int:
        return self.rng.choices(range(1, self.max_len + 1), weights=self.weights)[0]

    def reseed(self, seed: int) -> None:
        """Draw from the start of `seed`'s stream, as a new instance with that seed would."""
        self.rng.seed(seed)


class SpecDecoder:
    """Speculative decoding of a batch with the baseline (host) tree build and accept.
    `kernels` picks the verify and draft attention, the top-k (the heap itself is always the
    host's) and the fused forward; every forward and top-k of this decoder gets it passed."""

    def __init__(self, target: Target, drafter: Drafter, *, batch: int, max_len: int,
                 tree_budget: int, kernels: Kernels = Kernels(), acceptance: str = "greedy",
                 tau: float = 6.5, seed: int = 0, phase: PhaseFn = no_phase):
        self.target, self.drafter = target, drafter
        self.B = drafter.cfg.block_size
        self.N = tree_budget
        self.kernels = kernels
        self.phase = phase
        self.device = target.lm_head.weight.device
        self.cache = target.new_cache(batch, max_len)
        self.draft_cache = drafter.new_cache(batch, max_len)
        self.capture = tuple(drafter.cfg.target_layer_ids)
        self.synthetic = (SyntheticAcceptance(tau, self.B, seed)
                          if acceptance == "synthetic" else None)
        self.lengths = [0] * batch            # committed tokens per sequence (host copy)
        self.bonus = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.output: list[list[int]] = [[] for _ in range(batch)]
        self._prefilled = None        # (lengths, bonus, draw state) the last prefill left

    # -- setup ---------------------------------------------------------------------------
    @torch.no_grad()
    def reset(self, seed: int, phase: PhaseFn | None = None) -> None:
        """Back to the state right after construction with `seed` (and `phase`, when given),
        keeping the KV caches (zeroed in place): a process that measures the same cell many
        times allocates them once. Every other attribute a step changes is set anew here."""
        for c in (self.cache, self.draft_cache):
            c.k.zero_()
            c.v.zero_()
        if self.synthetic is not None:
            self.synthetic.reseed(seed)       # tau, and so the weights, are construction's
        batch = len(self.output)
        self.lengths = [0] * batch
        self.bonus = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.output = [[] for _ in range(batch)]
        self._prefilled = None
        if phase is not None:
            self.phase = phase

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], chunk: int = 1024) -> None:
        """Run the target over each prompt (causal, chunked), fill the drafter's context cache
        and take the first bonus token from the last prompt position."""
        self.lengths, self.bonus = prefill(self.target, self.cache, prompts, chunk,
                                           capture=self.capture, drafter=self.drafter,
                                           draft_cache=self.draft_cache, kernels=self.kernels)
        self._mark_prefilled()

    @torch.no_grad()
    def prefill_random(self, lengths: list[int], seed: int) -> None:
        """Fill both caches with random values instead of running the prompt: for synthetic
        acceptance with random weights, cache contents influence no measured quantity, while a
        real 65k-token prefill per cell would cost seconds."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for c in (self.cache, self.draft_cache):
            c.k.normal_(generator=gen)
            c.v.normal_(generator=gen)
        self.lengths = list(lengths)
        vocab = self.target.cfg.vocab_size - 1  # the last id is the drafter's mask token
        self.bonus = torch.randint(0, vocab, (len(lengths),), generator=gen, device=self.device)
        self._mark_prefilled()

    def _mark_prefilled(self) -> None:
        rng = self.synthetic.rng.getstate() if self.synthetic is not None else None
        self._prefilled = (list(self.lengths), self.bonus.clone(), rng)

    def rewind(self) -> None:
        """Back to the state the last prefill left, without running it again: the next step
        is its first step again, with the same synthetic draws, and what the steps since
        committed is forgotten (their KV stays past the prompt, where no step reads a slot
        before writing it). See fast._StepsBehind.rewind for what it is for."""
        lengths, bonus, rng = self._prefilled
        self.lengths, self.bonus = list(lengths), bonus.clone()
        if rng is not None:
            self.synthetic.rng.setstate(rng)
        self.output = [[] for _ in self.lengths]

    # -- one step ------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[int]:
        """One speculative step for every sequence. Returns tokens committed per sequence."""
        dev, b = self.device, len(self.lengths)
        lengths = torch.tensor(self.lengths, device=dev)
        kv_len = max(self.lengths) + max(self.B, self.N + 1)

        with self.phase("draft"):
            draft_logits = self.drafter.draft(self.target, self.draft_cache, self.bonus, lengths,
                                              kv_len, kernels=self.kernels)

        with self.phase("tree"):
            trees = []
            for i in range(b):
                lp, ids = ddtree.topk_logprobs(draft_logits[i], self.N, impl=self.kernels.topk)
                trees.append(ddtree.build_tree_cpu(lp, ids, self.N))
            T = 1 + max(len(t.tokens) for t in trees)
            host = host_tree_tensors(trees, self.bonus.tolist(), T)
            tree_ids, offsets, vis = (host[k].to(dev) for k in ("ids", "offsets", "vis"))

        with self.phase("verify"):
            positions = lengths[:, None] + offsets
            slots = lengths[:, None] + torch.arange(T, device=dev)
            mask = attention.Mask(lengths, vis, kv_len, kernels=self.kernels)
            logits, hidden = self.target(tree_ids, positions, self.cache, slots, mask,
                                         capture_layers=self.capture)

        with self.phase("accept"):
            target_next = logits.argmax(-1).tolist()            # host sync: the baseline's cost
            paths = [self._accept(t, nxt) for t, nxt in zip(trees, target_next)]
            self.bonus = torch.tensor([nxt[p[-1]] for p, nxt in zip(paths, target_next)],
                                      device=dev)

        with self.phase("commit"):
            self._commit(paths, trees, tree_ids, hidden, lengths)
        return [len(p) for p in paths]

    def _accept(self, t: ddtree.Tree, target_next: list[int]) -> list[int]:
        """Node indices accepted, starting with the root (index 0)."""
        path = [0]
        if self.synthetic is None:
            # Greedy: follow the target's argmax while it matches a child.
            while (child := t.child_maps[path[-1]].get(target_next[path[-1]])) is not None:
                path.append(child)
        else:
            # Synthetic: a drawn length along the drafter's best chain (first children).
            want = self.synthetic.draw()
            while len(path) < want and t.first_child[path[-1]] >= 0:
                path.append(t.first_child[path[-1]])
        return path

    def _commit(self, paths, trees, tree_ids, hidden, lengths) -> None:
        dev = self.device
        width = max(len(p) for p in paths)
        # Pad paths by repeating their last node: padded writes land past the new length, where
        # nothing reads them before they are overwritten.
        idx = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths], device=dev)
        src = lengths[:, None] + idx
        dst = lengths[:, None] + torch.arange(width, device=dev)
        for i in range(len(paths)):
            self.cache.move(i, src[i], dst[i])
        feats = torch.gather(hidden, 1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
        self.drafter.ingest(self.draft_cache, feats, dst, dst, kernels=self.kernels)
        committed = torch.gather(tree_ids, 1, idx).tolist()
        for i, p in enumerate(paths):
            self.output[i].extend(committed[i][: len(p)])
            self.lengths[i] += len(p)


def host_tree_tensors(trees: list[ddtree.Tree], roots: list[int], T: int) -> dict:
    """Stack per-sequence host trees into tensors (on the host): `ids` [b, T] (root first),
    `offsets` [b, T] position offsets (0 for the root, depth for nodes), `parents` and
    `first_child` [b, T] (-1 for none), `vis` [b, T, T]. Short trees are padded with
    self-only nodes that no link reaches."""
    b = len(trees)
    ids = torch.zeros(b, T, dtype=torch.long)
    offsets = torch.zeros(b, T, dtype=torch.long)
    parents = torch.full((b, T), -1, dtype=torch.long)
    first_child = torch.full((b, T), -1, dtype=torch.long)
    vis = torch.eye(T, dtype=torch.bool).repeat(b, 1, 1)
    for i, (t, root) in enumerate(zip(trees, roots)):
        n = 1 + len(t.tokens)
        ids[i, :n] = torch.tensor([root] + t.tokens)
        offsets[i, :n] = torch.tensor(ddtree.tree_positions(t))
        parents[i, :n] = torch.tensor(t.parents)
        first_child[i, :n] = torch.tensor(t.first_child)
        vis[i, :n, :n] = ddtree.visibility_matrix(t)
    return {"ids": ids, "offsets": offsets, "parents": parents, "first_child": first_child,
            "vis": vis}


class ARDecoder:
    """Plain greedy autoregressive decoding of the target: one token per step, on `kernels`
    (its attention and the fused forward)."""

    def __init__(self, target: Target, *, batch: int, max_len: int,
                 kernels: Kernels = Kernels(), phase: PhaseFn = no_phase):
        self.target = target
        self.kernels = kernels
        self.phase = phase
        self.device = target.lm_head.weight.device
        self.cache = target.new_cache(batch, max_len)
        self.lengths = [0] * batch
        self.bonus = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.output: list[list[int]] = [[] for _ in range(batch)]

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], chunk: int = 1024) -> None:
        self.lengths, self.bonus = prefill(self.target, self.cache, prompts, chunk,
                                           kernels=self.kernels)

    @torch.no_grad()
    def prefill_random(self, lengths: list[int], seed: int) -> None:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.cache.k.normal_(generator=gen)
        self.cache.v.normal_(generator=gen)
        self.lengths = list(lengths)
        vocab = self.target.cfg.vocab_size
        self.bonus = torch.randint(0, vocab, (len(lengths),), generator=gen, device=self.device)

    @torch.no_grad()
    def step(self) -> list[int]:
        dev, b = self.device, len(self.lengths)
        lengths = torch.tensor(self.lengths, device=dev)
        with self.phase("verify"):
            mask = attention.Mask(lengths, torch.ones(b, 1, 1, dtype=torch.bool, device=dev),
                                  max(self.lengths) + 1, kernels=self.kernels)
            logits, _ = self.target(self.bonus[:, None], lengths[:, None], self.cache,
                                    lengths[:, None], mask)
        with self.phase("accept"):
            nxt = logits[:, -1].argmax(-1)
        with self.phase("commit"):
            for i, tok in enumerate(self.bonus.tolist()):
                self.output[i].append(tok)
                self.lengths[i] += 1
            self.bonus = nxt
        return [1] * b


@torch.no_grad()
def prefill(target: Target, cache, prompts: list[list[int]], chunk: int,
            capture: tuple[int, ...] = (), drafter: Drafter | None = None, draft_cache=None,
            kernels: Kernels = Kernels()):
    """Causal chunked prefill of prompts of different lengths. Returns (lengths, bonus [b]).

    Short prompts are padded inside a chunk; the padding lands past each prompt's end, where
    the causal mask keeps it invisible and later writes overwrite it. The decoder's `kernels`
    apply but for the attention: a prefill chunk is causal, up to `chunk` queries, and always
    attends with SDPA (the verify kernels are chosen and timed for the step's forwards).
    """
    kernels = dataclasses.replace(kernels, verify="sdpa")
    dev = target.lm_head.weight.device
    b = len(prompts)
    lens = [len(p) for p in prompts]
    if min(lens) < 1:
        raise ValueError("every prompt needs at least one token")
    L = max(lens)
    padded = torch.zeros(b, L, dtype=torch.long)
    for i, p in enumerate(prompts):
        padded[i, : len(p)] = torch.tensor(p)
    padded = padded.to(dev)
    last = torch.tensor([n - 1 for n in lens], device=dev)
    bonus = torch.zeros(b, dtype=torch.long, device=dev)
    for start in range(0, L, chunk):
        T = min(chunk, L - start)
        starts = torch.full((b,), start, device=dev)
        pos = starts[:, None] + torch.arange(T, device=dev)
        mask = attention.causal_mask(starts, T, start + T, kernels=kernels)
        rows = (last - start).clamp(0, T - 1)
        logits, hidden = target(padded[:, start:start + T], pos, cache, pos, mask,
                                capture_layers=capture, logits_for=rows[:, None])
        here = (last >= start) & (last < start + T)
        bonus = torch.where(here, logits[:, 0].argmax(-1), bonus)
        if drafter is not None:
            drafter.ingest(draft_cache, hidden, pos, pos, kernels=kernels)
    return lens, bonus
