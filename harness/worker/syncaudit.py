"""Sync audit: how often a step makes the host wait for the GPU, and which lines do it.

Three detectors, active only inside an audited window of a few steps (unprofiled, untimed):
  - torch.cuda.set_sync_debug_mode("warn"): torch warns on every synchronizing CUDA call
    (`.item()`, `bool(t)`, `nonzero`, blocking copies, ...); a hook on those warnings takes the
    Python stack. It misses some syncs (docs/ARCHITECTURE.md), so:
  - Tensor.item / .tolist / .cpu / .to / .cuda / .copy_ are wrapped, as vLLM does, to catch
    device->host transfers and host->device copies from pageable memory (the driver stages
    those through a bounce buffer and may wait on the stream).
  - torch.cuda.synchronize and Event/Stream.synchronize, the explicit waits (e.g. a loop that
    reads last step's results from pinned memory waits on an event).
A call caught by a wrapper is counted once even when torch also warns about it.

Each sync is charged to the innermost stack frame in the project's own code (file:line relative
to the repository root, e.g. `harness/decode/loop.py:137`), not to torch internals.

Kinds: `sync` (a synchronizing call seen by torch's debug mode, or an explicit synchronize),
`d2h` (a blocking device->host transfer), `h2d_pageable` (a host->device copy from pageable
memory), `h2d_blocking` (a blocking host->device copy from pinned memory). All count in
`syncs_per_step`. Only CUDA tensors count: on a CPU-only run the audit reports nothing
(`audit_window` returns None), except with `device_only=False`, which tests use to exercise the
wrapping on CPU tensors.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter

import torch

SYNC_WARNING = "called a synchronizing CUDA operation"
KINDS = ("sync", "d2h", "h2d_pageable", "h2d_blocking")
_WRAPPED = ("item", "tolist", "cpu", "to", "cuda", "copy_")
# The explicit waits: (owner, attribute).
_EXPLICIT_SYNCS = ((torch.cuda, "synchronize"), (torch.cuda.Event, "synchronize"),
                   (torch.cuda.Stream, "synchronize"))
_HERE = os.path.abspath(__file__)
# The repository root: the folder holding the harness package (a checkout or a shipped bundle).
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))   # <root>/harness/worker/


def _non_blocking(args, kwargs) -> bool:
    # Tensor.to / .cuda / .copy_ take non_blocking as a keyword or as the first positional bool
    # (`copy`, the only other bool, comes after it).
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((a for a in args if isinstance(a, bool)), False)


class SyncAudit:
    """Context manager that counts synchronizations and where they happen.

    Set `.step` to the current step index while auditing several steps; read `.counts`
    (Counter of (site, kind)) and `.per_step` (Counter of step index) or call `summary()`.
    """

    def __init__(self, root: str = PROJECT_ROOT, device_only: bool = True):
        self.root = os.path.abspath(root)
        self.device_only = device_only
        self.counts: Counter = Counter()
        self.per_step: Counter = Counter()
        self.step = 0
        self._depth = 0          # > 0 inside a wrapped call: its own warning is not a 2nd sync
        self._saved = []         # (owner, name, the owner's own attribute or None)
        self._catch = None
        self._debug_mode = None

    # -- recording -----------------------------------------------------------------------
    def site(self) -> str:
        """file:line of the innermost frame in the project's code (outside this module and
        outside installed packages), or the innermost frame at all if there is none."""
        frame = sys._getframe(1)
        fallback = None
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if path != _HERE:
                fallback = fallback or f"{path}:{frame.f_lineno}"
                rel = os.path.relpath(path, self.root)
                if not rel.startswith(("..", ".")) and "site-packages" not in rel \
                        and "dist-packages" not in rel:
                    return f"{rel.replace(os.sep, '/')}:{frame.f_lineno}"
            frame = frame.f_back
        return fallback or "<unknown>"

    def record(self, kind: str) -> None:
        self.counts[(self.site(), kind)] += 1
        self.per_step[self.step] += 1

    def _counts(self, t: torch.Tensor) -> bool:
        return t.is_cuda or not self.device_only

    # -- wrappers ------------------------------------------------------------------------
    def _wrap(self, name, original):
        audit = self

        def wrapper(tensor, *args, **kwargs):
            audit._depth += 1
            try:
                result = original(tensor, *args, **kwargs)
            finally:
                audit._depth -= 1
            if audit._depth == 0:
                kind = audit._classify(name, tensor, result, args, kwargs)
                if kind:
                    audit.record(kind)
            return result

        wrapper.__name__ = name
        wrapper.__wrapped__ = original
        return wrapper

    def _classify(self, name, tensor, result, args, kwargs) -> str | None:
        if name in ("item", "tolist", "cpu"):
            return "d2h" if self._counts(tensor) else None
        if name == "copy_":  # tensor is the destination
            src, dst = args[0] if args else kwargs.get("src"), tensor
        else:                # .to / .cuda return the copy
            src, dst = tensor, result
        if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor) \
                or src.device == dst.device:
            return None
        blocking = not _non_blocking(args, kwargs)
        if src.is_cuda and not dst.is_cuda:
            return "d2h" if blocking else None   # non-blocking into pinned memory: async
        if dst.is_cuda and not src.is_cuda:
            if not src.is_pinned():
                return "h2d_pageable"
            return "h2d_blocking" if blocking else None
        return None

    def _wrap_explicit(self, original):
        audit = self

        def wrapper(*args, **kwargs):
            audit._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                audit._depth -= 1
                if audit._depth == 0:
                    audit.record("sync")

        wrapper.__name__ = getattr(original, "__name__", "synchronize")
        wrapper.__wrapped__ = original
        return wrapper

    def _patch(self, owner, name, wrapper) -> None:
        own = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
        self._saved.append((owner, name, own))
        setattr(owner, name, wrapper)

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            if self._depth == 0:
                self.record("sync")
            return
        self._forward(message, category, filename, lineno, file, line)

    # -- context -------------------------------------------------------------------------
    def __enter__(self):
        for name in _WRAPPED:
            self._patch(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        for owner, name in _EXPLICIT_SYNCS:
            self._patch(owner, name, self._wrap_explicit(getattr(owner, name)))
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("always", message=SYNC_WARNING)
        self._forward = warnings.showwarning
        warnings.showwarning = self._showwarning
        if torch.cuda.is_available():
            self._debug_mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self._debug_mode is not None:
            torch.cuda.set_sync_debug_mode(self._debug_mode)
        self._catch.__exit__(*exc)   # restores showwarning and the filters
        for owner, name, own in reversed(self._saved):
            if own is None:
                delattr(owner, name)     # it was inherited (Tensor.item from TensorBase)
            else:
                setattr(owner, name, own)
        self._saved.clear()
        return False

    # -- results -------------------------------------------------------------------------
    def summary(self, steps: int, top: int = 20) -> dict:
        """`syncs_per_step` and the `top` call sites, busiest first:
        `sync_sites: [{site, kind, count, per_step}]` (count over the whole window)."""
        total = sum(self.counts.values())
        sites = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return {
            "syncs_per_step": total / steps if steps else None,
            "syncs_per_step_max": max((self.per_step[i] for i in range(steps)), default=0),
            "sync_steps": steps,
            "sync_sites": [{"site": site, "kind": kind, "count": n, "per_step": n / steps}
                           for (site, kind), n in sites],
        }


def audit_window(step_fn, steps: int, device=None, *, top: int = 20) -> dict | None:
    """Run `steps` calls of `step_fn` under a SyncAudit and summarise it.

    None on a CPU device (syncs are a CUDA notion). Run it in its own window: not under the
    profiler (one CUPTI subscriber, and the wrappers slow the host) and not timed.
    """
    device = torch.device(device) if device is not None else None
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return None
    torch.cuda.synchronize()
    audit = SyncAudit()
    with audit:
        for i in range(steps):
            audit.step = i
            step_fn()
    torch.cuda.synchronize()
    return audit.summary(steps, top)
