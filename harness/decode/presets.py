"""Model presets: shapes of the synthetic target and its DFlash-style drafter.

Standard library only: the controller reads `max_context` from here to validate scenarios
without importing torch.
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # Small enough to run a whole sweep on two CPU cores in seconds.
    "tiny": {
        "target": dict(vocab_size=512, hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32,
                       ffn=256, rope_theta=10000.0, rms_eps=1e-6),
        "drafter": dict(layers=1, target_layer_ids=[0, 1]),
        "max_context": 8192,
    },
    # Qwen3-8B shapes (36 layers, hidden 4096, 32/8 heads, d 128, FFN 12288, vocab 151936);
    # drafter as DFlash's Qwen3-8B drafter: 5 layers, block 16.
    "qwen3-8b": {
        "target": dict(vocab_size=151936, hidden=4096, layers=36, heads=32, kv_heads=8,
                       head_dim=128, ffn=12288, rope_theta=1000000.0, rms_eps=1e-6),
        "drafter": dict(layers=5, target_layer_ids=[1, 9, 17, 25, 33]),
        "max_context": 131072,
    },
}


def max_context(preset: str) -> int:
    return int(PRESETS[preset]["max_context"])
