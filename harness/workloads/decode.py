"""The decode workload: build the target and drafter, run the decode loop, measure it.

Per repeat: a fresh KV cache is prefilled, `warmup_steps` steps run untimed, then `steps` steps
form the steady window (tokens/s = committed tokens / window wall time, with the device
synchronised at both ends). On a GPU, `profile_steps` further steps run under the CUDA-activity
profiler in the last repeat, outside the timed window so the profiler's overhead never touches
tokens/s, and give the idle fraction and per-phase GPU time.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch

from harness import measure
from harness.decode import presets
from harness.decode.drafter import Drafter, DrafterConfig
from harness.decode.loop import ARDecoder, SpecDecoder
from harness.decode.model import Target, TargetConfig, init_random_

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


def build_models(cell: dict, device: torch.device, dtype: torch.dtype) -> tuple[Target, Drafter]:
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
    device = resolve_device(cell)
    dtype = resolve_dtype(cell, device)
    torch.manual_seed(cell["seed"])
    progress(stage="build", device=str(device), dtype=str(dtype).removeprefix("torch."))
    target, drafter = build_models(cell, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    batch, ctx, B = cell["batch_size"], cell["context_length"], cell["block_size"]
    per_step = B if cell["speculation"] == "ddtree" else 1
    total_steps = cell["warmup_steps"] + cell["steps"] + cell["profile_steps"]
    max_len = ctx + (total_steps + 2) * per_step + cell["tree_budget"] + B + 8
    random_prefill = cell["acceptance"] == "synthetic"

    tps, accept_means, step_ms, phase_ms = [], [], [], defaultdict(list)
    trace_stats = {}
    for r in range(cell["repeats"]):
        progress(stage="prefill", repeat=r + 1, repeats=cell["repeats"])
        clock = PhaseClock()
        dec = _decoder(cell, target, drafter, batch, max_len, clock)
        seed = cell["seed"] * 1000 + r
        if random_prefill:
            dec.prefill_random([ctx] * batch, seed)
        else:
            gen = torch.Generator().manual_seed(seed)
            vocab = target.cfg.vocab_size - 1
            dec.prefill([torch.randint(0, vocab, (ctx,), generator=gen).tolist()
                         for _ in range(batch)])
        for _ in range(cell["warmup_steps"]):
            dec.step()
        progress(stage="measure", repeat=r + 1, repeats=cell["repeats"])

        clock.host_s.clear()
        sync()
        committed, times = 0, []
        t_start = time.perf_counter()
        for _ in range(cell["steps"]):
            t0 = time.perf_counter()
            with torch.profiler.record_function(measure.STEP_RANGE):
                committed += sum(dec.step())
            times.append(time.perf_counter() - t0)
        sync()
        window = time.perf_counter() - t_start

        tps.append(committed / window)
        accept_means.append(committed / (cell["steps"] * batch))
        step_ms.extend(t * 1e3 for t in times)
        for name in PHASES:
            if name in clock.host_s:
                phase_ms[name].append(clock.host_s[name] * 1e3 / cell["steps"])

        if r == cell["repeats"] - 1 and device.type == "cuda" and cell["profile_steps"] > 0:
            progress(stage="profile", steps=cell["profile_steps"])
            trace_stats = _profile(dec, cell["profile_steps"])
        del dec

    metrics = {
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_spread": measure.spread(tps),
        "accept_len_mean": statistics.mean(accept_means),
        "step_ms_p50": measure.percentile(step_ms, 50),
        "step_ms_p90": measure.percentile(step_ms, 90),
        # Absent, not zero, where it cannot be measured (no GPU, or profiling off).
        "idle_fraction": trace_stats.get("idle_fraction"),
    }
    for name, values in phase_ms.items():
        metrics[f"phase.{name}.host_ms"] = statistics.median(values)
    for name, p in trace_stats.get("phases", {}).items():
        metrics[f"phase.{name}.gpu_ms"] = p["gpu_ms"]
    samples = {"tokens_per_s": tps, "accept_len_mean": accept_means, "step_ms": step_ms}
    extra = {}
    if trace_stats:
        extra["profile"] = {k: v for k, v in trace_stats.items() if k != "phases"}
    return {"metrics": metrics, "samples": samples, **extra}


def _decoder(cell, target, drafter, batch, max_len, clock):
    if cell["speculation"] == "none":
        return ARDecoder(target, batch=batch, max_len=max_len, phase=clock)
    if cell["tree_build"] != "cpu" or cell["accept"] != "cpu" or cell["graph_capture"] != "none":
        raise NotImplementedError(
            "this build has the baseline loop only (tree_build cpu, accept cpu, graph_capture "
            "none); the fast modes are not implemented yet")
    return SpecDecoder(target, drafter, batch=batch, max_len=max_len,
                       tree_budget=cell["tree_budget"], verify_mode=cell["verify_mode"],
                       acceptance=cell["acceptance"], tau=cell["tau"], seed=cell["seed"],
                       phase=clock)


def _profile(dec, steps: int) -> dict:
    """Run `steps` steps under torch.profiler (CPU + CUDA activity) and analyse the trace.
    One profiler at a time: CUPTI allows a single subscriber per process."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            with torch.profiler.record_function(measure.STEP_RANGE):
                dec.step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return measure.analyze_trace(measure.load_trace(path))
