"""A service cell's engine is the host's (hosts.yaml `service:`), out of the cell id, and each
result records it (`deployment`, harness.hosts.service). The gate compares a service cell only
with a baseline measured on the same deployment — the same command, unit, model and URL — and
refuses another in one line, as it refuses a baseline that ran other kernels."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from harness.cli import app
from harness.gate import baselines
from harness.protocol import deployment
from harness.protocol.params import canonical, cell_id, cell_label
from harness.sweep.journal import RunJournal
from harness.sweep.scenario import parse_scenario

runner = CliRunner()
NAME = "gate-service"
TEXT = textwrap.dedent(f"""\
    name: {NAME}
    defaults: {{workload: service, repeats: 5}}
    matrix:
      concurrency: [1, 4]
    """)

SGLANG = {"host": "h200-a", "declared_in": "hosts.yaml:5", "service_manager": "setsid",
          "service_start": "/opt/sglang/bin/python -m sglang.launch_server --port 30000",
          "service_url": "http://127.0.0.1:30000", "service_ready_timeout_s": 900}
# The same engine declared for another host, on another line, readied more patiently: the same
# deployment (which host and how it is checked are not which engine answers).
SGLANG_ELSEWHERE = {**SGLANG, "host": "h200-b", "declared_in": "hosts.yaml:19",
                    "service_ready_timeout_s": 1800}
VLLM = {**SGLANG, "service_start": "/opt/vllm/bin/vllm serve Qwen/Qwen3-8B --port 30000"}


def journal(root: Path, run_id: str, tps: float, record: dict | None) -> RunJournal:
    """A run of TEXT's two service cells, each result recording `record` as its deployment
    (None: a result that records none)."""
    sc = parse_scenario(TEXT, "s.yaml")
    j = RunJournal.create(root / "runs", run_id, NAME, "s.yaml", TEXT, sc.cells(),
                          {"git_sha": "abc1234", "trigger": "nightly"})
    for cell in sc.cells():
        j.write_cell({"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell),
                      **({"deployment": record} if record is not None else {}),
                      "status": "ok", "error": None,
                      "metrics": {"tokens_per_s": tps, "ttft_ms_p50": 40.0},
                      "samples": {"tokens_per_s": [tps * f for f in (0.99, 1.0, 1.01, 0.995, 1.005)]},
                      "env": {"gpu": "NVIDIA H200"}, "started_at": "2026-01-01T00:00:00+00:00"})
    return j


def harness(*args):
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return r.exit_code, r.output


def latest_gate(results: Path) -> dict:
    # the newest by time: two gates of one second sort by their random suffix
    newest = max((results / "gates").glob("*/gate.json"), key=lambda p: p.stat().st_mtime_ns)
    return json.loads(newest.read_text())


def test_the_engine_a_result_measured():
    cell = canonical({"workload": "service"})
    assert deployment.engine({"cell": cell, "deployment": SGLANG}) == {
        "service_manager": "setsid", "service_start": SGLANG["service_start"],
        "service_unit": None, "service_model": None, "service_url": "http://127.0.0.1:30000"}
    assert (deployment.engine({"cell": cell, "deployment": SGLANG})
            == deployment.engine({"cell": cell, "deployment": SGLANG_ELSEWHERE}))
    # a cell that declares its own engine, on a host without service:
    own = canonical({"workload": "service", "service_start": "sglang serve",
                     "service_url": "http://h:1"})
    assert deployment.engine({"cell": own})["service_start"] == "sglang serve"
    assert deployment.engine({"cell": own})["service_url"] == "http://h:1"
    # an engine nobody recorded cannot be told; another workload has none
    assert deployment.engine({"cell": cell}) is None
    assert deployment.engine({"cell": canonical({})}) == {}


def gate_run_against_run(tmp_path, base, head) -> tuple[int, str]:
    """`harness gate` of run `head` against run `base` (journals under tmp_path/results)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    return harness("gate", scenario, "--baseline", f"run:{base.run_id}", "--run", head.run_id,
                   "--results", tmp_path / "results")


def test_a_baseline_from_another_deployment_is_not_compared(tmp_path):
    results = tmp_path / "results"
    base = journal(results, "20260104-000000-000001", 100.0, SGLANG)
    other = journal(results, "20260104-000000-000002", 150.0, VLLM)
    code, out = gate_run_against_run(tmp_path, base, other)
    assert code == 2 and "nothing was compared" in out, out
    gate = latest_gate(results)
    assert {c["verdict"] for c in gate["cells"]} == {"missing"}
    message = gate["cells"][0]["message"]
    assert "\n" not in message
    assert message == (
        f"baseline measured another deployment (service_start {SGLANG['service_start']}; this "
        f"run: service_start {VLLM['service_start']}): a different engine, not compared; mark "
        f"a baseline measured on this deployment")

    # The same deployment, recorded from another host's declaration: compared, unchanged.
    same = journal(results, "20260104-000000-000003", 100.0, SGLANG_ELSEWHERE)
    code, out = gate_run_against_run(tmp_path, base, same)
    assert code == 0, out
    assert {c["verdict"] for c in latest_gate(results)["cells"]} == {"unchanged"}


