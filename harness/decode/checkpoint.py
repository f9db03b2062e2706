"""Load a local HF-format Qwen3 checkpoint (config.json + *.safetensors) into `Target`.

The worker may import only the standard library, torch and numpy, so the safetensors format
(8-byte little-endian header length, a JSON header of name -> dtype/shape/offsets, raw bytes) is
read here directly instead of through the `safetensors` package.

A checkpoint is loaded only if `Target` computes exactly what transformers' Qwen3ForCausalLM
would compute from the same files. Anything else is refused with one line (a `CheckpointError`)
naming the file and the field or tensor at fault. config.json keys fall into four groups:

  model shape    (required)  model_type ("qwen3"), vocab_size, hidden_size, num_hidden_layers,
                             num_attention_heads, num_key_value_heads, head_dim, intermediate_size
  checked values (optional)  architectures (["Qwen3ForCausalLM"]), hidden_act ("silu"),
                             attention_bias (false), use_sliding_window (false), layer_types (all
                             "full_attention"), rope_theta / rope_parameters / rope_scaling (plain
                             RoPE; theta required in one of them, equal wherever given),
                             rms_norm_eps (default 1e-6), tie_word_embeddings (default false)
  harmless       (ignored)   `_HARMLESS` below: bookkeeping, token ids, training-only knobs, and
                             sliding-window details that are inert while it is off
  anything else  (refused)   an unknown key may change the model (quantization_config, a new
                             rope variant, ...), so it is refused rather than silently ignored

The model's sizes and rope_theta are required even though transformers has defaults for them:
its defaults describe Qwen3-8B (and theta 10000, where `TargetConfig` says 1e6), so a config
that leaves one out is refused instead of guessed.

Tensors are memory-mapped and copied straight into the model's parameters (the q/k/v and
gate/up slices of its stacked matrices), so a file is never read into memory whole.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.decode.model import Target, TargetConfig
from harness.protocol.errors import CellRefused


class CheckpointError(CellRefused):
    """A checkpoint this loader refuses; the message is one line naming the file at fault."""


# --- config.json --------------------------------------------------------------------------------

# config key -> TargetConfig field. Required: positive integers.
_SIZES = {"vocab_size": "vocab_size", "hidden_size": "hidden", "num_hidden_layers": "layers",
          "num_attention_heads": "heads", "num_key_value_heads": "kv_heads",
          "head_dim": "head_dim", "intermediate_size": "ffn"}

# Keys that select a variant of the math: the values this model implements (the first one is
# also transformers' default when the key is absent; "swish" is transformers' name for SiLU too).
_FIXED = {"hidden_act": ("silu", "swish"),
          "attention_bias": (False,),
          "use_sliding_window": (False,)}

# Keys whose value cannot change the logits of this model.
_HARMLESS = frozenset({
    # written by transformers and tools, describe the files rather than the model
    "_name_or_path", "_commit_hash", "transformers_version", "torch_dtype", "dtype",
    # token ids and tokenizer hints (generation and the tokenizer read them, not the model)
    "bos_token_id", "eos_token_id", "pad_token_id", "tokenizer_class",
    # training-only or cache-only knobs; plain RoPE does not depend on the context limit
    "initializer_range", "use_cache", "attention_dropout", "max_position_embeddings",
    # transformers sets sliding_window to None when use_sliding_window is false (checked)
    "sliding_window", "max_window_layers",
    # output switches of transformers' forward
    "output_attentions", "output_hidden_states", "return_dict",
})
_ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling")
_CHECKED = frozenset({"model_type", "architectures", "layer_types", "rms_norm_eps",
                      "tie_word_embeddings", *_SIZES, *_FIXED, *_ROPE_KEYS})

# A plain-RoPE dict (transformers 5's rope_parameters; rope_scaling's legacy "type" spelling).
_PLAIN_ROPE_KEYS = frozenset({"rope_type", "type", "rope_theta"})


def _show(value) -> str:
    """A config value as it is written in config.json (and on one line)."""
    return json.dumps(value)


def _positive_number(value) -> float | None:
    """`value` as a float if it is a finite positive JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:                  # an integer literal too large for a float
        return None
    return x if math.isfinite(x) and x > 0 else None


