"""MLflow upload of a journal, against a real sqlite store (no mocks), and the figures.

One store per module: creating MLflow's sqlite schema takes seconds. Each test uses its own
scenario name, hence its own experiment, so tests stay independent.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

# mlflow 3.17's sqlalchemy store uses a loader strategy SQLAlchemy 2.1 deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

from harness.sweep.journal import RunJournal, new_run_id
from harness.protocol.params import canonical, cell_id, cell_label
from harness.sweep.tracking import (
    TrackingUnavailable, default_tracking_uri, log_run, resolve_tracking_uri,
)

CELLS = [
    {"context_length": 256, "verify_mode": "sdpa"},
    {"context_length": 1024, "verify_mode": "sdpa"},
    {"context_length": 256, "verify_mode": "flex", "graph_capture": "verify"},
]


def make_result(cell: dict, status: str = "ok", tps: float = 100.0,
                started_at: str = "2026-01-01T00:00:00+00:00") -> dict:
    ok = status == "ok"
    cell = canonical(cell)  # workers return the canonical params
    return {
        "cell": cell, "cell_id": cell_id(cell), "label": cell_label(cell), "status": status,
        "error": None if ok else "RuntimeError: CUDA out of memory\n" + "x" * 6000,
        "metrics": {"tokens_per_s": tps, "tokens_per_s_spread": 2.0, "accept_len_mean": 3.25,
                    "step_ms_p50": 4.0, "idle_fraction": None, "phase.draft.host_ms": 0.5}
        if ok else {},
        "samples": {"tokens_per_s": [tps - 1, tps, tps + 1], "accept_len_mean": [3.0, 3.5, 3.25]}
        if ok else {},
        "env": {"hostname": "box", "python": "3.11.7", "torch": "2.13.0", "device": "cpu",
                "gpu": None, "driver": None},
        "host": "local", "started_at": started_at, "wall_s": 2.5,
    }


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture
def client(store):
    from mlflow import MlflowClient

    return MlflowClient(store)


def make_journal(tmp_path: Path, scenario: str, statuses=("ok", "ok", "failed")) -> RunJournal:
    j = RunJournal.create(tmp_path / "runs", new_run_id(), scenario, f"scenarios/{scenario}.yaml",
                          f"name: {scenario}\n", CELLS,
                          {"git_sha": "abc123", "git_branch": "main", "trigger": "nightly",
                           "hosts": ["local"]})
    for cell, status in zip(CELLS, statuses):
        j.write_cell(make_result(cell, status))
    return j


def test_the_targets_verdicts_are_in_the_description_and_counted(tmp_path, store, client):
    """A scenario's targets (harness.sweep.targets): their table opens the parent's description
    and their verdicts are counted as the parent's metrics, for a history of them."""
    text = ("name: aimed\ntargets:\n"
            "  - {name: fast, cells: verify_mode=sdpa, metric: tokens_per_s, min: 50}\n"
            "  - {name: flex fast, cells: verify_mode=flex, metric: tokens_per_s, min: 50}\n"
            "  - {name: idle, cells: verify_mode=sdpa, metric: idle_fraction, max: 0.01}\n"
            "  - {name: very fast, cells: context_length=256 and verify_mode=sdpa, metric: tokens_per_s, min: 1000}\n")
    j = RunJournal.create(tmp_path / "runs", new_run_id(), "aimed", "scenarios/aimed.yaml", text, CELLS,
                          {"git_sha": "abc123", "trigger": "nightly", "hosts": ["local"]})
    for cell, status in zip(CELLS, ("ok", "ok", "failed")):
        j.write_cell(make_result(cell, status))
    parent = client.get_run(log_run(j, store).parent_run_id)
    assert parent.data.metrics == {"n_ok": 2.0, "n_failed": 1.0, "targets_met": 1.0, "targets_not_met": 1.0,
                                   "targets_absent": 2.0}
    note = parent.data.tags["mlflow.note.content"]
    assert "| fast | 100 / 100 | tokens_per_s >= 50 | met |" in note
    assert "| flex fast | ? | tokens_per_s >= 50 | absent (failed: 1 of 1) |" in note
    assert "| very fast | 100 | tokens_per_s >= 1000 | not met (1 of 1 outside) |" in note
    assert note.index("| target |") < note.index("| cell |")


def children_of(client, report):
    return client.search_runs([report.experiment_id],
                              f"tags.mlflow.parentRunId = '{report.parent_run_id}'")


