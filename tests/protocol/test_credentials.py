"""A password or token in a tracking URI is used to connect and never recorded or printed:
not in run.json, tracking.json, the HTML report (uploaded to MLflow), the console, nor in the
MLflow store itself. A run logged with credentials needs them again to be resumed.

Real `harness` processes throughout; the logged path against a real `mlflow server` (started
once for the module), the failing paths against ports nobody listens on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_process import run_cli
from mlflow_server import free_port, mlflow_server

from harness.protocol.errors import InputError
from harness.protocol.redact import redact_uri, was_redacted

# mlflow 3.17's sqlalchemy store uses a loader strategy SQLAlchemy 2.1 deprecates: not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

SECRET = "pw-7Hq2Zx9"          # distinctive: MLflow's own schema has tables named "secrets"
NAP = "name: nap\ndefaults: {workload: noop, sleep_s: 0.01}\nmatrix:\n  seed: [0, 1, 2]\n"


def harness(*args: str, cwd: Path, env: dict | None = None, timeout: int = 240):
    full = dict(os.environ, COLUMNS="160")
    full.pop("MLFLOW_TRACKING_URI", None)
    full.update(env or {})
    return run_cli(args, cwd=cwd, env=full, timeout=timeout)


def run_id_from(stdout: str) -> str:
    return next(line.split()[1].rstrip(":") for line in stdout.splitlines()
                if line.startswith("Run "))


def files_holding(folder: Path, needle: str) -> list[str]:
    """Every file under `folder` whose bytes contain `needle` (sqlite files and PNGs too)."""
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def assert_nowhere(needle: str, *outputs, folders=()) -> None:
    for text in outputs:
        assert needle not in text, text
    for folder in folders:
        assert files_holding(Path(folder), needle) == []


# -- the function -------------------------------------------------------------------------------


@pytest.mark.parametrize("uri,shown", [
    ("http://user:pw@host:5000", "http://user:***@host:5000"),
    ("https://user:pw@mlflow.example.com/", "https://user:***@mlflow.example.com/"),
    ("postgresql://user:pw@db/mlflow", "postgresql://user:***@db/mlflow"),
    ("postgresql+psycopg2://user:p@ss:w@db:5432/mlflow?sslmode=require",
     "postgresql+psycopg2://user:***@db:5432/mlflow?sslmode=require"),
    ("mysql://u:pw@db/mlflow?password=pw", "mysql://u:***@db/mlflow?password=***"),
    ("http://host:5000/?token=abc&x=1", "http://host:5000/?token=***&x=1"),
    ("postgresql://db/mlflow?user=u&sslpassword=pw", "postgresql://db/mlflow?user=u&sslpassword=***"),
    ("https://host/?access_token=abc#f", "https://host/?access_token=***#f"),
    # Nothing secret: unchanged (a user name is not a secret, nor a port).
    ("http://user@host:5000", "http://user@host:5000"),
    ("http://host:5000/path", "http://host:5000/path"),
    ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ("databricks", "databricks"),
    # In a message or a command line, as URIs end up.
    ("API request to http://u:pw@h:1/api/2.0/x failed", "API request to http://u:***@h:1/api/2.0/x failed"),
    ("--tracking-uri=http://u:pw@h", "--tracking-uri=http://u:***@h"),
])
def test_redact_uri(uri, shown):
    assert redact_uri(uri) == shown
    assert redact_uri(shown) == shown                         # idempotent
    assert was_redacted(shown) == (shown != uri)
    assert not was_redacted(uri)


def test_input_errors_never_carry_a_password():
    err = InputError(None, None, None, f"malformed tracking URI 'htp://u:{SECRET}@h'")
    assert SECRET not in str(err) and "htp://u:***@h" in str(err)


# -- failing paths: nothing listens ------------------------------------------------------------


@pytest.mark.parametrize("uri", [
    f"http://user:{SECRET}@127.0.0.1:{{port}}",
    f"http://127.0.0.1:{{port}}/?token={SECRET}",
    f"postgresql+psycopg2://user:{SECRET}@127.0.0.1:{{port}}/mlflow",
    f"postgresql://127.0.0.1:{{port}}/mlflow?password={SECRET}",
])
def test_an_unreachable_store_is_named_without_its_secret(tmp_path, uri):
    uri = uri.format(port=free_port())
    (tmp_path / "nap.yaml").write_text(NAP)
    out = harness("run", "nap.yaml", "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 1, out.stderr + out.stdout        # ran, but not logged
    assert "MLflow logging failed" in out.stderr and "Traceback" not in out.stderr
    # Found unreachable up front, not after MLflow's own retries (minutes for a server,
    # ~12 s for a database).
    kind = "server" if uri.startswith("http") else "store"
    assert f"MLflow {kind} {redact_uri(uri)} unreachable" in out.stderr
    run_dir = tmp_path / "results" / "runs" / run_id_from(out.stdout)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["meta"]["tracking_uri"] == redact_uri(uri)
    assert redact_uri(uri) in run["meta"]["argv"]
    assert (run_dir / "report" / "index.html").is_file()
    assert_nowhere(SECRET, out.stdout, out.stderr, folders=[tmp_path])


def test_a_malformed_uri_is_refused_without_its_secret(tmp_path):
    (tmp_path / "nap.yaml").write_text(NAP)
    out = harness("run", "nap.yaml", "--tracking-uri", f"htp://user:{SECRET}@host", cwd=tmp_path)
    assert out.returncode == 2
    assert "malformed tracking URI 'htp://user:***@host'" in out.stderr
    assert_nowhere(SECRET, out.stdout, out.stderr)


def test_gate_and_ui_commands_name_the_store_without_its_secret(tmp_path):
    uri = f"http://user:{SECRET}@127.0.0.1:{free_port()}"
    shown = redact_uri(uri)
    out = harness("baseline", "show", "nap", "--gpu", "cpu", "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 2 and f"MLflow server {shown} unreachable" in out.stderr
    assert_nowhere(SECRET, out.stdout, out.stderr)
    out = harness("ui", "--tracking-uri", uri, cwd=tmp_path)   # a server: no UI started
    assert out.returncode == 0 and f"has its own UI: {shown}" in out.stdout
    assert_nowhere(SECRET, out.stdout, out.stderr)


# -- the logged path: a real MLflow server -------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on a free port: (its port, its folder: database and artifacts).
    It takes no password; the client sends the URI's as basic auth, which it ignores."""
    where = tmp_path_factory.mktemp("server")
    with mlflow_server(f"sqlite:///{where}/store.db", where, artifacts=where / "artifacts") as port:
        yield port, where


