"""Float64 reference for tree-verify attention, and random test inputs (pure torch, any device).

The reference is the definition the kernels are checked against: for sequence b with prefix
length L = lengths[b], query t of head h attends keys [0, L) and the tree keys L + j whose bit j
is set in tree_bits[b, t]; softmax in float64; a query that sees nothing gets zeros. It reads
lengths to the host, so it is for checking, never for timing.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

# The packing the kernels read is the decode loop's own (bit j % 32 of word j // 32).
from harness.decode.attention import visibility_bits as pack_visibility  # noqa: F401 (re-export)


def unpack_visibility(bits: torch.Tensor, T: int) -> torch.Tensor:
    """Inverse of pack_visibility (attention.visibility_bits): [b, T, W] int32 -> [b, T, T] bool."""
    j = torch.arange(T, device=bits.device)
    words = bits[:, :, j // 32]                                    # [b, T, T]
    return ((words >> (j % 32).to(torch.int32)) & 1).bool()


def random_tree(batch: int, T: int, generator: torch.Generator) -> torch.Tensor:
    """[b, T, T] bool ancestor-or-self visibility of random trees (node 0 is the root, every
    other node's parent is an earlier node), as DDTree builds them."""
    vis = torch.zeros(batch, T, T, dtype=torch.bool)
    for b in range(batch):
        vis[b, 0, 0] = True
        parents = [0] + [int(torch.randint(0, j, (1,), generator=generator)) for j in range(1, T)]
        for j in range(1, T):
            vis[b, j] = vis[b, parents[j]]
            vis[b, j, j] = True
    return vis


def gather_pages(pages: torch.Tensor, page_table: torch.Tensor, b: int, n: int) -> torch.Tensor:
    """Keys 0..n-1 of sequence b from a paged cache [num_pages, H, page_size, d] -> [H, n, d]."""
    page_size = pages.shape[2]
    used = page_table[b, : math.ceil(n / page_size)].long()
    rows = pages[used]                                             # [np, H, ps, d]
    return rows.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[3])[:, :n]


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                        tree_bits: torch.Tensor, sm_scale: float | None = None,
                        page_table: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 tree-verify attention. q [b, Hq, T, dk]; k [b, Hkv, S, dk] and v [b, Hkv, S, dv]
    (or pages [P, Hkv, ps, d] with page_table). Returns [b, Hq, T, dv] float64."""
    b, hq, T, dk = q.shape
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(dk)
    vis = unpack_visibility(tree_bits, T)
    out = []
    for i, L in enumerate(lengths.tolist()):
        n = int(L) + T
        if page_table is None:
            ki, vi = k[i, :, :n], v[i, :, :n]
        else:
            ki, vi = gather_pages(k, page_table, i, n), gather_pages(v, page_table, i, n)
        hkv = ki.shape[0]
        G = hq // hkv
        allowed = torch.ones(T, n, dtype=torch.bool, device=q.device)
        allowed[:, int(L):] = vis[i]
        heads = []
        for h in range(hkv):                     # one KV head at a time bounds the memory
            qh = q[i, h * G:(h + 1) * G].double().reshape(G * T, dk)
            s = (qh @ ki[h].double().T) * scale
            s = s.masked_fill(~allowed.repeat(G, 1), float("-inf"))
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)    # a row that sees nothing: zeros
            heads.append((p @ vi[h].double()).reshape(G, T, -1))
        out.append(torch.cat(heads, 0))
    return torch.stack(out)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf, never a pass."""
    out = out.double()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))
