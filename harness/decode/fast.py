"""The fast decode loop: device-resident state, GPU tree build, GPU accept, CUDA graphs.

Same algorithm as `loop.SpecDecoder` (the baseline it is measured against and must match token
for token under greedy acceptance), rearranged so the host never has to wait for the GPU:

  * every per-step tensor lives in a static buffer (fixed shapes), so steps can be captured;
  * tree_build=gpu builds the DDTree on the device (tree_gpu.py), no `.tolist()`;
  * accept=gpu finds the accepted path on the device (tensor ops, `accept_path`, or two Triton
    launches, Kernels.accept): node i is accepted iff every node on its root path matches the
    target's argmax at that node's parent (siblings carry distinct tokens, so the accepted nodes
    form one path); KV compaction and bookkeeping stay on device;
  * the host learns what was committed IN_FLIGHT (2) steps behind, from a ring of pinned
    buffers guarded by events, so reading it never stalls the GPU, which has the next two steps
    queued while the host reads;
  * graph_capture=verify replays the target's verify forward as one CUDA graph; full replays
    the whole step (draft, tree build, verify, accept, commit) as one graph (needs gpu/gpu);
  * `reset(seed)` makes a used decoder equal to a new one without reallocating a buffer or
    recapturing a graph, so a process that measures the same cell many times pays for the KV
    cache and the capture once.

Modes that keep work on the host (tree_build=cpu, accept=cpu) reproduce the motivating case:
a fast verify surrounded by host orchestration the GPU waits for.
"""

from __future__ import annotations

import torch

from harness.decode import attention, tree as ddtree
from harness.decode.drafter import Drafter
from harness.decode.kernel_choice import Kernels
from harness.decode.loop import (PhaseFn, SyntheticAcceptance, host_tree_tensors, no_phase,
                                 prefill)
from harness.decode.model import Target, gemm_overlaps


# Steps the GPU may have queued beyond the one whose record the host reads: with two, the host
# reads step k-2's record after queueing step k, so the GPU has step k-1 and step k ahead of it
# while the host reads, and a late host (a page fault, a context switch) costs no idle.
IN_FLIGHT = 2


