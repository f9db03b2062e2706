"""harness.kernels.accept.publish: a step's record stored into the host's buffer by a kernel.

Under the Triton interpreter on CPU tensors (the stores and their mask, records longer than one
block), then on a GPU into pinned memory: equal to the copy it replaces, read after an event as
the loop reads it, with no host sync, and refused where the GPU could not store (unpinned).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")

from harness.kernels.accept import publish  # noqa: E402


def _published(record: torch.Tensor) -> torch.Tensor:
    host = torch.full_like(record, -7)          # garbage: a slot the kernel skips fails
    publish.publish(record, host)
    return host


@pytest.mark.parametrize("shape", [(1, 17), (4, 17), (3, 200), (1, 1)])
def test_the_kernel_stores_the_whole_record(interp, shape):
    record = torch.randint(-2**40, 2**40, shape, dtype=torch.long)
    assert torch.equal(interp.apply(_published, (record,)), record)


def test_a_host_buffer_of_another_shape_or_dtype_is_refused():
    record = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="is not the record's"):
        publish.publish(record, torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="is not the record's"):
        publish.publish(record, torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        publish.publish(record, torch.zeros(5, 2, dtype=torch.long).t())


@pytest.mark.gpu
def test_on_the_gpu_it_stores_into_pinned_memory_as_the_copy_would(cuda):
    from cuda_checks import no_host_sync

    record = torch.randint(0, 2**40, (4, 17), dtype=torch.long, device=cuda)
    ring = torch.full((3, 4, 17), -7, dtype=torch.long, pin_memory=True)
    event = torch.cuda.Event()
    publish.publish(record, ring[0])                # compiled and loaded outside the check
    torch.cuda.synchronize()
    with no_host_sync():
        for slot in range(3):
            record.add_(1)
            publish.publish(record, ring[slot])
        event.record()
    event.synchronize()
    expected = torch.full_like(ring, -7)
    for slot in range(3):
        publish.publish_reference(record - 2 + slot, expected[slot])
    torch.cuda.synchronize()
    assert torch.equal(ring, expected)
    with pytest.raises(ValueError, match="must be pinned"):
        publish.publish(record, torch.zeros(4, 17, dtype=torch.long))
