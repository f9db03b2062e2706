"""A host's own serving engine (hosts.yaml `service:`) meeting a scenario's cells: which values a
cell runs with, the conflicts refused before anything runs (one hosts.yaml:line:col line, exit
2), the same rules in the worker, and the deployment recorded beside a result without secrets.
The real engine declared this way is in test_service_engine.py."""

from __future__ import annotations

import json
import os

import pytest
from cli_process import run_cli

from harness.hosts import service as host_service
from harness.hosts.inventory import parse_hosts
from harness.protocol import deployment, params
from harness.protocol.errors import InputError
from harness.sweep.scenario import parse_scenario
from harness.worker.service_proc import ServiceError
from harness.worker.workloads import service as runner

HOSTS = """\
hosts:
  h200-a:
    ssh: h200-a
    env: {SGLANG_API_KEY: "${SPECDEC_TEST_KEY}"}
    service:
      start: /opt/sglang/bin/python -m sglang.launch_server --port 30000
      url: http://127.0.0.1:30000
      ready_timeout_s: 900
      api_key: ${SGLANG_API_KEY}
  unit-host:
    ssh: unit-host
    service: {manager: systemd, unit: sglang.service}
  outside:
    ssh: outside
    service: {manager: external, url: "http://127.0.0.1:30000"}
  bare:
    ssh: bare
"""


