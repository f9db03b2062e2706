"""The GPU scripts' check of a GpuTree against the CPU heap (harness.decode.tree), node for node.

    from ci.gpu.treecheck import FIELDS, heap_mismatch    # scripts run with PYTHONPATH=<repo root>
"""

from __future__ import annotations

import torch

from harness.decode import tree as ddtree
from harness.decode.tree_gpu import GpuTree

FIELDS = ("tokens", "depths", "parents", "first_child", "next_sibling", "visibility", "bits", "scores")


def heap_mismatch(t: GpuTree, lp: torch.Tensor, ids: torch.Tensor, N: int) -> str | None:
    """None if every sequence's GpuTree equals the CPU heap's tree node for node."""
    lp_h, ids_h = lp.cpu(), ids.cpu()
    host = {f: getattr(t, f).cpu() for f in FIELDS}
    for i in range(lp.shape[0]):
        h = ddtree.build_tree_cpu(lp_h[i], ids_h[i], N)
        n = h.num_nodes
        checks = {
            "tokens": host["tokens"][i, :n].tolist() == h.tokens,
            "depths": host["depths"][i, :n].tolist() == h.depths,
            "parents": host["parents"][i, : n + 1].tolist() == h.parents,
            "first_child": host["first_child"][i, : n + 1].tolist() == h.first_child,
            "next_sibling": host["next_sibling"][i, : n + 1].tolist() == h.next_sibling,
            "visibility": torch.equal(host["visibility"][i, : n + 1, : n + 1], ddtree.visibility_matrix(h)),
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            paths_equal = ddtree.token_paths(host["tokens"][i].tolist(), host["parents"][i].tolist(),
                                             n) == ddtree.token_paths(h.tokens, h.parents, n)
            return f"seq {i}: {bad} differ (token-path sets equal: {paths_equal})"
    return None

