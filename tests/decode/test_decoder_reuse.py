"""A decoder reset and prefilled again decodes exactly what a new one does, and the decode
workload keeps one decoder per process for the last cell (a persistent worker measures the
same cell round after round without reallocating its KV cache or recapturing its graphs).

Every decoder is first stepped on other prompts with another seed and left with a record
unread, so any state a reset missed would show. CUDA graphs need a GPU: the graph tests at the
end are marked `gpu` (`pytest -m gpu`) and skipped elsewhere."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from harness.worker import measure, main as worker

from harness.protocol import params
from harness.decode.fast import FastARDecoder, FastSpecDecoder
from harness.decode.loop import SpecDecoder
from harness.decode.model import KVCache
from harness.worker.workloads import decode
from test_decode import OracleDrafter, ar_reference, make_models, prompts_for
from test_fast_loop import MODES

LENS = [14, 33]


def state(dec) -> dict:
    """Every attribute of a decoder, as comparable values. `_verify_out` is left out: the last
    verify's outputs, which a reset keeps on purpose (a captured verify graph writes them) and
    which a step reads only after its own verify has written them."""
    out = {}
    for name, value in vars(dec).items():
        if name == "_verify_out":
            continue
        out[name] = _value(value)
    return out


def _value(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", v.detach().cpu().clone())
    if isinstance(v, KVCache):
        return ("cache", v.k.cpu().clone(), v.v.cpu().clone())
    if isinstance(v, (list, tuple)):
        return [_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _value(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):   # GpuTree: its tensors
        return {f.name: _value(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "rng"):                                   # SyntheticAcceptance
        return ("acceptance", v.weights, v.max_len, v.rng.getstate())
    return v


def assert_same_state(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        _assert_same(got[name], want[name], name)


def _assert_same(a, b, where):
    if isinstance(b, tuple) and b and b[0] in ("tensor", "cache"):
        assert a[0] == b[0], where
        for x, y in zip(a[1:], b[1:]):
            assert x.dtype == y.dtype and torch.equal(x, y), where
    elif isinstance(b, list):
        assert isinstance(a, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in b:
            _assert_same(a[k], b[k], f"{where}[{k}]")
    else:
        assert a == b, where


def steps(dec, n: int) -> list[list[int]]:
    got = [dec.step() for _ in range(n)]
    return got + [dec.finish()] if hasattr(dec, "finish") else got


# -- the decoders ---------------------------------------------------------------------------

def spec_case(acceptance: str):
    """(target, drafter, prompts of the measured run, other prompts of the same lengths)."""
    if acceptance == "greedy":
        # float64 and a drafter that knows the continuation: long accepted paths, sibling
        # branches (KV compaction), and exact equality (no argmax flips on rounding).
        target, drafter = make_models(21, block=6)
        prompts = prompts_for(21, LENS)
        ref = ar_reference(target, prompts, 90)
        drafter = OracleDrafter(drafter, ref, LENS, wrong_at={(6, 2), (13, 0)},
                                second_at={(0, 1), (6, 0), (19, 3)})
        return target, drafter, prompts, prompts_for(22, LENS)
    target, drafter = make_models(23, block=8, dtype=torch.float32)
    return target, drafter, None, None


def start(dec, acceptance: str, prompts, seed: int) -> None:
    if acceptance == "greedy":
        dec.prefill(prompts)
    else:
        dec.prefill_random([200, 150], seed=seed)


def reset_against_new(cls, target, drafter, kw, acceptance, prompts, other):
    """A decoder of `cls` built with seed 5 and stepped 9 times, and one built with seed 8,
    stepped 7 times on other prompts with a record left pending (as after the audit window),
    then reset to seed 5: the reset one must be in the new one's state and step the same."""
    new = cls(target, drafter, seed=5, **kw)
    new_state = state(new)
    start(new, acceptance, prompts, seed=1)
    want = steps(new, 9)

    used = cls(target, drafter, seed=8, **kw)
    start(used, acceptance, other, seed=2)
    for _ in range(7):
        used.step()
    used.reset(5)
    assert_same_state(state(used), new_state)
    start(used, acceptance, prompts, seed=1)
    assert steps(used, 9) == want
    return new, used


