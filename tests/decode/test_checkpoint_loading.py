"""Odd and hostile checkpoints: every config field the model does not implement and every file
problem is one CheckpointError line naming the file and the field or tensor; a good checkpoint
(harmless extra keys, transformers 5's rope_parameters, shards) loads to the same logits."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from harness.decode import attention
from harness.decode.checkpoint import (CheckpointError, config_from_hf, load_target,
                                       read_safetensors, save_target, write_safetensors)
from harness.decode.model import Target, TargetConfig, init_random_

SMALL = dict(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=48,
             rope_theta=10000.0)
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
CPU = torch.device("cpu")


def small_model(seed: int = 0, **overrides) -> Target:
    model = Target(TargetConfig(**{**SMALL, **overrides}))
    init_random_(model, seed)
    return model.eval()


@pytest.fixture
def ckpt(tmp_path):
    save_target(small_model(), tmp_path / "ckpt")
    return tmp_path / "ckpt"


def load(root):
    return load_target(root, torch.float32, CPU)


def edit_config(root, **changes):
    """Set (or, with value `...`, remove) config.json keys."""
    path = root / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            del cfg[key]
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))
    return path


def refused(root) -> str:
    with pytest.raises(CheckpointError) as caught:
        load(root)
    message = str(caught.value)
    assert "\n" not in message
    return message


def rewrite_header(path, edit):
    """Rewrite a safetensors file's header through `edit(header)`, keeping its data bytes."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n:])


def logits(model: Target, ids: list[int]) -> torch.Tensor:
    """Prefill logits [T, V] of one sequence."""
    T = len(ids)
    positions = torch.arange(T)[None]
    mask = attention.Mask(lengths=torch.zeros(1, dtype=torch.int64),
                          new_vis=torch.ones(T, T, dtype=torch.bool).tril()[None], kv_len=T)
    with torch.no_grad():
        out, _ = model(torch.tensor([ids]), positions, model.new_cache(1, T), positions, mask)
    return out[0]


# --- good checkpoints ----------------------------------------------------------------------------

def test_harmless_keys_are_accepted_and_the_round_trip_gives_identical_logits(ckpt):
    edit_config(ckpt, torch_dtype="bfloat16", transformers_version="4.51.0", bos_token_id=1,
                eos_token_id=[2, 3], pad_token_id=None, max_position_embeddings=40960,
                initializer_range=0.02, use_cache=True, attention_dropout=0.0,
                max_window_layers=28, sliding_window=None, use_sliding_window=False,
                hidden_act="silu", attention_bias=False, rope_scaling=None,
                layer_types=["full_attention"] * 2)
    ids = [5, 17, 3, 60, 9, 41, 0, 22]
    assert torch.equal(logits(load(ckpt), ids), logits(small_model(), ids))


def test_tied_embeddings_round_trip(tmp_path):
    model = small_model(tie_embeddings=True)
    save_target(model, tmp_path / "ckpt")
    assert "lm_head.weight" not in read_safetensors(tmp_path / "ckpt" / "model.safetensors")
    loaded = load(tmp_path / "ckpt")
    assert loaded.lm_head.weight is loaded.embed_tokens.weight
    assert torch.equal(logits(loaded, [1, 2, 3]), logits(model, [1, 2, 3]))


def test_sharded_checkpoint_loads(ckpt):
    state = read_safetensors(ckpt / "model.safetensors")
    names = sorted(state)
    (ckpt / "model.safetensors").unlink()
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        write_safetensors(ckpt / file, {n: state[n] for n in part})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}))
    assert torch.equal(logits(load(ckpt), [4, 5]), logits(small_model(), [4, 5]))


# --- config.json ---------------------------------------------------------------------------------

