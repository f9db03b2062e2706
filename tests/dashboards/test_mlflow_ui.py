"""The MLflow UI a user gets, in headless Chromium against a real `mlflow server`: the link
`harness run` prints opens the run with its description (the summary table), the experiment
opens on its runs, not on MLflow 3's GenAI overview of traces, the printed view link opens the
saved benchmark view (its columns in order, rows grouped by verify mode, a chart of each metric
against context length), and a cell's GPU samples are charted in its run's System metrics tab."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from cli_process import run_cli
from live_dom import dom_when
from mlflow_server import mlflow_server

from harness.dashboards import headless

pytestmark = [
    pytest.mark.skipif(headless.find_chromium() is None, reason="Chromium is not installed"),
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]

SCENARIO = ("name: ui-check\ndescription: Two no-op cells, to look at in the UI.\n"
            "matrix: {workload: [noop], seed: [1, 2]}\n")


DECODE_METRICS = ["tokens_per_s", "idle_fraction", "accept_len_mean", "step_ms_p50"]
# A page's condition for dom_when (whose window is wide enough for the runs table to render
# every column of the view: it renders only those in sight): the table shows this column.
HAS_COLUMN = "document.querySelector('[role=columnheader][col-id=\"%s\"]')"


def dom(url: str) -> str:
    """The page after its scripts ran (Chromium's virtual time: no fixed sleep)."""
    out = subprocess.run([headless.find_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=20000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    return out.stdout


def table_columns(page: str) -> list[str]:
    """The runs table's param and metric columns, left to right (ag-grid's header cells)."""
    cells = re.findall(r'role="columnheader"[^>]*aria-colindex="(\d+)"[^>]*col-id="([^"]+)"', page)
    return [c for _, c in sorted((int(i), c) for i, c in cells)
            if c.startswith(("params.", "metrics."))]


def test_the_printed_link_and_the_experiment_open_on_runs(tmp_path, fresh_store):
    uri = fresh_store(tmp_path)
    (tmp_path / "s.yaml").write_text(SCENARIO)
    run = run_cli(["run", "s.yaml", "--tracking-uri", uri], cwd=tmp_path,
                  env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    assert run.returncode == 0, run.stderr + run.stdout
    link = re.search(r"http://127\.0\.0\.1:5000/(#/experiments/(\d+)/runs/\w+\?\S+)", run.stdout)
    assert link, run.stdout

    with mlflow_server(uri, tmp_path / "server") as port:
        base = f"http://127.0.0.1:{port}/"
        page = dom(base + link.group(1))
        assert "ui-check" in page and "2 ok" in page          # the run's description
        assert page.count("noop") >= 2                         # a row per cell in it
        experiment = dom(f"{base}#/experiments/{link.group(2)}?workflowType=machine_learning")
        assert ">Runs<" in experiment and "Detect Issues" not in experiment
        # The printed view link: the experiment's saved view, its param columns first.
        view = re.search(r"MLflow benchmark view: http://127\.0\.0\.1:5000/(\S+)", run.stdout)
        assert view, run.stdout
        columns = table_columns(dom_when(base + view.group(1), HAS_COLUMN % "params.`verify_mode`"))
        assert columns[:2] == ["params.`context_length`", "params.`verify_mode`"], columns
        # The bare experiment page has no view to open: its table shows no param column.
        assert 'col-id="attributes.`Run Name`"' in experiment and table_columns(experiment) == []


def test_the_benchmark_view_and_the_system_metrics_in_a_browser(tmp_path, fresh_store):
    from test_tracking import gpu_series, make_result

    from harness.protocol.params import cell_id
    from harness.sweep.journal import RunJournal, new_run_id
    from harness.sweep.tracking import log_run

    uri = fresh_store(tmp_path)
    cells = [{"context_length": ctx, "verify_mode": mode}
             for ctx in (256, 1024) for mode in ("sdpa", "triton")]
    journal = RunJournal.create(tmp_path / "runs", new_run_id(), "view-check", None,
                                "name: view-check\n", cells, {})
    for i, cell in enumerate(cells):
        result = make_result(cell, tps=100.0 + i) | {"gpu_series": gpu_series()}
        result["metrics"]["idle_fraction"] = 0.1 * i         # as a GPU host measures it
        journal.write_cell(result)
    report = log_run(journal, uri)
    child = journal.tracking_state()["logged"][cell_id(cells[0])]

    with mlflow_server(uri, tmp_path / "server") as port:
        base = f"http://127.0.0.1:{port}/"
        view = report.view_url.replace("http://127.0.0.1:5000/", base)
        table = dom_when(view, HAS_COLUMN % "metrics.`step_ms_p50`")
        assert table_columns(table) == [f"params.`{p}`" for p in (
            "context_length", "verify_mode", "graph_capture", "tree_build")] + [
            f"metrics.`{m}`" for m in DECODE_METRICS]
        assert "Group by: verify_mode" in table
        assert "Group: sdpa" in table and "Group: triton" in table
        assert ">Benchmark<" in table                          # the Views menu names it

        charts = dom_when(view.replace("&workflowType", "&compareRunsMode=CHART&workflowType"),
                          "document.querySelectorAll('text.ytitle').length >= 4")
        titles = re.findall(r'<text class="([xy])title"[^>]*>([^<]+)<', charts)
        assert sorted(t for axis, t in titles if axis == "y") == sorted(DECODE_METRICS)
        assert [t for axis, t in titles if axis == "x"] == ["context_length"] * 4

        system = dom_when(f"{base}#/experiments/{report.experiment_id}/runs/{child}/"
                          f"system-metrics?workflowType=machine_learning",
                          "document.querySelectorAll('.js-plotly-plot').length >= 4")
        for name in ("utilization_percentage", "memory_usage_megabytes", "power_usage_watts",
                     "sm_clock_megahertz"):
            assert f"gpu_0_{name}" in system
        assert system.count("js-plotly-plot") >= 4            # a chart of each, drawn
        assert 'data-unformatted="Time"' in system             # over the samples' own times