@pytest.mark.parametrize("acceptance", ["greedy", "synthetic"])
@pytest.mark.parametrize("tree_build,accept", MODES)
def test_fast_spec_decoder_reset_decodes_what_a_new_one_does(tree_build, accept, acceptance):
    target, drafter, prompts, other = spec_case(acceptance)
    kw = dict(batch=2, max_len=1024, tree_budget=16, tree_build=tree_build, accept=accept,
              acceptance=acceptance, tau=3.0, max_steps=64)
    new, used = reset_against_new(FastSpecDecoder, target, drafter, kw, acceptance, prompts, other)
    assert used.output == new.output and used.lengths_host == new.lengths_host
    assert used.lengths.tolist() == new.lengths.tolist() == new.lengths_host
    if acceptance == "greedy":
        assert all(len(o) > 9 for o in new.output)        # whole blocks were accepted


def test_fast_ar_decoder_reset_decodes_what_a_new_one_does():
    target, _ = make_models(24)
    prompts, other = prompts_for(24, [9, 21]), prompts_for(25, [9, 21])
    new = FastARDecoder(target, batch=2, max_len=128)
    new_state = state(new)
    new.prefill(prompts)
    want = steps(new, 12)
    assert new.output == ar_reference(target, prompts, 12)

    used = FastARDecoder(target, batch=2, max_len=128)
    used.prefill(other)
    for _ in range(5):
        used.step()
    used.reset(7)
    assert_same_state(state(used), new_state)
    used.prefill(prompts)
    assert steps(used, 12) == want and used.output == new.output


@pytest.mark.parametrize("acceptance", ["greedy", "synthetic"])
def test_baseline_decoder_reset_decodes_what_a_new_one_does(acceptance):
    target, drafter, prompts, other = spec_case(acceptance)
    kw = dict(batch=2, max_len=1024, tree_budget=16, acceptance=acceptance, tau=3.0)
    new, used = reset_against_new(SpecDecoder, target, drafter, kw, acceptance, prompts, other)
    assert used.output == new.output


# -- rewind: back to the prefill's state without running it again ---------------------------

def rewound_against_prefilled(dec, acceptance, prompts, n: int = 9):
    """`dec` prefilled and stepped n times, then rewound after 7 more steps with a record left
    unread, must step the same n steps again (greedy: the same tokens; synthetic: the same
    accepted lengths), from the prefill's lengths."""
    start(dec, acceptance, prompts, seed=1)
    want = steps(dec, n)
    first = [list(o) for o in dec.output]
    for _ in range(7):
        dec.step()
    dec.rewind()
    assert dec.output == [[] for _ in first]
    assert steps(dec, n) == want
    assert dec.output == first
    return want


@pytest.mark.parametrize("acceptance", ["greedy", "synthetic"])
@pytest.mark.parametrize("tree_build,accept", MODES)
def test_a_rewound_fast_spec_decoder_steps_as_after_its_prefill(tree_build, accept, acceptance):
    target, drafter, prompts, _ = spec_case(acceptance)
    dec = FastSpecDecoder(target, drafter, batch=2, max_len=1024, tree_budget=16,
                          tree_build=tree_build, accept=accept, acceptance=acceptance, tau=3.0,
                          max_steps=64, seed=5)
    want = rewound_against_prefilled(dec, acceptance, prompts)
    assert sum(map(sum, want)) > 18                    # more than a token a step: real blocks
    assert dec.lengths.tolist() == dec.lengths_host    # the device's lengths rewound too


