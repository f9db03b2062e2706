"""Runner of the peer workload (harness/protocol/workloads/peer.py): transformers' own greedy
decoding of the cell's target, timed from outside `generate`.

The model is kept between cells of one process (8B random weights take seconds to make, and
transformers compiles the static-cache forward on the model it is given). Within a repeat the
longer `generate` runs first: transformers keeps its static cache on the model and reuses it
for a call that fits, so the shorter call decodes with the same cache shape and the compiled
forward is not made twice.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.protocol import presets
from harness.protocol.workloads.peer import SHORT
from harness.worker import graphstate, measure
from harness.worker.workloads.decode import resolve_device, resolve_dtype

_MODEL: dict = {}      # (model, checkpoint, seed, device, dtype) -> the transformers model


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError("the peer workload needs transformers on the worker host "
                           "(pip install transformers)") from e
    return transformers


def qwen3_config(transformers, preset: str, max_positions: int):
    """A preset's target shapes as transformers' Qwen3Config (untied embeddings, as ours)."""
    t = presets.PRESETS[preset]["target"]
    return transformers.Qwen3Config(
        vocab_size=t["vocab_size"], hidden_size=t["hidden"], intermediate_size=t["ffn"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
        num_key_value_heads=t["kv_heads"], head_dim=t["head_dim"], rms_norm_eps=t["rms_eps"],
        rope_theta=t["rope_theta"], max_position_embeddings=max_positions,
        tie_word_embeddings=False)


def _dtype_kwarg(transformers, dtype: torch.dtype) -> dict:
    """`dtype=` from transformers 4.56 on; `torch_dtype=` before (deprecated since)."""
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def build_model(cell: dict, device: torch.device, dtype: torch.dtype):
    transformers = _transformers()
    key = (cell["model"], cell["checkpoint"], cell["seed"], str(device), str(dtype))
    if key not in _MODEL:
        _MODEL.clear()                   # one model at a time: two 8B models may not fit
        if cell["checkpoint"]:
            model = transformers.Qwen3ForCausalLM.from_pretrained(
                cell["checkpoint"], local_files_only=True,
                **_dtype_kwarg(transformers, dtype)).to(device)
        else:
            config = qwen3_config(transformers, cell["model"], presets.max_context(cell["model"]))
            torch.manual_seed(cell["seed"])
            with torch.device(device):
                model = transformers.Qwen3ForCausalLM._from_config(
                    config, **_dtype_kwarg(transformers, dtype))
        _MODEL[key] = model.eval()
    return _MODEL[key]


@torch.no_grad()
def run(cell: dict, progress) -> dict:
    transformers = _transformers()
    device = resolve_device(cell)
    dtype = resolve_dtype(cell, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    graphstate.settle(device)        # the state our own cells time in: a fair comparison
    progress(stage="build", device=str(device), dtype=str(dtype).removeprefix("torch."))
    model = build_model(cell, device, dtype)
    b, ctx, steps = cell["batch_size"], cell["context_length"], cell["steps"]
    gen = torch.Generator().manual_seed(cell["seed"])
    prompt = torch.randint(0, model.config.vocab_size, (b, ctx), generator=gen).to(device)
    mask = torch.ones_like(prompt)
    cache = None if cell["peer_cache"] == "dynamic" else cell["peer_cache"]

    def generate(new_tokens: int) -> float:
        config = transformers.GenerationConfig(
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            cache_implementation=cache, pad_token_id=0, eos_token_id=None)
        sync()
        t0 = time.perf_counter()
        out = model.generate(prompt, attention_mask=mask, generation_config=config)
        sync()
        if out.shape[1] != ctx + new_tokens:
            raise RuntimeError(f"generate returned {out.shape[1] - ctx} new tokens, not {new_tokens}")
        return time.perf_counter() - t0

    progress(stage="warmup", steps=SHORT + steps)
    t0 = time.perf_counter()
    for _ in range(max(1, cell["warmup_steps"])):
        generate(SHORT + steps)          # the longer call first: it makes the cache and compiles
        generate(SHORT)
    warmup_s = time.perf_counter() - t0
    tps, step_ms = [], []
    for r in range(cell["repeats"]):
        progress(stage="measure", repeat=r + 1, repeats=cell["repeats"])
        long, short = generate(SHORT + steps), generate(SHORT)
        if long <= short:    # noise larger than the decoding itself: no number, not a wrong one
            raise RuntimeError(f"generate of {SHORT + steps} new tokens took {long * 1e3:.1f} ms, "
                               f"of {SHORT} {short * 1e3:.1f} ms: decoding {steps} tokens is "
                               f"below this host's noise (raise steps)")
        tps.append(b * steps / (long - short))
        step_ms.append((long - short) * 1e3 / steps)
    metrics = {"tokens_per_s": statistics.median(tps), "tokens_per_s_spread": measure.spread(tps),
               "step_ms_p50": measure.percentile(step_ms, 50)}
    return {"metrics": metrics, "samples": {"tokens_per_s": tps, "step_ms_p50": step_ms},
            # compiled: whether generate compiled the forward (it does so itself for a static
            # cache on a GPU, never for the dynamic one), read off the model rather than
            # assumed; the model is kept between cells, so only a static cell's counts
            "peer": {"library": "transformers", "version": transformers.__version__,
                     "cache": cell["peer_cache"],
                     "compiled": cache is not None and hasattr(model, "_compiled_call")},
            "timing": {"warmup_s": warmup_s}}