QWEN3_0_6B = {   # Qwen/Qwen3-0.6B's config.json as published (written by transformers 4.51)
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def test_published_configs_are_accepted():
    expected = TargetConfig(vocab_size=151936, hidden=1024, layers=28, heads=16, kv_heads=8,
                            head_dim=128, ffn=3072, rope_theta=1e6, rms_eps=1e-6,
                            tie_embeddings=True)
    assert config_from_hf(QWEN3_0_6B) == expected
    # The same model as transformers 5 writes it: theta inside rope_parameters, `dtype`.
    v5 = {k: v for k, v in QWEN3_0_6B.items() if k not in ("rope_theta", "rope_scaling",
                                                             "torch_dtype")}
    v5.update(dtype="bfloat16", transformers_version="5.0.0",
              rope_parameters={"rope_type": "default", "rope_theta": 1000000})
    assert config_from_hf(v5) == expected


def test_rope_parameters_theta_is_used_and_a_conflicting_top_level_theta_refused(ckpt):
    path = edit_config(ckpt, rope_theta=...,
                       rope_parameters={"rope_type": "default", "rope_theta": 12345.0})
    assert load(ckpt).cfg.rope_theta == 12345.0
    edit_config(ckpt, rope_theta=12345)                      # the same value: fine
    assert load(ckpt).cfg.rope_theta == 12345.0
    edit_config(ckpt, rope_theta=1000000.0)
    assert (f"{path}: conflicting RoPE theta: rope_theta 1000000.0, "
            f"rope_parameters.rope_theta 12345.0") in refused(ckpt)


def test_missing_rope_theta_is_refused(ckpt):
    path = edit_config(ckpt, rope_theta=...)
    assert f"{path}: rope_theta is missing" in refused(ckpt)


@pytest.mark.parametrize("key, value", [
    ("rope_scaling", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0, "factor": 2.0}),
])
def test_rope_scaling_is_refused(ckpt, key, value):
    path = edit_config(ckpt, **{key: value})
    expected = f"{path}: {key} {json.dumps(value)} is not supported: this loader implements"
    assert f"{expected} plain RoPE" in refused(ckpt)


def test_hidden_act_gelu_is_refused(ckpt):
    path = edit_config(ckpt, hidden_act="gelu")
    assert f'{path}: hidden_act "gelu" is not supported: this loader implements "silu"' \
        in refused(ckpt)


