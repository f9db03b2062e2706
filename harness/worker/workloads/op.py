"""The op workload: one kernel family of the decode step, at the loop's shapes, against its roofline.

The families (harness/protocol/workloads/op.py), each called exactly as the decode loop calls it:

  topk           tree_gpu.topk_logprobs_batched(logits, N, impl) over the drafter's float32
                 logits [b, B-1, V] (B = block_size, V the model's vocabulary, N = tree_budget)
  tree_build     tree_gpu.build_tree_gpu(log_probs, ids, N, out, impl) over a top-N of such
                 logits, into a preallocated GpuTree
  fused_forward  the target's verify forward: 1 + N tree tokens (a random tree) over a KV cache
                 of context_length tokens, attention by verify_mode, on the fused Triton kernels
                 or the torch ops (fused_ops)
  linear         model.linear_weight over one target layer's weight GEMMs (q/k/v, o, gate/up,
                 down), or one of them or the lm_head (linear_gemm), at one forward's rows
                 (protocol linear_rows), on cuBLAS, the skinny Triton kernel or the stream-K
                 GEMM (linear_impl)
  accept         the accept of a step (accept: gpu) over the verify's logits [b, 1 + N, V] and
                 a tree built from random drafter logits: fast.accept_path + fast.book (tensor
                 ops), or kernels/accept/triton_accept.py (accept_impl)

The cell, in order (as the kernel workload's):
  1. Checks the kernel against its reference on fresh inputs; a wrong kernel fails the cell and
     is never timed. topk: the ids must be the float64 reference's (value descending, id
     ascending on ties) and the log-probs within 1e-3 of float64's topk - logsumexp. tree_build:
     every sequence's tree must be the reference heap's (harness/decode/tree.py), node for node.
     fused_forward: logits of the first CHECK_LAYERS layers of the model (same weights scheme)
     against the same forward in float64 on the torch ops, relative error at most 5e-2 in a
     16-bit dtype (1e-3 otherwise), and the fused forward no worse than 1.5x the unfused one.
     linear: each GEMM's output against float64's, relative error at most LINEAR_TOLERANCE.
     accept: every output (path, bonus, record, slots, lengths) equal to the baseline loop's
     walk on the host.
  2. Measures the host's ceilings (harness.worker.kerneltime).
  3. Times graph replays over input sets rotated to several times the L2 cache.
  4. With `ncu: true`, the call once more in a process under Nsight Compute (harness/worker/
     ncu.py): `ncu.<kernel>.<counter>` for each of its kernels, or why there are none
     (`kernel.ncu_errors`).

Metrics: kernel_us (median per call), kernel_us_spread, achieved_tbps and achieved_tflops (the
minimum bytes and FLOPs of the call over its time), roofline_us = max(bytes / copy bandwidth,
FLOPs / matmul rate), pct_roofline, check_error, copy_tbps, matmul_tflops. Bytes count each
input once and each output once: top-k reads the logits once, a tree build its top-k and
writes its tree, a forward reads its weights (not the embedding table: it gathers T rows) and
the KV cache. The tree build moves a few kilobytes: it is bound by latency, not by either
ceiling, and its pct_roofline says how far from a bandwidth bound it is, nothing more.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from harness.decode import attention, fast, tree_gpu
from harness.decode.drafter import DrafterConfig
from harness.decode.kernel_choice import Kernels, blas_library
from harness.decode.model import Target, TargetConfig, gemm_overlaps, init_random_, linear_weight
from harness.decode.tree import build_tree_cpu
from harness.kernels.verify import verify_reference as ref
from harness.protocol import params, presets
from harness.protocol.workloads.op import BLAS, KNOBS, ON_CPU, linear_rows, op_knobs
from harness.worker import graphstate, ncu
from harness.worker.kerneltime import MIN_LAUNCHES, ceilings, roofline_metrics, set_count, time_calls
from harness.worker.workloads.decode import build_models, resolve_device, resolve_dtype

TOPK_TOLERANCE = 1e-3          # log-probs, absolute, against float64
CHECK_LAYERS = 2               # layers of the fused-forward check model
FORWARD_TOLERANCE = {16: 5e-2, 32: 1e-3, 64: 1e-3}   # relative logits error, by dtype bits
FUSED_SLACK = 1.5              # the fused forward's error at most this times the unfused one's
FORWARD_LAUNCHES = 2           # a forward is milliseconds: two per replay amortise the launch
LINEAR_TOLERANCE = {16: 1e-2, 32: 1e-4, 64: 1e-4}    # relative output error, by dtype bits


def _logits(b: int, depth: int, vocab: int, gen: torch.Generator, device) -> torch.Tensor:
    """Random drafter logits, float32 [b, depth, vocab], standardised and scaled as the random
    drafter's (harness/decode/drafter.py): tie-free, with a realistic top-k spread."""
    return torch.randn(b, depth, vocab, generator=gen, device=device) * DrafterConfig.logit_scale