def _check_model_type(cfg: dict, source: str) -> None:
    if cfg.get("model_type") != "qwen3":
        found = _show(cfg["model_type"]) if "model_type" in cfg else "missing"
        raise CheckpointError(f"{source}: model_type is {found}: this loader reads Qwen3 "
                              f"checkpoints only (model_type \"qwen3\")")
    if "architectures" in cfg and cfg["architectures"] != ["Qwen3ForCausalLM"]:
        raise CheckpointError(f"{source}: architectures {_show(cfg['architectures'])} is not "
                              f"supported: this loader builds [\"Qwen3ForCausalLM\"]")


def _check_known_keys(cfg: dict, source: str) -> None:
    unknown = sorted(set(cfg) - _CHECKED - _HARMLESS)
    if unknown:
        raise CheckpointError(f"{source}: unknown key(s) {', '.join(map(_show, unknown))}: this "
                              f"loader refuses keys it does not know, as they may change the model")


def _sizes(cfg: dict, source: str) -> dict[str, int]:
    missing = [key for key in _SIZES if key not in cfg]
    if missing:
        raise CheckpointError(f"{source}: required key(s) missing: {', '.join(missing)}")
    for key in _SIZES:
        value = cfg[key]
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise CheckpointError(f"{source}: {key} {_show(value)} is not a positive integer")
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if heads % kv_heads:
        raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of "
                              f"num_key_value_heads {kv_heads}")
    if cfg["head_dim"] % 2:
        raise CheckpointError(f"{source}: head_dim {cfg['head_dim']} is odd: RoPE rotates "
                              f"the two halves of each head")
    return {field: cfg[key] for key, field in _SIZES.items()}


def _check_fixed(cfg: dict, source: str) -> None:
    for key, implemented in _FIXED.items():
        value = cfg.get(key, implemented[0])
        if value not in implemented:       # 0 counts as false, as it does in transformers
            raise CheckpointError(f"{source}: {key} {_show(value)} is not supported: this loader "
                                  f"implements {_show(implemented[0])}")
    layer_types = cfg.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        raise CheckpointError(f"{source}: layer_types {_show(layer_types)} is not supported: "
                              f"this loader implements full attention in every layer")
    if layer_types is not None and len(layer_types) != cfg["num_hidden_layers"]:
        raise CheckpointError(f"{source}: layer_types has {len(layer_types)} entries for "
                              f"num_hidden_layers {cfg['num_hidden_layers']}")


def _check_plain_rope(key: str, params, source: str) -> None:
    """rope_parameters / rope_scaling must say unscaled RoPE: type "default", at most a theta."""
    plain = (isinstance(params, dict) and set(params) <= _PLAIN_ROPE_KEYS
             and params.get("rope_type", params.get("type", "default")) == "default")
    if not plain:
        raise CheckpointError(f"{source}: {key} {_show(params)} is not supported: this loader "
                              f"implements plain RoPE")


def _rope_theta(cfg: dict, source: str) -> float:
    """theta from the top level (transformers 4) or from rope_parameters (transformers 5); where
    both are given they must agree, since the two versions would read different ones."""
    given = {}
    if "rope_theta" in cfg:
        given["rope_theta"] = cfg["rope_theta"]
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None:
            _check_plain_rope(key, cfg[key], source)
            if "rope_theta" in cfg[key]:
                given[f"{key}.rope_theta"] = cfg[key]["rope_theta"]
    if not given:
        raise CheckpointError(f"{source}: rope_theta is missing (neither at the top level nor "
                              f"in rope_parameters)")
    thetas = set()
    for where, theta in given.items():
        if _positive_number(theta) is None:
            raise CheckpointError(f"{source}: {where} {_show(theta)} is not a positive number")
        thetas.add(_positive_number(theta))
    if len(thetas) > 1:
        shown = ", ".join(f"{where} {_show(theta)}" for where, theta in given.items())
        raise CheckpointError(f"{source}: conflicting RoPE theta: {shown}")
    return thetas.pop()


def _rms_eps(cfg: dict, source: str) -> float:
    eps = cfg.get("rms_norm_eps", 1e-6)
    if _positive_number(eps) is None:
        raise CheckpointError(f"{source}: rms_norm_eps {_show(eps)} is not a positive number")
    return _positive_number(eps)


def _tie_embeddings(cfg: dict, source: str) -> bool:
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise CheckpointError(f"{source}: tie_word_embeddings {_show(tie)} is not true or false")
    return tie


