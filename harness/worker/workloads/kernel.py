"""The kernel workload: one verify-attention kernel at one point, against its roofline.

A point is (attention gqa|mla, batch, context, tree tokens T, heads, kv heads, head dim, layout
contiguous|paged, page size); `context_length` is the committed prefix per sequence, so each
sequence reads context + T keys. `tree_tokens` is T, every query of the verify forward (root +
tree nodes), each seeing the prefix and its ancestors in a random tree.

The cell, in order:
  1. Checks `verify_mode` against a float64 reference on fresh random inputs (sequences of
     different prefix lengths when batch > 1), output poisoned with NaN where the mode accepts
     an output buffer. Relative error above 1e-2 fails the cell: a wrong kernel is never timed.
  2. Measures this host's ceilings once per process: device copy bandwidth and bf16 matmul
     rate (harness.worker.kerneltime; a small CPU version on CPU hosts).
  3. Times the mode (harness.worker.kerneltime): input sets rotated so that together they are
     several times the L2 cache, one launch per set captured in a CUDA graph (at least 8
     launches), `warmup_steps` untimed replays, then `repeats` replays each timed with CUDA
     events; per-launch time = replay time / launches; the median is `kernel_us`. A mode that
     cannot be captured is timed as eager launches the same way (recorded as graph: false).
  4. The same for every mode in `compare_modes` (a measurement knob: it adds metrics, never
     changes this mode's), giving `<mode>.kernel_us`, `<mode>.pct_roofline` and
     `speedup_vs_<mode>` = their time / this mode's time, measured in the same process on the
     same inputs. A compared mode that fails or is wrong leaves its metrics absent and its
     error in `compare_errors`; the cell still succeeds. How each was timed (graph or eager
     launches) is `compare_graph`.
  5. With `ncu: true`, each timed mode's call once more in a process under Nsight Compute
     (harness/worker/ncu.py): `ncu.<kernel>.<counter>` (and `<mode>.ncu....` for a compared
     mode) for every kernel of the call: duration, SM / memory / DRAM / L2 throughput, registers,
     occupancy, warps a scheduler, cycles per issued instruction and its stall reasons
     (harness/worker/counters.py). Counters that cannot be read here leave the reason in
     `ncu_errors`; the timed metrics stand either way.

Roofline (docs/ARCHITECTURE.md): roofline_us = max(bytes / copy bandwidth, FLOPs / matmul rate), bytes =
K and V (MLA: the one 576-wide latent row per key, values are its first 512) + Q + output,
FLOPs = 2 * rows * keys * (dk + dv); pct_roofline = 100 * roofline_us / kernel_us.

The modes: `custom` (kernels/verify/custom_verify.py), `triton` (kernels/verify/triton_verify.py; for MLA it
attends with the 576-wide latent as values and drops the last 64 output columns unless the
module has an MLA entry point), `sdpa` (torch SDPA with an additive mask, the G query heads of
a KV head folded into its query axis so the cache is never expanded: the decode loop's SDPA
path) and `flex` (harness/decode/flex_verify.py: torch.compile'd flex_attention with a block
mask, the decode loop's flex path). A compared mode may also be `vendor`
(kernels/verify/vendor_verify.py): torch's fused attention kernel (cuDNN on Hopper) over the
unmasked prefix and, with an additive mask, over the tree block, merged by log-sum-exp; the
kernel it used is `kernel.vendor_backend` and the key ranges of its prefix,
`kernel.vendor_ranges`. sdpa, flex and vendor read a contiguous cache only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from harness.kernels.verify import verify_reference as ref
from harness.protocol import params
from harness.worker import graphstate, ncu
from harness.worker.kerneltime import ceilings, roofline_metrics, set_count, time_calls
from harness.worker.workloads.decode import resolve_device, resolve_dtype

TOLERANCE = 1e-2
MLA_DK, MLA_DV = 576, 512


@dataclass(frozen=True)
class Point:
    attention: str
    batch: int
    context: int
    tokens: int
    heads: int
    kv_heads: int
    dk: int
    dv: int
    layout: str
    page_size: int

    @classmethod
    def from_cell(cls, cell: dict) -> "Point":
        mla = cell["attention"] == "mla"
        if mla and (cell["kv_heads"] != 1 or cell["head_dim"] != MLA_DK):
            raise ValueError(f"attention mla needs kv_heads 1 and head_dim {MLA_DK} (the latent: "
                             f"{MLA_DV} values + 64 rope)")
        if cell["heads"] % cell["kv_heads"]:
            raise ValueError(f"heads {cell['heads']} is not a multiple of kv_heads {cell['kv_heads']}")
        return cls(cell["attention"], cell["batch_size"], cell["context_length"], cell["tree_tokens"],
                   cell["heads"], cell["kv_heads"], cell["head_dim"],
                   MLA_DV if mla else cell["head_dim"], cell["layout"], cell["page_size"])

    @property
    def mla(self) -> bool:
        return self.attention == "mla"

    def kv_bytes(self, elem: int) -> int:
        keys = self.batch * (self.context + self.tokens)
        row = self.dk if self.mla else 2 * self.dk        # MLA: values live inside the key row
        return keys * self.kv_heads * row * elem

    def bytes(self, elem: int) -> int:
        qo = self.batch * self.heads * self.tokens * (self.dk + self.dv) * elem
        return self.kv_bytes(elem) + qo

    def flops(self) -> int:
        return 2 * self.batch * self.heads * self.tokens * (self.context + self.tokens) * (self.dk + self.dv)


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

def make_inputs(pt: Point, lengths: list[int], seed: int, device: torch.device,
                dtype: torch.dtype, tree_boost: float = 1.0) -> dict:
    """Random q, cache (contiguous or paged), lengths, random tree bitmasks for one input set.

    `tree_boost` scales the keys of the tree (slots L .. L+T-1): checks use it so that the tree
    part carries real weight next to a long prefix, where a wrong tree mask would otherwise hide
    below the tolerance."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    b, T = pt.batch, pt.tokens

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    inp = {"q": randn(b, pt.heads, T, pt.dk),
           "lengths": torch.tensor(lengths, dtype=torch.int32, device=device)}
    vis = ref.random_tree(b, T, cpu_gen)
    inp["bits"] = ref.pack_visibility(vis).to(device)
    n_max = max(lengths) + T
    if pt.layout == "contiguous":
        inp["k"] = randn(b, pt.kv_heads, n_max, pt.dk)
        inp["v"] = inp["k"][..., :MLA_DV] if pt.mla else randn(b, pt.kv_heads, n_max, pt.dk)
    else:
        ps = pt.page_size
        counts = [math.ceil((L + T) / ps) for L in lengths]
        perm = torch.randperm(sum(counts), generator=cpu_gen).to(torch.int32)
        table = torch.zeros(b, max(counts), dtype=torch.int32)
        start = 0
        for i, c in enumerate(counts):                 # scattered pages, like a real pool
            table[i, :c] = perm[start:start + c]
            start += c
        inp["page_table"] = table.to(device)
        inp["k"] = randn(sum(counts), pt.kv_heads, ps, pt.dk)
        inp["v"] = inp["k"][..., :MLA_DV] if pt.mla else randn(sum(counts), pt.kv_heads, ps, pt.dk)
    inp["n_keys"] = n_max
    if tree_boost != 1.0:
        _boost_tree_keys(pt, inp, lengths, tree_boost)
    return inp