@pytest.mark.slow
def test_a_run_logged_with_credentials_records_and_prints_none_and_resumes_with_them(
        tmp_path, server):
    port, server_dir = server
    uri = f"http://user:{SECRET}@127.0.0.1:{port}"
    shown = f"http://user:***@127.0.0.1:{port}"
    (tmp_path / "nap.yaml").write_text(NAP)

    out = harness("run", "nap.yaml", "--tracking-uri", uri, cwd=tmp_path)
    assert out.returncode == 0, out.stderr + out.stdout
    assert "MLflow: 3 cell run(s) logged" in out.stdout and f"{shown}/#/experiments/" in out.stdout
    assert "Report attached to the MLflow run" in out.stdout
    run_id = run_id_from(out.stdout)
    run_dir = tmp_path / "results" / "runs" / run_id
    assert json.loads((run_dir / "tracking.json").read_text())["tracking_uri"] == shown
    assert json.loads((run_dir / "run.json").read_text())["meta"]["tracking_uri"] == shown
    assert f"in {shown}" in (run_dir / "report" / "index.html").read_text()
    # Nowhere: not in the journal, not on the console, not in the store the report went to.
    assert_nowhere(SECRET, out.stdout, out.stderr, folders=[tmp_path, server_dir])

    # The journal cannot give the password back: resuming without it is one line, exit 2 ...
    lost = harness("run", "nap.yaml", "--resume", run_id, cwd=tmp_path)
    assert lost.returncode == 2, lost.stderr + lost.stdout
    (line,) = [ln for ln in lost.stderr.splitlines() if ln.strip()]
    assert f"was logged to {shown}, whose credentials are not kept" in line
    assert "--tracking-uri" in line
    # ... and so is attaching a report to it (a note: the report itself is written).
    report = harness("report", run_id, cwd=tmp_path)
    assert report.returncode == 0, report.stderr + report.stdout
    assert "Report not attached to MLflow" in report.stdout and "credentials" in report.stdout

    # Given again (here through the environment), both go on where the run was logged.
    again = harness("run", "nap.yaml", "--resume", run_id, cwd=tmp_path,
                    env={"MLFLOW_TRACKING_URI": uri})
    assert again.returncode == 0, again.stderr + again.stdout
    assert "0 cell run(s) logged, 3 already there" in again.stdout
    report = harness("report", run_id, "--tracking-uri", uri, cwd=tmp_path)
    assert report.returncode == 0 and "Report attached to the MLflow run" in report.stdout
    assert_nowhere(SECRET, lost.stdout, lost.stderr, again.stdout, again.stderr, report.stdout,
                   report.stderr, folders=[tmp_path, server_dir])
