"""Tree-verify attention with torch's flex_attention (`verify_mode: flex`), a reference path.

The mask is the one every verify forward has (attention.py): sequence b sees its committed
prefix, keys [0, lengths[b]), and among the T tree keys at slots lengths[b] + j only those whose
ancestor bit is set. flex_attention turns that `mask_mod` into a block-sparse mask, so blocks past
lengths[b] + T are skipped, and GQA comes from `enable_gqa`.

On CUDA flex_attention runs compiled (torch.compile, once per shape); on CPU it runs eagerly (slow,
tests only). Its compile can fail for some shapes (64 tree tokens at d=128 on torch 2.11; docs/ARCHITECTURE.md): that
surfaces as a FlexVerifyError naming the shape, which the decode cell reports as a failed cell.
flex_attention is imported lazily, so importing this module costs nothing on the sdpa path.
"""

from __future__ import annotations

import functools

import torch


class FlexVerifyError(RuntimeError):
    """flex_attention could not run (typically: failed to compile) for this shape."""


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(lengths: torch.Tensor, tree: torch.Tensor, T: int, kv_len: int):
    """BlockMask for [b, T] tree queries over kv_len keys. `tree` is the ancestor bitmask
    [b, T, ceil(T/32)] int32 (attention.visibility_bits) or the bool visibility [b, T, T].
    Build it once per forward and share it across layers."""
    from torch.nn.attention.flex_attention import create_block_mask

    b = lengths.shape[0]
    is_bool = tree.dtype == torch.bool

    def tree_verify_mask(bi, h, q_idx, kv_idx):
        L = lengths[bi]
        rel = kv_idx - L
        in_tree = (rel >= 0) & (rel < T)
        j = rel.clamp(0, T - 1)
        if is_bool:
            seen = tree[bi, q_idx, j]
        else:
            seen = ((tree[bi, q_idx, j // 32] >> (j % 32)) & 1) != 0
        return (kv_idx < L) | (in_tree & seen)

    return create_block_mask(tree_verify_mask, b, None, T, kv_len, device=lengths.device)


def flex_tree_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                     tree: torch.Tensor, sm_scale: float | None = None, block_mask=None,
                     compiled: bool | None = None) -> torch.Tensor:
    """q [b, Hq, T, d]; k, v [b, Hkv, S, d]; lengths [b]; tree: bits [b, T, W] int32 or bool
    visibility [b, T, T]. Same contract as harness.kernels.verify.triton_verify.tree_verify_attention.
    `compiled` defaults to True on CUDA, False (eager) elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention

    b, hq, T, d = q.shape
    S = k.shape[2]
    if block_mask is None:
        block_mask = flex_block_mask(lengths, tree, T, S)
    if compiled is None:
        compiled = q.device.type == "cuda"
    fn = _compiled_flex() if compiled else flex_attention
    try:
        return fn(q, k, v, block_mask=block_mask, scale=sm_scale, enable_gqa=hq != k.shape[1])
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # inductor raises many types; all mean "flex cannot do this shape"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise FlexVerifyError(
            f"flex_attention failed for T={T} tree tokens, d={d}, {hq}/{k.shape[1]} heads, "
            f"{q.dtype}, S={S} ({'compiled' if compiled else 'eager'}): "
            f"{type(e).__name__}: {first[:300]}") from e
