"""Which kernels a decode step runs: one value, handed to a decoder and passed down from it.

(Named kernel_choice, not kernels: `harness.kernels` is the package of the kernels themselves.)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from harness.protocol import params


@dataclass(frozen=True)
class Kernels:
    """The kernels of one decode cell, not what it computes (every choice gives the same tokens):

      verify      the attention of the tree-verify forward and of the draft block
                  (custom | triton | sdpa | flex, harness/decode/attention.py)
      topk        the drafter's top-k log-probs (torch | triton, tree_gpu.topk_logprobs_batched)
      tree_build  the GPU tree build on a CUDA device (triton | cuda | torch); on any other
                  device the tree is built with torch, the only implementation there
      fused_ops   the target and drafter forward, and the commit's KV compaction, on the
                  fused Triton kernels (triton_fused.py)
      custom_impl the custom verify kernel's S = QK^T (mma | wgmma, custom_verify.py), where
                  verify is custom
      linear      the forward's weight GEMMs (torch | triton | wgmma): cuBLAS, or the skinny
                  Triton kernel for forwards of up to 16 rows (kernels/linear/skinny_linear.py;
                  model.linear), and with wgmma the verify's 17-72 rows on the stream-K CUDA
                  kernel (kernels/linear/stream_linear.py; Hopper, bf16)
      accept      the GPU accept's argmax, path and bookkeeping (torch | triton): tensor ops, or
                  two Triton launches (kernels/accept/triton_accept.py)
      blas        the library under the GEMMs `linear` leaves to torch (torch | cublaslt |
                  cublaslt_tuned): torch's default (cuBLAS on CUDA) or cuBLASLt; torch picks it
                  per process, not per call, so whoever runs the decoder holds
                  `blas_library(kernels.blas)` around it. cublaslt_tuned calls cuBLASLt itself
                  with the algorithm timed fastest for each GEMM shape (lt_linear.py)

    The defaults are the plain torch code (what a library caller gets); a cell's knobs default
    to `auto`, the kernels measured fastest on its device (`from_cell`).

    It is a value, not module switches, because one worker process runs many cells one after
    another (a persistent worker, a test session): a switch one cell sets stays set for the
    next until something puts it back, and a decoder kept for reuse would quietly run whatever
    the last cell left. A value belongs to the decoder built with it and reaches nothing else.
    """

    verify: str = "sdpa"
    topk: str = "torch"
    tree_build: str = "triton"
    fused_ops: bool = False
    custom_impl: str = "mma"
    linear: str = "torch"
    accept: str = "torch"
    blas: str = "torch"

    def __post_init__(self):
        for name, allowed in (("verify", params.VERIFY_MODES), ("topk", params.TOPK_IMPLS),
                              ("tree_build", params.TREE_BUILD_IMPLS),
                              ("custom_impl", params.CUSTOM_IMPLS),
                              ("linear", params.LINEAR_IMPLS),
                              ("accept", params.ACCEPT_IMPLS),
                              ("blas", params.BLAS_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Kernels.{name} must be one of {', '.join(allowed)} "
                                 f"(got {getattr(self, name)!r})")
        if not isinstance(self.fused_ops, bool):
            raise ValueError(f"Kernels.fused_ops must be true or false (got {self.fused_ops!r})")

    @classmethod
    def from_cell(cls, cell: dict, device: torch.device | str) -> "Kernels":
        """The kernels a decode cell's knobs pick on `device` (verify_mode, and each
        implementation knob, `auto` resolved for the device: params.resolve_kernels). The
        Triton and CUDA C++ kernels run on a CUDA device only: naming one elsewhere is an
        error, never a quiet fallback to torch."""
        device = torch.device(device)
        cuda = device.type == "cuda"
        # (A cell planned for CUDA on a host without one: no capability, the plain CUDA choice.)
        capability = (torch.cuda.get_device_capability(device)
                      if cuda and torch.cuda.is_available() else None)
        k = params.resolve_kernels(cell, cuda, capability)
        if not cuda:
            named = {n: v for n, v in k.items() if v != params.AUTO_KERNELS["cpu"][n]}
            if named:
                raise ValueError(f"{named} pick CUDA kernels; this cell runs on {device}")
        return cls(verify=cell["verify_mode"], topk=k["topk_impl"],
                   tree_build=k["tree_build_impl"], fused_ops=k["fused_ops"],
                   custom_impl=k["custom_impl"], linear=k["linear_impl"],
                   accept=k["accept_impl"], blas=k["blas_impl"])


@contextlib.contextmanager
def blas_library(name: str):
    """torch's BLAS library set to `name` (a Kernels.blas value; cublaslt for cublaslt_tuned)
    while the block runs, and put back after.

    torch takes it process-wide (torch.backends.cuda.preferred_blas_library), never per call,
    and a CUDA graph keeps the kernels chosen while it was captured: so a cell holds this around
    everything its decoders run (prefill, capture, steps, the lossless check), and the next cell
    of the process starts from what was there before."""
    if name == "torch":
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    # cublaslt_tuned: the GEMMs lt_linear hands back to torch (prefill's rows) on cuBLASLt too
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)