def config_from_hf(cfg: dict, source: str = "config.json") -> TargetConfig:
    """The TargetConfig of an HF Qwen3 config.json (already parsed); `source` names the file in
    errors. Raises CheckpointError for anything the model does not implement."""
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{source}: not a JSON object")
    _check_model_type(cfg, source)
    _check_known_keys(cfg, source)
    sizes = _sizes(cfg, source)
    _check_fixed(cfg, source)
    return TargetConfig(**sizes, rope_theta=_rope_theta(cfg, source),
                        rms_eps=_rms_eps(cfg, source), tie_embeddings=_tie_embeddings(cfg, source))


def _read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not found (a checkpoint directory holds config.json and "
                              f"*.safetensors files)") from None
    except (OSError, ValueError) as exc:   # ValueError: not JSON, or not UTF-8
        raise CheckpointError(f"{path}: cannot be read as JSON: {exc}") from None


# --- safetensors --------------------------------------------------------------------------------

# Floating dtypes only: the model's parameters are floating point, and an fp8 or integer tensor
# in a checkpoint means quantized weights (with scales elsewhere), which this model does not run.
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64}
_NAMES = {v: k for k, v in _DTYPES.items()}
# The safetensors library's own bound: a header this large is a corrupt or hostile file.
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header, checked against the file: bytes [start, end)."""
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


class _NameTwice(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    """json object_pairs_hook: a name given twice in a header would silently keep the last."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _NameTwice(key)
        out[key] = value
    return out


def _parse_header(path: Path, f, size: int) -> tuple[dict, int]:
    """The raw header of open file `f` (`size` bytes) and where its data section starts."""
    if size < 8:
        raise CheckpointError(f"{path} is truncated: {size} bytes, shorter than the 8-byte "
                              f"header length")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(size - 8, _MAX_HEADER):
        raise CheckpointError(f"{path} is truncated: the header length says {n} bytes, the "
                              f"file has {size}")
    try:
        header = json.loads(f.read(n), object_pairs_hook=_unique_keys)
    except ValueError as exc:              # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path}: the header is not JSON: {exc}") from None
    except _NameTwice as exc:
        raise CheckpointError(f"{path}: the header names tensor {exc.args[0]!r} twice") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    return header, 8 + n


def _check_entry(path: Path, name: str, meta, data_start: int, size: int) -> TensorEntry:
    """A header entry as a TensorEntry, once its dtype, shape and byte range make sense."""
    if not (isinstance(meta, dict) and isinstance(meta.get("dtype"), str)
            and isinstance(meta.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                    for d in meta["shape"])
            and isinstance(meta.get("data_offsets"), list) and len(meta["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in meta["data_offsets"])):
        raise CheckpointError(f"{path}: tensor {name!r} has a malformed header entry (it needs "
                              f"a dtype, a shape of sizes and two data_offsets)")
    if meta["dtype"] not in _DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} is {meta['dtype']}: supported dtypes are "
                              f"{', '.join(_DTYPES)}")
    dtype, shape = _DTYPES[meta["dtype"]], tuple(meta["shape"])
    a, b = meta["data_offsets"]
    needed = math.prod(shape) * dtype.itemsize
    if not 0 <= a <= b or b - a != needed:
        raise CheckpointError(f"{path}: tensor {name!r} has data_offsets [{a}, {b}], but shape "
                              f"{list(shape)} in {meta['dtype']} takes {needed} bytes")
    if data_start + b > size:
        raise CheckpointError(f"{path} is truncated: tensor {name!r} needs bytes up to "
                              f"{data_start + b}, the file has {size}")
    return TensorEntry(dtype, shape, data_start + a, data_start + b)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The checked header of a safetensors file (no tensor data is read)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            header, data_start = _parse_header(path, f, size)
    except OSError as exc:                 # a directory named *.safetensors, no permission, ...
        raise CheckpointError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return {name: _check_entry(path, name, meta, data_start, size)
            for name, meta in header.items() if name != "__metadata__"}


def _map_tensors(path: Path, entries: dict[str, TensorEntry]) -> dict[str, torch.Tensor]:
    """CPU tensors over a private (copy-on-write) memory map of the file: pages are read when a
    tensor is used, and each tensor keeps the map alive for as long as it lives."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    out = {}
    for name, e in entries.items():
        count = math.prod(e.shape)
        flat = (torch.frombuffer(mapped, dtype=e.dtype, count=count, offset=e.start) if count
                else torch.empty(0, dtype=e.dtype, device="cpu"))   # frombuffer refuses count 0
        out[name] = flat.view(e.shape)
    return out


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file (memory-mapped CPU tensors)."""
    return _map_tensors(Path(path), read_header(path))


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


# --- HF names <-> the model's parameters ---------------------------------------------------------

# HF keeps q/k/v and gate/up as separate matrices; the model stacks them (see model.Attention).
_STACKED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                          "self_attn.v_proj.weight"),
            "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def _hf_views(model: Target) -> dict[str, torch.Tensor]:
    """The model's parameters under their HF Qwen3ForCausalLM names, as views: each stacked
    matrix split back into its rows (views of the parameter, so copying into one loads it).
    A tied lm_head is left out, as transformers leaves it out of the files it writes."""
    c = model.cfg
    rows = {"self_attn.qkv_proj.weight": [c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                          c.kv_heads * c.head_dim],
            "mlp.gate_up_proj.weight": [c.ffn, c.ffn]}
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            if not c.tie_embeddings:
                out[name] = t
            continue
        suffix = next((s for s in _STACKED if name.endswith(s)), None)
        if suffix is None:
            out["model." + name] = t
            continue
        prefix = "model." + name[: -len(suffix)]
        for part, chunk in zip(_STACKED[suffix], t.split(rows[suffix], dim=0)):
            out[prefix + part] = chunk
    return out


