"""The decode workload: build the target and drafter, run the decode loop, measure it.

Per repeat: the decoder is reset to its new state with the repeat's seed and prefilled, it
decodes for `warmup_s` seconds at the cell's context (steps, a rewind to the prefill's state,
steps again: by default on a GPU, whose steps run slow just after a pause and slow down at its
power cap), `warmup_steps` steps run untimed, then `steps` steps form the steady window
(tokens/s = committed tokens / window wall time, with the device synchronised at both ends).
On a GPU, `profile_steps` further steps run under the CUDA-activity profiler in the last
repeat, outside the timed window so the profiler's overhead never touches tokens/s, and give
the idle fraction and per-phase GPU time; as many steps unprofiled just before and just after
them give what the profiler costs (`profiler_overhead_pct`).

A process keeps the last cell's models and decoder (a persistent worker measures the same cell
round after round): a round after the first allocates no KV cache and captures no CUDA graph.
A reset decoder computes exactly what a new one would (harness/decode/fast.py, `reset`), so
reuse changes what a round costs, not what it measures; the result says what was reused
(`reuse`) and where a round's time went (`timing`).

The kernels a cell picks (verify_mode and the implementation knobs) become one `Kernels` value
(harness/decode/kernel_choice.py) that the cell's decoder is built with: nothing process-wide
is set, so no cell's choice can reach the next one's decoder. Models are shared between cells;
they hold no kernel choice.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
import traceback
from collections import defaultdict

import torch

from harness.decode.drafter import Drafter, DrafterConfig
from harness.decode.fast import FastARDecoder, FastSpecDecoder
from harness.decode.kernel_choice import Kernels, blas_library
from harness.decode.loop import SpecDecoder
from harness.decode.model import Target, TargetConfig, init_random_
from harness.protocol import params, presets
from harness.protocol.workloads.decode import AUDIT_STEPS, repeat_steps, settle_seconds
from harness.worker import graphstate, idle, measure, syncaudit

PHASES = ("draft", "tree", "verify", "accept", "commit")


def resolve_device(cell: dict) -> torch.device:
    want = cell["device"]
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cell asks for device cuda but this host has no CUDA device")
    return torch.device(want)


def resolve_dtype(cell: dict, device: torch.device) -> torch.dtype:
    if cell["dtype"] == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cell["dtype"])


# What a process keeps between cells: the last models and the last cell's decoder, one of
# each (8B weights are 16 GB; a 32k KV cache several more). The decoder belongs to the models:
# whatever drops the models drops it first.
_MODELS: dict = {}
_DECODERS: dict = {}


def _model_key(cell: dict, device: torch.device, dtype: torch.dtype) -> tuple:
    return (cell["model"], cell["checkpoint"], cell["seed"], cell["block_size"], str(device), dtype)


def build_models(cell: dict, device: torch.device, dtype: torch.dtype) -> tuple[Target, Drafter]:
    """The target and drafter of a cell: the last pair when it matches (a persistent worker,
    or a batch that runs many cells in one process: python -m harness.worker --cells)."""
    key = _model_key(cell, device, dtype)
    if key not in _MODELS:
        release()                            # the old decoder and models before the new ones
        _MODELS[key] = _build_models(cell, device, dtype)
    return _MODELS[key]


def release() -> None:
    """Free what this process keeps for the next decode cell: the decoder, then the models."""
    _DECODERS.clear()
    _MODELS.clear()
    torch.cuda.empty_cache()                 # a no-op where CUDA was never initialised


def drop_decoder() -> None:
    """Free the kept decoder: its KV caches, static buffers and CUDA graphs (and their pool)."""
    _DECODERS.clear()
    torch.cuda.empty_cache()


def _decoder_key(cell: dict, device: torch.device, dtype: torch.dtype, kernels: Kernels) -> str:
    """The whole cell but `profile`: measurement knobs set max_len and max_steps, and any knob
    may be baked into a captured graph; whether this run profiles changes neither. The kernels
    the decoder was built with are part of it too (they follow from the cell, but a kept
    decoder must never step with kernels other than its own)."""
    kept = {k: v for k, v in cell.items() if k != "profile"}
    return json.dumps(kept, sort_keys=True) + f"|{device}|{dtype}|{kernels}"


def _build_models(cell: dict, device: torch.device, dtype: torch.dtype) -> tuple[Target, Drafter]:
    preset = presets.PRESETS[cell["model"]]
    with torch.device(device):
        if cell["checkpoint"]:
            from harness.decode.checkpoint import load_target
            target = load_target(cell["checkpoint"], dtype, device)
        else:
            target = Target(TargetConfig(**preset["target"])).to(dtype)
            init_random_(target, cell["seed"])
        d = preset["drafter"]
        ids = tuple(i for i in d["target_layer_ids"] if i < target.cfg.layers)
        drafter = Drafter(DrafterConfig(d["layers"], ids, cell["block_size"]), target.cfg).to(dtype)
        init_random_(drafter, cell["seed"] + 1)
    return target.eval(), drafter.eval()


class PhaseClock:
    """Host time per phase (always on) plus profiler ranges (cheap when no profiler runs)."""

    def __init__(self):
        self.host_s = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        with torch.profiler.record_function(measure.PHASE_PREFIX + name):
            yield
        self.host_s[name] += time.perf_counter() - t0


def run(cell: dict, progress) -> dict:
    try:
        return _run(cell, progress)
    except BaseException as exc:
        # A failed cell (out of memory at 65k, a kernel error) must not keep its decoder for
        # the next cell of this process. The traceback's frames still reference it, so their
        # locals go too (the worker formats the traceback from code and line numbers only).
        traceback.clear_frames(exc.__traceback__)
        drop_decoder()
        raise


def _run(cell: dict, progress) -> dict:
    device = resolve_device(cell)
    dtype = resolve_dtype(cell, device)
    kernels = Kernels.from_cell(cell, device)   # handed to the decoder, which passes it down
    with blas_library(kernels.blas):
        return _measure(cell, progress, device, dtype, kernels)


def _measure(cell: dict, progress, device: torch.device, dtype: torch.dtype,
             kernels: Kernels) -> dict:
    graphstate.settle(device)                   # every cell times in the same graph state
    torch.manual_seed(cell["seed"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # Seconds of this run by part, summed over the repeats: window_s is the timed windows,
    # the others are what a round costs beyond its measurement.
    timing = dict.fromkeys(("build_s", "setup_s", "warmup_s", "window_s", "profile_s"), 0.0)
    progress(stage="build", device=str(device), dtype=str(dtype).removeprefix("torch."))
    t0 = time.perf_counter()
    model_kept = _model_key(cell, device, dtype) in _MODELS
    target, drafter = build_models(cell, device, dtype)
    if not model_kept:
        sync()
        timing["build_s"] = time.perf_counter() - t0

    batch, ctx, B = cell["batch_size"], cell["context_length"], cell["block_size"]
    per_step = B if cell["speculation"] == "ddtree" else 1
    max_len = ctx + (repeat_steps(cell) + 2) * per_step + cell["tree_budget"] + B + 8
    random_prefill = cell["acceptance"] == "synthetic"

    lengths = prefix_lengths(ctx, batch)
    settle_s, settle_steps = settle_seconds(cell, device.type == "cuda"), []
    tps, accept_means, step_ms, step_p50, phase_ms = [], [], [], [], defaultdict(list)
    gpu_step_ms, drifts = [], []     # each timed step on the GPU's clock; each window's drift
    trace_stats, plain, event_ms, audit, decoder_kept = {}, [], [], None, False
    key = _decoder_key(cell, device, dtype, kernels)
    for r in range(cell["repeats"]):
        progress(stage="prefill", repeat=r + 1, repeats=cell["repeats"])
        t0 = time.perf_counter()
        clock = PhaseClock()
        seed = cell["seed"] * 1000 + r     # each repeat its own prompt and acceptance draws
        dec = _DECODERS.get(key)
        if r == 0:
            decoder_kept = dec is not None
        if dec is not None:
            dec.reset(seed, phase=clock)   # as new with this repeat's seed: same measurement
        else:
            drop_decoder()                 # first: two 32k KV caches may not fit side by side
            dec = _DECODERS[key] = _decoder(cell, kernels, target, drafter, batch, max_len, clock,
                                            seed)
        if random_prefill:
            dec.prefill_random(lengths, seed)
        else:
            gen = torch.Generator().manual_seed(seed)
            vocab = target.cfg.vocab_size - 1
            dec.prefill([torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths])
        sync()
        timing["setup_s"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        if settle_s > 0:
            progress(stage="settle", seconds=settle_s, repeat=r + 1, repeats=cell["repeats"])
        # The cache holds a window's steps past the prompt: settle in runs of that many.
        settle_steps.append(settle(dec, settle_s, cell["warmup_steps"] + cell["steps"]))
        for _ in range(cell["warmup_steps"]):
            dec.step()
        drain(dec)  # what the fast loops still owe from warm-up is read outside the window
        sync()
        timing["warmup_s"] += time.perf_counter() - t0
        progress(stage="measure", repeat=r + 1, repeats=cell["repeats"])

        clock.host_s.clear()
        events = idle.EventStepClock(cell["steps"], enabled=device.type == "cuda")
        sync()
        committed, times = 0, []
        t_start = time.perf_counter()
        for _ in range(cell["steps"]):
            events.mark()
            t0 = time.perf_counter()
            with torch.profiler.record_function(measure.STEP_RANGE):
                committed += sum(dec.step())
            times.append(time.perf_counter() - t0)
        events.mark()
        committed += sum(drain(dec))
        sync()
        window = time.perf_counter() - t_start
        timing["window_s"] += window
        event_ms.append(events.window_ms())
        if (gpu_steps := events.step_ms()) is not None:
            gpu_step_ms.extend(gpu_steps)
            drifts.append(measure.drift_pct(gpu_steps))

        tps.append(committed / window)
        accept_means.append(committed / (cell["steps"] * batch))
        step_ms.extend(t * 1e3 for t in times)
        step_p50.append(measure.percentile([t * 1e3 for t in times], 50))
        for name in PHASES:
            if name in clock.host_s:
                phase_ms[name].append(clock.host_s[name] * 1e3 / cell["steps"])

        if r == cell["repeats"] - 1 and device.type == "cuda" and cell["profile"]:
            # After the timed windows, never inside them: the profiler and the audit slow
            # the host, and CUPTI takes one subscriber at a time.
            t0 = time.perf_counter()
            if cell["profile_steps"] > 0:
                progress(stage="profile", steps=cell["profile_steps"])
                # Warm-up steps inside the profiler until the host is as far ahead of the GPU
                # as it runs in steady state (the fast loops read IN_FLIGHT steps behind):
                # a window that starts with the queue empty counts its filling as host time.
                # The same window unprofiled just before and just after: the profiler's cost
                # against them, not against the timed windows (steps slow down over a repeat).
                warm = getattr(dec, "in_flight", 0) + 1       # <= PROFILE_WARMUP
                plain = [idle.plain_window(dec.step, cell["profile_steps"], warmup=warm)]
                trace_stats = idle.profile_window(dec.step, cell["profile_steps"], warmup=warm)
                plain.append(idle.plain_window(dec.step, cell["profile_steps"], warmup=warm))
                trace_stats["plain_step_ms"] = plain      # kept in the result's profile
            progress(stage="sync audit", steps=AUDIT_STEPS)
            audit = syncaudit.audit_window(dec.step, AUDIT_STEPS, device)
            timing["profile_s"] = time.perf_counter() - t0

    checked = {}
    if cell["check_tokens"]:
        progress(stage="lossless check", tokens=cell["check_tokens"])
        checked = _lossless_check(cell, kernels, target, drafter, lengths, device, dtype)

    metrics = {
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_spread": measure.spread(tps),
        "accept_len_mean": statistics.mean(accept_means),
        "step_ms_p50": measure.percentile(step_ms, 50),
        "step_ms_p90": measure.percentile(step_ms, 90),
    }
    metrics.update(checked)
    for name, values in phase_ms.items():
        metrics[f"phase.{name}.host_ms"] = statistics.median(values)
    # idle_fraction (profiled window), idle_fraction_est (every repeat, from CUDA events),
    # per-phase GPU and idle time, syncs per step: absent, never zero, where not measured.
    meter, meter_samples, extra = idle.meter_outputs(trace_stats, event_ms, cell["steps"], audit)
    metrics.update(meter)
    metrics.update(idle.profiler_overhead(trace_stats, plain))
    # step_ms: every timed step of every repeat; step_ms_p50: one p50 per repeat, the
    # per-repeat samples of metrics["step_ms_p50"] (which is the p50 over all steps).
    samples = {"tokens_per_s": tps, "accept_len_mean": accept_means, "step_ms": step_ms,
               "step_ms_p50": step_p50, **meter_samples}
    # On a GPU: each step's time between CUDA events at its boundaries, and whether a window
    # was steady (window_drift_pct: its second half's median step against its first's).
    if gpu_step_ms:
        samples["gpu_step_ms"] = gpu_step_ms
    if drifts and None not in drifts:
        samples["window_drift_pct"] = drifts
        metrics["window_drift_pct"] = statistics.median(drifts)
    if device.type == "cuda":
        metrics.update(roofline(cell, target, drafter, lengths, metrics))
        extra["ceilings"] = copy_ways()
    if kernels.blas == "cublaslt_tuned":
        # each GEMM shape's algorithm and its time against F.linear's (every shape this process
        # has planned so far: a plan is kept for the process's later cells)
        from harness.kernels.linear import lt_linear
        extra["blas_plans"] = lt_linear.plans()
    # reuse.decoder: this run built no decoder (its first repeat reset the kept one; later
    # repeats always reset).
    # What ran, `auto` resolved: the gate compares a cell only with a baseline that ran these.
    ran = {"fused_ops": kernels.fused_ops, "topk_impl": kernels.topk,
           "tree_build_impl": kernels.tree_build, "custom_impl": kernels.custom_impl,
           "linear_impl": kernels.linear, "accept_impl": kernels.accept,
           "blas_impl": kernels.blas}
    return {"metrics": metrics, "samples": samples, **extra,
            "settle": {"seconds": settle_s, "steps": settle_steps},
            "kernels": {k: ran[k] for k in params.cell_kernels(cell)},
            "reuse": {"model": model_kept, "decoder": decoder_kept}, "timing": timing}


def copy_ways() -> dict:
    """The copy ceiling's two ways apart (TB/s, harness.worker.ceilings.copy_rates): the
    roofline takes the faster, the result keeps both, so a process whose memcpy runs slow says
    so."""
    from harness.worker import ceilings
    return {"copy_tbps": {way: rate / 1e12 for way, rate in ceilings.copy_rates().items()}}


def prefix_lengths(ctx: int, batch: int) -> list[int]:
    """Committed tokens per sequence: the first has `context_length`, the others are spaced
    evenly down towards half of it, so a batch exercises different prefix lengths."""
    return [ctx - i * (ctx // (2 * batch)) for i in range(batch)]


def settle(dec, seconds: float, run: int, clock=time.perf_counter) -> int:
    """Decode for at least `seconds` without growing the context: `run` steps, a rewind to
    the state the prefill left, again, until the time has passed. Returns the steps taken.
    A rewind waits only for the steps in flight, so the GPU never pauses for longer than the
    host takes to queue the next step: the window that follows starts on a GPU that has
    been decoding, not one that has just woken from the prefill."""
    if seconds <= 0:
        return 0

    def one_run():
        for _ in range(run):
            dec.step()
        dec.rewind()

    one_run()       # its first step may capture the cell's CUDA graph (a second): not decoding
    taken, start = run, clock()
    while clock() - start < seconds:
        one_run()
        taken += run
    return taken


def drain(dec) -> list[int]:
    """Tokens the decoder has committed but not yet reported (the fast loops report one step
    behind); nothing for the baseline loop, which reports each step as it ends."""
    return dec.finish() if hasattr(dec, "finish") else [0]


def _lossless_check(cell, kernels, target, drafter, lengths, device, dtype) -> dict:
    """harness/worker/lossless.py on a decoder like the timed one but accepting greedily, from
    prompts of the cell's lengths drawn for the check alone; the decoder goes afterwards."""
    from harness.worker import lossless
    n, B = cell["check_tokens"], cell["block_size"]
    max_len = max(lengths) + (n + 2) * B + cell["tree_budget"] + B + 8
    greedy = {**cell, "acceptance": "greedy", "warmup_steps": 0, "steps": n, "profile_steps": 0}
    gen = torch.Generator().manual_seed(cell["seed"] * 1000 + 997)
    vocab = target.cfg.vocab_size - 1
    prompts = [torch.randint(0, vocab, (m,), generator=gen).tolist() for m in lengths]
    dec = _decoder(greedy, kernels, target, drafter, len(lengths), max_len, PhaseClock(),
                   cell["seed"])
    try:
        return lossless.check(dec, target, prompts, n, dtype)
    finally:
        del dec
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _decoder(cell, kernels, target, drafter, batch, max_len, clock, seed):
    if cell["speculation"] == "none":
        return FastARDecoder(target, batch=batch, max_len=max_len, kernels=kernels,
                             graph_capture=cell["graph_capture"], phase=clock)
    common = dict(batch=batch, max_len=max_len, tree_budget=cell["tree_budget"],
                  kernels=kernels, acceptance=cell["acceptance"],
                  tau=cell["tau"], seed=seed, phase=clock)
    if (cell["tree_build"], cell["accept"], cell["graph_capture"]) == ("cpu", "cpu", "none"):
        # The baseline: the plain host-orchestrated loop the fast modes are measured against.
        return SpecDecoder(target, drafter, **common)
    return FastSpecDecoder(target, drafter, tree_build=cell["tree_build"], accept=cell["accept"],
                           graph_capture=cell["graph_capture"], max_steps=repeat_steps(cell) + 8,
                           **common)