def test_log_run_creates_parent_and_children(tmp_path, store, client):
    j = make_journal(tmp_path, "layout")
    report = log_run(j, store)
    assert report.logged_now == 3 and report.already_logged == 0
    assert report.parent_run_id in report.ui_hint

    exp = client.get_experiment(report.experiment_id)
    assert exp.name == "layout"
    # A benchmark's experiment, not MLflow 3's GenAI default (which opens on traces).
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # Artifacts go next to the database, not into ./mlruns of the CWD.
    assert exp.artifact_location == (Path(store[len("sqlite:///"):]).parent / "mlartifacts").as_uri()

    parent = client.get_run(report.parent_run_id)
    assert parent.info.run_name == j.run_id
    assert parent.data.tags["harness.run_id"] == j.run_id
    assert "mlflow.parentRunId" not in parent.data.tags
    for k, v in {"git.sha": "abc123", "git.branch": "main", "trigger": "nightly",
                 "host": "local", "gpu": "none"}.items():
        assert parent.data.tags[k] == v
    assert parent.data.params == {"scenario": "layout", "trigger": "nightly", "n_cells": "3"}
    assert parent.data.metrics == {"n_ok": 2.0, "n_failed": 1.0}
    # Its description (the run page's "Description"): the summary table, a row per cell.
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith(f"**layout**, run `{j.run_id}`: 2 ok, 1 failed · commit `abc123`")
    assert all(f"| {cell_label(c)} |" in note for c in CELLS)
    assert parent.info.status == "FAILED"  # one cell failed
    artifacts = {a.path for a in client.list_artifacts(report.parent_run_id)}
    assert {"scenario.yaml", "env.json", "tokens_vs_context.png"} <= artifacts
    env = client.download_artifacts(report.parent_run_id, "env.json", str(tmp_path))
    env = json.loads(Path(env).read_text())
    assert env["worker_env"]["device"] == "cpu" and env["controller"]["python"]

    children = {r.data.tags["harness.cell_id"]: r for r in children_of(client, report)}
    assert set(children) == {cell_id(c) for c in CELLS}

    ok = children[cell_id(CELLS[0])]
    assert ok.info.run_name == cell_label(CELLS[0])
    assert ok.info.status == "FINISHED"
    for k, v in {"status": "ok", "baseline": "false", "git.sha": "abc123", "git.branch": "main",
                 "host": "local", "gpu": "none", "trigger": "nightly",
                 "harness.run_id": j.run_id}.items():
        assert ok.data.tags[k] == v
    # Every canonical cell parameter, JSON-spelled (None -> "null").
    assert ok.data.params == {k: v if isinstance(v, str) else json.dumps(v)
                              for k, v in canonical(CELLS[0]).items()}
    assert ok.data.params["checkpoint"] == "null"
    assert ok.data.params["context_length"] == "256"
    # Null metrics (idle_fraction on CPU) are skipped, never logged as a number.
    assert ok.data.metrics == {"tokens_per_s": 100.0, "tokens_per_s_spread": 2.0,
                               "accept_len_mean": 3.25, "step_ms_p50": 4.0,
                               "phase.draft.host_ms": 0.5, "tokens_per_s_repeat": 101.0}
    series = client.get_metric_history(ok.info.run_id, "tokens_per_s_repeat")
    assert [(m.step, m.value) for m in sorted(series, key=lambda m: m.step)] == [
        (0, 99.0), (1, 100.0), (2, 101.0)]
    cell_json = client.download_artifacts(ok.info.run_id, "cell.json", str(tmp_path))
    assert json.loads(Path(cell_json).read_text()) == j.results()[cell_id(CELLS[0])]

    failed = children[cell_id(CELLS[2])]
    assert failed.data.tags["status"] == "failed"
    assert failed.info.status == "FAILED"
    assert failed.data.tags["error"].startswith("RuntimeError: CUDA out of memory")
    assert len(failed.data.tags["error"]) == 5000
    assert failed.data.metrics == {}

    state = j.tracking_state()
    assert state["parent_run_id"] == report.parent_run_id
    assert state["logged"] == {cid: r.info.run_id for cid, r in children.items()}
    assert (j.path / "tokens_vs_context.png").is_file()


