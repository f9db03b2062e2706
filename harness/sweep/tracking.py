"""Upload a run journal to MLflow, idempotently.

Layout (a contract, docs/ARCHITECTURE.md): experiment = scenario name; one parent run per sweep (run name
= run id, tag `harness.run_id`); one nested child run per cell result (run name = cell label,
tag `harness.cell_id`, every cell parameter as a param, the worker's metrics as metrics, the
GPU's samples during the cell as MLflow system metrics, harness.sweep.system_metrics),
nested through the `mlflow.parentRunId` tag, which is what the MLflow UI uses. Both carry the
tags `git.sha`, `git.branch`, `host`, `gpu`, `trigger`, `baseline` (and children `status`).
The experiment gets its kind, the scenario's description and a saved "Benchmark" view of its
runs (harness.sweep.mlflow_view), each only where nobody has set their own.

The journal is written first and is the source of truth; this module only mirrors it, so it
can fail (server down, disk full) and be re-run later: `log_run` finds the parent again by its
tag and skips every result that already has a complete child. Because MLflow params are
immutable, "already logged" is decided by searching MLflow itself, not only by the journal's
tracking.json (which records what was logged, for humans and for `harness report`).
A child's last call is set_terminated, so "complete" = no longer RUNNING; a child left RUNNING
by a crash mid-upload is deleted and logged again. Each execution of a cell (tag
`harness.attempt`) gets its own child: a failed cell retried by --resume adds a new child and
marks the old one `harness.superseded_by`.

mlflow is imported inside functions: it takes 1-2 s to import and `harness validate` must
stay fast. Only the controller writes, through an explicit `MlflowClient` (no fluent global
state). Two controllers (two sweeps at once) can still meet at a fresh sqlite store, and two
processes creating its schema at once break one of them ("duplicate column"): the first
client of a sqlite store is made under a flock on `<db>.lock` beside it (`open_client`).

A tracking URI can carry a password or a token; the real one is used to connect, but every URI
this module records (tracking.json) or puts in a message is `redact_uri`'s (harness.protocol.redact).
Since the journal keeps only the redacted form, a run logged with credentials needs them given
again to be logged further (`tracking_uri_for`).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from harness.protocol.errors import InputError
from harness.protocol.redact import redact_uri, was_redacted
from harness.protocol.numbers import is_finite_number
from harness.sweep import mlflow_view
from harness.sweep.journal import RunJournal, utc_now_iso
from harness.sweep.system_metrics import system_metrics

DEFAULT_SQLITE_URI = "sqlite:///results/mlflow.db"
FIGURE_NAME = "tokens_vs_context.png"
ERROR_TAG_MAX = 5000
PROBE_TIMEOUT_S = 3.0
# Set while logging (unless the user set them): over HTTP, fail in seconds rather than after
# MLflow's default ~4 min of retries (a server that is down is found by the /health probe
# before any logging; the two quick retries ride out a connection the server drops, as a
# loaded one does); and stop MlflowClient.set_terminated from writing "View run ... at: URL"
# to stdout for every run (it does so for any REST store in 3.x).
MLFLOW_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}

# Tags written by this module (besides the contract ones named in the docstring).
TAG_RUN_ID = "harness.run_id"
TAG_CELL_ID = "harness.cell_id"
TAG_ATTEMPT = "harness.attempt"        # which execution of a cell a child holds
TAG_SUPERSEDED = "harness.superseded_by"
TAG_PARENT = "mlflow.parentRunId"
# MLflow 3's own tags: the experiment's kind (without it the UI opens a benchmark's experiment
# on its GenAI overview of traces) and the description shown on an experiment's or run's page.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
TAG_NOTE = "mlflow.note.content"
NOTE_LIMIT = 7800       # MLflow keeps tag values up to 8000 characters
UI_WORKFLOW = "workflowType=machine_learning"   # the UI's "Model training" side: runs, metrics


class TrackingUnavailable(Exception):
    """MLflow could not be reached or refused the upload; str() is a one-line reason.

    The journal is intact: the caller can say "finish with harness run --resume RUN_ID".
    """


class CredentialsNeeded(InputError):
    """The run was logged to a URI with a secret, which the journal does not keep."""


@dataclass
class TrackingReport:
    tracking_uri: str        # redacted: for showing, not for connecting
    experiment_id: str
    parent_run_id: str
    logged_now: int          # child runs created by this call
    already_logged: int      # results that already had a complete child run
    ui_hint: str             # where to look, e.g. a URL or the command to start the UI
    view_url: str = ""       # the experiment's runs in the saved benchmark view

    def __str__(self) -> str:
        text = (f"MLflow: {self.logged_now} cell run(s) logged, {self.already_logged} already "
                f"there; {self.ui_hint}")
        return text + (f"\nMLflow benchmark view: {self.view_url}" if self.view_url else "")


# -- tracking URIs ---------------------------------------------------------------------------


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI if set, else the embedded store `sqlite:///results/mlflow.db`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_SQLITE_URI


def tracking_uri_for(journal: RunJournal, given: str | None = None) -> str:
    """The store to log an existing run to (`--resume`, `harness report`): `given`, else
    MLFLOW_TRACKING_URI, else the store the run was logged to, else the embedded default.

    The journal records URIs with their secrets redacted; connecting with `***` for a password
    would fail in a puzzling way, so a recorded URI that lost one is CredentialsNeeded (one line,
    exit 2) asking for the URI again.
    """
    given = given or os.environ.get("MLFLOW_TRACKING_URI")
    if given:
        return given
    recorded = journal.tracking_state().get("tracking_uri") or journal.meta.get("tracking_uri")
    if recorded and was_redacted(recorded):
        raise CredentialsNeeded(
            None, None, None,
            f"run {journal.run_id} was logged to {recorded}, whose credentials are not kept in "
            f"the journal: give the URI again with --tracking-uri (or MLFLOW_TRACKING_URI)")
    return recorded or DEFAULT_SQLITE_URI


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///relative` or `sqlite:////absolute` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def resolve_tracking_uri(uri: str | None = None) -> str:
    """Make a sqlite URI absolute (relative paths in it are relative to the CWD *now*, not to
    wherever the MLflow UI is started later) and create its folder; other URIs unchanged."""
    uri = _absolute(uri or default_tracking_uri())
    path = _sqlite_path(uri)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return uri


def _absolute(uri: str) -> str:
    path = _sqlite_path(uri)
    if path is None:
        return uri
    query = uri.split("?", 1)[1] if "?" in uri else ""
    return f"sqlite:///{path.expanduser().resolve()}" + (f"?{query}" if query else "")


# Database stores MLflow reaches over the network, by SQLAlchemy dialect, and their ports.
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def check_reachable(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Probe a tracking server's /health, or open a TCP connection to a database store's
    host; TrackingUnavailable if neither answers (MLflow itself retries a database for ~12 s
    and a server for minutes before it gives up).

    Any HTTP answer below 500 counts as reachable (an auth error is reported by the logging
    calls themselves, with MLflow's own message). File and sqlite stores are not probed.
    """
    if not uri.startswith(("http://", "https://")):
        _check_database(uri, timeout)
        return
    import requests

    try:
        resp = requests.get(uri.rstrip("/") + "/health", timeout=timeout)
    except requests.RequestException as e:
        raise TrackingUnavailable(f"MLflow server {redact_uri(uri)} unreachable: "
                                  f"{_one_line(e)}") from e
    if resp.status_code >= 500:
        raise TrackingUnavailable(f"MLflow server {redact_uri(uri)} unhealthy: "
                                  f"HTTP {resp.status_code}")