def test_a_rewound_fast_ar_decoder_steps_as_after_its_prefill():
    target, _ = make_models(24)
    prompts = prompts_for(24, [9, 21])
    dec = FastARDecoder(target, batch=2, max_len=128)
    rewound_against_prefilled(dec, "greedy", prompts, n=12)
    assert dec.output == ar_reference(target, prompts, 12)
    assert dec.lengths.tolist() == dec.lengths_host == [9 + 12, 21 + 12]


@pytest.mark.parametrize("acceptance", ["greedy", "synthetic"])
def test_a_rewound_baseline_decoder_steps_as_after_its_prefill(acceptance):
    target, drafter, prompts, _ = spec_case(acceptance)
    dec = SpecDecoder(target, drafter, batch=2, max_len=1024, tree_budget=16,
                      acceptance=acceptance, tau=3.0, seed=5)
    rewound_against_prefilled(dec, acceptance, prompts)


# -- the workload ---------------------------------------------------------------------------

@pytest.fixture
def clean_process():
    """No models or decoder kept from an earlier test, and none left for a later one."""
    decode.release()
    yield
    decode.release()


def cell_of(**kw) -> dict:
    base = dict(model="tiny", context_length=40, steps=4, repeats=3, warmup_steps=1,
                profile_steps=0, device="cpu", tree_budget=8, block_size=6)
    return params.canonical(dict(base, **kw))


def kept_output() -> list[list[int]]:
    """The committed tokens of the last repeat, from the decoder the process kept."""
    (dec,) = decode._DECODERS.values()
    return [list(o) for o in dec.output]


CELLS = {
    "baseline": dict(),                                          # SpecDecoder, host loop
    "fast-gpu": dict(tree_build="gpu", accept="gpu", acceptance="synthetic", tau=3.0),
    "fast-mixed": dict(tree_build="cpu", accept="gpu"),
    "ar": dict(speculation="none"),
}


@pytest.mark.parametrize("kind", CELLS)
def test_a_kept_decoder_measures_what_a_new_one_does(kind, clean_process):
    cell = cell_of(**CELLS[kind])
    first = decode.run(cell, lambda **_: None)
    first_out = kept_output()
    second = decode.run(cell, lambda **_: None)
    assert second["samples"]["accept_len_mean"] == first["samples"]["accept_len_mean"]
    assert second["metrics"]["accept_len_mean"] == first["metrics"]["accept_len_mean"]
    assert kept_output() == first_out
    decode.release()
    third = decode.run(cell, lambda **_: None)       # a new process, as far as caches go
    assert third["samples"]["accept_len_mean"] == first["samples"]["accept_len_mean"]
    assert kept_output() == first_out

    assert first["reuse"] == third["reuse"] == {"model": False, "decoder": False}
    assert second["reuse"] == {"model": True, "decoder": True}
    assert "reuse" not in second["metrics"] and "timing" not in second["metrics"]
    if kind == "fast-gpu":
        assert len(set(first["samples"]["accept_len_mean"])) > 1    # the seeds do differ


@pytest.mark.parametrize("kind", CELLS)
def test_a_settled_window_decodes_what_an_unsettled_one_does(kind, clean_process):
    """warmup_s decodes before the window without moving it: the window's committed tokens
    and synthetic draws are the same with and without it, and the steps are counted."""
    cell = cell_of(**CELLS[kind])
    plain = decode.run(cell, lambda **_: None)
    plain_out = kept_output()
    assert plain["settle"] == {"seconds": 0.0, "steps": [0, 0, 0]}     # a CPU: none by default
    settled = decode.run(dict(cell, warmup_s=0.05), lambda **_: None)
    assert settled["samples"]["accept_len_mean"] == plain["samples"]["accept_len_mean"]
    assert kept_output() == plain_out
    steps = settled["settle"]["steps"]
    assert settled["settle"]["seconds"] == 0.05 and len(steps) == 3
    assert all(n > 0 and n % (cell["warmup_steps"] + cell["steps"]) == 0 for n in steps)
    assert settled["timing"]["warmup_s"] >= 3 * 0.05