class _StepsBehind:
    """What the host learns from the device, IN_FLIGHT steps late and without stalling it: each
    step copies its record [accepted length, committed tokens...] to one of IN_FLIGHT + 1
    pinned host buffers (a ring) and records an event; the host reads the oldest unread record
    after its event, which in steady state completed while later steps were already queued."""

    def _init_behind(self, batch: int, width: int, device: torch.device, phase: PhaseFn,
                     in_flight: int) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be >= 1 (got {in_flight})")
        self.cuda = device.type == "cuda"
        self.phase = phase
        self.in_flight = in_flight
        self.record = torch.zeros(batch, width, dtype=torch.long, device=device)
        self.host_record = [torch.zeros(batch, width, dtype=torch.long, pin_memory=self.cuda)
                            for _ in range(in_flight + 1)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in self.host_record]
        self.pending: list[int] = []                 # ring slots of records not read yet
        self.slot = 0
        self.output: list[list[int]] = [[] for _ in range(batch)]
        self.lengths_host = [0] * batch              # as of the last record read
        self.graphs: dict = {}

    def _reset_behind(self, phase: PhaseFn | None) -> None:
        """Back to `_init_behind`'s state, in the same buffers and events (and graphs)."""
        if self.cuda:
            # A window that ended without `finish` (the profile and audit windows) leaves
            # copies to the pinned buffers in flight: they must land before the host clears
            # them. Outside any timed window, so a full synchronise costs nothing measured.
            torch.cuda.synchronize(self.device)
        self.record.zero_()
        for host in self.host_record:
            host.zero_()
        self.pending.clear()
        self.slot = 0
        self.output = [[] for _ in range(self.b)]
        self.lengths_host = [0] * self.b
        self.steps_launched = 0
        if phase is not None:
            self.phase = phase

    def finish(self) -> list[int]:
        """Read the records still outstanding (call at the end of a window, before timing)."""
        return self._read_behind(drain=True)

    def _set_state(self, lengths: list[int], bonus: torch.Tensor) -> None:
        """What a prefill leaves: the sequences' lengths and first bonus tokens, kept for
        `rewind` as well."""
        self.lengths.copy_(torch.tensor(lengths))
        self.bonus.copy_(bonus)
        self.lengths_host = list(lengths)
        self._prefilled = (list(lengths), self.lengths.clone(), bonus.clone())

    @torch.no_grad()
    def rewind(self) -> None:
        """Back to the state the last prefill left, without running it again: the next step
        is its first step again, and what the steps since committed is forgotten. Their KV
        stays in the caches past the prompt, where no step reads a slot before writing it (as
        after `reset`). Every record in flight is read first (the GPU has finished the steps
        before the rewind) and none kept. A time-based warm-up (harness/worker/workloads/
        decode.py, `settle`) steps, rewinds and steps on, so the GPU runs as long as it takes
        to settle while the cache never grows past the cell's context."""
        self.finish()
        self.slot = 0
        self.output = [[] for _ in range(self.b)]
        self.steps_launched = 0
        host_lengths, lengths, bonus = self._prefilled
        self.lengths_host = list(host_lengths)
        self.lengths.copy_(lengths)
        self.bonus.copy_(bonus)

    def _publish(self) -> None:
        """Queue a copy of this step's record to pinned host memory, marked by an event."""
        p = self.slot
        if self.cuda:
            with self.phase("record"):
                self.host_record[p].copy_(self.record, non_blocking=True)
                self.events[p].record()
        else:
            self.host_record[p].copy_(self.record)
        self.pending.append(p)
        self.slot = (p + 1) % len(self.host_record)

    def _read_behind(self, drain: bool = False) -> list[int]:
        """Read the records older than the last `in_flight` steps. Their events completed long
        ago in steady state (the GPU is already on a later step), so the wait costs nothing.
        A slot is written again only after it was read: the ring has one slot more than
        there are unread records when a step publishes."""
        committed = [0] * self.b
        while len(self.pending) > (0 if drain else self.in_flight):
            p = self.pending.pop(0)
            if self.cuda:
                self.events[p].synchronize()
            rec = self.host_record[p].tolist()
            for i, row in enumerate(rec):
                n = row[0]
                self.output[i].extend(row[1:1 + n])
                self.lengths_host[i] += n
                committed[i] += n
        return committed

    # -- CUDA graphs ---------------------------------------------------------------------
    def _graph(self, name: str, fn):
        """The graph of `fn` (captured at the first call) to replay. `fn` has already run once
        for real when this returns the new graph: the caller replays it, so `fn` must be safe
        to run twice on the same inputs. The verify forward is: it writes the tree's KV slots
        from its inputs alone, so a second run writes the same values and returns the same
        outputs."""
        if name not in self.graphs:
            self.graphs[name] = self._capture(fn)
        return self.graphs[name]

    def _graph_step(self, name: str, fn) -> None:
        """One whole step `fn` through its graph. The call that captures it does not replay
        it: the warm-up run before the capture was this call's step (a step is not safe to run
        twice). So every call is exactly one step, whether the graph was captured in this call,
        earlier, or before a `reset`: a reset decoder steps exactly like a new one."""
        if name in self.graphs:
            with self.phase("graph"):
                self.graphs[name].replay()
        else:
            self.graphs[name] = self._capture(fn)

    @staticmethod
    def _capture(fn) -> torch.cuda.CUDAGraph:
        """Run `fn` for real on a side stream (torch wants a warm-up run before a capture),
        then capture it."""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph


_ARANGES: dict = {}


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """torch.arange(n) on `device`, made once (at a warm-up, outside any graph capture)."""
    key = (n, str(device))
    if key not in _ARANGES:
        _ARANGES[key] = torch.arange(n, device=device)
    return _ARANGES[key]


