"""Load a local HF-format Qwen3 checkpoint (config.json + *.safetensors) into `Target`.

The worker may import only the standard library, torch and numpy, so the safetensors format
(8-byte little-endian header length, a JSON header of name -> dtype/shape/offsets, raw bytes) is
read here directly instead of through the `safetensors` package.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from harness.decode.model import Target, TargetConfig

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        dtype = _DTYPES[meta["dtype"]]
        t = torch.frombuffer(bytearray(body[a:b]), dtype=dtype) if b > a else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(meta["shape"])
    return out


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Minimal writer (used by tests and to export a synthetic model)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def config_from_hf(cfg: dict) -> TargetConfig:
    heads = cfg["num_attention_heads"]
    return TargetConfig(
        vocab_size=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
        heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        ffn=cfg["intermediate_size"], rope_theta=float(cfg.get("rope_theta", 1_000_000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))


# HF keeps q/k/v and gate/up as separate matrices; the model stacks them (see model.Attention).
_STACKED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight"),
            "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def _stack_hf(state: dict) -> dict:
    """HF names (without `model.`) -> ours: stack each layer's q/k/v and gate/up rows."""
    out = dict(state)
    for name in list(state):
        for ours, parts in _STACKED.items():
            if name.endswith(parts[0]):
                prefix = name[: -len(parts[0])]
                if all(prefix + p in state for p in parts):
                    out[prefix + ours] = torch.cat([out.pop(prefix + p) for p in parts], dim=0)
    return out


def _split_ours(model: Target, state: dict) -> dict:
    """Ours -> HF names: split the stacked matrices back (inverse of _stack_hf)."""
    c = model.cfg
    sizes = {"self_attn.qkv_proj.weight": [c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                           c.kv_heads * c.head_dim],
             "mlp.gate_up_proj.weight": [c.ffn, c.ffn]}
    out = {}
    for name, t in state.items():
        suffix = next((s for s in _STACKED if name.endswith(s)), None)
        if suffix is None:
            out[name] = t
            continue
        prefix = name[: -len(suffix)]
        for part, chunk in zip(_STACKED[suffix], t.split(sizes[suffix], dim=0)):
            out[prefix + part] = chunk.contiguous()
    return out


def load_target(checkpoint: str | Path, dtype: torch.dtype, device: torch.device) -> Target:
    """Build a Target from an HF Qwen3 checkpoint directory. HF parameter names map onto ours
    once the leading `model.` is dropped and q/k/v, gate/up are stacked."""
    root = Path(checkpoint)
    cfg = config_from_hf(json.loads((root / "config.json").read_text()))
    with torch.device(device):
        model = Target(cfg).to(dtype)
    state = {}
    for f in sorted(root.glob("*.safetensors")):
        for name, t in read_safetensors(f).items():
            state[name.removeprefix("model.")] = t
    state = _stack_hf(state)
    if cfg.tie_embeddings:
        state.setdefault("lm_head.weight", state["embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {root} does not match a Qwen3 model: "
                         f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return model


def save_target(model: Target, root: str | Path) -> None:
    """Write `model` as an HF-format checkpoint directory (config.json + model.safetensors)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    c = model.cfg
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": c.vocab_size, "hidden_size": c.hidden, "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
        "intermediate_size": c.ffn, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
        "tie_word_embeddings": c.tie_embeddings}, indent=2))
    state = {("model." + k if not k.startswith("lm_head") else k): v
             for k, v in _split_ours(model, model.state_dict()).items()}
    write_safetensors(root / "model.safetensors", state)
