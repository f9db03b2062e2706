"""The MLflow UI a user gets, in headless Chromium against a real `mlflow server`: the link
`harness run` prints opens the run with its description (the summary table), and the
experiment opens on its runs, not on MLflow 3's GenAI overview of traces."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from cli_process import run_cli
from mlflow_server import mlflow_server

from harness.dashboards import headless

pytestmark = [
    pytest.mark.skipif(headless.find_chromium() is None, reason="Chromium is not installed"),
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning"),
]

SCENARIO = ("name: ui-check\ndescription: Two no-op cells, to look at in the UI.\n"
            "matrix: {workload: [noop], seed: [1, 2]}\n")


def dom(url: str) -> str:
    """The page after its scripts ran (Chromium's virtual time: no fixed sleep)."""
    out = subprocess.run([headless.find_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=20000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    return out.stdout


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