def accept_path(logits: torch.Tensor, tree_ids: torch.Tensor, parents: torch.Tensor,
                first_child: torch.Tensor, depth: torch.Tensor, vis: torch.Tensor, B: int,
                synthetic: bool = False, want: torch.Tensor | None = None):
    """The accepted path of a tree [b, T] (root first; parents -1 at the root, vis[t, s]: s is t
    or an ancestor of t) from the verify's logits [b, T, V], with tensor ops only: a fixed
    handful of kernels whatever the tree's depth (a walk node by node would launch a few per
    depth). Greedy: node i is accepted iff every node on its root path carries the target's
    argmax at its parent. Synthetic: the drafter's best chain (first children), cut at `want`
    [b]. Returns the accepted node at each depth [b, B] (padded with the last accepted one), the
    accepted length [b] (root included) and the next bonus token [b]. The reference of the
    Triton accept (kernels/accept/triton_accept.py)."""
    arange_T, arange_B = _arange(tree_ids.shape[1], tree_ids.device), _arange(B, tree_ids.device)
    target_next = logits.argmax(-1)                                          # [b, T]
    parent = parents.clamp(min=0)
    if synthetic:
        # Node i follows its parent iff it is the parent's first child (padding never is:
        # nothing links to it).
        follows = first_child.gather(1, parent) == arange_T
    else:
        # Node i follows its parent iff its token is the target's argmax there.
        follows = tree_ids == target_next.gather(1, parent)
    follows[:, 0] = True
    # A node is on the path iff it and all its ancestors follow; those nodes form one chain
    # from the root (siblings carry distinct tokens; one first child per node).
    on_path = ~(vis & ~follows[:, None, :]).any(-1)                          # [b, T]
    per_depth = on_path[:, None, :] & (depth[:, None, :] == arange_B[None, :, None])
    ok = per_depth.any(-1)                                                   # [b, B], a prefix
    if want is not None:
        ok &= arange_B[None, :] < want[:, None]
    chain = per_depth.to(torch.int8).argmax(-1)
    accepted = ok.sum(-1)                                                    # [b] >= 1
    last = chain.gather(1, (accepted - 1)[:, None])
    idx = torch.where(ok, chain, last)
    return idx, accepted, target_next.gather(1, last).squeeze(1)


def book(idx: torch.Tensor, accepted: torch.Tensor, tree_ids: torch.Tensor,
         lengths: torch.Tensor, step_index: torch.Tensor, record: torch.Tensor):
    """A step's bookkeeping with tensor ops, after `accept_path` (the Triton accept does it in
    its kernel): the record [accepted, the accepted tokens], the lengths and step index
    advanced in place, and the commit's KV slots (src, dst) [b, B], taken from the lengths
    before they advance."""
    src = lengths[:, None] + idx                                             # [b, B]
    dst = lengths[:, None] + _arange(idx.shape[1], idx.device)
    record[:, 0] = accepted
    record[:, 1:] = tree_ids.gather(1, idx)
    lengths.add_(accepted)
    step_index.add_(1)
    return src, dst