def _check_database(uri: str, timeout: float) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    dialect = parts.scheme.split("+", 1)[0]
    if dialect not in DATABASE_PORTS or not parts.hostname:
        return                   # sqlite, file stores, a socket path: nothing to connect to
    try:
        port = parts.port or DATABASE_PORTS[dialect]
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise TrackingUnavailable(f"MLflow store {redact_uri(uri)} unreachable: "
                                  f"{_one_line(e)}") from e


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Hold an exclusive flock on `<db>.lock` beside a sqlite store (nothing for other stores).

    The lock file is separate from the database: sqlite has its own locks on the db file, and
    the flock must exist before the database does.
    """
    path = _sqlite_path(uri)
    if path is None:
        yield
        return
    import fcntl

    try:
        lock = open(f"{path}.lock", "a")
    except OSError:
        # A folder we cannot write to: no store can be created there by us either (reading
        # an existing one needs no lock), and MLflow's own error says more than ours would.
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)    # released when the file is closed
        yield


def open_client(uri: str):
    """An MlflowClient on `uri`. Making it creates (and migrates) a sqlite store's schema when
    the database is new; under the store's lock, a second process waits, then finds the
    schema complete instead of half-made."""
    from mlflow import MlflowClient

    with _store_lock(uri):
        return MlflowClient(tracking_uri=uri)


# -- logging ---------------------------------------------------------------------------------


def log_run(journal: RunJournal, tracking_uri: str | None = None,
            figure_dir: str | os.PathLike | None = None) -> TrackingReport:
    """Mirror `journal` into MLflow; safe to call again (after a failure, or on --resume).

    `figure_dir` is where the tokens/s-vs-context PNG is rendered before upload (default: the
    run folder, so `harness report` finds it too). Raises TrackingUnavailable on any failure.
    """
    uri = resolve_tracking_uri(tracking_uri)
    check_reachable(uri)
    try:  # before _quiet_mlflow: importing mlflow resets its own logger's level
        import mlflow  # noqa: F401
    except ImportError as e:
        raise TrackingUnavailable(f"mlflow is not importable: {_one_line(e)}") from e

    with _quiet_mlflow(), _env(MLFLOW_ENV):
        try:
            return _Uploader(journal, uri, Path(figure_dir or journal.path)).run()
        except TrackingUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - any failure here leaves the journal intact
            raise TrackingUnavailable(f"{type(e).__name__}: {_one_line(e)}") from e


REPORT_ARTIFACT_DIR = "report"


def log_report(journal: RunJournal, report_dir: str | os.PathLike,
               tracking_uri: str | None = None) -> str:
    """Upload a run's report folder (index.html + PNGs) as artifacts `report/` of its parent
    MLflow run; returns the parent run id. Re-logging overwrites the same artifact paths.

    The store is `tracking_uri_for(journal, tracking_uri)`; the parent is the one `log_run`
    recorded in tracking.json for this store, else found by its `harness.run_id` tag.
    TrackingUnavailable when the store is unreachable, does not exist (a sqlite file is never
    created just for this), needs credentials given again, or has no parent run for the journal.
    """
    try:
        uri = _absolute(tracking_uri_for(journal, tracking_uri))
    except CredentialsNeeded as e:
        raise TrackingUnavailable(str(e)) from None
    path = _sqlite_path(uri)
    if path is not None and not path.is_file():
        raise TrackingUnavailable(f"no MLflow store at {path}")
    check_reachable(uri)
    try:
        import mlflow  # noqa: F401
    except ImportError as e:
        raise TrackingUnavailable(f"mlflow is not importable: {_one_line(e)}") from e

    with _quiet_mlflow(), _env(MLFLOW_ENV):
        try:
            client = open_client(uri)
            parent = _find_parent(client, journal, uri)
            if parent is None:
                raise TrackingUnavailable(
                    f"run {journal.run_id} is not in {redact_uri(uri)} yet (log it with harness "
                    f"run --resume {journal.run_id})")
            client.log_artifacts(parent, str(report_dir), artifact_path=REPORT_ARTIFACT_DIR)
            return parent
        except TrackingUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - the report on disk is intact either way
            raise TrackingUnavailable(f"{type(e).__name__}: {_one_line(e)}") from e


def _find_parent(client, journal: RunJournal, uri: str) -> str | None:
    state = journal.tracking_state()
    if state.get("parent_run_id") and state.get("tracking_uri") == redact_uri(uri):
        try:
            run = client.get_run(state["parent_run_id"])
            if run.info.lifecycle_stage == "active":
                return run.info.run_id
        except Exception:  # noqa: BLE001 - deleted or another store: search below
            pass
    exp = client.get_experiment_by_name(journal.scenario_name)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], f"tags.`{TAG_RUN_ID}` = '{journal.run_id}'")
    return next((r.info.run_id for r in runs if TAG_PARENT not in r.data.tags), None)


class _Uploader:
    """One log_run call: holds the client, the journal and what has been found/logged."""

    def __init__(self, journal: RunJournal, uri: str, figure_dir: Path):
        self.journal = journal
        self.uri = uri
        self.shown_uri = redact_uri(uri)     # what is recorded and printed
        self.figure_dir = figure_dir
        self.client = open_client(uri)
        self.results = journal.results()
        meta = journal.meta
        git = meta.get("git") if isinstance(meta.get("git"), dict) else {}
        self.common_tags = {
            "git.sha": meta.get("git_sha") or git.get("sha") or "unknown",
            "git.branch": meta.get("git_branch") or git.get("branch") or "unknown",
            "trigger": meta.get("trigger") or "manual",
            # `harness baseline mark` records the mark in the journal too, so re-logging the
            # run (--resume) keeps it.
            "baseline": "true" if meta.get("baseline") else "false",
            TAG_RUN_ID: journal.run_id,
        }
        # MLflow's own source tags: the UI shows them in its "Source"/"Version" columns.
        self.common_tags["mlflow.source.git.commit"] = self.common_tags["git.sha"]
        self.common_tags["mlflow.source.git.branch"] = self.common_tags["git.branch"]

    def run(self) -> TrackingReport:
        state = self.journal.tracking_state()
        if state.get("tracking_uri") != self.shown_uri:
            # Logged ids are only meaningful in the store they were logged to (a store is known
            # by its redacted URI: a changed password does not make it another store).
            state = {"parent_run_id": None, "tracking_uri": self.shown_uri, "logged": {}}

        experiment_id = self._experiment()
        parent, created = self._parent(experiment_id, state.get("parent_run_id"))
        state["parent_run_id"] = parent.info.run_id
        self.journal.save_tracking_state(state)

        children = self._children(experiment_id, parent.info.run_id)
        logged_now = already = 0
        for cid, result in self.results.items():
            attempt = _attempt_key(result)
            mine = [r for r in children.get(cid, []) if r.data.tags.get(TAG_ATTEMPT) == attempt]
            complete = [r for r in mine if _terminated(r)]
            if complete:
                state["logged"][cid] = complete[0].info.run_id
                already += 1
                continue
            for r in mine:  # cut off mid-upload last time: params are immutable, so start over
                self.client.delete_run(r.info.run_id)
            new_id = self._log_child(experiment_id, parent.info.run_id, result, attempt)
            # Earlier attempts (a failure now retried by --resume) stay visible, marked.
            for r in children.get(cid, []):
                if _terminated(r) and r.info.run_id != new_id:
                    self.client.set_tag(r.info.run_id, TAG_SUPERSEDED, new_id)
            state["logged"][cid] = new_id
            self.journal.save_tracking_state(state)  # progress survives a failure mid-way
            logged_now += 1

        if created or logged_now or not _terminated(parent):
            self._finish_parent(parent)
        self.journal.save_tracking_state(state)
        return TrackingReport(
            tracking_uri=self.shown_uri, experiment_id=experiment_id,
            parent_run_id=parent.info.run_id, logged_now=logged_now, already_logged=already,
            ui_hint=_ui_hint(self.uri, experiment_id, parent.info.run_id),
            view_url=_view_url(self.uri, experiment_id),
        )

    # -- experiment and parent ---------------------------------------------------------------

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.journal.scenario_name
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                created = self.client.create_experiment(
                    name, artifact_location=_artifact_root(self.uri))
                self._describe_experiment(created, {})
                return created
            except MlflowException as e:
                # Another sweep of the same scenario created it since the lookup: use theirs.
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = self.client.get_experiment_by_name(name)
        if exp.lifecycle_stage != "active":
            raise TrackingUnavailable(
                f"experiment {name!r} is deleted in {self.shown_uri}; restore it in the MLflow "
                f"UI (or `mlflow gc` it) and retry")
        self._describe_experiment(exp.experiment_id, exp.tags)
        return exp.experiment_id

    def _describe_experiment(self, experiment_id: str, tags: dict) -> None:
        """The experiment's kind, the scenario's description and the saved benchmark view,
        unless someone set them."""
        if TAG_EXPERIMENT_KIND not in tags:
            self.client.set_experiment_tag(experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND)
        if TAG_NOTE not in tags:
            description = self._scenario_description()
            if description:
                self.client.set_experiment_tag(experiment_id, TAG_NOTE, description[:NOTE_LIMIT])
        from harness.protocol.params import times_a_kernel

        kinds = sorted({"kernel" if times_a_kernel(c.get("cell") or {}) else "decode"
                        for c in self.journal.cells})
        view = mlflow_view.view_tag(tags.get(mlflow_view.TAG), kinds, int(time.time() * 1000))
        if view is not None:
            self.client.set_experiment_tag(experiment_id, mlflow_view.TAG, view)

    def _scenario_description(self) -> str | None:
        from harness.protocol.errors import InputError
        from harness.sweep.scenario import parse_scenario

        try:
            text = self.journal.scenario_file.read_text(encoding="utf-8")
            return parse_scenario(text, str(self.journal.scenario_file)).description
        except (OSError, InputError):     # an old or damaged copy: no description, no failure
            return None

    def _parent(self, experiment_id: str, known_id: str | None):
        """(parent run, created now?): the recorded one, else found by tag, else a new one."""
        run_id = self.journal.run_id
        if known_id:
            try:
                run = self.client.get_run(known_id)
                if (run.data.tags.get(TAG_RUN_ID) == run_id
                        and run.info.lifecycle_stage == "active"):
                    return run, False
            except Exception:  # noqa: BLE001 - gone or another store: search below instead
                pass
        flt = f"tags.`{TAG_RUN_ID}` = '{run_id}'"
        for run in self._search(experiment_id, flt):
            if TAG_PARENT not in run.data.tags:  # children carry harness.run_id too
                return run, False
        run = self.client.create_run(
            experiment_id, run_name=run_id, start_time=_ms(self.journal.run.get("created_at")),
            tags=self.common_tags)
        return run, True

    def _finish_parent(self, parent) -> None:
        pid = parent.info.run_id
        results = list(self.results.values())
        n_ok = sum(r.get("status") == "ok" for r in results)
        n_failed = sum(r.get("status") != "ok" for r in results)
        hosts = sorted({str(r.get("host")) for r in results if r.get("host")})
        hosts = hosts or [str(h) for h in self.journal.meta.get("hosts") or []]
        gpus = sorted({_gpu(r) for r in results}) or ["none"]
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        judged = judged_targets(self.journal, results)
        tags = {**self.common_tags, "host": ",".join(hosts) or "unknown", "gpu": ",".join(gpus),
                TAG_NOTE: run_description(self.journal, results, parent.info.experiment_id, judged)}
        # Identical values may be re-logged; only a changed value is refused (immutable params).
        params = {"scenario": self.journal.scenario_name, "trigger": self.common_tags["trigger"],
                  "n_cells": str(len(self.journal.cells))}
        counts = [("n_ok", n_ok), ("n_failed", n_failed)]
        if judged:     # how many of the scenario's targets each verdict: a run's history of them
            from harness.sweep.targets import counts as verdict_counts
            counts += [(f"targets_{verdict.replace(' ', '_')}", n)
                       for verdict, n in verdict_counts(judged).items()]
        metrics = [Metric(k, float(v), now, 0) for k, v in counts
                   if parent.data.metrics.get(k) != v]  # no duplicate history on a no-op call
        self.client.log_batch(pid, metrics=metrics,
                              params=[Param(k, v) for k, v in params.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])

        if self.journal.scenario_file.is_file():
            self.client.log_artifact(pid, str(self.journal.scenario_file))
        self.client.log_dict(pid, self._env_fingerprint(results), "env.json")
        from harness.dashboards.figures import tokens_vs_context

        figure = tokens_vs_context(results, self.figure_dir / FIGURE_NAME)
        self.client.log_artifact(pid, str(figure))

        # Status mirrors the journal: every cell ok / some failed / some never ran.
        if any(c["cell_id"] not in self.results for c in self.journal.cells):
            status = "KILLED"
        else:
            status = "FINISHED" if n_failed == 0 else "FAILED"
        self.client.set_terminated(pid, status=status)

    def _env_fingerprint(self, results: list[dict]) -> dict:
        import mlflow

        first = next((r for r in results if r.get("status") == "ok"), results[0] if results else {})
        return {
            "run_id": self.journal.run_id,
            "worker_env": first.get("env"),
            "controller": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "hostname": platform.node(),
                "mlflow": mlflow.__version__,
            },
            "logged_at": utc_now_iso(),
        }

    # -- children ----------------------------------------------------------------------------

    def _children(self, experiment_id: str, parent_id: str) -> dict[str, list]:
        found: dict[str, list] = {}
        for run in self._search(experiment_id, f"tags.`{TAG_PARENT}` = '{parent_id}'"):
            cid = run.data.tags.get(TAG_CELL_ID)
            if cid:
                found.setdefault(cid, []).append(run)
        return found

    def _log_child(self, experiment_id: str, parent_id: str, result: dict, attempt: str) -> str:
        from mlflow.entities import Metric, Param

        cid = result["cell_id"]
        ok = result.get("status") == "ok"
        start = _ms(result.get("started_at"))
        env = result.get("env") or {}
        tags = {
            **self.common_tags,
            TAG_PARENT: parent_id,
            TAG_CELL_ID: cid,
            TAG_ATTEMPT: attempt,
            "status": "ok" if ok else "failed",
            "host": str(result.get("host") or env.get("hostname") or "unknown"),
            "gpu": _gpu(result),
        }
        if env.get("device"):
            tags["device"] = str(env["device"])
        if env.get("cpu_model"):    # a CPU cell's baseline class (harness.gate.baselines)
            tags["cpu_model"] = str(env["cpu_model"])[:250]
        if not ok:
            tags["error"] = str(result.get("error") or "unknown error")[:ERROR_TAG_MAX]
        run = self.client.create_run(experiment_id, run_name=result.get("label") or cid,
                                     start_time=start, tags=tags)
        rid = run.info.run_id

        params = [Param(k, _param_value(v)) for k, v in (result.get("cell") or {}).items()]
        # The kernels an `auto` knob ran, beside the knob: a column to filter runs by.
        params += [Param(f"ran.{k}", _param_value(v))
                   for k, v in (result.get("kernels") or {}).items()]
        metrics: list = []
        if ok:  # a failed cell has no measurements, whatever partial numbers it carries
            metrics = [Metric(k, v, start, 0) for k, v in _finite_metrics(result.get("metrics"))]
            repeats = (result.get("samples") or {}).get("tokens_per_s") or []
            metrics += [Metric("tokens_per_s_repeat", float(v), start, i)
                        for i, v in enumerate(repeats) if is_finite_number(v)]
        # The GPU's own samples, failed cells included: they are the host's, not the
        # workload's numbers, and a memory curve climbing to an out-of-memory explains it.
        metrics += [Metric(*m) for m in system_metrics(result, start)]
        self._log_batches(rid, params, metrics)
        self.client.log_dict(rid, result, "cell.json")
        # Terminating is the last call: a child still RUNNING was cut off mid-upload.
        wall = result.get("wall_s")
        end = start + int(float(wall) * 1000) if is_finite_number(wall) else None
        self.client.set_terminated(rid, status="FINISHED" if ok else "FAILED", end_time=end)
        return rid

    def _log_batches(self, run_id: str, params: list, metrics: list) -> None:
        """As few log_batch calls as MLflow's limits allow (one for a typical cell: each call
        is a round trip to a server): per batch 100 params and 1000 entities in all."""
        while params or metrics:
            p, params = params[:100], params[100:]
            m, metrics = metrics[:1000 - len(p)], metrics[1000 - len(p):]
            self.client.log_batch(run_id, metrics=m, params=p)

    def _search(self, experiment_id: str, filter_string: str) -> Iterator:
        """All active runs matching the filter, following pagination."""
        token = None
        while True:
            page = self.client.search_runs([experiment_id], filter_string, max_results=1000,
                                           page_token=token)
            yield from page
            token = page.token
            if not token:
                return


# -- helpers ---------------------------------------------------------------------------------


def _attempt_key(result: dict) -> str:
    """Identifies one execution of a cell: a resumed (re-run) cell gets a new key, so a new
    child; re-uploading the same result finds its child again. Falls back to a content hash
    for results without a start time."""
    started = result.get("started_at")
    if started:
        return f"{result.get('status')}@{started}"
    import hashlib

    blob = json.dumps(result, sort_keys=True, default=str).encode()
    return f"{result.get('status')}#{hashlib.sha256(blob).hexdigest()[:16]}"


def _terminated(run) -> bool:
    """Whether an upload of this run went through to its last call (set_terminated)."""
    return run.info.status != "RUNNING"


def judged_targets(journal: RunJournal, results: list[dict]) -> list:
    """The run's scenario's targets judged on `results` (harness.sweep.targets); none where it
    has none or they do not read (the report says why; the upload never fails on them)."""
    from harness.sweep import targets
    try:
        return targets.judge_run(journal, results)
    except (OSError, InputError):
        return []


def run_description(journal: RunJournal, results: list[dict],
                    experiment_id: str | None = None, judged: list | None = None) -> str:
    """The parent run's description in MLflow (markdown): what ran where, the scenario's targets
    with their verdicts, and each cell's headline number, the summary table of the end of
    `harness run`; with the experiment's id, a link to its saved benchmark view (a route of the
    UI's own page, so it works on any host). `judged`: the targets' outcomes, where the caller
    has them (else judged here)."""
    from harness.protocol.params import times_a_kernel
    from harness.sweep.summary import measured_text

    ok = sum(r.get("status") == "ok" for r in results)
    failed = len(results) - ok
    not_run = len(journal.cells) - len(results)
    meta = journal.meta
    lines = [f"**{journal.scenario_name}**, run `{journal.run_id}`: {ok} ok"
             + (f", {failed} failed" if failed else "") + (f", {not_run} not run" if not_run else "")
             + f" · commit `{str(meta.get('git_sha') or 'unknown')[:10]}`"
             + f" · trigger {meta.get('trigger') or 'manual'}", ""]
    if experiment_id is not None:
        table, charts = (f"{mlflow_view.view_fragment(experiment_id, c)}&{UI_WORKFLOW}"
                         for c in (False, True))
        lines += [f"Every run of the scenario in the {mlflow_view.VIEW_NAME} view, grouped by "
                  f"verify mode: [table]({table}) · [charts against context length]({charts})", ""]
    judged = judged_targets(journal, results) if judged is None else judged
    if judged:
        lines += ["| target | measured | bound | verdict |", "| --- | ---: | --- | --- |"]
        lines += ["| " + " | ".join(text.replace("|", "\\|") for text in (
            o.name, measured_text(o), o.bound, o.verdict + (f" ({o.why})" if o.why else ""))) + " |"
            for o in judged]
        lines.append("")
    lines += ["| cell | status | tokens/s | idle | kernel µs |",
              "| --- | --- | ---: | ---: | ---: |"]
    rows = []
    for r in results:
        m = r.get("metrics") or {}
        kernel = times_a_kernel(r.get("cell") or {})
        idle = m.get("idle_fraction")
        cells = [str(r.get("label") or r.get("cell_id")).replace("|", "\\|"), r.get("status", "?"),
                 "" if kernel or m.get("tokens_per_s") is None else f"{m['tokens_per_s']:.1f}",
                 "" if kernel or idle is None else f"{100 * idle:.1f} %",
                 f"{m['kernel_us']:.1f}" if kernel and m.get("kernel_us") is not None else ""]
        rows.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    for i, row in enumerate(rows):
        if len(text) + len(row) + 80 > NOTE_LIMIT:
            return text + f"\n\n… and {len(rows) - i} more cell(s): the run's report has them all."
        text += "\n" + row
    return text


def _gpu(result: dict) -> str:
    return str((result.get("env") or {}).get("gpu") or "none")


def _param_value(v: Any) -> str:
    # JSON spelling: None -> "null", True -> "true", 4096 -> "4096"; strings as they are.
    return v if isinstance(v, str) else json.dumps(v)


def _finite_metrics(metrics: dict | None) -> Iterator[tuple[str, float]]:
    """Metric values that are real measurements: null (not measurable here), NaN/inf and
    non-numbers are never sent to MLflow (DESIGN: no made-up numbers)."""
    for k, v in (metrics or {}).items():
        if is_finite_number(v):
            yield k, float(v)


def _ms(iso: str | None) -> int:
    """Epoch milliseconds of an ISO-8601 time (the journal's timestamps), else now."""
    if iso:
        try:
            dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
            return int(dt.timestamp() * 1000)  # naive times are taken as local time
        except ValueError:
            pass
    return int(time.time() * 1000)


def _artifact_root(uri: str) -> str | None:
    """Artifacts of a sqlite store go next to the database (results/mlartifacts), not into
    ./mlruns of whatever directory the harness happened to run in. Servers decide their own."""
    path = _sqlite_path(uri)
    return (path.parent / "mlartifacts").as_uri() if path is not None else None


def _ui_hint(uri: str, experiment_id: str, parent_id: str) -> str:
    """Where to look at the run; printed, so with the URI's secret redacted."""
    # MLflow 3's UI keeps one workflow for every experiment, GenAI unless the link says
    # otherwise: without the parameter a benchmark's run opens among traces and judges.
    fragment = f"#/experiments/{experiment_id}/runs/{parent_id}?{UI_WORKFLOW}"
    if uri.startswith(("http://", "https://")):
        return _ui_base(uri) + fragment
    # An embedded store has no server: `harness ui` serves it (on port 5000 by default).
    default = uri == _absolute(DEFAULT_SQLITE_URI)
    command = "harness ui" if default else f"harness ui --tracking-uri {redact_uri(uri)}"
    return f"view with `{command}`, then {_ui_base(uri)}{fragment}"


def _view_url(uri: str, experiment_id: str) -> str:
    """The experiment's runs in its saved benchmark view (mlflow_view), redacted like _ui_hint:
    MLflow opens a saved view only from such a link, never by itself."""
    return f"{_ui_base(uri)}{mlflow_view.view_fragment(experiment_id)}&{UI_WORKFLOW}"


def _ui_base(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        return redact_uri(uri).rstrip("/") + "/"
    return "http://127.0.0.1:5000/"


def _one_line(e: BaseException) -> str:
    """The first line of an error, with any URI's secret redacted: MLflow's and requests'
    messages quote the URL they failed on."""
    # Redacted before it is cut: a URI cut short of its '@' no longer looks like one.
    text = redact_uri(str(e)).strip() or type(e).__name__
    return text.splitlines()[0][:500]


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables the user has not set themselves, restoring them after."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """Silence MLflow's and alembic's INFO chatter (schema creation, migrations) so the CLI's
    own output stays readable; warnings and errors still come through."""
    loggers = [logging.getLogger(n) for n in ("mlflow", "alembic", "alembic.runtime.migration")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