# --------------------------------------------------------------------------------------------
# The families: inputs(seed) -> one input set; call(inputs) -> a zero-argument callable doing
# only the work the loop does (everything allocated here); check(seed) -> the error against the
# reference (raises when wrong); traffic() -> (minimum bytes, FLOPs) of one call.
# --------------------------------------------------------------------------------------------

@dataclass
class _OverDraftedLogits:
    """A family whose inputs come from the drafter's logits [batch, depth, vocab], with the
    tree's top-k / node budget `k`; an input set is only what one call reads (set_bytes)."""
    impl: str
    batch: int
    depth: int
    vocab: int
    k: int
    device: torch.device

    def logits(self, seed: int) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return _logits(self.batch, self.depth, self.vocab, gen, self.device)

    def set_bytes(self) -> int:
        return self.traffic()[0]


class TopK(_OverDraftedLogits):
    def inputs(self, seed: int) -> dict:
        return {"logits": self.logits(seed)}

    def call(self, inp: dict):
        logits, k, impl = inp["logits"], self.k, self.impl
        return lambda: tree_gpu.topk_logprobs_batched(logits, k, impl=impl)

    def check(self, seed: int) -> float:
        logits = self.inputs(seed)["logits"]
        lp, ids = self.call({"logits": logits})()
        x = logits.double()
        top = torch.sort(x, dim=-1, descending=True, stable=True)
        want_ids = top.indices[..., :self.k]
        want_lp = top.values[..., :self.k] - torch.logsumexp(x, dim=-1, keepdim=True)
        if not torch.equal(ids.long(), want_ids):
            rows = int((ids.long() != want_ids).any(-1).sum())
            raise AssertionError(f"topk {self.impl} is wrong: {rows} of {ids.shape[0] * ids.shape[1]} "
                                 f"rows pick other ids than the float64 reference; not timing it")
        err = float((lp.double() - want_lp).abs().max())
        if not err <= TOPK_TOLERANCE:
            raise AssertionError(f"topk {self.impl} is wrong: log-probs {err:.3g} from float64 "
                                 f"(> {TOPK_TOLERANCE}); not timing it")
        return err

    def traffic(self) -> tuple[int, int]:
        rows = self.batch * self.depth
        return rows * self.vocab * 4 + rows * self.k * (4 + 8), 0


