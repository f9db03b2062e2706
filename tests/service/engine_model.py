"""A tiny random Qwen3 and a tokenizer trained on the spot, saved where `transformers serve`
loads them: a real engine with a real model, small enough for two CPU cores.

The tokenizer is a word-level one (the `tokenizers` library, trained on a few sentences), so
" hello" repeated n times is exactly n prompt tokens, which the service workload checks against
the engine's own count. The model has no EOS token, so a request always gets its max_tokens.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ("hello world the quick brown fox jumps over a lazy dog speculative decoding draft "
         "tree verify accept commit token prompt engine serve kernel")


def make(folder: Path) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([WORDS] * 4, trainers.WordLevelTrainer(special_tokens=["[UNK]",
                                                                                  "[PAD]"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                                pad_token="[PAD]")
    fast.save_pretrained(folder)
    config = transformers.Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
        pad_token_id=tok.token_to_id("[PAD]"), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    return folder
