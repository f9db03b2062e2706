"""The peer workload: transformers' own greedy decoding of the cell's target, run for real (a
tiny Qwen3 of the `tiny` preset's shapes on the CPU), timed from outside `generate`."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the peer workload runs transformers")

from harness.protocol import params  # noqa: E402
from harness.sweep.scenario import parse_scenario  # noqa: E402
from harness.worker import main as worker  # noqa: E402

CELL = {"workload": "peer", "model": "tiny", "context_length": 24, "steps": 32, "repeats": 2,
        "warmup_steps": 1, "device": "cpu"}


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_a_peer_cell_decodes_with_transformers_and_reports_tokens_per_s(cache):
    r = worker.run_cell({**CELL, "peer_cache": cache})
    assert r["status"] == "ok", r["error"]
    assert r["label"] == f"peer transformers {cache} tiny ctx=24"
    assert r["metrics"]["tokens_per_s"] > 0 and len(r["samples"]["tokens_per_s"]) == 2
    assert r["peer"]["library"] == "transformers" and r["peer"]["cache"] == cache
    assert r["peer"]["compiled"] is False          # transformers compiles only on a GPU


def test_the_peer_is_the_harness_target_in_transformers():
    """Same shapes and parameter count as the target the decode cells run (its embedding and
    head untied as ours)."""
    import torch
    import transformers

    from harness.decode.model import Target, TargetConfig
    from harness.protocol import presets
    from harness.worker.workloads.peer import qwen3_config
    ours = Target(TargetConfig(**presets.PRESETS["tiny"]["target"]))
    theirs = transformers.Qwen3ForCausalLM(qwen3_config(transformers, "tiny", 512))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(theirs) == count(ours)
    assert isinstance(theirs.lm_head.weight, torch.nn.Parameter)
    assert theirs.lm_head.weight.data_ptr() != theirs.model.embed_tokens.weight.data_ptr()


def test_peer_cells_validate_and_name_their_limits():
    sc = parse_scenario("name: x\ndefaults: {workload: peer, model: tiny}\nmatrix:\n"
                        "  peer_cache: [static, dynamic]\n", "s.yaml")
    assert [params.cell_label(c) for c in sc.cells()] == [
        "peer transformers static tiny ctx=256", "peer transformers dynamic tiny ctx=256"]
    with pytest.raises(Exception, match="plus 10 generated tokens exceeds model 'tiny' limit 8192"):
        parse_scenario("name: x\ndefaults: {workload: peer, model: tiny}\nmatrix:\n"
                       "  context_length: [8190]\n", "s.yaml")
    with pytest.raises(Exception, match="fused_ops picks kernels of the decode workload"):
        parse_scenario("name: x\ndefaults: {workload: peer}\nmatrix:\n  fused_ops: [true]\n",
                       "s.yaml")
