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
    # Kimi K2.6 as one tensor-parallel rank of eight sees it. Emulated: 61 layers,
    # hidden 7168, 8 query heads per rank, the KV bytes per token per layer of the MLA latent
    # (576 values: here one KV head of 288 for keys plus 288 for values), the per-rank width of
    # the active FFN ((8 routed + 1 shared experts) x 2048 / 8 ranks = 2304, as a dense SwiGLU),
    # the per-rank vocabulary shard (163840 / 8), and the K2.6 drafter (6 layers, block 8,
    # target layers [1, 12, 24, 35, 47, 58]). Not emulated: MLA's absorbed projections and the
    # sharing of one latent by keys and values, MoE routing and its all-to-all, the TP
    # all-reduce. The `custom` verify mode's MLA-latent kernel targets the real layout.
    "kimi-k2.6-rank": {
        "target": dict(vocab_size=20480, hidden=7168, layers=61, heads=8, kv_heads=1,
                       head_dim=288, ffn=2304, rope_theta=50000.0, rms_eps=1e-6),
        "drafter": dict(layers=6, target_layer_ids=[1, 12, 24, 35, 47, 58]),
        "max_context": 262144,
    },
}


def max_context(preset: str) -> int:
    return int(PRESETS[preset]["max_context"])