class FastSpecDecoder(_StepsBehind):
    """`kernels` picks every kernel a step runs (kernel_choice.py); the decoder passes it to
    each forward (on the mask), top-k and tree build, so it is fixed for the decoder's life,
    captured graphs included."""

    def __init__(self, target: Target, drafter: Drafter, *, batch: int, max_len: int,
                 tree_budget: int, kernels: Kernels = Kernels(), tree_build: str = "gpu",
                 accept: str = "gpu", graph_capture: str = "none", acceptance: str = "greedy",
                 tau: float = 6.5, seed: int = 0, max_steps: int = 4096,
                 phase: PhaseFn = no_phase, in_flight: int = IN_FLIGHT):
        if graph_capture == "full" and (tree_build, accept) != ("gpu", "gpu"):
            raise ValueError("graph_capture 'full' needs tree_build gpu and accept gpu")
        self.target, self.drafter = target, drafter
        self.tree_build, self.accept, self.graph_capture = tree_build, accept, graph_capture
        self.kernels = kernels
        dev = self.device = target.lm_head.weight.device
        if graph_capture != "none" and dev.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        # The tree-build kernels are CUDA kernels: off CUDA the torch build is the only one.
        self.tree_build_impl = kernels.tree_build if dev.type == "cuda" else "torch"
        self.b, self.B, self.N = batch, drafter.cfg.block_size, tree_budget
        self.D = self.B - 1
        self.T = T = 1 + tree_budget
        self.max_len = max_len
        self.cache = target.new_cache(batch, max_len)
        self.draft_cache = drafter.new_cache(batch, max_len)
        self.capture = tuple(drafter.cfg.target_layer_ids)

        # Static state and per-step buffers (the addresses a captured graph reads and writes).
        L = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=dev)  # noqa: E731
        self.lengths, self.bonus = L(batch), L(batch)
        self.tree_ids, self.depth, self.parents, self.first_child = L(batch, T), L(batch, T), L(batch, T), L(batch, T)
        self.vis = torch.zeros(batch, T, T, dtype=torch.bool, device=dev)
        self.bits = torch.zeros(batch, T, (T + 31) // 32, dtype=torch.int32, device=dev)
        if tree_build == "gpu":
            # The GPU tree build writes straight into the step's buffers (node i + 1 is column
            # i + 1 of tree_ids and depth; column 0 is the root's), no copies after it.
            from harness.decode.tree_gpu import GpuTree
            self.tree_out = GpuTree(
                tokens=self.tree_ids[:, 1:], depths=self.depth[:, 1:], parents=self.parents,
                first_child=self.first_child, next_sibling=L(batch, T), visibility=self.vis,
                bits=self.bits, scores=torch.zeros(batch, tree_budget, device=dev))
        self.arange_T = torch.arange(T, device=dev)
        self.step_index = L(1)
        self.synthetic = acceptance == "synthetic"
        self.max_steps = max_steps
        if self.synthetic:
            self.acceptance = SyntheticAcceptance(tau, self.B, seed)
            self.draws_host = self._draw()
            self.draws = torch.tensor(self.draws_host, device=dev)
        self.steps_launched = 0
        self._prefilled = None          # (host lengths, lengths, bonus) the last prefill left
        self._accept_ws = None          # the Triton accept's scratch and outputs, made at first use

        self._init_behind(batch, 1 + self.B, dev, phase, in_flight)

    def _draw(self) -> list[list[int]]:
        """The next synthetic accepted lengths [max_steps][batch], in the baseline loop's
        draw order."""
        acc = self.acceptance
        return [[acc.draw() for _ in range(self.b)] for _ in range(self.max_steps)]

    # -- setup ---------------------------------------------------------------------------
    @torch.no_grad()
    def reset(self, seed: int, phase: PhaseFn | None = None) -> None:
        """Put the decoder back into its state right after construction with `seed`, then
        `prefill` or `prefill_random` as after construction. `phase`, when given, replaces the
        host phase timer.

        What survives: every buffer construction allocated (the KV caches, the static per-step
        tensors, the pinned record buffers and their events), each cleared in place (the new
        seed's synthetic draws are copied into `draws`); the captured CUDA graphs; and
        `_verify_out`, the verify graph's output tensors, which its replays write.

        Why that is sound: a graph replays fixed kernels on fixed addresses. It reads and
        writes only those buffers (same address, shape and dtype after a reset) and its own
        memory pool, and the shapes it bakes in come from construction arguments, which a reset
        cannot change. The host state a step keeps (steps_launched, the pending records, the
        output) is reset here, and `_graph_step` makes the capturing call one step like any
        other. So step k after a reset computes what step k of a new decoder computes.
        """
        self._reset_behind(phase)
        self._prefilled = None
        # Zeroed as construction leaves them, although no step reads a slot that neither the
        # prefill nor the step itself wrote: a few ms at HBM bandwidth buy exact equality.
        for c in (self.cache, self.draft_cache):
            c.k.zero_()
            c.v.zero_()
        for t in (self.lengths, self.bonus, self.tree_ids, self.depth, self.parents,
                  self.first_child, self.vis, self.bits, self.step_index):
            t.zero_()
        if self.tree_build == "gpu":
            self.tree_out.next_sibling.zero_()
            self.tree_out.scores.zero_()
        if self.synthetic:
            self.acceptance.reseed(seed)
            self.draws_host = self._draw()            # the host walk reads it; no graph does
            self.draws.copy_(torch.tensor(self.draws_host))

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], chunk: int = 1024) -> None:
        lengths, bonus = prefill(self.target, self.cache, prompts, chunk, capture=self.capture,
                                 drafter=self.drafter, draft_cache=self.draft_cache,
                                 kernels=self.kernels)
        self._set_state(lengths, bonus)

    @torch.no_grad()
    def prefill_random(self, lengths: list[int], seed: int) -> None:
        """Random cache contents (see loop.SpecDecoder.prefill_random for why this is fair)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for c in (self.cache, self.draft_cache):
            c.k.normal_(generator=gen)
            c.v.normal_(generator=gen)
        bonus = torch.randint(0, self.target.cfg.vocab_size - 1, (self.b,), generator=gen,
                              device=self.device)
        self._set_state(list(lengths), bonus)

    def _set_state(self, lengths: list[int], bonus: torch.Tensor) -> None:
        super()._set_state(lengths, bonus)
        if max(lengths) + 2 * self.B + self.T > self.max_len:
            raise ValueError(f"max_len {self.max_len} too small for prompts of {max(lengths)} tokens")

    @torch.no_grad()
    def rewind(self) -> None:
        """`_StepsBehind.rewind`, with the synthetic draws back at their first too."""
        super().rewind()
        self.step_index.zero_()

    # -- the step ------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[int]:
        """One speculative step. Returns the tokens committed per sequence by the step whose
        record has been read (IN_FLIGHT steps behind; the first calls return zeros)."""
        if self.graph_capture == "full":
            self._graph_step("full", self._device_step)
        else:
            self._eager_step()
        self.steps_launched += 1
        self._publish()
        return self._read_behind()

    def _eager_step(self) -> None:
        with self.phase("draft"):
            logits_d = self._draft()
        with self.phase("tree"):
            host_trees = self._build_tree(logits_d)
        with self.phase("verify"):
            if self.graph_capture == "verify":
                self._graph("verify", self._verify).replay()
                logits, hidden = self._verify_out
            else:
                logits, hidden = self._verify()
        with self.phase("accept"):
            if self.accept == "gpu":
                idx, src, dst = self._accept_gpu(logits)
            else:
                idx, src, dst = self._book(*self._accept_cpu(logits, host_trees))
        with self.phase("commit"):
            self._commit(idx, src, dst, hidden)

    def _device_step(self):
        """The whole step with no host involvement: what graph_capture=full captures."""
        logits_d = self._draft()
        self._build_tree(logits_d)
        logits, hidden = self._verify()
        idx, src, dst = self._accept_gpu(logits)
        self._commit(idx, src, dst, hidden)

    # -- phases --------------------------------------------------------------------------
    def _draft(self) -> torch.Tensor:
        return self.drafter.draft(self.target, self.draft_cache, self.bonus, self.lengths,
                                  self.max_len, kernels=self.kernels)

    def _build_tree(self, logits_d: torch.Tensor):
        """Fill tree_ids / depth / parents / first_child / vis / bits for this step. Returns
        the host trees when built on the host (the cpu accept walk uses their child maps)."""
        self.tree_ids[:, 0] = self.bonus
        if self.tree_build == "gpu":
            from harness.decode import tree_gpu
            lp, ids = tree_gpu.topk_logprobs_batched(logits_d, self.N, impl=self.kernels.topk)
            tree_gpu.build_tree_gpu(lp, ids, self.N, out=self.tree_out, impl=self.tree_build_impl)
            return None
        trees = []
        for i in range(self.b):  # the reference heap, with its .tolist() syncs
            lp, ids = ddtree.topk_logprobs(logits_d[i], self.N, impl=self.kernels.topk)
            trees.append(ddtree.build_tree_cpu(lp, ids, self.N))
        # The root column stays the device-side bonus written above (no host read of it).
        host = host_tree_tensors(trees, [0] * self.b, self.T)
        self.tree_ids[:, 1:].copy_(host["ids"][:, 1:], non_blocking=True)
        self.depth.copy_(host["offsets"], non_blocking=True)
        self.parents.copy_(host["parents"], non_blocking=True)
        self.first_child.copy_(host["first_child"], non_blocking=True)
        self.vis.copy_(host["vis"], non_blocking=True)
        self.bits.copy_(attention.visibility_bits(host["vis"]), non_blocking=True)
        return trees

    def _verify(self):
        positions = self.lengths[:, None] + self.depth
        slots = self.lengths[:, None] + self.arange_T
        mask = attention.Mask(self.lengths, self.vis, self.max_len, kernels=self.kernels,
                              bits=self.bits)
        out = self.target(self.tree_ids, positions, self.cache, slots, mask,
                          capture_layers=self.capture)
        self._verify_out = out
        return out

    def _accept_gpu(self, logits: torch.Tensor):
        """The accept on the device, then the step's bookkeeping (`_book`): the accepted node
        at each depth [b, B] and the commit's KV slots (src, dst) [b, B]. On the Triton kernels
        (kernels/accept/triton_accept.py: two launches) or with tensor ops (`_accept_torch`)."""
        if self.kernels.accept != "triton":
            return self._book(*self._accept_torch(logits))
        from harness.kernels.accept import triton_accept
        if self._accept_ws is None:     # the first call, outside any capture (the warm-up's)
            self._accept_ws = triton_accept.alloc_workspace(self.b, self.T, logits.shape[-1],
                                                            self.device)
            self._idx, self._src, self._dst = (torch.zeros(self.b, self.B, dtype=torch.long,
                                                           device=self.device) for _ in range(3))
        triton_accept.accept(
            logits, tree_ids=self.tree_ids, parents=self.parents, first_child=self.first_child,
            depth=self.depth, bits=self.bits, lengths=self.lengths, step_index=self.step_index,
            bonus=self.bonus, record=self.record, idx=self._idx, src=self._src, dst=self._dst,
            draws=self.draws if self.synthetic else None, workspace=self._accept_ws,
            overlap=gemm_overlaps(self.b * self.T, self.target.cfg.hidden, self.kernels))
        return self._idx, self._src, self._dst

    def _accept_torch(self, logits: torch.Tensor):
        """`accept_path` on this step's tree: (idx, accepted), the bonus token written."""
        want = None
        if self.synthetic:
            # This step's drawn length (the draws are cyclic: a long run never indexes past them).
            want = self.draws.index_select(0, self.step_index % self.draws.shape[0]).squeeze(0)
        idx, accepted, bonus = accept_path(logits, self.tree_ids, self.parents, self.first_child,
                                           self.depth, self.vis, self.B, self.synthetic, want)
        self.bonus.copy_(bonus)
        return idx, accepted

    def _accept_cpu(self, logits: torch.Tensor, host_trees):
        """The host walk of the baseline (one .tolist() sync), then back to device tensors."""
        target_next = logits.argmax(-1).tolist()
        if host_trees is None:  # tree built on the GPU: fetch it for the walk
            host_trees = self._fetch_trees()
        paths = []
        for i, (t, nxt) in enumerate(zip(host_trees, target_next)):
            path = [0]
            if self.synthetic:
                want = self.draws_host[self.steps_launched % len(self.draws_host)][i]
                while len(path) < want and t.first_child[path[-1]] >= 0:
                    path.append(t.first_child[path[-1]])
            else:
                while (c := t.child_maps[path[-1]].get(nxt[path[-1]])) is not None:
                    path.append(c)
            paths.append(path)
        self.bonus.copy_(torch.tensor([nxt[p[-1]] for p, nxt in zip(paths, target_next)]))
        idx = torch.tensor([p + [p[-1]] * (self.B - len(p)) for p in paths])
        accepted = torch.tensor([len(p) for p in paths])
        return idx.to(self.device), accepted.to(self.device)

    def _fetch_trees(self) -> list[ddtree.Tree]:
        first = self.first_child.tolist()
        parents = self.parents.tolist()
        tokens = self.tree_ids.tolist()
        trees = []
        for i in range(self.b):
            maps = [dict() for _ in range(self.T)]
            for node in range(1, self.T):
                if parents[i][node] >= 0:
                    maps[parents[i][node]][tokens[i][node]] = node
            trees.append(ddtree.Tree(tokens=tokens[i][1:], depths=[], parents=parents[i],
                                     first_child=first[i], next_sibling=[], child_maps=maps))
        return trees

    def _book(self, idx: torch.Tensor, accepted: torch.Tensor):
        """`book` on this decoder's state. Returns (idx, src, dst)."""
        src, dst = book(idx, accepted, self.tree_ids, self.lengths, self.step_index, self.record)
        return idx, src, dst

    def _commit(self, idx: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                hidden: torch.Tensor) -> None:
        """Move the accepted KV (slots src) to the front of the window (dst), feed the
        drafter the accepted nodes' hidden states."""
        self.cache.move_rows(src, dst, fused=self.kernels.fused_ops)
        feats = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
        self.drafter.ingest(self.draft_cache, feats, dst, dst, kernels=self.kernels)


