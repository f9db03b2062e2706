"""The decode workload: build the target and drafter, run the decode loop, measure it.

Per repeat: a fresh KV cache is prefilled, `warmup_steps` steps run untimed, then `steps` steps
form the steady window (tokens/s = committed tokens / window wall time, with the device
synchronised at both ends). On a GPU, `profile_steps` further steps run under the CUDA-activity
profiler in the last repeat, outside the timed window so the profiler's overhead never touches
tokens/s, and give the idle fraction and per-phase GPU time.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import defaultdict

import torch

from harness import idle, measure, params, syncaudit
from harness.decode import presets
from harness.decode.drafter import Drafter, DrafterConfig
from harness.decode.fast import FastARDecoder, FastSpecDecoder
from harness.decode.loop import SpecDecoder
from harness.decode.model import Target, TargetConfig, init_random_

PHASES = ("draft", "tree", "verify", "accept", "commit")
AUDIT_STEPS = 3   # steps under the sync audit (GPU only; its own untimed, unprofiled window)


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


_MODELS: dict = {}


def build_models(cell: dict, device: torch.device, dtype: torch.dtype) -> tuple[Target, Drafter]:
    """The target and drafter of a cell. A worker runs one cell, but a script that runs many
    cells in one process (ci/gpu/decode_modes.py) reuses the last pair when it matches."""
    key = (cell["model"], cell["checkpoint"], cell["seed"], cell["block_size"], str(device), dtype)
    if key not in _MODELS:
        _MODELS.clear()                      # one model at a time: 8B weights are 16 GB
        _MODELS[key] = _build_models(cell, device, dtype)
    return _MODELS[key]


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


def use_kernels(cell: dict, device: torch.device) -> None:
    """Point the decode code at the kernels the cell's implementation knobs pick. Set on every
    cell (the defaults too): callers may run several cells in one process."""
    from harness.decode import model, tree_gpu
    picked = {k: cell[k] for k, v in params.IMPL_DEFAULTS.items() if cell[k] != v}
    if picked and device.type != "cuda":
        raise ValueError(f"{picked} pick CUDA kernels; this cell runs on {device}")
    model.FUSED_OPS = "auto" if cell["fused_ops"] else "off"
    tree_gpu.TOPK_IMPL = cell["topk_impl"]
    tree_gpu.TREE_BUILD_IMPL = cell["tree_build_impl"]


def run(cell: dict, progress) -> dict:
    device = resolve_device(cell)
    dtype = resolve_dtype(cell, device)
    use_kernels(cell, device)
    torch.manual_seed(cell["seed"])
    progress(stage="build", device=str(device), dtype=str(dtype).removeprefix("torch."))
    target, drafter = build_models(cell, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    batch, ctx, B = cell["batch_size"], cell["context_length"], cell["block_size"]
    per_step = B if cell["speculation"] == "ddtree" else 1
    total_steps = cell["warmup_steps"] + cell["steps"] + cell["profile_steps"] + 1 + AUDIT_STEPS
    max_len = ctx + (total_steps + 2) * per_step + cell["tree_budget"] + B + 8
    random_prefill = cell["acceptance"] == "synthetic"

    lengths = prefix_lengths(ctx, batch)
    tps, accept_means, step_ms, phase_ms = [], [], [], defaultdict(list)
    trace_stats, event_ms, audit = {}, [], None
    for r in range(cell["repeats"]):
        progress(stage="prefill", repeat=r + 1, repeats=cell["repeats"])
        clock = PhaseClock()
        seed = cell["seed"] * 1000 + r     # each repeat its own prompt and acceptance draws
        dec = _decoder(cell, target, drafter, batch, max_len, clock, seed)
        if random_prefill:
            dec.prefill_random(lengths, seed)
        else:
            gen = torch.Generator().manual_seed(seed)
            vocab = target.cfg.vocab_size - 1
            dec.prefill([torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths])
        for _ in range(cell["warmup_steps"]):
            dec.step()
        drain(dec)  # what the fast loops still owe from warm-up is read outside the window
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
        event_ms.append(events.window_ms())

        tps.append(committed / window)
        accept_means.append(committed / (cell["steps"] * batch))
        step_ms.extend(t * 1e3 for t in times)
        for name in PHASES:
            if name in clock.host_s:
                phase_ms[name].append(clock.host_s[name] * 1e3 / cell["steps"])

        if r == cell["repeats"] - 1 and device.type == "cuda":
            # After the timed windows, never inside them: the profiler and the audit slow
            # the host, and CUPTI takes one subscriber at a time.
            if cell["profile_steps"] > 0:
                progress(stage="profile", steps=cell["profile_steps"])
                trace_stats = idle.profile_window(dec.step, cell["profile_steps"])
            progress(stage="sync audit", steps=AUDIT_STEPS)
            audit = syncaudit.audit_window(dec.step, AUDIT_STEPS, device)
        del dec
        if device.type == "cuda":
            torch.cuda.empty_cache()

    metrics = {
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_spread": measure.spread(tps),
        "accept_len_mean": statistics.mean(accept_means),
        "step_ms_p50": measure.percentile(step_ms, 50),
        "step_ms_p90": measure.percentile(step_ms, 90),
    }
    for name, values in phase_ms.items():
        metrics[f"phase.{name}.host_ms"] = statistics.median(values)
    # idle_fraction (profiled window), idle_fraction_est (every repeat, from CUDA events),
    # per-phase GPU and idle time, syncs per step: absent, never zero, where not measured.
    meter, meter_samples, extra = idle.meter_outputs(trace_stats, event_ms, cell["steps"], audit)
    metrics.update(meter)
    samples = {"tokens_per_s": tps, "accept_len_mean": accept_means, "step_ms": step_ms,
               **meter_samples}
    if device.type == "cuda":
        metrics.update(roofline(cell, target, drafter, lengths, metrics))
    return {"metrics": metrics, "samples": samples, **extra}


def prefix_lengths(ctx: int, batch: int) -> list[int]:
    """Committed tokens per sequence: the first has `context_length`, the others are spaced
    evenly down towards half of it, so a batch exercises different prefix lengths."""
    return [ctx - i * (ctx // (2 * batch)) for i in range(batch)]


def drain(dec) -> list[int]:
    """Tokens the decoder has committed but not yet reported (the fast loops report one step
    behind); nothing for the baseline loop, which reports each step as it ends."""
    return dec.finish() if hasattr(dec, "finish") else [0]


def _decoder(cell, target, drafter, batch, max_len, clock, seed):
    if cell["speculation"] == "none":
        return FastARDecoder(target, batch=batch, max_len=max_len,
                             attention_mode=cell["verify_mode"],
                             graph_capture=cell["graph_capture"], phase=clock)
    common = dict(batch=batch, max_len=max_len, tree_budget=cell["tree_budget"],
                  verify_mode=cell["verify_mode"], acceptance=cell["acceptance"],
                  tau=cell["tau"], seed=seed, phase=clock)
    if (cell["tree_build"], cell["accept"], cell["graph_capture"]) == ("cpu", "cpu", "none"):
        # The baseline: the plain host-orchestrated loop the fast modes are measured against.
        return SpecDecoder(target, drafter, **common)
    steps = cell["warmup_steps"] + cell["steps"] + cell["profile_steps"] + AUDIT_STEPS + 8
    return FastSpecDecoder(target, drafter, tree_build=cell["tree_build"], accept=cell["accept"],
                           graph_capture=cell["graph_capture"], max_steps=steps, **common)


def roofline(cell, target, drafter, lengths, metrics) -> dict:
    """How close tokens/s is to what the hardware allows: the bytes each step must read
    (weights and KV) over the copy bandwidth measured here, plus the step's matmul FLOPs over
    the measured bf16 rate. `bw_pct_roofline` = measured tokens/s / that bound."""
    from harness import ceilings
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