def _expected_shapes(cfg: TargetConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor a checkpoint of `cfg` holds (from a model on the meta
    device: no memory, and the same names `_hf_views` loads into)."""
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in _hf_views(Target(cfg)).items()}


# --- the checkpoint directory --------------------------------------------------------------------

def _index_tensors(root: Path) -> dict[str, tuple[Path, TensorEntry]]:
    """tensor name -> (file, entry) over every *.safetensors file (one file or shards)."""
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{root}: no *.safetensors files")
    index = {}
    for f in files:
        for name, entry in read_header(f).items():
            if name in index:
                raise CheckpointError(f"{f}: tensor {name!r} is also in {index[name][0]}")
            index[name] = (f, entry)
    return index


def _check_tensors(root: Path, index: dict, cfg: TargetConfig) -> None:
    """Every tensor the model needs is there with its shape, and nothing else is."""
    expected = _expected_shapes(cfg)
    for name, (f, entry) in index.items():
        # A tied head has the embedding's shape (its values are compared on loading).
        tied_head = name == "lm_head.weight" and cfg.tie_embeddings
        like = "model.embed_tokens.weight" if tied_head else name
        if like not in expected:
            raise CheckpointError(f"{f}: tensor {name!r} does not match a Qwen3ForCausalLM of "
                                  f"this config.json (the model has no such parameter)")
        if entry.shape != expected[like]:
            raise CheckpointError(f"{f}: tensor {name!r} has shape {list(entry.shape)}, "
                                  f"expected {list(expected[like])}")
    missing = [name for name in expected if name not in index]
    if missing:
        raise CheckpointError(f"{root}: the checkpoint does not match its config.json: "
                              f"{len(missing)} tensor(s) missing, e.g. {missing[0]!r}")


def _check_tied_head(index: dict, tensors: dict, root: Path) -> None:
    """With tie_word_embeddings the embedding is the output head (transformers ties them); a
    stored lm_head.weight is accepted only if it is the same matrix, never silently dropped."""
    if "lm_head.weight" not in tensors:
        return
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    if head.dtype != embed.dtype or not torch.equal(head, embed):
        raise CheckpointError(f"{index['lm_head.weight'][0]}: tensor 'lm_head.weight' differs "
                              f"from 'model.embed_tokens.weight', but {root / 'config.json'} "
                              f"sets tie_word_embeddings true (transformers would use the "
                              f"embedding as the output head)")


def load_target(checkpoint: str | Path, dtype: torch.dtype, device: torch.device) -> Target:
    """Build a Target from an HF Qwen3 checkpoint directory; CheckpointError (one line) for any
    config field the model does not implement and any file or tensor that does not fit it."""
    root = Path(checkpoint)
    config_path = root / "config.json"
    cfg = config_from_hf(_read_config(config_path), str(config_path))
    index = _index_tensors(root)
    _check_tensors(root, index, cfg)
    tensors = {}
    for f in sorted({f for f, _ in index.values()}):
        tensors.update(_map_tensors(f, {n: e for n, (g, e) in index.items() if g == f}))
    if cfg.tie_embeddings:
        _check_tied_head(index, tensors, root)
    with torch.device(device):
        model = Target(cfg).to(dtype)
    with torch.no_grad():
        for name, param in _hf_views(model).items():
            param.copy_(tensors[name])            # casts to the model's dtype and device
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
    write_safetensors(root / "model.safetensors", _hf_views(model))