class TreeBuild(_OverDraftedLogits):
    def inputs(self, seed: int) -> dict:
        lp, ids = tree_gpu.topk_logprobs_batched(self.logits(seed), self.k, impl="torch")
        return {"lp": lp, "ids": ids, "out": tree_gpu.GpuTree.empty(self.batch, self.k, self.device)}

    def call(self, inp: dict):
        lp, ids, out, n, impl = inp["lp"], inp["ids"], inp["out"], self.k, self.impl
        return lambda: tree_gpu.build_tree_gpu(lp, ids, n, out=out, impl=impl)

    def check(self, seed: int) -> float:
        inp = self.inputs(seed)
        got = self.call(inp)()
        lp, ids = inp["lp"].cpu(), inp["ids"].cpu()
        tokens, depths, parents = got.tokens.cpu(), got.depths.cpu(), got.parents.cpu()
        wrong = 0
        for i in range(self.batch):
            heap = build_tree_cpu(lp[i], ids[i], self.k)
            n = heap.num_nodes
            wrong += (tokens[i, :n].tolist() != heap.tokens or depths[i, :n].tolist() != heap.depths
                      or parents[i, :n + 1].tolist() != heap.parents)
        if wrong:
            raise AssertionError(f"tree_build {self.impl} is wrong: {wrong} of {self.batch} trees "
                                 f"differ from the reference heap; not timing it")
        return 0.0

    def traffic(self) -> tuple[int, int]:
        read = self.batch * self.depth * self.k * (4 + 8)
        tree = tree_gpu.GpuTree.empty(1, self.k, "meta")
        written = self.batch * sum(getattr(tree, f.name).nbytes for f in dataclasses.fields(tree))
        return read + written, 0


@dataclass
class FusedForward:
    fused: bool
    verify: str
    cell: dict
    device: torch.device
    dtype: torch.dtype

    @property
    def cfg(self) -> TargetConfig:
        return TargetConfig(**presets.PRESETS[self.cell["model"]]["target"])

    @property
    def tokens(self) -> int:
        return 1 + self.cell["tree_budget"]

    def kernels(self, fused: bool | None = None) -> Kernels:
        return Kernels(verify=self.verify, fused_ops=self.fused if fused is None else fused,
                       blas=self.cell[BLAS])

    def model(self) -> Target:
        return build_models(self.cell, self.device, self.dtype)[0]

    def inputs(self, seed: int, target: Target | None = None, kernels: Kernels | None = None) -> dict:
        target = target if target is not None else self.model()
        b, T, ctx = self.cell["batch_size"], self.tokens, self.cell["context_length"]
        dev = self.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        cpu_gen = torch.Generator().manual_seed(seed)
        cache = target.new_cache(b, ctx + T)
        for layer in range(target.cfg.layers):   # drawn in float32: the same keys in every dtype
            for t in (cache.k[layer], cache.v[layer]):
                t.copy_(torch.randn(t.shape, generator=gen, device=dev))
        vis = ref.random_tree(b, T, cpu_gen).to(dev)
        lengths = torch.full((b,), ctx, dtype=torch.long, device=dev)
        positions = lengths[:, None] + vis.sum(-1) - 1          # a node's depth below the root
        slots = lengths[:, None] + torch.arange(T, device=dev)
        ids = torch.randint(0, target.cfg.vocab_size, (b, T), generator=gen, device=dev)
        mask = attention.Mask(lengths, vis, ctx + T, kernels=kernels or self.kernels(),
                              bits=attention.visibility_bits(vis))
        return {"target": target, "ids": ids, "positions": positions, "cache": cache,
                "slots": slots, "mask": mask}

    def call(self, inp: dict):
        target, ids, positions, cache, slots, mask = (
            inp["target"], inp["ids"], inp["positions"], inp["cache"], inp["slots"], inp["mask"])
        return lambda: target(ids, positions, cache, slots, mask)[0]

    @torch.no_grad()
    def check(self, seed: int) -> float:
        small = dataclasses.replace(self.cfg, layers=min(CHECK_LAYERS, self.cfg.layers))
        with torch.device(self.device):
            model = Target(small).to(torch.float64).eval()
        init_random_(model, self.cell["seed"])

        def logits(kernels):
            return self.call(self.inputs(seed, model, kernels))().double()

        want = logits(Kernels(verify="sdpa"))
        model.to(self.dtype)                     # the same weights, rounded to the cell's dtype
        err = ref.relative_error(logits(self.kernels()), want)
        tolerance = FORWARD_TOLERANCE[torch.finfo(self.dtype).bits]
        if not err <= tolerance:
            raise AssertionError(f"the verify forward (fused_ops {self.fused}) is wrong: logits "
                                 f"{err:.3g} from float64 (> {tolerance}); not timing it")
        if self.fused:
            plain = ref.relative_error(logits(self.kernels(fused=False)), want)
            if not err <= FUSED_SLACK * plain + 1e-3:
                raise AssertionError(f"the fused forward is wrong: logits {err:.3g} from float64, "
                                     f"the torch ops' {plain:.3g}; not timing it")
        return err

    def _sizes(self) -> tuple[int, int, int]:
        """(weight elements read, KV elements read, FLOPs) of one forward."""
        c, t = self.cell, self.cfg
        b, T, ctx = c["batch_size"], self.tokens, c["context_length"]
        # Per layer: q, k, v, o projections, the gate-up and down projections, the norms.
        layer = (t.hidden * (t.heads + 2 * t.kv_heads) * t.head_dim + t.heads * t.head_dim * t.hidden
                 + 3 * t.hidden * t.ffn + 2 * t.hidden + 2 * t.head_dim)
        weights = t.layers * layer + t.hidden * t.vocab_size + t.hidden
        kv = 2 * t.layers * t.kv_heads * t.head_dim * (ctx + T) * b
        flops = 2 * weights * T * b + 4 * t.layers * t.heads * t.head_dim * T * (ctx + T) * b
        return weights, kv, flops

    def traffic(self) -> tuple[int, int]:
        weights, kv, flops = self._sizes()
        return (weights + kv) * torch.empty((), dtype=self.dtype).element_size(), flops

    def set_bytes(self) -> int:
        """An input set's own bytes: its KV cache (every set shares the one copy of the weights)."""
        return self._sizes()[1] * torch.empty((), dtype=self.dtype).element_size()