def roofline(cell, target, drafter, lengths, metrics) -> dict:
    """How close tokens/s is to what the hardware allows: the bytes each step must read
    (weights and KV) over the copy bandwidth measured here, plus the step's matmul FLOPs over
    the measured bf16 rate. `bw_pct_roofline` = measured tokens/s / that bound."""
    from harness.worker import ceilings
    elt = next(target.parameters()).element_size()
    t, spec = target.cfg, cell["speculation"] != "none"
    weights = sum(p.numel() for n, p in target.named_parameters() if "embed" not in n)
    kv = 2 * t.layers * t.kv_heads * t.head_dim * sum(lengths)
    tokens = (1 + cell["tree_budget"]) if spec else 1            # target tokens per step
    flops = 2 * weights * tokens * len(lengths)
    flops += 4 * t.layers * t.heads * t.head_dim * tokens * sum(lengths)
    if spec:
        d = drafter
        d_weights = sum(p.numel() for p in d.parameters()) + target.lm_head.weight.numel()
        weights += d_weights
        kv += 2 * d.cfg.layers * t.kv_heads * t.head_dim * sum(lengths)
        flops += 2 * d_weights * cell["block_size"] * len(lengths)
    step_s = (weights + kv) * elt / ceilings.copy_bandwidth() + flops / ceilings.matmul_rate()
    per_step = (metrics["accept_len_mean"] if spec else 1.0) * len(lengths)
    bound = per_step / step_s
    return {"roofline_tokens_per_s": bound, "bw_pct_roofline": metrics["tokens_per_s"] / bound,
            "copy_bw_tbps": ceilings.copy_bandwidth() / 1e12,
            "matmul_tflops": ceilings.matmul_rate() / 1e12}