def test_log_run_twice_logs_nothing_new(tmp_path, store, client):
    j = make_journal(tmp_path, "idempotent")
    first = log_run(j, store)
    second = log_run(j, store)
    assert second.parent_run_id == first.parent_run_id
    assert (second.logged_now, second.already_logged) == (0, 3)
    assert len(children_of(client, first)) == 3
    # No duplicate history for the parent's counters either.
    assert len(client.get_metric_history(first.parent_run_id, "n_ok")) == 1

    # Without tracking.json (lost, or resumed elsewhere) the parent and children are found
    # again through their tags in MLflow itself.
    (j.path / "tracking.json").unlink()
    third = log_run(j, store)
    assert third.parent_run_id == first.parent_run_id
    assert (third.logged_now, third.already_logged) == (0, 3)
    parents = client.search_runs([first.experiment_id], f"tags.`harness.run_id` = '{j.run_id}'")
    assert len(parents) == 4  # 1 parent + 3 children, nothing duplicated


def test_resume_logs_a_new_child_for_a_retried_cell(tmp_path, store, client):
    j = make_journal(tmp_path, "resume")
    first = log_run(j, store)
    failed_cid = cell_id(CELLS[2])
    old_child = j.tracking_state()["logged"][failed_cid]
    assert j.missing() == [CELLS[2]]

    # --resume re-runs the failed cell; this time it succeeds.
    j.write_cell(make_result(CELLS[2], "ok", tps=80.0, started_at="2026-01-02T00:00:00+00:00"))
    assert j.missing() == []
    second = log_run(j, store)
    assert second.parent_run_id == first.parent_run_id
    assert (second.logged_now, second.already_logged) == (1, 2)

    new_child = j.tracking_state()["logged"][failed_cid]
    assert new_child != old_child
    new = client.get_run(new_child)
    assert new.data.tags["status"] == "ok" and new.data.metrics["tokens_per_s"] == 80.0
    assert new.data.tags["mlflow.parentRunId"] == first.parent_run_id
    assert client.get_run(old_child).data.tags["harness.superseded_by"] == new_child
    parent = client.get_run(first.parent_run_id)
    assert parent.data.metrics == {"n_ok": 3.0, "n_failed": 0.0}
    assert parent.info.status == "FINISHED"
    assert len(children_of(client, first)) == 4


def test_child_cut_off_mid_upload_is_redone(tmp_path, store, client):
    j = make_journal(tmp_path, "cutoff", statuses=("ok",))
    first = log_run(j, store)
    (child,) = children_of(client, first)
    # What a crash between create_run and the final set_terminated leaves behind.
    client.update_run(child.info.run_id, status="RUNNING")
    second = log_run(j, store)
    assert (second.logged_now, second.already_logged) == (1, 0)
    (redone,) = children_of(client, first)  # the partial one was deleted
    assert redone.info.run_id != child.info.run_id
    assert redone.data.metrics["tokens_per_s"] == 100.0
    assert client.get_run(first.parent_run_id).info.status == "KILLED"  # 2 cells never ran


def test_deleted_experiment_is_a_tracking_error(tmp_path, store, client):
    j = make_journal(tmp_path, "deleted", statuses=("ok",))
    report = log_run(j, store)
    client.delete_experiment(report.experiment_id)
    with pytest.raises(TrackingUnavailable, match="deleted"):
        log_run(j, store)