@pytest.fixture
def hosts(monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_KEY", "sk-very-secret")
    return parse_hosts(HOSTS, "hosts.yaml")


def scenario(defaults: str, matrix: str = "  context_length: [4096]\n"):
    text = "name: s\ndefaults:\n  workload: service\n" + defaults + "matrix:\n" + matrix
    return parse_scenario(text, "s.yaml")


def cells(defaults: str) -> list[dict]:
    return scenario(defaults).cells()


def check(defaults: str, host) -> None:
    """As harness run checks: with the parameters the scenario itself sets."""
    sc = scenario(defaults)
    host_service.check_cells(sc.cells(), [host], "s.yaml", sc.given)


def refusal(defaults: str, host) -> str:
    with pytest.raises(InputError) as err:
        check(defaults, host)
    return str(err.value)


def test_the_host_fills_what_the_cell_leaves_at_its_default(hosts):
    [cell] = cells("  service_flags: --disable-cuda-graph\n  service_trace_dir: /tmp/t\n")
    declared = hosts["h200-a"].service.declared
    check("  service_flags: --disable-cuda-graph\n  service_trace_dir: /tmp/t\n",
          hosts["h200-a"])                                                 # no conflict
    run = deployment.effective(cell, declared)
    assert run["service_start"].startswith("/opt/sglang/bin/python")
    assert (run["service_url"], run["service_ready_timeout_s"]) == ("http://127.0.0.1:30000", 900)
    # the scenario's toggles and what the block leaves out stay the cell's
    assert run["service_flags"] == "--disable-cuda-graph" and run["service_trace_dir"] == "/tmp/t"
    # the cell's id is the scenario's: the deployment is where it ran
    assert params.cell_id(cell) != params.cell_id(run)
    # a value the cell writes as the host does is no conflict
    check("  service_url: http://127.0.0.1:30000\n  service_manager: setsid\n", hosts["h200-a"])


def test_a_default_the_scenario_writes_out_is_set(hosts):
    """harness run knows what the scenario writes: the default URL written out meets the
    host's; the worker, which sees only the canonical cell, cannot tell it from a default."""
    assert "the cell sets service_url to http://127.0.0.1:8000" in refusal(
        "  service_url: http://127.0.0.1:8000\n", hosts["h200-a"])
    [cell] = cells("  service_url: http://127.0.0.1:8000\n")
    declared = hosts["h200-a"].service.declared
    assert deployment.conflict(cell, declared) is None
    assert deployment.effective(cell, declared)["service_url"] == "http://127.0.0.1:30000"


@pytest.mark.parametrize("defaults, host, where, says", [
    # a value declared twice, differently: at the host's value, naming both sides
    ("  service_url: http://127.0.0.1:8001\n", "h200-a", "hosts.yaml:7:12",
     "the cell sets service_url to http://127.0.0.1:8001, the host's service: to "
     "http://127.0.0.1:30000"),
    ("  service_ready_timeout_s: 60\n", "h200-a", "hosts.yaml:8:24",
     "service_ready_timeout_s to 60"),
    # which engine runs is one declaration: a cell's start command on a host with a service
    ("  service_start: engine --port 1\n", "h200-a", "hosts.yaml:6:14",
     "the cell sets service_start (engine --port 1), but the host's service: declares how its "
     "engine is started"),
    ("  service_start: engine --port 1\n", "unit-host", "hosts.yaml:12:5",
     "the cell sets service_start"),
    ("  service_manager: external\n", "h200-a", "hosts.yaml:5:5", "the cell sets service_manager"),
    # the effective cell's own checks: an external engine takes no toggles
    ("  service_flags: --disable-cuda-graph\n", "outside", "hosts.yaml:15:24",
     "service_manager external applies no toggles"),
])
def test_a_cell_its_host_contradicts_is_refused_at_the_hosts_line(hosts, defaults, host, where,
                                                                   says):
    got = refusal(defaults, hosts[host])
    assert got.startswith(f"{where}: host '{host}', cell 'service engine ctx=4096") and says in got, got
    assert "\n" not in got


def test_a_cell_without_an_engine_needs_a_host_that_declares_one(hosts):
    check("  service_flags: --x\n", hosts["unit-host"])
    got = refusal("  service_flags: --x\n", hosts["bare"])
    assert got == ("s.yaml: cell 'service engine ctx=4096 out=64 c=1 --x' declares no engine "
                   "(service_start) and host 'bare' has no service: in hosts.yaml; give one of "
                   "them")
    # other workloads' cells are not the service's business
    host_service.check_cells([params.canonical({"workload": "noop"})], [hosts["bare"]], "s.yaml")


def test_harness_run_refuses_the_conflict_in_one_line_before_anything_runs(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  local:\n    service:\n      start: engine\n"
                                         "      url: http://127.0.0.1:30000\n")
    (tmp_path / "s.yaml").write_text("name: s\ndefaults:\n  workload: service\n  service_url: "
                                     "http://127.0.0.1:8000\nmatrix:\n  context_length: [64]\n")
    proc = run_cli(["run", "s.yaml"], cwd=tmp_path, env=dict(os.environ, COLUMNS="1000"),
                   timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: hosts.yaml:5:12: host 'local'"), lines
    assert not (tmp_path / "results").exists()
    # the same scenario without the URL is fine on that host (the plan, nothing run)
    (tmp_path / "s.yaml").write_text("name: s\ndefaults:\n  workload: service\nmatrix:\n"
                                     "  context_length: [64]\n")
    proc = run_cli(["run", "s.yaml", "--dry-run"], cwd=tmp_path,
                   env=dict(os.environ, COLUMNS="1000"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_worker_applies_the_same_rules_from_its_environment(hosts):
    carried = hosts["h200-a"].env[deployment.DEPLOYMENT_ENV]
    [cell] = cells("  service_flags: --x\n")
    run = runner.deployed(cell, carried)
    assert run == deployment.effective(cell, hosts["h200-a"].service.declared)
    assert runner.deployed(dict(cell, service_start="e"), None)["service_start"] == "e"
    with pytest.raises(ServiceError, match="service_manager setsid needs service_start"):
        runner.deployed(cell, None)
    with pytest.raises(ServiceError, match="the cell sets service_url to http://h:1, the host's"):
        runner.deployed(dict(cell, service_url="http://h:1"), carried)
    with pytest.raises(ServiceError, match="the host's service declaration is unreadable"):
        runner.deployed(cell, '{"not_a_parameter": 1}')
    with pytest.raises(ServiceError, match="applies no toggles"):
        runner.deployed(cell, hosts["outside"].env[deployment.DEPLOYMENT_ENV])


def test_a_result_records_its_deployment_and_never_the_key(hosts):
    [cell] = cells("  service_flags: --x\n")
    result = {"cell": cell, "status": "ok"}
    host_service.record(hosts["h200-a"], result)
    assert result["deployment"] == {
        "host": "h200-a", "declared_in": "hosts.yaml:5", "service_manager": "setsid",
        "service_start": "/opt/sglang/bin/python -m sglang.launch_server --port 30000",
        "service_url": "http://127.0.0.1:30000", "service_ready_timeout_s": 900,
        "service_api_key": "${SGLANG_API_KEY}"}
    assert "sk-very-secret" not in json.dumps(result)
    assert "sk-very-secret" not in hosts["h200-a"].env[deployment.DEPLOYMENT_ENV]
    other = {"cell": params.canonical({"workload": "noop"})}
    host_service.record(hosts["h200-a"], other)            # not a service cell: nothing added
    bare = {"cell": cell}
    host_service.record(hosts["bare"], bare)
    assert "deployment" not in other and "deployment" not in bare


def test_the_shipped_example_and_the_readme_declare_the_engine_in_hosts_yaml(monkeypatch):
    """The worked example as written: its header's hosts.yaml entry (and the README's) parses,
    and the example's cells, toggles and load alone, run on that host without a conflict."""
    from pathlib import Path

    from harness.sweep.scenario import load_scenario
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("SGLANG_API_KEY", "k")
    monkeypatch.setenv("HF_TOKEN", "t")
    path = root / "scenarios" / "service-example.yaml"
    header = [line[2:] if line.startswith("# ") else "" for line in path.read_text().splitlines()]
    start = header.index("  hosts:")
    block = []
    for line in header[start:]:
        if not line.startswith("  "):
            break
        block.append(line[2:])
    readme = (root / "README.md").read_text()
    fenced = readme[readme.index("```yaml\n# hosts.yaml\nhosts:\n  h200-a:"):]
    fenced = fenced[len("```yaml\n"):fenced.index("```", 3)]
    sc = load_scenario(path)
    for text in ("\n".join(block) + "\n", fenced):
        host = parse_hosts(text, "hosts.yaml")["h200-a"]
        assert host.service.declared["service_start"].startswith("/opt/sglang/bin/python -m "
                                                                 "sglang.launch_server")
        host_service.check_cells(sc.cells(), [host], str(path), sc.given)
    with pytest.raises(InputError, match="declares no engine"):      # and nowhere else
        host_service.check_cells(sc.cells(), [parse_hosts("", "h.yaml")["local"]], str(path),
                                 sc.given)