@dataclass
class LayerLinear:
    """One target layer's weight GEMMs at one forward's rows, as the forward calls them
    (model.linear_weight), on the kernel `impl` (linear_impl) picks."""
    impl: str
    cell: dict
    device: torch.device
    dtype: torch.dtype

    def shapes(self) -> list[tuple[int, int]]:
        """(N, K) of the cell's GEMMs (linear_gemm): q/k/v, o, gate/up and down, or one of them,
        or the lm_head."""
        t = TargetConfig(**presets.PRESETS[self.cell["model"]]["target"])
        gemms = {"qkv": ((t.heads + 2 * t.kv_heads) * t.head_dim, t.hidden),
                 "o": (t.hidden, t.heads * t.head_dim), "gate_up": (2 * t.ffn, t.hidden),
                 "down": (t.hidden, t.ffn), "lm_head": (t.vocab_size, t.hidden)}
        which = self.cell["linear_gemm"]
        return [gemms[g] for g in ("qkv", "o", "gate_up", "down")] if which == "layer" else [gemms[which]]

    def inputs(self, seed: int) -> dict:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        rows = linear_rows(self.cell)
        # Drawn in float32 then rounded: the same values in every dtype; weights scaled as a
        # trained model's (~0.02), so outputs stay O(1).
        weights = [(torch.randn(n, k, generator=gen, device=self.device) * 0.02).to(self.dtype)
                   for n, k in self.shapes()]
        xs = [torch.randn(rows, k, generator=gen, device=self.device).to(self.dtype)
              for _, k in self.shapes()]
        return {"weights": weights, "xs": xs}

    def call(self, inp: dict):
        kernels = Kernels(linear=self.impl, blas=self.cell[BLAS])
        pairs = list(zip(inp["weights"], inp["xs"]))
        return lambda: [linear_weight(w, x, kernels) for w, x in pairs]

    def check(self, seed: int) -> float:
        inp = self.inputs(seed)
        got = self.call(inp)()
        err = max(ref.relative_error(y.double(), x.double() @ w.double().T)
                  for y, w, x in zip(got, inp["weights"], inp["xs"]))
        tolerance = LINEAR_TOLERANCE[torch.finfo(self.dtype).bits]
        if not err <= tolerance:
            raise AssertionError(f"linear {self.impl} is wrong: outputs {err:.3g} from float64 "
                                 f"(> {tolerance}); not timing it")
        return err

    def traffic(self) -> tuple[int, int]:
        elt = torch.empty((), dtype=self.dtype).element_size()
        rows = linear_rows(self.cell)
        weights = sum(n * k for n, k in self.shapes())
        acts = sum(rows * (n + k) for n, k in self.shapes())
        return (weights + acts) * elt, 2 * weights * rows

    def set_bytes(self) -> int:
        return self.traffic()[0]