def _boost_tree_keys(pt: Point, inp: dict, lengths: list[int], factor: float) -> None:
    k, table, T = inp["k"], inp.get("page_table"), pt.tokens
    for i, L in enumerate(lengths):
        slots = torch.arange(L, L + T, device=k.device)
        if table is None:
            k[i, :, L:L + T] *= factor
        else:
            pages = table[i, slots // pt.page_size].long()
            k[pages, :, slots % pt.page_size] *= factor


def check_boost(context: int) -> float:
    """Tree-key scale for checks: about ln(context)/2, so the tree's softmax mass is not negligible."""
    return max(1.0, math.log(context + 1) / 2)


def reference(pt: Point, inp: dict) -> torch.Tensor:
    return ref.reference_attention(inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"],
                                   sm_scale=1.0 / math.sqrt(pt.dk), page_table=inp.get("page_table"))


# --------------------------------------------------------------------------------------------
# Modes: each returns a zero-argument callable for one input set (all preparation done here)
# --------------------------------------------------------------------------------------------

def prepare(mode: str, pt: Point, inp: dict, out: torch.Tensor | None = None, *,
            custom_impl: str = "mma", custom_splits: int | None = None):
    """A callable running `mode` on input set `inp`; `out` (if the mode takes one) is written.
    `custom_impl`: the custom kernel's S = QK^T (custom_verify's `impl`; the cell's knob of that
    name, resolved for the device by `run`); `custom_splits`: its split count (None: its plan)."""
    scale = 1.0 / math.sqrt(pt.dk)
    q, k, v, lengths, bits = inp["q"], inp["k"], inp["v"], inp["lengths"], inp["bits"]
    table = inp.get("page_table")
    if mode in ("sdpa", "flex", "vendor") and table is not None:
        raise NotImplementedError(f"{mode} reads a contiguous cache only (layout paged)")

    if mode == "custom":
        if q.device.type != "cuda":
            raise RuntimeError("the custom kernel needs a CUDA device")
        from harness.kernels.verify import custom_verify as cv
        if pt.mla:
            return lambda: cv.mla_tree_verify_attention(q, k, lengths, bits, scale, num_splits=custom_splits,
                                                        page_table=table, impl=custom_impl, out=out)
        if table is not None:
            return lambda: cv.tree_verify_attention_paged(q, k, v, table, lengths, bits, scale,
                                                          num_splits=custom_splits, impl=custom_impl,
                                                          out=out)
        return lambda: cv.tree_verify_attention(q, k, v, lengths, bits, scale, num_splits=custom_splits,
                                                impl=custom_impl, out=out)

    if mode == "triton":
        from harness.kernels.verify import triton_verify as tv
        if pt.mla:
            if hasattr(tv, "mla_tree_verify_attention"):
                return lambda: tv.mla_tree_verify_attention(q, k, lengths, bits, scale, page_table=table)
            if table is not None:
                raise NotImplementedError("the Triton baseline has no paged MLA variant")
            return lambda: tv.tree_verify_attention(q, k, k, lengths, bits, scale)[..., :MLA_DV]
        if table is not None:
            if not hasattr(tv, "tree_verify_attention_paged"):
                raise NotImplementedError("the Triton baseline has no paged variant")
            return lambda: tv.tree_verify_attention_paged(q, k, v, table, lengths, bits, scale)
        return lambda: tv.tree_verify_attention(q, k, v, lengths, bits, scale, out=out)

    n = inp["n_keys"]
    kn, vn = k[:, :, :n], v[:, :, :n]
    b, hq, T, _ = q.shape
    G = hq // k.shape[1]
    if mode == "sdpa":
        bias = _sdpa_bias(lengths, bits, T, G, n, q.dtype)
        qg = q.reshape(b, k.shape[1], G * T, pt.dk)
        return lambda: F.scaled_dot_product_attention(qg, kn, vn, attn_mask=bias, scale=scale
                                                      ).reshape(b, hq, T, pt.dv)
    if mode == "vendor":
        if pt.mla:
            raise NotImplementedError("vendor attends with one head dim for keys and values (not mla)")
        from harness.kernels.verify import vendor_verify as vv
        # decided once, outside the timed call: the prefixes (sliced on the host), the kernel,
        # the tree mask (built once a forward, as a model's layers would share it)
        prefixes = [int(L) for L in lengths.tolist()]
        backend = vv.pick_backend(q.device)
        mask = vv.tree_mask(bits, T, G, backend, k.shape[1], q.dtype)
        return lambda: vv.tree_verify_attention(q, k, v, prefixes, bits, scale, backend=backend,
                                                mask=mask, out=out)
    if mode == "flex":                # the decode loop's flex path, block mask built here
        from harness.decode.flex_verify import flex_block_mask, flex_tree_verify
        block_mask = flex_block_mask(lengths, bits, T, n)
        return lambda: flex_tree_verify(q, kn, vn, lengths, bits, scale, block_mask=block_mask)
    raise ValueError(f"unknown verify mode '{mode}'")


def _sdpa_bias(lengths, bits, T, G, n, dtype) -> torch.Tensor:
    """Additive mask [b, 1, G*T, n] (0 visible, -inf hidden), rows g*T + t; stored with its last
    dim padded to a multiple of 16, as the memory-efficient SDPA kernel wants."""
    b = lengths.shape[0]
    j = torch.arange(n, device=lengths.device)
    rel = j[None, :] - lengths.long()[:, None]                                   # [b, n]
    tree = ref.unpack_visibility(bits, T)                                       # [b, T, T]
    in_tree = (rel >= 0) & (rel < T)
    seen = torch.gather(tree, 2, rel.clamp(0, T - 1)[:, None, :].expand(b, T, n))
    allowed = (rel < 0)[:, None, :] | (in_tree[:, None, :] & seen)             # [b, T, n]
    allowed = allowed.repeat(1, G, 1)[:, None]                                  # [b, 1, G*T, n]
    padded = torch.full((b, 1, G * T, (n + 15) // 16 * 16), float("-inf"), dtype=dtype,
                        device=lengths.device)
    bias = padded[..., :n]
    bias.masked_fill_(allowed, 0.0)
    return bias


# --------------------------------------------------------------------------------------------
# The cell
# --------------------------------------------------------------------------------------------

def _resolve(cell: dict) -> tuple[torch.device, torch.dtype]:
    device = resolve_device(cell)
    return device, resolve_dtype(cell, device)


def compare_list(cell: dict) -> list[str]:
    return [m for m in cell["compare_modes"].split(",") if m and m != cell["verify_mode"]]


def check(mode: str, pt: Point, device, dtype, seed: int, *, custom_impl: str = "mma",
          custom_splits: int | None = None) -> float:
    """Relative error of `mode` against the float64 reference on fresh random inputs; raises
    if it is above TOLERANCE (or NaN). `custom_impl` and `custom_splits` as for `prepare`."""
    gen = torch.Generator().manual_seed(seed)
    if pt.batch == 1:
        lengths = [pt.context]
    else:                            # different prefix lengths per sequence
        lengths = [int(torch.randint(max(1, pt.context // 2), pt.context + 1, (1,), generator=gen))
                   for _ in range(pt.batch)]
        lengths[0] = pt.context
    inp = make_inputs(pt, lengths, seed, device, dtype, tree_boost=check_boost(pt.context))
    out = None
    if mode in ("custom", "triton", "vendor"):  # poisoned: an element never written stays NaN
        out = torch.full((pt.batch, pt.heads, pt.tokens, pt.dv), float("nan"), dtype=dtype, device=device)
    got = prepare(mode, pt, inp, out, custom_impl=custom_impl, custom_splits=custom_splits)()
    err = ref.relative_error(got, reference(pt, inp))
    if not err <= TOLERANCE:
        raise AssertionError(f"{mode} is wrong at this point: relative error {err:.3g} > {TOLERANCE} "
                             f"against the float64 reference; not timing it")
    return err


def input_sets(pt: Point, device, dtype, seed: int) -> list[dict]:
    elem = torch.empty((), dtype=dtype).element_size()
    return [input_set(pt, device, dtype, seed, i) for i in range(set_count(pt.bytes(elem), device))]


def input_set(pt: Point, device, dtype, seed: int, i: int) -> dict:
    """The i-th timed input set of a cell whose sets start at `seed`."""
    return make_inputs(pt, [pt.context] * pt.batch, seed + 1 + i, device, dtype)


def measure_mode(mode: str, pt: Point, sets: list[dict], cell: dict, device, *,
                 custom_impl: str = "mma", custom_splits: int | None = None) -> tuple[list[float], bool]:
    calls = [prepare(mode, pt, s, custom_impl=custom_impl, custom_splits=custom_splits) for s in sets]
    return time_calls(calls, cell["repeats"], cell["warmup_steps"], device)


def custom_knobs(cell: dict, pt: Point, device) -> dict:
    """The custom kernel's variant (the cell's custom_impl, `auto` resolved for this GPU) and
    split count (None: its plan), as `prepare` takes them."""
    impl = cell.get("custom_impl", params.AUTO)
    if impl == params.AUTO:
        cuda = device.type == "cuda"
        impl = params.custom_auto(params.device_class(
            cuda, torch.cuda.get_device_capability(device) if cuda else None), pt.dk, pt.mla)
    return {"custom_impl": impl, "custom_splits": cell.get("custom_splits", 0) or None}


def profile_call(cell: dict, mode: str, device, dtype):
    """The call `ncu: true` profiles (harness/worker/ncu_target.py): `mode` on the cell's first
    timed input set."""
    pt = Point.from_cell(cell)
    inp = input_set(pt, device, dtype, cell["seed"] * 1000, 0)
    return prepare(mode, pt, inp, **custom_knobs(cell, pt, device))


def run(cell: dict, progress) -> dict:
    device, dtype = _resolve(cell)
    graphstate.settle(device)                   # every cell times in the same graph state
    pt = Point.from_cell(cell)
    mode = cell["verify_mode"]
    elem = torch.empty((), dtype=dtype).element_size()
    seed = cell["seed"]
    custom = custom_knobs(cell, pt, device)
    impl = custom["custom_impl"]
    progress(stage="check", mode=mode)
    err = check(mode, pt, device, dtype, seed * 1000 + 7919, **custom)
    progress(stage="ceilings", device=str(device))
    copy_bw, mm_rate = ceilings(device, dtype)
    bytes_, flops = pt.bytes(elem), pt.flops()

    sets = input_sets(pt, device, dtype, seed * 1000)
    progress(stage="time", mode=mode, input_sets=len(sets))
    samples, graph = measure_mode(mode, pt, sets, cell, device, **custom)
    metrics = {**roofline_metrics(samples, bytes_, flops, copy_bw, mm_rate), "rel_error": err}
    us, roofline_us = metrics["kernel_us"], metrics["roofline_us"]
    info = {"bytes": bytes_, "flops": flops, "input_sets": len(sets), "graph": graph,
            "bound": "memory" if bytes_ / copy_bw >= flops / mm_rate else "compute"}
    if mode == "custom":
        info["custom_plan"] = _custom_plan(pt, sets[0], impl, custom["custom_splits"])

    compare_errors, compare_graph = {}, {}
    for other in compare_list(cell):
        progress(stage="compare", mode=other)
        try:
            other_err = check(other, pt, device, dtype, seed * 1000 + 7919, **custom)
            other_samples, compare_graph[other] = measure_mode(other, pt, sets, cell, device, **custom)
        except Exception as exc:     # a peer that cannot run here is a note, not a failed cell
            compare_errors[other] = f"{type(exc).__name__}: {str(exc)[:500]}"
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            continue
        other_us = statistics.median(other_samples)
        metrics[f"{other}.kernel_us"] = other_us
        metrics[f"{other}.pct_roofline"] = 100.0 * roofline_us / other_us
        metrics[f"{other}.rel_error"] = other_err
        metrics[f"speedup_vs_{other}"] = other_us / us
    info["compare_errors"] = compare_errors
    # How each peer was timed: a mode whose calls cannot be captured (a host sync inside) is timed
    # by eager launches, host launch cost included, and its speedup means less for it.
    info["compare_graph"] = compare_graph
    if "vendor" in compare_list(cell) and "vendor" not in compare_errors:
        from harness.kernels.verify.vendor_verify import key_ranges, pick_backend
        info["vendor_backend"] = pick_backend(device)
        info["vendor_ranges"] = key_ranges(pt.context)     # the timed sets' prefixes are all pt.context
    if cell["ncu"]:
        timed = [mode] + [m for m in compare_list(cell) if m not in compare_errors]
        found, info["ncu_errors"] = ncu.counters_for(cell, timed, mode, device, progress)
        metrics.update(found)
    ran = {"custom_impl": impl}
    return {"metrics": metrics, "samples": {"kernel_us": samples}, "kernel": info,
            "kernels": {k: ran[k] for k in params.cell_kernels(cell)}}


def _custom_plan(pt: Point, inp: dict, impl: str, num_splits: int | None = None) -> dict:
    from harness.kernels.verify import custom_verify as cv
    k = inp["k"]
    table = inp.get("page_table")
    max_keys = table.shape[1] * pt.page_size if table is not None else k.shape[2]
    return cv.plan(inp["q"], pt.kv_heads, max_keys, table is not None, mla=pt.mla,
                   num_splits=num_splits, impl=impl)
