"""What a service cell must declare (scenario validation: exit 2, one line at the YAML node),
the systemd drop-in a cell's toggles become, and the acceptance length read from Prometheus
text in the formats SGLang and vLLM expose."""

from __future__ import annotations

import json
import os

import pytest
from cli_process import run_cli

from harness.protocol import params
from harness.worker import engine_metrics, service_proc

GOOD = ("name: s\ndefaults:\n  workload: service\n  service_start: /opt/sglang/bin/python -m "
        "sglang.launch_server --port 30000\n")


@pytest.mark.parametrize("extra, where, says", [
    ("  service_manager: systemd\n", "s.yaml:5:20", "service_manager systemd needs service_unit"),
    ("  service_api_key: sk-live-123\n", "s.yaml:5:20", "service_api_key must be ${VAR}"),
    ("  service_env: CUDA_GRAPH\n", "s.yaml:5:16", "service_env word 'CUDA_GRAPH' is not KEY=VALUE"),
    ("  service_flags: \"--tree-budget '64\"\n", "s.yaml:5:18", "unbalanced quoting"),
    ("  service_manager: external\n  service_flags: --disable-cuda-graph\n", "s.yaml:6:18",
     "service_manager external applies no toggles"),
])
def test_a_bad_service_declaration_is_one_line_at_its_node(tmp_path, extra, where, says):
    (tmp_path / "s.yaml").write_text(GOOD + extra + "matrix:\n  context_length: [4096]\n")
    proc = run_cli(["validate", "s.yaml"], cwd=tmp_path, env=dict(os.environ, COLUMNS="200"),
                   timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {where}: ") and says in lines[0], lines


def test_the_good_declaration_validates(tmp_path):
    (tmp_path / "s.yaml").write_text(GOOD + "matrix:\n  context_length: [4096, 65536]\n")
    proc = run_cli(["validate", "s.yaml"], cwd=tmp_path, env=dict(os.environ, COLUMNS="200"),
                   timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_toggles_become_a_systemd_drop_in():
    cell = params.canonical({"workload": "service", "service_manager": "systemd",
                             "service_unit": "sglang.service",
                             "service_env": "SGLANG_VERIFY_KERNEL=triton 'NOTE=a \"b\" c'",
                             "service_flags": "--speculative-algorithm DDTREE "
                                              "--disable-cuda-graph"})
    assert service_proc.dropin_text(cell).splitlines() == [
        "# written by the harness's service workload: this cell's toggles",
        "[Service]",
        'Environment="SGLANG_VERIFY_KERNEL=triton"',
        'Environment="NOTE=a \\"b\\" c"',
        'Environment="HARNESS_SERVICE_FLAGS=--speculative-algorithm DDTREE --disable-cuda-graph"',
    ]


SGLANG = """# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="qwen3-8b",engine_type="unified",tp_rank="0"} 3.5
sglang:spec_accept_length{model_name="qwen3-8b",engine_type="unified",tp_rank="1"} 4.5
sglang:num_running_reqs{model_name="qwen3-8b"} 2.0
"""
VLLM_BEFORE = """vllm:spec_decode_num_drafts_total{model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 250.0
"""
VLLM_AFTER = """vllm:spec_decode_num_drafts_total{model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 400.0
vllm:spec_decode_num_draft_tokens_total{model_name="m"} NaN
"""


def test_acceptance_length_from_prometheus_text():
    assert engine_metrics.accept_len({}, engine_metrics.parse(SGLANG)) == 4.0   # ranks averaged
    before, after = engine_metrics.parse(VLLM_BEFORE), engine_metrics.parse(VLLM_AFTER)
    assert engine_metrics.accept_len(before, after) == 1 + 150 / 50             # over the cell
    assert engine_metrics.accept_len(after, after) is None                      # no drafts since
    assert engine_metrics.accept_len({}, engine_metrics.parse("# nothing\n")) is None


def test_the_shipped_example_starts_its_engine_once_per_setting():
    from pathlib import Path

    from harness.sweep.scenario import load_scenario
    scenario = load_scenario(Path(__file__).resolve().parents[2] / "scenarios"
                             / "service-example.yaml")
    cells = scenario.cells()
    assert len(cells) == len(set(scenario.cell_ids())) == 48
    # Cells run in matrix order, toggles outermost: each setting's cells are contiguous.
    settings = [service_proc.toggles(params.canonical(c)) for c in cells]
    starts = sum(1 for i, t in enumerate(settings) if i == 0 or t != settings[i - 1])
    assert starts == len({json.dumps(t, sort_keys=True) for t in settings}) == 8