def test_settling_steps_in_runs_and_rewinds_after_each_until_its_time_has_passed():
    log, now = [], [0.0]

    class Decoder:
        def step(self):
            log.append("step")
            now[0] += 0.1

        def rewind(self):
            log.append("rewind")

    assert decode.settle(Decoder(), 0.0, 3, clock=lambda: now[0]) == 0 and log == []
    # a first run (whose step may capture a graph), then runs of 0.3 s until 0.5 s have passed
    assert decode.settle(Decoder(), 0.5, 3, clock=lambda: now[0]) == 9
    assert log == (["step"] * 3 + ["rewind"]) * 3


def test_a_gpu_settles_by_default_and_a_scenario_can_say_otherwise():
    from harness.protocol.workloads.decode import GPU_SETTLE_S, settle_seconds
    cell = cell_of()
    assert cell["warmup_s"] is None
    assert settle_seconds(cell, cuda=True) == GPU_SETTLE_S > 0
    assert settle_seconds(cell, cuda=False) == 0.0
    assert settle_seconds(dict(cell, warmup_s=0), cuda=True) == 0.0
    assert settle_seconds(dict(cell, warmup_s=2.5), cuda=False) == 2.5


def test_what_a_result_says_it_settled():
    from harness.protocol.workloads.decode import settled
    decode_cell = {"workload": "decode"}
    assert settled({"cell": decode_cell, "settle": {"seconds": 2.0, "steps": [150]}}) == 2.0
    assert settled({"cell": decode_cell}) == 0.0       # a worker from before settling
    assert settled({"cell": {"context_length": 64}}) == 0.0    # a cell from before workloads
    assert settled({"cell": {"workload": "kernel"}, "settle": {"seconds": 2.0}}) is None
    assert settled({"cell": decode_cell, "settle": {"seconds": True}}) is None
    assert settled({"metrics": {}}) is None            # no cell: cannot tell


def test_samples_and_timing(clean_process):
    cell = cell_of(repeats=3, steps=5)
    first = decode.run(cell, lambda **_: None)
    second = decode.run(cell, lambda **_: None)
    for out in (first, second):
        s, m = out["samples"], out["metrics"]
        assert len(s["step_ms_p50"]) == 3 and len(s["step_ms"]) == 15
        for r in range(3):
            assert s["step_ms_p50"][r] == measure.percentile(s["step_ms"][5 * r: 5 * r + 5], 50)
        assert m["step_ms_p50"] == measure.percentile(s["step_ms"], 50)
        t = out["timing"]
        assert set(t) == {"build_s", "setup_s", "warmup_s", "window_s", "profile_s"}
        assert all(isinstance(v, float) and v >= 0 for v in t.values())
        assert t["setup_s"] > 0 and t["warmup_s"] > 0 and t["window_s"] > 0
        assert t["profile_s"] == 0.0                                # CPU: no profile window
    assert first["timing"]["build_s"] > 0 and second["timing"]["build_s"] == 0.0


def test_another_cell_gets_a_new_decoder_and_another_model_drops_it(clean_process):
    quiet = lambda **_: None  # noqa: E731
    cell = cell_of(repeats=1)
    decode.run(cell, quiet)
    (old,) = decode._DECODERS.values()
    old = weakref.ref(old)
    more_steps = decode.run(dict(cell, steps=5), quiet)       # a measurement knob: max_len
    assert more_steps["reuse"] == {"model": True, "decoder": False}
    gc.collect()
    assert len(decode._DECODERS) == 1 and old() is None     # one decoder at a time
    other_model = decode.run(dict(cell, seed=1), quiet)
    assert other_model["reuse"] == {"model": False, "decoder": False}
    assert len(decode._DECODERS) == 1 and len(decode._MODELS) == 1
    back = decode.run(dict(cell, seed=1), quiet)
    assert back["reuse"] == {"model": True, "decoder": True}


