"""The Triton accept (harness.kernels.accept.triton_accept) on a GPU at the loop's shapes: bf16
logits over qwen3-8b's vocabulary (151936), trees of 65 nodes over 15 drafted positions, one
and four sequences, greedy and synthetic acceptance, against the tensor-op accept
(harness.decode.fast.accept_path) and the decoder's tensor-op bookkeeping, on the same GPU.
Then: no host sync, and a CUDA graph replayed on new logits equal to eager calls. The same
comparison runs under the interpreter on CPU (test_triton_accept.py, whose case maker this
reuses); the decode loop with it is tests/decode/test_fast_loop_gpu.py's.
"""

from __future__ import annotations

import pytest
import torch
from cuda_checks import capture, no_host_sync
from test_triton_accept import expected, make_case

pytest.importorskip("triton", reason="Triton is needed (Linux wheels only)")
from harness.decode.attention import visibility_bits  # noqa: E402
from harness.kernels.accept import triton_accept  # noqa: E402

pytestmark = pytest.mark.gpu

VOCAB, BUDGET, D = 151936, 64, 15


def on(case, device, dtype=torch.bfloat16):
    return {k: (v.to(device, dtype) if k == "logits" else v.to(device)) for k, v in case.items()}


def run(case, B, lengths, step, draws, ws=None):
    b, T, V = case["logits"].shape
    dev = case["logits"].device
    out = dict(bonus=torch.full((b,), -5, dtype=torch.long, device=dev),
               record=torch.full((b, 1 + B), -5, dtype=torch.long, device=dev),
               idx=torch.full((b, B), -5, dtype=torch.long, device=dev),
               src=torch.full((b, B), -5, dtype=torch.long, device=dev),
               dst=torch.full((b, B), -5, dtype=torch.long, device=dev),
               lengths=lengths.clone(), step_index=torch.tensor([step], device=dev))
    ws = ws or triton_accept.alloc_workspace(b, T, V, dev)
    triton_accept.accept(case["logits"], tree_ids=case["tree_ids"], parents=case["parents"],
                         first_child=case["first_child"], depth=case["depth"], bits=visibility_bits(case["vis"]),
                         draws=draws, workspace=ws, **out)
    return {**out, "next": ws.next}


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("synthetic", [False, True])
def test_equals_the_tensor_ops_at_the_loops_shape(cuda, b, synthetic):
    case = on(make_case(10 + b, b, BUDGET, D, 64, VOCAB, ties=True), cuda)
    B = D + 1
    lengths = torch.randint(1000, 60000, (b,), device=cuda)
    draws = torch.randint(1, B + 1, (9, b), device=cuda) if synthetic else None
    got = run(case, B, lengths, 11, draws)
    want = expected(case, B, lengths, 11, draws)
    for name, value in want.items():
        assert torch.equal(got[name], value), name


def test_no_host_sync_and_graph_replays_equal_eager_calls(cuda):
    b, B = 2, D + 1
    case = on(make_case(20, b, BUDGET, D, 64, VOCAB, ties=True), cuda)
    bits = visibility_bits(case["vis"])
    ws = triton_accept.alloc_workspace(b, BUDGET + 1, VOCAB, cuda)
    outs = run(case, B, torch.full((b,), 4096, device=cuda), 0, None, ws)   # compiles
    keep = {k: v for k, v in outs.items() if k != "next"}

    def call():
        triton_accept.accept(case["logits"], tree_ids=case["tree_ids"], parents=case["parents"],
                             first_child=case["first_child"], depth=case["depth"],
                             bits=bits, draws=None, workspace=ws, **keep)
    with no_host_sync():
        call()
    graph = capture(call)
    for seed in (21, 22, 23):
        new = on(make_case(seed, b, BUDGET, D, 64, VOCAB, ties=True), cuda)
        for name in ("logits", "tree_ids", "parents", "first_child", "depth"):
            case[name].copy_(new[name])
        bits.copy_(visibility_bits(new["vis"]))
        keep["lengths"].fill_(4096)
        keep["step_index"].zero_()
        graph.replay()
        torch.cuda.synchronize()
        want = expected(new, B, torch.full((b,), 4096, device=cuda), 0, None)
        for name, value in want.items():
            got = ws.next if name == "next" else keep[name]
            assert torch.equal(got, value), (seed, name)
