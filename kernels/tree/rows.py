"""Rows of logits [..., V] as the top-k kernels address them, without a copy."""

from __future__ import annotations

import torch


def rows_view(logits: torch.Tensor) -> tuple[int, int, int, int]:
    """(rows, n1, stride0, stride1): row r starts at (r // n1) * stride0 + (r % n1) * stride1
    elements. Raises ValueError when the leading dims do not merge into [-1, n, V] as a view."""
    V = logits.shape[-1]
    if logits.dim() == 1:
        return 1, 1, 0, 0
    try:
        x3 = logits.view(-1, logits.shape[-2], V)
    except RuntimeError:
        raise ValueError(f"logits {tuple(logits.shape)} with strides {logits.stride()}: the "
                         "leading dims must merge into [-1, n, V] without a copy") from None
    return x3.shape[0] * x3.shape[1], x3.shape[1], x3.stride(0), x3.stride(1)