def test_a_failed_cell_frees_its_decoder(clean_process, monkeypatch):
    cell = cell_of(repeats=1)
    decode.run(cell, lambda **_: None)
    kept = weakref.ref(next(iter(decode._DECODERS.values())))

    def fail(dec):
        raise RuntimeError("out of memory (simulated)")

    freed_by_then = []

    def empty_cache():            # the memory goes back here: the decoder must be gone by then
        gc.collect()
        freed_by_then.append(kept() is None)

    monkeypatch.setattr(decode, "drain", fail)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    out = worker.run_cell(cell)
    assert out["status"] == "failed" and "out of memory (simulated)" in out["error"]
    assert "in _run" in out["error"]                  # the traceback survives the cleared frames
    assert decode._DECODERS == {} and freed_by_then == [True]
    monkeypatch.undo()
    again = decode.run(cell, lambda **_: None)
    assert again["reuse"] == {"model": True, "decoder": False}


# -- CUDA graphs (GPU only) -----------------------------------------------------------------

GRAPH_MODES = [("gpu", "gpu", "full"), ("gpu", "gpu", "verify"), ("cpu", "cpu", "verify")]


@pytest.mark.gpu
@pytest.mark.parametrize("acceptance", ["greedy", "synthetic"])
@pytest.mark.parametrize("tree_build,accept,graph", GRAPH_MODES)
def test_a_reset_keeps_its_graphs_and_decodes_what_a_new_one_does(tree_build, accept, graph,
                                                                   acceptance):
    target, drafter = make_models(26, block=8, dtype=torch.float32)
    target, drafter = target.cuda(), drafter.cuda()
    kw = dict(batch=2, max_len=1024, tree_budget=16, tree_build=tree_build, accept=accept,
              acceptance=acceptance, tau=3.0, max_steps=64)
    runs = {}
    for name, g in (("eager", "none"), ("graph", graph)):
        new = FastSpecDecoder(target, drafter, seed=5, graph_capture=g, **kw)
        new.prefill_random([200, 150], seed=1)
        runs[name] = (steps(new, 9), new.output)
    # The capturing call is one step like any other: graph and eager decode step for step.
    assert runs["graph"] == runs["eager"]

    used = FastSpecDecoder(target, drafter, seed=8, graph_capture=graph, **kw)
    used.prefill_random([200, 150], seed=2)
    for _ in range(7):
        used.step()
    graphs = dict(used.graphs)
    assert graphs
    used.reset(5)
    used.prefill_random([200, 150], seed=1)
    assert (steps(used, 9), used.output) == runs["graph"]
    assert used.graphs == graphs                                  # replayed, not recaptured


@pytest.mark.gpu
def test_a_reset_ar_decoder_keeps_its_graph():
    target, _ = make_models(27, dtype=torch.float32)
    target = target.cuda()
    prompts, other = prompts_for(27, [9, 21]), prompts_for(28, [9, 21])
    eager = FastARDecoder(target, batch=2, max_len=128, graph_capture="none")
    eager.prefill(prompts)
    want = steps(eager, 12)
    used = FastARDecoder(target, batch=2, max_len=128, graph_capture="full")
    used.prefill(other)
    for _ in range(5):
        used.step()
    graph = used.graphs["ar"]
    used.reset(0)
    used.prefill(prompts)
    assert steps(used, 12) == want and used.output == eager.output
    assert used.graphs == {"ar": graph}


@pytest.mark.gpu
@pytest.mark.parametrize("graph", ["full", "verify"])
def test_a_kept_graph_decoder_measures_what_a_new_one_does(graph, clean_process):
    cell = cell_of(device="cuda", dtype="float32", tree_build="gpu", accept="gpu",
                   graph_capture=graph, acceptance="synthetic", tau=3.0, profile_steps=2)
    first = decode.run(cell, lambda **_: None)
    second = decode.run(cell, lambda **_: None)
    assert second["reuse"] == {"model": True, "decoder": True}
    assert second["samples"]["accept_len_mean"] == first["samples"]["accept_len_mean"]
    assert second["timing"]["profile_s"] > 0