def test_a_baseline_file_keeps_the_deployment_it_measured(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TEXT)
    results = tmp_path / "results"
    base = journal(results, "20260105-000000-000001", 100.0, SGLANG)
    code, out = harness("baseline", "mark", base.run_id, "--no-mlflow", "--file",
                        "--results", results)
    assert code == 0, out
    [path] = (results / "baselines").glob(f"*/{NAME}.json")
    assert {e["deployment"]["service_start"] for e in json.loads(path.read_text())["cells"].values()
            } == {SGLANG["service_start"]}

    other = journal(results, "20260105-000000-000002", 100.0, VLLM)
    code, out = harness("gate", scenario, "--baseline", "file", "--run", other.run_id,
                        "--results", results)
    assert code == 2 and "baseline measured another deployment" in " ".join(out.split()), out
    same = journal(results, "20260105-000000-000003", 100.0, SGLANG_ELSEWHERE)
    code, out = harness("gate", scenario, "--baseline", "file", "--run", same.run_id,
                        "--results", results)
    assert code == 0, out


def test_what_differs_is_named_and_a_url_password_is_not():
    cell = canonical({"workload": "service"})
    unit = {"host": "u", "service_manager": "systemd", "service_unit": "sglang.service",
            "service_url": "http://bob:hunter2@h:30000"}
    moved = {**unit, "service_url": "http://bob:hunter2@h:30001", "service_model": "qwen3-8b"}
    base = baselines.side_from_results("c", "c", [{"cell": cell, "status": "ok",
                                                   "deployment": unit}], "base")
    head = baselines.side_from_results("c", "c", [{"cell": cell, "status": "ok",
                                                   "deployment": moved}], "head")
    why = baselines.other_deployment(head, base)
    assert why.startswith("baseline measured another deployment (service_model none, "
                          "service_url http://bob:***@h:30000; this run: service_model qwen3-8b, "
                          "service_url http://bob:***@h:30001)"), why
    assert "hunter2" not in why
    assert baselines.other_deployment(base, base) is None


def test_a_side_pooled_over_two_deployments_is_a_measurement_of_neither():
    cell = canonical({"workload": "service"})
    side = baselines.side_from_results("c", "c", [
        {"cell": cell, "status": "ok", "deployment": SGLANG, "metrics": {"tokens_per_s": 1.0}},
        {"cell": cell, "status": "ok", "deployment": VLLM, "metrics": {"tokens_per_s": 2.0}}],
        "base")
    assert side.error.startswith("measured on different deployments: ")
    assert side.engine is None


def test_an_engine_that_cannot_be_told_is_compared_as_before(tmp_path):
    # Results from before they recorded their deployment, of cells that declare no engine
    # (the host's hosts.yaml did): nothing says they differ, so they are compared.
    results = tmp_path / "results"
    base = journal(results, "20260106-000000-000001", 100.0, None)
    head = journal(results, "20260106-000000-000002", 100.0, VLLM)
    code, out = gate_run_against_run(tmp_path, base, head)
    assert code == 0, out


def test_the_gate_s_own_measurements_record_their_deployment():
    # As harness run does: a head the gate measures on a host with service: says which
    # engine answered, so other_deployment has something to compare.
    import asyncio

    from harness.gate import abtest
    from harness.gate.sequential import Design
    from harness.hosts.service import HostService

    class Host:
        name, slots, labels = "h200-a", 1, {}
        service = HostService("h200-a", {k: v for k, v in SGLANG.items()
                                         if k.startswith("service_")}, "hosts.yaml", (5, 3))

        async def run_cell(self, cell, slot, on_progress):
            await asyncio.sleep(0)
            return {"cell": cell, "status": "ok", "metrics": {"tokens_per_s": 1.0}}

    cell = canonical({"workload": "service"})
    measured = abtest.measure([cell], {"head": Host()}, design=Design(1, 1))
    [result] = measured.results[cell_id(cell)]["head"]
    assert result["deployment"]["service_start"] == SGLANG["service_start"]
    assert deployment.engine(result) == deployment.engine({"cell": cell, "deployment": SGLANG})
