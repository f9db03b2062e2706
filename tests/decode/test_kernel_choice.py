"""Kernel choices as a value (harness/decode/kernel_choice.py): validation, the mapping from a
cell, and that two decoders in one process each run their own kernels, with nothing global
left to set or to put back."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types

import pytest
import torch

import harness.kernels.tree
from harness.protocol import params
from harness.decode import attention, model, tree, tree_gpu
from harness.decode.fast import FastSpecDecoder
from harness.decode.kernel_choice import Kernels, blas_library
from harness.decode.loop import SpecDecoder
from harness.kernels.verify import custom_verify as cv
from harness.worker.workloads import decode
from test_decode import make_models, prompts_for


# -- the value ------------------------------------------------------------------------------

def test_defaults_are_the_cell_defaults():
    assert Kernels() == Kernels(verify="sdpa", topk="torch", tree_build="triton", fused_ops=False)
    # A cell's knobs default to auto: on a CPU the torch code, the tree build's included.
    assert Kernels.from_cell(params.canonical({}), "cpu") == Kernels(tree_build="torch")


@pytest.mark.parametrize("field,value", [("verify", "fast"), ("verify", "SDPA"), ("topk", "cuda"),
                                         ("tree_build", "auto"), ("tree_build", "metal"),
                                         ("fused_ops", "true"), ("fused_ops", 1),
                                         ("accept", "cuda"), ("blas", "cublas"), ("blas", "auto")])
def test_bad_values_are_refused(field, value):
    with pytest.raises(ValueError, match=f"Kernels.{field} must be"):
        Kernels(**{field: value})


def test_it_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Kernels().topk = "triton"


def test_from_cell_maps_the_knobs():
    cell = params.canonical({"verify_mode": "custom", "topk_impl": "triton",
                             "tree_build_impl": "cuda", "fused_ops": True})
    # custom_impl left auto: wgmma on a Hopper GPU, mma.sync on any other (or none visible)
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert Kernels.from_cell(cell, torch.device("cuda")) == \
        Kernels(verify="custom", topk="triton", tree_build="cuda", fused_ops=True,
                custom_impl="wgmma" if hopper else "mma", accept="triton",
                linear="triton" if hopper else "torch", blas="cublaslt" if hopper else "torch")
    assert Kernels.from_cell(params.canonical({"tree_build_impl": "torch"}), "cuda").tree_build == "torch"
    named = params.canonical({"verify_mode": "custom", "custom_impl": "wgmma"})
    assert Kernels.from_cell(named, "cuda").custom_impl == "wgmma"
    with pytest.raises(ValueError, match="custom_impl must be one of mma, wgmma"):
        Kernels(custom_impl="auto")


@pytest.mark.parametrize("knob,value", [("topk_impl", "triton"), ("tree_build_impl", "cuda"),
                                        ("fused_ops", True), ("accept_impl", "triton"),
                                        ("blas_impl", "cublaslt")])
def test_a_cuda_kernel_on_a_cpu_device_is_refused(knob, value):
    with pytest.raises(ValueError, match="pick CUDA kernels; this cell runs on cpu"):
        Kernels.from_cell(params.canonical({knob: value}), torch.device("cpu"))


@pytest.fixture
def blas_calls(monkeypatch):
    """torch.backends.cuda.preferred_blas_library recorded (a CPU build refuses cuBLASLt)."""
    calls, current = [], ["cublas"]

    def preferred(backend=None):
        if backend is not None:
            calls.append(backend)
            current[0] = backend
        return current[0]
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    return calls


def test_the_blas_library_is_the_cells_while_it_runs_and_put_back_after(blas_calls):
    with blas_library("cublaslt"):
        assert torch.backends.cuda.preferred_blas_library() == "cublaslt"
    assert blas_calls == ["cublaslt", "cublas"]
    with pytest.raises(RuntimeError, match="a failing cell"):
        with blas_library("cublaslt"):
            raise RuntimeError("a failing cell")
    assert torch.backends.cuda.preferred_blas_library() == "cublas"      # put back all the same
    blas_calls.clear()
    with blas_library(Kernels().blas):                 # torch's own: nothing set, nothing put back
        pass
    assert blas_calls == []


def test_timed_cublaslt_leaves_torch_on_cublaslt_for_what_it_hands_back(blas_calls):
    """blas_impl cublaslt_tuned calls cuBLASLt itself (lt_linear.py) and gives the GEMMs it does
    not take (prefill's rows) to F.linear: on cuBLASLt too."""
    with blas_library("cublaslt_tuned"):
        assert torch.backends.cuda.preferred_blas_library() == "cublaslt"
    assert blas_calls == ["cublaslt", "cublas"]


def test_the_verify_mode_is_not_an_implementation_knob():
    # verify_mode is what the CPU cells sweep (sdpa, flex): no device check for it here.
    assert Kernels.from_cell(params.canonical({"verify_mode": "flex"}), "cpu").verify == "flex"


# -- nothing global -------------------------------------------------------------------------

def test_no_module_decides_a_kernel():
    assert not hasattr(model, "FUSED_OPS")
    assert not hasattr(model, "fused_ops")
    assert not hasattr(tree_gpu, "TOPK_IMPL")
    assert not hasattr(tree_gpu, "TREE_BUILD_IMPL")
    assert not hasattr(decode, "use_kernels")


def test_custom_verify_default_impl_ignores_the_environment(monkeypatch):
    monkeypatch.setenv("HARNESS_TVA_IMPL", "wgmma")
    for fn in (cv.tree_verify_attention, cv.tree_verify_attention_paged,
               cv.mla_tree_verify_attention, cv.plan):
        assert inspect.signature(fn).parameters["impl"].default == "mma", fn.__name__
    assert cv._resolve_impl(cv.DEFAULT_IMPL, 0, 2) == 0          # mma: never wgmma
    source = inspect.getsource(cv)
    assert "os.environ" not in source and "getenv" not in source


# -- two decoders, one process --------------------------------------------------------------

@pytest.fixture
def recorded(monkeypatch):
    """On CPU, every kernel is really torch, but what was asked for is recorded: the Triton
    top-k entry point (a stand-in module, made reachable on CPU) appends to `topk`, and each
    attention call appends the kernels its mask carries to `attend` (then runs SDPA)."""
    calls = types.SimpleNamespace(topk=[], attend=[])

    def topk_logprobs(logits, k, workspace=None):
        calls.topk.append(tuple(logits.shape))
        return tree_gpu.topk_logprobs_batched(logits, k, impl="torch")

    fake = types.SimpleNamespace(alloc_workspace=lambda logits, k: None, topk_logprobs=topk_logprobs)
    monkeypatch.setitem(sys.modules, "harness.kernels.tree.triton_topk", fake)
    monkeypatch.setattr(harness.kernels.tree, "triton_topk", fake, raising=False)
    monkeypatch.setattr(tree_gpu, "_on_triton", lambda t: True)
    monkeypatch.setattr(tree_gpu, "_TOPK_WORKSPACES", {})

    real_attend = attention.attend

    def attend(q, k, v, mask, out=None):
        calls.attend.append(mask.kernels)
        as_sdpa = dataclasses.replace(mask, kernels=dataclasses.replace(mask.kernels, verify="sdpa"))
        return real_attend(q, k, v, as_sdpa, out=out)

    monkeypatch.setattr(attention, "attend", attend)
    return calls


def test_the_host_heap_takes_torch_top_k_unless_told(recorded):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    tree.topk_logprobs(logits, 16)
    assert recorded.topk == []
    tree.topk_logprobs(logits, 16, impl="triton")
    assert recorded.topk == [(1, 5, 300)]
    for fn, x in ((tree.topk_logprobs, logits), (tree_gpu.topk_logprobs_batched, logits[None])):
        with pytest.raises(ValueError, match="impl must be torch or triton"):
            fn(x, 16, impl="cuda")


def test_two_decoders_in_one_process_each_run_their_own_kernels(recorded):
    target, drafter = make_models(31, block=6)
    prompts = prompts_for(31, [20])
    mine = Kernels(verify="flex", topk="triton")
    a = SpecDecoder(target, drafter, batch=1, max_len=256, tree_budget=8, kernels=mine)
    b = SpecDecoder(target, drafter, batch=1, max_len=256, tree_budget=8)    # built after a
    fast = FastSpecDecoder(target, drafter, batch=1, max_len=256, tree_budget=8,
                           kernels=Kernels(verify="triton", topk="triton"), tree_build="gpu")
    for dec in (a, b, fast):
        dec.prefill(prompts)
    assert {k.verify for k in recorded.attend} == {"sdpa"}      # prefill: SDPA, whoever asks
    recorded.attend.clear()

    for _ in range(3):
        b.step()
    assert recorded.topk == [] and set(recorded.attend) == {Kernels()}
    recorded.attend.clear()
    for _ in range(3):
        a.step()
    assert len(recorded.topk) == 3 and set(recorded.attend) == {mine}
    recorded.topk.clear()
    recorded.attend.clear()
    for _ in range(3):
        fast.step()
    assert len(recorded.topk) == 3
    assert set(recorded.attend) == {Kernels(verify="triton", topk="triton")}
    recorded.topk.clear()
    recorded.attend.clear()
    b.step()                                            # b is still on the defaults
    assert recorded.topk == [] and set(recorded.attend) == {Kernels()}
    # A choice changes which kernel runs, not what is computed (here all of them are torch).
    assert a.output[0] == b.output[0][: len(a.output[0])]


def test_the_kept_decoder_is_keyed_by_its_kernels():
    cell = params.canonical({"device": "cpu"})
    dev, dtype = torch.device("cpu"), torch.float32
    assert decode._decoder_key(cell, dev, dtype, Kernels()) != \
        decode._decoder_key(cell, dev, dtype, Kernels(topk="triton"))


def test_the_workload_builds_its_decoder_with_the_cells_kernels():
    decode.release()
    try:
        cell = params.canonical(dict(model="tiny", context_length=24, steps=2, repeats=1,
                                     warmup_steps=0, profile_steps=0, device="cpu",
                                     tree_budget=4, block_size=4))
        decode.run(cell, lambda **_: None)
        (dec,) = decode._DECODERS.values()
        assert dec.kernels == Kernels.from_cell(cell, "cpu") == Kernels(tree_build="torch")
    finally:
        decode.release()