@dataclass
class Accept:
    """The accept of one step as the decode loop runs it (FastSpecDecoder._accept_gpu with
    greedy acceptance): the verify's logits [b, T, V] over a tree of T = 1 + N nodes in, the
    accepted path, the bonus token, the record, the commit's slots and the advanced lengths
    out, on the tensor ops or the Triton accept (accept_impl)."""
    impl: str
    cell: dict
    device: torch.device
    dtype: torch.dtype

    def _dims(self) -> tuple[int, int, int, int]:
        c, vocab = self.cell, presets.PRESETS[self.cell["model"]]["target"]["vocab_size"]
        return c["batch_size"], 1 + c["tree_budget"], c["block_size"], vocab

    def inputs(self, seed: int) -> dict:
        b, T, B, V = self._dims()
        gen = torch.Generator(device=self.device).manual_seed(seed)
        lp, ids = tree_gpu.topk_logprobs_batched(_logits(b, B - 1, V, gen, self.device), T - 1)
        tree = tree_gpu.build_tree_gpu(lp, ids, T - 1, impl="torch")
        tree_ids = torch.cat([torch.randint(0, V, (b, 1), generator=gen, device=self.device),
                              tree.tokens], 1)
        logits = torch.randn(b, T, V, generator=gen, device=self.device)
        # The target agrees with the drafter's best chain for half its depth: a path of a
        # few nodes, as a trained pair accepts.
        node = torch.zeros(b, dtype=torch.long, device=self.device)
        rows = torch.arange(b, device=self.device)
        for _ in range((B - 1) // 2):
            child = tree.first_child[rows, node].clamp(min=0)
            logits[rows, node, tree_ids[rows, child]] = 10.0
            node = child
        z = lambda *shape: torch.zeros(*shape, dtype=torch.long, device=self.device)  # noqa: E731
        state = dict(lengths=torch.full((b,), self.cell["context_length"], dtype=torch.long,
                                        device=self.device),
                     step_index=z(1), bonus=z(b), record=z(b, 1 + B), idx=z(b, B), src=z(b, B),
                     dst=z(b, B))
        inp = dict(logits=logits.to(self.dtype), tree_ids=tree_ids, parents=tree.parents,
                   first_child=tree.first_child, depth=torch.cat([z(b, 1), tree.depths], 1),
                   vis=tree.visibility, bits=tree.bits, **state)
        if self.impl == "triton":
            from harness.kernels.accept import triton_accept
            inp["workspace"] = triton_accept.alloc_workspace(b, T, V, self.device)
        return inp

    def call(self, inp: dict):
        b, T, B, V = self._dims()
        if self.impl == "triton":
            from harness.kernels.accept import triton_accept
            hidden = presets.PRESETS[self.cell["model"]]["target"]["hidden"]
            overlap = gemm_overlaps(b * T, hidden, Kernels(linear=self.cell["linear_impl"]))
            args = {k: inp[k] for k in ("tree_ids", "parents", "first_child", "depth", "bits",
                                        "lengths", "step_index", "bonus", "record", "idx",
                                        "src", "dst", "workspace")}
            return lambda: triton_accept.accept(inp["logits"], draws=None, overlap=overlap, **args)

        def tensor_ops():
            idx, accepted, bonus = fast.accept_path(inp["logits"], inp["tree_ids"], inp["parents"],
                                                    inp["first_child"], inp["depth"], inp["vis"], B)
            inp["bonus"].copy_(bonus)
            src, dst = fast.book(idx, accepted, inp["tree_ids"], inp["lengths"],
                                 inp["step_index"], inp["record"])
            # The loop hands these on as they are: kept for the check, not copied (a copy is
            # work the loop does not do).
            inp["idx"], inp["src"], inp["dst"] = idx, src, dst
        return tensor_ops

    def check(self, seed: int) -> float:
        inp = self.inputs(seed)
        want = self._host_walk(inp)
        self.call(inp)()
        wrong = [k for k, v in want.items() if not torch.equal(inp[k].cpu(), v)]
        if wrong:
            raise AssertionError(f"accept {self.impl} is wrong: {', '.join(wrong)} differ from "
                                 f"the host walk's; not timing it")
        return 0.0

    def _host_walk(self, inp: dict) -> dict:
        """The reference: the baseline loop's walk on the host (from the root, follow the child
        whose token is the target's argmax, until there is none), and its bookkeeping."""
        b, T, B, V = self._dims()
        nxt = inp["logits"].float().argmax(-1).tolist()
        parents, tokens = inp["parents"].tolist(), inp["tree_ids"].tolist()
        lengths = inp["lengths"].cpu()
        out = {k: torch.zeros(b, n, dtype=torch.long) for k, n in
               (("idx", B), ("record", 1 + B), ("src", B), ("dst", B))}
        bonus = torch.zeros(b, dtype=torch.long)
        for i in range(b):
            children = {(parents[i][n], tokens[i][n]): n for n in range(1, T) if parents[i][n] >= 0}
            path = [0]
            while len(path) < B and (path[-1], nxt[i][path[-1]]) in children:
                path.append(children[(path[-1], nxt[i][path[-1]])])
            idx = torch.tensor(path + [path[-1]] * (B - len(path)))
            out["idx"][i] = idx
            out["record"][i] = torch.tensor([len(path)] + [tokens[i][n] for n in idx.tolist()])
            out["src"][i] = lengths[i] + idx
            out["dst"][i] = lengths[i] + torch.arange(B)
            bonus[i] = nxt[i][path[-1]]
        return {**out, "bonus": bonus, "lengths": lengths + out["record"][:, 0],
                "step_index": inp["step_index"].cpu() + 1}

    def traffic(self) -> tuple[int, int]:
        b, T, B, V = self._dims()
        elt = torch.empty((), dtype=self.dtype).element_size()
        tree = b * T * (4 * 8 + (T + 31) // 32 * 4)   # four int64 per node, its mask words
        out = b * (4 * B + 1) * 8                      # idx, src, dst, record (int64)
        return b * T * V * elt + tree + out, 0

    def set_bytes(self) -> int:
        return self.traffic()[0]


def family(cell: dict, device: torch.device, dtype: torch.dtype):
    """The cell's family, with the kernel its knob picks."""
    op, model = cell["op"], presets.PRESETS[cell["model"]]["target"]
    b, depth, vocab, n = cell["batch_size"], cell["block_size"] - 1, model["vocab_size"], cell["tree_budget"]
    if op == "topk":
        return TopK(cell["topk_impl"], b, depth, vocab, n, device)
    if op == "tree_build":
        return TreeBuild(cell["tree_build_impl"], b, depth, vocab, n, device)
    if op == "fused_forward":
        return FusedForward(cell["fused_ops"], cell["verify_mode"], cell, device, dtype)
    if op == "linear":
        return LayerLinear(cell["linear_impl"], cell, device, dtype)
    if op == "accept":
        return Accept(cell["accept_impl"], cell, device, dtype)
    raise ValueError(f"unknown op '{op}'")


def _needs_cuda(cell: dict, device: torch.device) -> None:
    """Triton and CUDA C++ kernels run on a CUDA device (Triton also under TRITON_INTERPRET=1,
    as the tests run them); the loop would quietly fall back to torch anywhere else."""
    if device.type != "cuda" and cell[BLAS] != ON_CPU[BLAS]:
        raise RuntimeError(f"{BLAS} {cell[BLAS]} is a CUDA library; this cell runs on {device}")
    knob = KNOBS[cell["op"]]
    if device.type == "cuda" or cell[knob] == ON_CPU[knob]:
        return
    from harness.kernels.tree import triton_topk
    if not (triton_topk._interpreting() and cell[knob] != "cuda"):
        raise RuntimeError(f"{knob} {cell[knob]} is a CUDA kernel; this cell runs on {device}")


def profile_call(cell: dict, mode: str, device, dtype):
    """The call `ncu: true` profiles (harness/worker/ncu_target.py): the op's kernel on the
    cell's first timed input set (`mode` is the op)."""
    cell = resolved(cell, device)
    fam = family(cell, device, dtype)
    call = fam.call(fam.inputs(cell["seed"] * 1000))

    def in_its_library():         # each call on the cell's BLAS library, as `run` times it
        with blas_library(cell[BLAS]):
            return call()
    return in_its_library


def resolved(cell: dict, device) -> dict:
    """The cell with its `auto` kernel knobs resolved for this device."""
    return {**cell, **params.resolve_kernels(cell, device.type == "cuda")}


@torch.no_grad()
def run(cell: dict, progress) -> dict:
    device = resolve_device(cell)
    dtype = resolve_dtype(cell, device)
    cell = resolved(cell, device)
    _needs_cuda(cell, device)
    # The GEMMs torch runs (the verify forward's, the linear op's) on the loop's library.
    with blas_library(cell[BLAS]):
        return _measure(cell, progress, device, dtype)


def _measure(cell: dict, progress, device: torch.device, dtype: torch.dtype) -> dict:
    graphstate.settle(device)                   # every cell times in the same graph state
    fam = family(cell, device, dtype)
    seed = cell["seed"]

    progress(stage="check", op=cell["op"])
    err = fam.check(seed * 1000 + 7919)
    progress(stage="ceilings", device=str(device))
    copy_bw, mm_rate = ceilings(device, dtype)
    bytes_, flops = fam.traffic()

    sets = [fam.inputs(seed * 1000 + i) for i in range(set_count(fam.set_bytes(), device))]
    progress(stage="time", op=cell["op"], input_sets=len(sets))
    launches = FORWARD_LAUNCHES if cell["op"] == "fused_forward" else MIN_LAUNCHES
    samples, graph = time_calls([fam.call(s) for s in sets], cell["repeats"], cell["warmup_steps"],
                                device, min_launches=launches)
    metrics = {**roofline_metrics(samples, bytes_, flops, copy_bw, mm_rate), "check_error": err}
    bound = "latency" if cell["op"] == "tree_build" else (
        "memory" if bytes_ / copy_bw >= flops / mm_rate else "compute")
    info = {"op": cell["op"], "bytes": bytes_, "flops": flops, "input_sets": len(sets),
            "graph": graph, "bound": bound}
    if cell["ncu"]:
        found, info["ncu_errors"] = ncu.counters_for(cell, [cell["op"]], cell["op"], device, progress)
        metrics.update(found)
    return {"metrics": metrics, "samples": {"kernel_us": samples}, "kernel": info,
            "kernels": {knob: cell[knob] for knob in op_knobs(cell["op"])}}