def test_unreachable_server_fails_fast(tmp_path):
    j = make_journal(tmp_path, "unreachable", statuses=("ok",))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TrackingUnavailable, match="unreachable") as info:
        log_run(j, f"http://127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    assert "\n" not in str(info.value)
    assert j.tracking_state()["logged"] == {}  # the journal is untouched


def test_tracking_uris(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri() == "sqlite:///results/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert default_tracking_uri() == "http://mlflow:5000"
    assert resolve_tracking_uri("http://mlflow:5000") == "http://mlflow:5000"

    monkeypatch.chdir(tmp_path)
    uri = resolve_tracking_uri("sqlite:///results/mlflow.db")
    assert uri == f"sqlite:///{tmp_path.resolve()}/results/mlflow.db"
    assert (tmp_path / "results").is_dir()
    assert resolve_tracking_uri(uri) == uri  # already absolute: unchanged


def test_tracking_module_does_not_import_mlflow():
    # `harness validate` imports the controller modules and must stay fast.
    code = "import sys, harness.sweep.tracking, harness.sweep.journal; print('mlflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_figure_renders_ok_and_failed_cells(tmp_path):
    from harness.dashboards.figures import tokens_vs_context

    results = [make_result(c) for c in CELLS[:2]] + [make_result(CELLS[2], "failed")]
    results.append(make_result({"context_length": 65536, "verify_mode": "sdpa"}, tps=12.0))
    no_samples = make_result({"context_length": 4096, "verify_mode": "sdpa"}, tps=50.0)
    no_samples["samples"] = {}  # error bar from tokens_per_s_spread instead
    results.append(no_samples)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = tokens_vs_context(results, tmp_path / "figs" / "tvc.png")
        empty = tokens_vs_context([make_result(CELLS[0], "failed")], tmp_path / "empty.png")
    for path in (out, empty):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_database_store_is_probed_by_connecting_to_it():
    """A network database store is found down in one connect, not after MLflow's ~12 s of
    engine retries; sqlite and file stores have nothing to connect to."""
    import socket

    from harness.sweep.tracking import TrackingUnavailable, check_reachable
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        check_reachable(f"postgresql://u:secret@127.0.0.1:{port}/mlflow")     # answers: fine
    with pytest.raises(TrackingUnavailable) as info:                         # closed now
        check_reachable(f"mysql+pymysql://u:secret@127.0.0.1:{port}/mlflow", timeout=1)
    assert f"MLflow store mysql+pymysql://u:***@127.0.0.1:{port}/mlflow unreachable" in str(info.value)
    assert "secret" not in str(info.value)
    check_reachable("sqlite:////nonexistent/dir/mlflow.db")
    check_reachable("file:///nonexistent/mlruns")


def test_the_experiment_says_what_the_scenario_is_and_keeps_what_a_person_wrote(
        tmp_path, store, client):
    j = RunJournal.create(tmp_path / "runs", new_run_id(), "described", None,
                          "name: described\ndescription: Verify kernels at 4k-64k.\n"
                          "matrix:\n  workload: [noop]\n", [{"workload": "noop"}], {})
    report = log_run(j, store)
    exp = client.get_experiment(report.experiment_id)
    assert exp.tags["mlflow.note.content"] == "Verify kernels at 4k-64k."
    client.set_experiment_tag(report.experiment_id, "mlflow.note.content", "edited by a person")
    client.set_experiment_tag(report.experiment_id, "mlflow.experimentKind", "finetuning")
    again = RunJournal.create(tmp_path / "runs", new_run_id(), "described", None,
                              "name: described\ndescription: changed\nmatrix:\n  workload: [noop]\n",
                              [{"workload": "noop"}], {})
    log_run(again, store)
    tags = client.get_experiment(report.experiment_id).tags
    assert tags["mlflow.note.content"] == "edited by a person"
    assert tags["mlflow.experimentKind"] == "finetuning"


# -- the GPU's samples as system metrics, the saved benchmark view ----------------------------

def gpu_series(index: int = 0, origin: float = 1767225600.25) -> dict:
    """A result's `gpu_series` as the worker writes it (harness.worker.gpuseries)."""
    return {"gpu_index": index, "origin": origin, "interval_s": 0.5, "t_s": [0.0, 0.5, 1.0],
            "utilization_pct": [90, None, 95], "memory_used_mb": [1610.6, 1700.0, 1800.5],
            "sm_clock_mhz": [1980, 1965, 1980], "power_w": [350.5, 400.0, 410.2]}


def test_gpu_samples_become_the_child_runs_system_metrics(tmp_path, store, client):
    j = RunJournal.create(tmp_path / "runs", new_run_id(), "sysmetrics", None,
                          "name: sysmetrics\n", CELLS, {})
    with_series = make_result(CELLS[0]) | {"gpu_series": gpu_series()}
    j.write_cell(with_series)
    j.write_cell(make_result(CELLS[1]))                                  # a CPU host: no series
    j.write_cell(make_result(CELLS[2], "failed") | {"gpu_series": gpu_series(index=3)})
    report = log_run(j, store)
    children = {r.data.tags["harness.cell_id"]: r.info.run_id for r in children_of(client, report)}

    run_id = children[cell_id(CELLS[0])]
    origin_ms = 1767225600250
    # MLflow's own names (mlflow/system_metrics/metrics/gpu_monitor.py), a step per sample, each
    # at its own time; the sample NVML could not read is skipped, not logged as a number.
    history = client.get_metric_history(run_id, "system/gpu_0_utilization_percentage")
    assert sorted((m.step, m.value, m.timestamp) for m in history) == [
        (0, 90.0, origin_ms), (2, 95.0, origin_ms + 1000)]
    for key, values in {"memory_usage_megabytes": [1610.6, 1700.0, 1800.5],
                        "power_usage_watts": [350.5, 400.0, 410.2],
                        "sm_clock_megahertz": [1980.0, 1965.0, 1980.0]}.items():
        history = client.get_metric_history(run_id, f"system/gpu_0_{key}")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == values
        assert [m.timestamp for m in sorted(history, key=lambda m: m.step)] == [
            origin_ms, origin_ms + 500, origin_ms + 1000]
    assert client.get_run(run_id).data.metrics["tokens_per_s"] == 100.0   # the cell's own too

    plain = client.get_run(children[cell_id(CELLS[1])]).data.metrics
    assert not [k for k in plain if k.startswith("system/")]
    # A failed cell keeps no measurement of its workload, but the GPU's samples are the host's.
    failed = client.get_run(children[cell_id(CELLS[2])]).data.metrics
    assert set(failed) == {f"system/gpu_3_{k}" for k in (
        "utilization_percentage", "memory_usage_megabytes", "power_usage_watts",
        "sm_clock_megahertz")}


def test_a_malformed_gpu_series_logs_nothing_rather_than_failing():
    from harness.sweep.system_metrics import system_metrics

    for series in (None, [], {"gpu_index": 0}, {"gpu_index": None, "t_s": [0.0]},
                   {"gpu_index": True, "t_s": [0.0], "power_w": [1.0]},
                   {"gpu_index": 0, "t_s": "0", "power_w": [1.0]},
                   {"gpu_index": 0, "t_s": [0.0, 1.0], "power_w": [float("nan"), "x"]}):
        assert system_metrics({"gpu_series": series}, 5000) == []
    # No origin: counted from the run's start.
    series = {"gpu_index": 1, "t_s": [0.25], "power_w": [7]}
    assert system_metrics({"gpu_series": series}, 5000) == [
        ("system/gpu_1_power_usage_watts", 7.0, 5250, 0)]


def test_the_experiment_gets_a_saved_benchmark_view(tmp_path, store, client):
    from harness.sweep import mlflow_view

    j = make_journal(tmp_path, "viewed", statuses=("ok",))
    report = log_run(j, store)
    tag = client.get_experiment(report.experiment_id).tags[mlflow_view.TAG]
    assert tag.startswith("{") and mlflow_view.TAG == "mlflow.sharedViewState.benchmark"
    envelope = json.loads(tag)
    assert envelope["name"] == "Benchmark" and isinstance(envelope["createdAt"], int)
    state = json.loads(envelope["state"])
    assert state["selectedColumns"] == [
        "params.`context_length`", "params.`verify_mode`", "params.`graph_capture`",
        "params.`tree_build`", "metrics.`tokens_per_s`", "metrics.`idle_fraction`",
        "metrics.`accept_len_mean`", "metrics.`step_ms_p50`"]
    assert state["groupBy"]["groupByKeys"] == [{"mode": "param", "groupByData": "verify_mode"}]
    charts = [(c["type"], c["xaxis"], c["yaxis"]) for c in state["compareRunCharts"]]
    assert charts == [("SCATTER", {"key": "context_length", "type": "PARAM"},
                       {"key": m, "type": "METRIC"})
                      for m in ("tokens_per_s", "idle_fraction", "accept_len_mean", "step_ms_p50")]
    # The view opens only from its link: printed, and in the parent run's description.
    link = f"#/experiments/{report.experiment_id}/runs?viewStateShareKey=benchmark"
    assert report.view_url.endswith(link + "&workflowType=machine_learning")
    assert f"MLflow benchmark view: {report.view_url}" in str(report)
    note = client.get_run(report.parent_run_id).data.tags["mlflow.note.content"]
    assert f"[table]({link}&workflowType=machine_learning)" in note
    assert f"({link}&compareRunsMode=CHART&workflowType=machine_learning)" in note

    # Kernel cells in a later run of the scenario add their metrics to the harness's view ...
    kernel = RunJournal.create(tmp_path / "runs", new_run_id(), "viewed", None, "name: viewed\n",
                               [{"workload": "kernel"}], {})
    log_run(kernel, store)
    state = json.loads(json.loads(
        client.get_experiment(report.experiment_id).tags[mlflow_view.TAG])["state"])
    assert "metrics.`kernel_us`" in state["selectedColumns"]
    assert "metrics.`tokens_per_s`" in state["selectedColumns"]
    # ... but a view a person overwrote in the UI (no "harness" key any more) stays theirs.
    mine = json.dumps({"name": "Mine", "createdAt": 1, "updatedAt": 2, "state": "{}"})
    client.set_experiment_tag(report.experiment_id, mlflow_view.TAG, mine)
    log_run(make_journal(tmp_path, "viewed", statuses=("ok",)), store)
    assert client.get_experiment(report.experiment_id).tags[mlflow_view.TAG] == mine
    assert mlflow_view.view_tag("{not a view", ["decode"], 1) is None     # nor one it cannot read
