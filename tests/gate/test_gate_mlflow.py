"""MLflow as a baseline source and as the history store, against a real sqlite store.

Runs are logged with harness.sweep.tracking.log_run from journals made here and marked with
`harness baseline mark`; the gate, `baseline show` and `history` then read them back. One
store per module (creating MLflow's schema takes seconds); each test uses its own scenario
name, hence its own experiment.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

from harness.cli import app  # noqa: E402
from harness.gate import baselines  # noqa: E402
from harness.gate.history import analyse, fetch_metrics  # noqa: E402
from harness.gate.policy import DEFAULT_POLICIES  # noqa: E402
from harness.protocol.errors import InputError  # noqa: E402
from harness.protocol.params import cell_id, cell_label  # noqa: E402
from harness.sweep.journal import RunJournal  # noqa: E402
from harness.sweep.scenario import parse_scenario  # noqa: E402
from harness.sweep.tracking import log_run  # noqa: E402

runner = CliRunner()


def scenario_text(name: str) -> str:
    return textwrap.dedent(f"""\
        name: {name}
        defaults: {{model: tiny, device: cpu, repeats: 5, profile_steps: 0}}
        matrix:
          context_length: [64, 128]
        """)


def write_scenario(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(scenario_text(name))
    return path


def make_journal(tmp_path: Path, name: str, run_id: str, tps: float, gpu: str | None,
                 started: str, sha: str = "abc1234") -> RunJournal:
    sc = parse_scenario(scenario_text(name), f"{name}.yaml")
    j = RunJournal.create(tmp_path / "results" / "runs", run_id, name, f"{name}.yaml", sc.text,
                          sc.cells(), {"git_sha": sha, "git_branch": "main", "trigger": "nightly"})
    for k, cell in enumerate(sc.cells()):
        samples = [tps * f for f in (0.99, 1.0, 1.01, 0.995, 1.005)]
        j.write_cell({"cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell),
                      "status": "ok", "error": None,
                      "metrics": {"tokens_per_s": tps, "accept_len_mean": 6.5, "step_ms_p50": 1000 / tps},
                      "samples": {"tokens_per_s": samples, "accept_len_mean": [6.5] * 5},
                      "env": {"gpu": gpu, "device": "cuda" if gpu else "cpu"}, "host": "local",
                      "started_at": started, "wall_s": 3.0})
    return j


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def harness(*args: str):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_mark_then_latest_baseline_of_the_same_gpu_class(tmp_path, store):
    name = "gate-mlflow-latest"
    old = make_journal(tmp_path, name, "20260101-000000-aaaaaa", 100.0, "NVIDIA H200",
                       "2026-01-01T00:00:00+00:00", sha="1111111")
    new = make_journal(tmp_path, name, "20260102-000000-bbbbbb", 110.0, "NVIDIA H200",
                       "2026-01-02T00:00:00+00:00", sha="2222222")
    later_unmarked = make_journal(tmp_path, name, "20260103-000000-cccccc", 50.0, "NVIDIA H200",
                                  "2026-01-03T00:00:00+00:00")
    other_class = make_journal(tmp_path, name, "20260104-000000-dddddd", 300.0,
                               "NVIDIA H100 80GB HBM3", "2026-01-04T00:00:00+00:00")
    log_run(later_unmarked, store)
    for j in (old, new, other_class):
        code, out = harness("baseline", "mark", j.run_id, "--results", tmp_path / "results",
                            "--tracking-uri", store)
        assert code == 0, out
        assert "2 cell run(s)" in out and "baseline=true" in out
    assert RunJournal.open(tmp_path / "results" / "runs", new.run_id).meta["baseline"] is True

    sides = baselines.from_mlflow(store, name, "h200")
    assert set(sides) == {c["cell_id"] for c in new.cells}
    side = next(iter(sides.values()))
    # The samples come back whole from the child's cell.json artifact.
    assert side.samples["tokens_per_s"] == pytest.approx([110 * f for f in (0.99, 1.0, 1.01, 0.995, 1.005)])
    assert side.git_sha == "2222222" and side.gpu_class == "h200"
    h100 = baselines.from_mlflow(store, name, "h100-80gb-hbm3")
    assert next(iter(h100.values())).samples["tokens_per_s"][1] == pytest.approx(300.0)

    with pytest.raises(InputError, match="GPU class 'a100'.*h100-80gb-hbm3, h200.*never compared"):
        baselines.from_mlflow(store, name, "a100")
    with pytest.raises(InputError, match="no MLflow experiment"):
        baselines.from_mlflow(store, "no-such-scenario", "h200")

    code, out = harness("baseline", "show", name, "--gpu", "h200", "--tracking-uri", store)
    assert code == 0 and "110.0 tok/s (n=5)" in out and "sha 2222222" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert len(rows) == 2 and len({ln.index("110.0 tok/s") for ln in rows}) == 1   # aligned
    # Two classes have baselines: say which, rather than guess.
    code, out = harness("baseline", "show", name, "--tracking-uri", store)
    assert code == 2 and "h100-80gb-hbm3, h200" in out and "--gpu" in out


def test_gate_against_the_mlflow_baseline(tmp_path, store):
    name = "gate-mlflow-gate"
    scenario = write_scenario(tmp_path, name)
    base = make_journal(tmp_path, name, "20260101-000000-eeeeee", 100.0, "NVIDIA H200",
                        "2026-01-01T00:00:00+00:00")
    code, out = harness("baseline", "mark", base.run_id, "--results", tmp_path / "results",
                        "--tracking-uri", store)
    assert code == 0, out
    # One class has baselines: it is the one meant, and its cells come back.
    assert set(baselines.from_mlflow(store, name, None)) == {c["cell_id"] for c in base.cells}
    code, out = harness("baseline", "show", name, "--tracking-uri", store)
    assert code == 0 and "100.0 tok/s (n=5)" in out, out

    slower = make_journal(tmp_path, name, "20260102-000000-ffffff", 90.0, "NVIDIA H200",
                          "2026-01-02T00:00:00+00:00")
    code, out = harness("gate", scenario, "--baseline", "mlflow", "--run", slower.run_id,
                        "--tracking-uri", store, "--results", tmp_path / "results",
                        "--json", tmp_path / "gate.json")
    assert code == 1, out
    report = json.loads((tmp_path / "gate.json").read_text())
    assert report["mode"] == "mlflow" and report["counts"]["regressed"] == 2
    tps = report["cells"][0]["metrics"][0]
    assert tps["metric"] == "tokens_per_s" and tps["hl_ratio"] == pytest.approx(0.9)
    assert "mlflow run" in report["cells"][0]["base_source"]

    same = make_journal(tmp_path, name, "20260103-000000-abcdef", 100.0, "NVIDIA H200",
                        "2026-01-03T00:00:00+00:00")
    code, out = harness("gate", scenario, "--baseline", "mlflow", "--run", same.run_id,
                        "--tracking-uri", store, "--results", tmp_path / "results")
    assert code == 0, out

    # A head on another GPU class has no baseline: exit 2, never a comparison with the H200.
    elsewhere = make_journal(tmp_path, name, "20260104-000000-fedcba", 100.0, "NVIDIA A100-SXM4-80GB",
                             "2026-01-04T00:00:00+00:00")
    code, out = harness("gate", scenario, "--baseline", "mlflow", "--run", elsewhere.run_id,
                        "--tracking-uri", store, "--results", tmp_path / "results")
    assert code == 2 and "a100-sxm4-80gb" in out and "never compared" in out


def test_history_names_the_commit_range_of_a_step(tmp_path, store):
    from mlflow import MlflowClient

    name = "gate-mlflow-history"
    client = MlflowClient(store)
    exp = client.create_experiment(name)
    values = [100, 101, 99, 100.5, 99.5, 100.2, 90, 89.5, 90.5, 90.2, 89.8, 90.1]
    cid = "0123456789ab"
    for i, v in enumerate(values):
        for trigger, value in (("nightly", v), ("pr", 10.0)):   # PR runs must be left out
            run = client.create_run(exp, run_name="tiny ctx=64", start_time=1_700_000_000_000 + i * 86_400_000,
                                    tags={"harness.cell_id": cid, "status": "ok", "gpu": "NVIDIA H200",
                                          "git.sha": f"{i:02d}" * 20, "git.branch": "main",
                                          "trigger": trigger, "harness.run_id": f"night-{i}",
                                          "mlflow.parentRunId": "p"})
            client.log_metric(run.info.run_id, "tokens_per_s", value)
            client.set_terminated(run.info.run_id)

    series = analyse(fetch_metrics(store, name, ["tokens_per_s"])["tokens_per_s"],
                     DEFAULT_POLICIES["tokens_per_s"])
    assert len(series) == 1 and len(series[0].points) == 12
    (step,) = series[0].steps
    assert step.index == 6 and series[0].commit_range(step) == f"{'05' * 5}..{'06' * 5}"

    code, out = harness("history", name, "--metric", "tokens_per_s", "--tracking-uri", store,
                        "--json", tmp_path / "h.json", "--plot", tmp_path / "plots")
    assert code == 1, out
    assert (tmp_path / "plots" / f"{cid}-h200-tokens_per_s.png").stat().st_size > 1000
    assert f"harness bisect --good {'05' * 20} --bad {'06' * 20} --cell {cid}" in out
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["series"][0]["steps"][0]["regression"] is True
    # Old enough to be acknowledged: not within the last 3 runs.
    code, out = harness("history", name, "--tracking-uri", store, "--recent", "3")
    assert code == 0, out
    code, out = harness("history", name, "--tracking-uri", store, "--gpu", "b200")
    assert code == 2 and "no ok runs" in out


def test_history_of_several_metrics_reads_once_and_reports_each(tmp_path, store):
    """--metric twice: each metric's table, JSON (FILE names {metric}) and exit; a metric with
    no history is an error line and exit 2 after the others are written."""
    from mlflow import MlflowClient

    name = "gate-mlflow-history-metrics"
    client = MlflowClient(store)
    exp = client.create_experiment(name)
    cid = "0123456789ab"
    for i in range(12):
        run = client.create_run(exp, run_name="tiny ctx=64", start_time=1_700_000_000_000 + i * 86_400_000,
                                tags={"harness.cell_id": cid, "status": "ok", "gpu": "NVIDIA H200",
                                      "git.sha": f"{i:02d}" * 20, "git.branch": "main",
                                      "trigger": "nightly", "harness.run_id": f"night-{i}",
                                      "mlflow.parentRunId": "p"})
        client.log_metric(run.info.run_id, "tokens_per_s", 100.0 + (i % 3) * 0.5)   # flat
        client.log_metric(run.info.run_id, "accept_len_mean", 6.0 if i < 6 else 5.0)  # a drop
        client.set_terminated(run.info.run_id)

    code, out = harness("history", name, "--metric", "tokens_per_s", "--metric", "accept_len_mean",
                        "--tracking-uri", store, "--json", tmp_path / "h-{metric}.json")
    assert code == 1, out                       # the accepted length's step is recent
    flat = json.loads((tmp_path / "h-tokens_per_s.json").read_text())
    drop = json.loads((tmp_path / "h-accept_len_mean.json").read_text())
    assert flat["metric"] == "tokens_per_s" and flat["series"][0]["steps"] == []
    (step,) = drop["series"][0]["steps"]
    assert step["regression"] and step["index"] == 6
    assert "accept_len_mean: 6 -> 5" in " ".join(out.split())

    code, out = harness("history", name, "--metric", "tokens_per_s", "--metric", "idle_fraction",
                        "--tracking-uri", store, "--json", tmp_path / "g-{metric}.json")
    assert code == 2 and "no ok runs with metric 'idle_fraction'" in " ".join(out.split())
    assert json.loads((tmp_path / "g-tokens_per_s.json").read_text())["series"]
    assert not (tmp_path / "g-idle_fraction.json").exists()

    code, out = harness("history", name, "--metric", "tokens_per_s", "--metric", "accept_len_mean",
                        "--tracking-uri", store, "--json", tmp_path / "one.json")
    assert code == 2 and "{metric}" in out and not (tmp_path / "one.json").exists()
    code, out = harness("history", name, "--metric", "tokens_per_s", "--metric", "accept_len_mean",
                        "--tracking-uri", store, "--direction", "lower")
    assert code == 2 and "one --metric" in " ".join(out.split())