@pytest.mark.parametrize("changes, field", [
    (dict(use_sliding_window=True, sliding_window=16), "use_sliding_window true"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
])
def test_sliding_window_is_refused(ckpt, changes, field):
    path = edit_config(ckpt, **changes)
    assert f"{path}: {field}" in refused(ckpt)


def test_attention_bias_is_refused(ckpt):
    path = edit_config(ckpt, attention_bias=True)
    assert f"{path}: attention_bias true is not supported" in refused(ckpt)


@pytest.mark.parametrize("changes, expected", [
    (dict(model_type="llama"), 'model_type is "llama": this loader reads Qwen3 checkpoints only'),
    (dict(model_type=...), "model_type is missing"),
    (dict(architectures=["LlamaForCausalLM"]),
     'architectures ["LlamaForCausalLM"] is not supported'),
])
def test_model_type_other_than_qwen3_is_refused(ckpt, changes, expected):
    path = edit_config(ckpt, **changes)
    assert f"{path}: {expected}" in refused(ckpt)


def test_missing_config_key_is_named(ckpt):
    path = edit_config(ckpt, num_attention_heads=..., head_dim=...)
    assert f"{path}: required key(s) missing: num_attention_heads, head_dim" in refused(ckpt)


def test_unknown_config_key_is_refused(ckpt):
    path = edit_config(ckpt, quantization_config={"quant_method": "fp8"})
    assert f'{path}: unknown key(s) "quantization_config"' in refused(ckpt)


@pytest.mark.parametrize("changes, expected", [
    (dict(num_key_value_heads=3),
     "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    (dict(hidden_size="32"), 'hidden_size "32" is not a positive integer'),
    (dict(rms_norm_eps=-1), "rms_norm_eps -1 is not a positive number"),
    (dict(tie_word_embeddings="yes"), 'tie_word_embeddings "yes" is not true or false'),
])
def test_impossible_values_are_refused(ckpt, changes, expected):
    path = edit_config(ckpt, **changes)
    assert f"{path}: {expected}" in refused(ckpt)


def test_config_missing_or_not_json(ckpt):
    path = ckpt / "config.json"
    path.write_text("{not json")
    assert f"{path}: cannot be read as JSON" in refused(ckpt)
    path.write_text("[1, 2]")
    assert f"{path}: not a JSON object" in refused(ckpt)
    path.unlink()
    assert f"{path}: not found" in refused(ckpt)


# --- tensors and files ---------------------------------------------------------------------------

def test_tied_head_that_differs_from_the_embedding_is_refused(ckpt):
    edit_config(ckpt, tie_word_embeddings=True)   # the file keeps its own (different) lm_head
    file = ckpt / "model.safetensors"
    assert (f"{file}: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight', but "
            f"{ckpt / 'config.json'} sets tie_word_embeddings true") in refused(ckpt)
    state = read_safetensors(file)
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    write_safetensors(file, state)                 # the same matrix stored twice: fine
    loaded = load(ckpt)
    assert loaded.lm_head.weight is loaded.embed_tokens.weight


def test_untied_checkpoint_without_lm_head_is_refused(ckpt):
    file = ckpt / "model.safetensors"
    state = read_safetensors(file)
    del state["lm_head.weight"]
    write_safetensors(file, state)
    assert (f"{ckpt}: the checkpoint does not match its config.json: 1 tensor(s) missing, "
            f"e.g. 'lm_head.weight'") in refused(ckpt)


def test_wrong_shape_names_file_and_tensor(ckpt):
    file = ckpt / "model.safetensors"
    state = read_safetensors(file)
    state[Q_PROJ] = torch.zeros(64, 16)
    write_safetensors(file, state)
    assert f"{file}: tensor '{Q_PROJ}' has shape [64, 16], expected [64, 32]" in refused(ckpt)


def test_unexpected_tensor_names_file_and_tensor(ckpt):
    file = ckpt / "model.safetensors"
    state = read_safetensors(file)
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    write_safetensors(file, state)
    assert f"{file}: tensor 'model.layers.0.self_attn.q_proj.bias' does not match" in refused(ckpt)


def test_fp8_tensor_names_file_and_tensor(ckpt):
    file = ckpt / "model.safetensors"
    rewrite_header(file, lambda h: h[Q_PROJ].update(dtype="F8_E4M3"))
    assert f"{file}: tensor '{Q_PROJ}' is F8_E4M3: supported dtypes are F32, F16, BF16" \
        in refused(ckpt)


def test_offsets_that_disagree_with_the_shape_are_refused(ckpt):
    file = ckpt / "model.safetensors"
    rewrite_header(file, lambda h: h[Q_PROJ].update(shape=[64, 31]))
    assert f"{file}: tensor '{Q_PROJ}' has data_offsets" in refused(ckpt)


def test_truncated_file_names_file_and_tensor(ckpt):
    file = ckpt / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[:-10])
    last = max(json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]]).items(),
               key=lambda kv: kv[1]["data_offsets"][1])[0]
    assert (f"{file} is truncated: tensor '{last}' needs bytes up to {len(data)}, "
            f"the file has {len(data) - 10}") in refused(ckpt)


def test_header_length_past_the_end_and_short_file_are_refused(ckpt):
    file = ckpt / "model.safetensors"
    file.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert f"{file} is truncated: the header length says {1 << 40} bytes, the file has 10" \
        in refused(ckpt)
    file.write_bytes(b"abc")
    assert f"{file} is truncated: 3 bytes" in refused(ckpt)


@pytest.mark.parametrize("head", [b"\xff\xfe garbage", b"not json", b"[1, 2]",
                                  b'{"a": {"dtype": "F32"}}',
                                  b'{"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},'
                                  b' "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}'])
def test_header_garbage_names_the_file(ckpt, head):
    file = ckpt / "model.safetensors"
    file.write_bytes(struct.pack("<Q", len(head)) + head + bytes(8))
    assert str(file) in (message := refused(ckpt)) and ("header" in message)


def test_no_safetensors_files_or_an_unreadable_one(ckpt):
    (ckpt / "model.safetensors").unlink()
    assert f"{ckpt}: no *.safetensors files" in refused(ckpt)
    (ckpt / "model.safetensors").mkdir()
    assert f"{ckpt / 'model.safetensors'}: cannot be read" in refused(ckpt)


def test_tensor_in_two_shards_is_refused(ckpt):
    state = read_safetensors(ckpt / "model.safetensors")
    (ckpt / "model.safetensors").unlink()
    first = ckpt / "model-00001-of-00002.safetensors"
    second = ckpt / "model-00002-of-00002.safetensors"
    write_safetensors(first, state)
    write_safetensors(second, {Q_PROJ: state[Q_PROJ]})
    assert f"{second}: tensor '{Q_PROJ}' is also in {first}" in refused(ckpt)
