"""A step's record to the host by the GPU's own stores, not by a copy.

The fast loops hand the host each step's record [accepted, tokens...] through a ring of pinned
host buffers (harness/decode/fast.py, `_StepsBehind`). As a device-to-host copy the record is a
copy-engine operation between the step's last kernel and the next step's first, and the GPU
idled around it every step: on an H100, gpu/full at 4k-64k keys, ~4.5 µs from the step's last
kernel to the copy and ~10 µs from the copy to the next step's first kernel (kernels/NOTES.md,
session 35). Pinned host memory is mapped into the GPU's address space (unified addressing:
the host pointer is the device pointer), so one small kernel stores the record there itself and
the step ends at a kernel boundary instead.

Kernel, reference (`torch.Tensor.copy_`, what it replaces) and test side by side:
tests/kernels/test_publish.py runs it under TRITON_INTERPRET=1 on CPU tensors and, on a GPU,
into pinned memory. The stores are visible to the host once an event recorded after the kernel
has completed (a kernel's writes are complete when it is), which is how the loop reads them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 512     # a step's record is batch x (1 + block_size) int64: one pass of one program


@triton.jit
def _publish_kernel(SRC, DST, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for start in range(0, N, BLOCK):
        mask = start + offs < N
        tl.store(DST + start + offs, tl.load(SRC + start + offs, mask=mask), mask=mask)


def publish(record: torch.Tensor, host: torch.Tensor) -> None:
    """host[...] = record by one program on record's device, on the current stream. `host` is
    pinned (page-locked) memory of record's shape and dtype, both contiguous (under the Triton
    interpreter any CPU tensor)."""
    if host.shape != record.shape or host.dtype != record.dtype:
        raise ValueError(f"publish: host {tuple(host.shape)} {host.dtype} is not the record's "
                         f"{tuple(record.shape)} {record.dtype}")
    if not (record.is_contiguous() and host.is_contiguous()):
        raise ValueError("publish: the record and its host buffer must be contiguous")
    if record.device.type == "cuda" and not host.is_pinned():
        raise ValueError("publish: the host buffer must be pinned (the GPU stores into it)")
    _publish_kernel[(1,)](record, host, record.numel(), BLOCK=BLOCK)


def publish_reference(record: torch.Tensor, host: torch.Tensor) -> None:
    """What `publish` replaces: a device-to-host copy (the copy engine's), queued."""
    host.copy_(record, non_blocking=True)
