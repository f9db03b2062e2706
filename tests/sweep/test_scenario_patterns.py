"""A parameter's `pattern` is matched against the whole scenario value, as hosts.yaml matches
it (harness/hosts/inventory.py, re.fullmatch): a value that merely contains a match (`a/b` for
a path, `sk-${KEY}` for a variable) is refused with one `file:line:col:` line, exit 2, while
every documented good value of every pattern still validates."""

from __future__ import annotations

import json
import os
import re

import pytest

from cli_process import run_cli
from harness.protocol import params
from harness.protocol.errors import InputError
from harness.protocol.workloads import SPECS
from harness.sweep.scenario import load_scenario

# What a cell of each workload needs besides the value under test.
NEEDS = {"service": {"service_start": "/opt/sglang/bin/python -m sglang.launch_server"},
         "pytest_benchmark": {"benchmark": "tests/test_x.py::test_y[a]"}}

# Values the parameter's `what`, docs and shipped scenarios give as good ones.
GOOD = {
    "compare_modes": ["", "custom", "custom,triton,flex"],   # beside verify_mode sdpa
    "benchmark": ["tests/test_x.py::test_y[param]", "test_topk"],
    "bench_group": ["topk", "verify attention"],
    "bench_params": ["", "k=16,dtype=bf16"],
    "service_unit": ["sglang.service", "vllm@0.service"],
    "service_name": ["engine", "sglang-8b_v0.5"],
    "prompt_word": [" hello", "x", "two\nlines"],
    "service_url": ["http://127.0.0.1:8000", "https://engine.example:443/v1", "http://h"],
    "service_ready": ["/health", "/", "/v1/models"],
    "service_api_key": ["${VLLM_API_KEY}", "${_K1}"],
    "service_profile_start": ["/start_profile"],
    "service_profile_stop": ["/stop_profile", "/end_profile"],
    "service_metrics": ["/metrics"],
    "service_gpus": ["0", "0,1,2,3"],
}

# Values that contain a match somewhere but are not one: what a search let through.
BAD = {
    "compare_modes": ["sdpa,"],
    "service_unit": ["sglang.service.d/x", "my unit.service"],
    "service_name": ["bad name!", "a/b"],
    "service_url": ["see http://127.0.0.1:8000", "http://a b"],
    "service_ready": ["a/b", "health", "/a b"],
    "service_api_key": ["sk-${KEY}", "${KEY}x"],
    "service_profile_start": ["start_profile/"],
    "service_profile_stop": ["x/stop_profile"],
    "service_metrics": ["metrics/"],
    "service_gpus": ["0,1;rm", "a0"],
}

PATTERNED = {name: p for name, p in params.PARAMS.items() if p.pattern}
OWNER = {p.name: workload for workload, spec in SPECS.items() for p in spec.params}


def test_every_patterned_parameter_has_good_values_listed():
    assert set(GOOD) == set(PATTERNED)
    assert set(BAD) <= set(PATTERNED)


def _scenario(tmp_path, name: str, value: str):
    # JSON is YAML: the value goes in exactly as written, whatever its characters
    cell = {"workload": OWNER[name], **NEEDS.get(OWNER[name], {}), name: value}
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ndefaults:\n" + "".join(
        f"  {k}: {json.dumps(v)}\n" for k, v in cell.items()) + "matrix:\n  seed: [0]\n")
    return path


@pytest.mark.parametrize("name,value", [(n, v) for n, vs in GOOD.items() for v in vs])
def test_documented_good_values_validate(tmp_path, name, value):
    [cell] = load_scenario(_scenario(tmp_path, name, value)).cells()
    assert cell[name] == value


@pytest.mark.parametrize("name,value", [(n, v) for n, vs in BAD.items() for v in vs])
def test_a_value_that_only_contains_a_match_is_refused_at_its_node(tmp_path, name, value):
    path = _scenario(tmp_path, name, value)
    with pytest.raises(InputError) as info:
        load_scenario(path).cells()
    message = str(info.value)
    line = 4 + len(NEEDS.get(OWNER[name], {}))      # name, defaults, workload, needs, it
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}:{len(name) + 5}: {name} must be "), message
    assert PATTERNED[name].what in message


@pytest.mark.parametrize("name,value", [(n, v) for n, vs in {**GOOD, **BAD}.items() for v in vs])
def test_a_scenario_checks_a_value_as_hosts_yaml_does(tmp_path, name, value):
    whole = re.fullmatch(PATTERNED[name].pattern, value) is not None
    try:
        load_scenario(_scenario(tmp_path, name, value)).cells()
        accepted = True
    except InputError:
        accepted = False
    assert accepted == whole


def test_validate_refuses_a_path_that_is_not_one_in_one_line_exit_2(tmp_path):
    _scenario(tmp_path, "service_ready", "a/b")
    proc = run_cli(["validate", "s.yaml"], cwd=tmp_path, env=dict(os.environ, COLUMNS="200"),
                   timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == ["error: s.yaml:5:18: service_ready must be a path starting with /, "
                     "got 'a/b'"], lines