class FastARDecoder(_StepsBehind):
    """Plain greedy decoding of the target, one token a step, graph-captured when asked: the
    reference speculative speedups are quoted against (`speedup_vs_ar`). `kernels`: its
    attention (`verify`) and the fused forward; top-k and tree build do not arise."""

    def __init__(self, target: Target, *, batch: int, max_len: int, kernels: Kernels = Kernels(),
                 graph_capture: str = "full", phase: PhaseFn = no_phase,
                 in_flight: int = IN_FLIGHT):
        self.target = target
        self.device = dev = target.lm_head.weight.device
        self.b, self.max_len, self.kernels = batch, max_len, kernels
        self.graph_capture = graph_capture if dev.type == "cuda" else "none"
        self.cache = target.new_cache(batch, max_len)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=dev)
        self.bonus = torch.zeros(batch, dtype=torch.long, device=dev)
        self.one = torch.ones(batch, 1, 1, dtype=torch.bool, device=dev)
        self.one_bits = attention.visibility_bits(self.one)     # the same every step
        self.steps_launched = 0
        self._prefilled = None
        self._init_behind(batch, 2, dev, phase, in_flight)

    @torch.no_grad()
    def reset(self, seed: int = 0, phase: PhaseFn | None = None) -> None:
        """Back to the state right after construction, keeping the KV cache, the static
        buffers and the captured graph, as `FastSpecDecoder.reset` (which says why that is
        sound). Plain greedy decoding draws nothing: `seed` is taken so every decoder resets
        alike, and changes nothing."""
        self._reset_behind(phase)
        self._prefilled = None
        self.cache.k.zero_()
        self.cache.v.zero_()
        self.lengths.zero_()
        self.bonus.zero_()

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], chunk: int = 1024) -> None:
        lengths, bonus = prefill(self.target, self.cache, prompts, chunk, kernels=self.kernels)
        self._set_state(lengths, bonus)

    @torch.no_grad()
    def prefill_random(self, lengths: list[int], seed: int) -> None:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.cache.k.normal_(generator=gen)
        self.cache.v.normal_(generator=gen)
        self._set_state(list(lengths), torch.randint(0, self.target.cfg.vocab_size, (self.b,),
                                                     generator=gen, device=self.device))

    def _device_step(self) -> None:
        pos = self.lengths[:, None]
        mask = attention.Mask(self.lengths, self.one, self.max_len, kernels=self.kernels,
                              bits=self.one_bits)
        logits, _ = self.target(self.bonus[:, None], pos, self.cache, pos, mask)
        self.record[:, 0] = 1
        self.record[:, 1] = self.bonus
        self.bonus.copy_(logits[:, -1].argmax(-1))
        self.lengths.add_(1)

    @torch.no_grad()
    def step(self) -> list[int]:
        if self.graph_capture != "none":
            self._graph_step("ar", self._device_step)
        else:
            with self.phase("verify"):
                self._device_step()
        self.steps_launched += 1
        self._publish()
        return self._read_behind()
