"""Baselines: what a head measurement is compared with, and how a run becomes one.

Three sources, one shape (`Side`: the samples of every metric of one cell, plus provenance):

- same-job A/B (harness.gate.abtest): the base commit measured on the same host, interleaved
  with the head. The recommended PR gate: same machine, same hour, same noise.
- MLflow: per cell, the latest child run tagged `baseline=true` for the same scenario (the
  experiment), the same cell id and the same GPU class. The nightly job on main marks itself.
- a JSON file `results/baselines/<gpu-class>/<scenario>.json`, committed with the code.
- (and any journaled run, `run:RUN_ID`, handy for comparing two runs by hand.)

Numbers from different GPU classes are never compared: an H100 baseline says nothing about an
H200 head. The class is the GPU's name as the worker reports it, lower-cased, vendor dropped
(`NVIDIA H200` -> `h200`, `NVIDIA H100 80GB HBM3` -> `h100-80gb-hbm3`); without a GPU it is the
CPU model (`cpu-intel-r-xeon-r-platinum-8480c`), since a CPU cell's speed is the CPU's; plain
`cpu` where the worker could not tell its CPU model.

`harness baseline mark RUN` tags a run's MLflow runs `baseline=true` and/or writes its cells
into the JSON file (merged per cell, so a run with a failed cell keeps that cell's older entry).
"""

from __future__ import annotations

import json
import re
import statistics
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from harness.gate.samples import repeat_samples
from harness.protocol import deployment
from harness.protocol.errors import InputError
from harness.protocol.numbers import is_finite_number
from harness.protocol.params import kernels_ran
from harness.protocol.redact import redact_uri
from harness.protocol.workloads import decode, yaml_word
from harness.sweep.journal import (
    JournalError,
    RunJournal,
    atomic_write_json,
    utc_now_iso,
)

DEFAULT_BASELINES_DIR = Path("results/baselines")
FILE_FORMAT = 1
TAG_CELL_ID = "harness.cell_id"
TAG_RUN_ID = "harness.run_id"
TAG_SUPERSEDED = "harness.superseded_by"
TAG_PARENT = "mlflow.parentRunId"


def _absent(value) -> bool:
    return not value or str(value).strip().lower() in ("none", "null", "unknown")


def gpu_class(gpu_name: str | None, cpu_model: str | None = None) -> str:
    """`NVIDIA H200` -> `h200`; no GPU -> `cpu-<cpu model>`, or `cpu` without one."""
    if _absent(gpu_name):
        if _absent(cpu_model):
            return "cpu"
        return "cpu-" + (re.sub(r"[^a-z0-9]+", "-", str(cpu_model).lower()).strip("-") or "unknown")
    name = str(gpu_name).strip().lower()
    name = re.sub(r"^(nvidia|amd|intel)\s+", "", name)
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"


def result_gpu_class(result: dict) -> str:
    env = result.get("env") or {}
    return gpu_class(env.get("gpu"), env.get("cpu_model"))


@dataclass
class Side:
    """One side of a comparison for one cell: every metric's samples and where they came from."""

    cell_id: str
    label: str
    gpu_class: str | None
    samples: dict[str, list[float]] = field(default_factory=dict)
    source: str = ""             # e.g. "A/B base 1a2b3c4d", "mlflow run 9f.. (sha 1a2b3c4d)"
    git_sha: str | None = None
    error: str | None = None     # set when there is no ok measurement
    n_runs: int = 0              # worker runs pooled into these samples
    kernels: dict | None = None  # what the measurements ran, by knob (params.kernels_ran)
    engine: dict | None = None   # a service cell's engine, by parameter (deployment.engine)
    settle: float | None = None  # seconds a decode repeat settled before its window


REPEAT, RUN = "repeat", "run"    # the unit of a sample: one repeat, or one worker run


def samples_of(results: list[dict], unit: str = REPEAT) -> dict[str, list[float]]:
    """Every metric's samples over ok results. `unit` REPEAT: the per-repeat list where the
    worker gives one (`samples.tokens_per_s`), pooled; else the metric's single value. RUN: one
    sample per worker run, the median of its repeats.

    Repeats of one run share its process, its clocks, its allocations: on a GPU host they are
    far more alike than two runs are (an A/A on an H200 showed runs of identical code settle
    3-12 % apart with repeats within 1 % of each other). Pooled as if independent they make a
    run-to-run difference look significant; the A/B gate therefore tests runs (RUN), each
    summarised by its repeats. A stored baseline is one run, so a comparison with it can only
    use repeats, and says so. Decode tokens/s repeats come with their acceptance's scatter
    divided out (`repeat_samples`); a run's median is of its raw repeats."""
    pooled: dict[str, list[float]] = {}
    for r in results:
        if r.get("status") != "ok":
            continue
        for name, value in (r.get("metrics") or {}).items():
            values = repeat_samples(r, name)
            if values is not None:
                raw = [float(v) for v in r["samples"][name]]
                pooled.setdefault(name, []).extend(values if unit == REPEAT
                                                   else [statistics.median(raw)])
            elif is_finite_number(value):
                pooled.setdefault(name, []).append(float(value))
    return pooled


def side_from_results(cell_id: str, label: str, results: list[dict], source: str,
                      git_sha: str | None = None, unit: str = REPEAT) -> Side:
    ok = [r for r in results if r.get("status") == "ok"]
    classes = sorted({result_gpu_class(r) for r in ok})
    side = Side(cell_id, label, classes[0] if len(classes) == 1 else None,
                samples_of(ok, unit), source, git_sha, n_runs=len(ok))
    ran = []                                    # the distinct kernel sets (dicts: no set())
    for k in (kernels_ran(r) for r in ok):
        if k not in ran:
            ran.append(k)
    side.kernels = ran[0] if len(ran) == 1 else None
    engines = []
    for e in (deployment.engine(r) for r in ok):
        if e not in engines:
            engines.append(e)
    side.engine = engines[0] if len(engines) == 1 else None
    settles = sorted({s for s in (decode.settled(r) for r in ok) if s is not None})
    side.settle = settles[0] if len(settles) == 1 else None
    if len(classes) > 1:  # pooled over two GPU classes: a measurement of neither
        side.error = f"measured on more than one GPU class ({', '.join(classes)})"
    elif len(ran) > 1:    # likewise over two sets of kernels
        side.error = "measured with different kernels: " + "; ".join(
            sorted(kernels_text(k) for k in ran))
    elif len(settles) > 1:    # and over two ways of timing a window
        side.error = ("measured with different settling: "
                      + "; ".join(f"{s:g} s a repeat" for s in settles))
    elif len(engines) > 1:    # and over two deployments of a serving engine
        side.error = "measured on different deployments: " + "; ".join(
            sorted(engine_text(e, deployment.ENGINE) for e in engines))
    elif not ok:
        errors = [(r.get("error") or "no result").strip().splitlines() for r in results]
        first = next((e[0] for e in errors if e), "not measured")
        side.error = first[:300] if results else "not measured"
    return side


def kernels_text(kernels: dict | None) -> str:
    """e.g. `fused_ops true, topk_impl triton` (`unknown` when they cannot be told)."""
    if kernels is None:
        return "unknown"
    return ", ".join(f"{k} {yaml_word(v)}" for k, v in sorted(kernels.items())) or "none"


def other_kernels(head: Side, base: Side) -> str | None:
    """Why a baseline is not this cell's configuration although its id is the same: it ran
    other kernels (a cell that leaves a knob `auto` runs what is fastest at the time, and an
    older baseline ran what was the default then). None when they ran the same, or when
    either side cannot tell."""
    if head.kernels is None or base.kernels is None:
        return None
    differ = sorted(k for k in set(head.kernels) | set(base.kernels)
                    if head.kernels.get(k) != base.kernels.get(k))
    if not differ:
        return None

    def ran(kernels: dict) -> str:
        return ", ".join(f"{k} {yaml_word(kernels[k])}" if k in kernels else f"{k} not run"
                         for k in differ)

    return (f"baseline ran other kernels ({ran(base.kernels)}; this run: {ran(head.kernels)}): "
            f"a different configuration, not compared; mark a baseline made with these kernels")


def other_settling(head: Side, base: Side) -> str | None:
    """Why a decode baseline is not this cell's measurement although its id is the same: its
    repeats settled for another time before their windows (`warmup_s`, a measurement knob, or
    the default a worker of its day had), so its tokens/s time another state of the GPU. None
    when they settled alike, or when either side cannot tell."""
    if head.settle is None or base.settle is None or head.settle == base.settle:
        return None
    then = ("timed its windows unsettled" if base.settle == 0
            else f"settled {base.settle:g} s a repeat before its windows")
    now = "unsettled" if head.settle == 0 else f"settled {head.settle:g} s a repeat"
    return (f"baseline {then} (this run: {now}; warmup_s): another measurement, not compared; "
            f"mark a baseline measured the same way")


def engine_text(engine: dict | None, names) -> str:
    """e.g. `service_start sglang ... --port 30000, service_url http://h:30000` (a URL's
    password shown as ***; `unknown` when the engine cannot be told)."""
    if engine is None:
        return "unknown"
    return ", ".join(f"{k} {redact_uri(str(engine.get(k))) if engine.get(k) is not None else 'none'}"
                     for k in names)


def other_deployment(head: Side, base: Side) -> str | None:
    """Why a service baseline is not this cell's configuration although its id is the same:
    it measured another engine (the host's hosts.yaml declares the engine, out of the id, so a
    host that moved to another command, unit, model or URL keeps its cells' ids). None when
    both measured the same engine, or when either side cannot tell."""
    if head.engine is None or base.engine is None:
        return None
    differ = [k for k in deployment.ENGINE if head.engine.get(k) != base.engine.get(k)]
    if not differ:
        return None
    return (f"baseline measured another deployment ({engine_text(base.engine, differ)}; this "
            f"run: {engine_text(head.engine, differ)}): a different engine, not compared; mark a "
            f"baseline measured on this deployment")


def check_same_class(head: Side, base: Side) -> None:
    """Refuse a cross-GPU-class comparison (InputError: the gate exits 2)."""
    if head.gpu_class and base.gpu_class and head.gpu_class != base.gpu_class:
        raise InputError(None, None, None,
                         f"cell {head.cell_id}: baseline is from GPU class '{base.gpu_class}' "
                         f"({base.source}) but the head ran on '{head.gpu_class}': results of "
                         f"different GPU classes are never compared")


# -- JSON files --------------------------------------------------------------------------------


def baseline_path(root: str | Path, scenario: str, cls: str) -> Path:
    return Path(root) / cls / f"{scenario}.json"


def only_class(classes: set[str], scenario: str, where: str) -> str:
    """The one GPU class baselines of `scenario` exist for (what `--gpu` defaults to), or an
    InputError saying which to choose from."""
    if len(classes) == 1:
        return next(iter(classes))
    if not classes:
        raise InputError(None, None, None, f"no baseline for scenario '{scenario}' in {where}; "
                                           f"make one with: harness baseline mark RUN")
    raise InputError(None, None, None, f"baselines of scenario '{scenario}' exist for GPU classes "
                                       f"{', '.join(sorted(classes))} in {where}: pick one with --gpu")


def from_file(root: str | Path, scenario: str, cls: str | None) -> dict[str, Side]:
    """The cells of `<root>/<cls>/<scenario>.json` (InputError if there is none); cls None:
    the only class that has one."""
    if cls is None:
        cls = only_class({p.parent.name for p in Path(root).glob(f"*/{scenario}.json")},
                         scenario, str(root))
    path = baseline_path(root, scenario, cls)
    if not path.is_file():
        others = sorted(p.parent.name for p in Path(root).glob(f"*/{scenario}.json"))
        hint = (f" (baselines exist for GPU class {', '.join(others)}; never compared across "
                f"classes)" if others else "")
        raise InputError(str(path), None, None,
                         f"no baseline for scenario '{scenario}' on GPU class '{cls}'{hint}; "
                         f"make one with: harness baseline mark RUN --file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(str(path), None, None, f"unreadable baseline file: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), dict):
        raise InputError(str(path), None, None, "not a baseline file (no 'cells' mapping)")
    if data.get("gpu_class") not in (None, cls):
        raise InputError(str(path), None, None,
                         f"file says GPU class '{data.get('gpu_class')}' but lies under "
                         f"'{cls}': never compared across classes")
    out = {}
    for cid, entry in data["cells"].items():
        sha = entry.get("git_sha")
        source = f"{path} (run {entry.get('run_id', '?')}, sha {str(sha)[:8]})"
        # As a result: its GPU under env (where kernels_ran looks, for entries from before
        # baseline files kept the kernels they ran).
        result = {**entry, "status": "ok", "env": {"gpu": entry.get("gpu")}}
        out[cid] = side_from_results(cid, entry.get("label", cid), [result], source, sha)
        out[cid].gpu_class = cls
    return out


def write_file(root: str | Path, journal: RunJournal, replace: bool = False) -> list[tuple[Path, int, int]]:
    """Write the ok cells of `journal` into `<root>/<class>/<scenario>.json`, one file per GPU
    class the run measured. Cells already in a file and not in this run are kept (unless
    `replace`). Returns (path, cells written, cells kept) per file."""
    by_class: dict[str, dict[str, dict]] = {}
    for cid, r in journal.results().items():
        if r.get("status") != "ok":
            continue
        metrics = {k: v for k, v in (r.get("metrics") or {}).items() if is_finite_number(v)}
        # Per-repeat samples of the metrics only (not e.g. every step time): what the gate uses.
        samples = {k: v for k, v in (r.get("samples") or {}).items() if k in metrics}
        by_class.setdefault(result_gpu_class(r), {})[cid] = {
            "label": r.get("label"), "cell": r.get("cell"), "run_id": journal.run_id,
            "git_sha": journal.meta.get("git_sha"), "started_at": r.get("started_at"),
            "gpu": (r.get("env") or {}).get("gpu"), "host": r.get("host"),
            "kernels": kernels_ran(r), "metrics": metrics, "samples": samples,
            **({"settle": r["settle"]} if r.get("settle") else {}),
            **({"deployment": r["deployment"]} if r.get("deployment") else {})}
    written = []
    for cls, cells in sorted(by_class.items()):
        path = baseline_path(root, journal.scenario_name, cls)
        kept: dict[str, dict] = {}
        if path.is_file() and not replace:
            try:
                kept = json.loads(path.read_text(encoding="utf-8")).get("cells") or {}
            except (OSError, json.JSONDecodeError, AttributeError):
                kept = {}
        kept = {cid: entry for cid, entry in kept.items() if cid not in cells}
        atomic_write_json(path, {"format": FILE_FORMAT, "scenario": journal.scenario_name,
                                 "gpu_class": cls, "updated_at": utc_now_iso(),
                                 "cells": {**kept, **cells}})
        written.append((path, len(cells), len(kept)))
    return written


# -- journaled runs ----------------------------------------------------------------------------


def from_journal(runs_root: str | Path, run_id: str) -> tuple[RunJournal, dict[str, Side]]:
    try:
        journal = RunJournal.open(runs_root, run_id)
    except JournalError as e:
        raise InputError(None, None, None, str(e)) from None
    sha = journal.meta.get("git_sha")
    labels = {c["cell_id"]: c["label"] for c in journal.cells}
    sides = {cid: side_from_results(cid, labels.get(cid, r.get("label", cid)), [r],
                                    f"run {run_id} (sha {str(sha)[:8]})", sha)
             for cid, r in journal.results().items()}
    return journal, sides


# -- MLflow ------------------------------------------------------------------------------------


@contextmanager
def mlflow_client(uri: str | None) -> Iterator:
    """An MlflowClient on `uri` (default: $MLFLOW_TRACKING_URI or results/mlflow.db), quiet and
    failing fast; InputError for a sqlite store that does not exist (never create one to read)."""
    from harness.sweep import tracking

    uri = tracking._absolute(uri or tracking.default_tracking_uri())
    path = tracking._sqlite_path(uri)
    if path is not None and not path.is_file():
        raise InputError(None, None, None, f"no MLflow store at {path} (nothing logged there yet)")
    try:
        tracking.check_reachable(uri)
    except tracking.TrackingUnavailable as e:
        raise InputError(None, None, None, str(e)) from None
    import mlflow  # noqa: F401 - before _quiet_mlflow: importing mlflow resets its logger level

    with tracking._quiet_mlflow(), tracking._env(tracking.MLFLOW_ENV):
        yield tracking.open_client(uri)    # waits out a sweep creating this store's schema


def search_all(client, experiment_ids: list[str], filter_string: str,
               order_by: list[str] | None = None) -> Iterator:
    """Every active run matching the filter, following pagination."""
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string, max_results=1000,
                                  order_by=order_by, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def run_result(client, run) -> dict:
    """The cell result a child run holds: its cell.json artifact, else rebuilt from its metrics
    (and the tokens_per_s_repeat history for the per-repeat samples)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(run.info.run_id, "cell.json", tmp)
            return json.loads(Path(local).read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - artifacts can be unreachable (another machine's store)
        pass
    metrics = dict(run.data.metrics)
    samples = {}
    if "tokens_per_s_repeat" in metrics:
        history = client.get_metric_history(run.info.run_id, "tokens_per_s_repeat")
        samples["tokens_per_s"] = [m.value for m in sorted(history, key=lambda m: m.step)]
    metrics.pop("tokens_per_s_repeat", None)
    return {"status": "ok", "metrics": metrics, "samples": samples,
            "env": {"gpu": run.data.tags.get("gpu"), "cpu_model": run.data.tags.get("cpu_model")}}


def from_mlflow(uri: str | None, scenario: str, cls: str | None,
                cell_ids: list[str] | None = None) -> dict[str, Side]:
    """Per cell, the latest ok child run tagged baseline=true of experiment `scenario` whose
    GPU class is `cls` (InputError when the experiment or every baseline is missing); cls None:
    the only class that has baselines."""
    with mlflow_client(uri) as client:
        exp = client.get_experiment_by_name(scenario)
        if exp is None:
            raise InputError(None, None, None,
                             f"no MLflow experiment '{scenario}' in {client.tracking_uri}: no "
                             f"baseline (mark one with: harness baseline mark RUN)")
        wanted = set(cell_ids) if cell_ids is not None else None
        found: dict[str, Side] = {}
        other_classes: set[str] = set()
        # a list: the classes are read off it before the cells (a generator would be spent)
        runs = list(search_all(client, [exp.experiment_id],
                               "tags.baseline = 'true' and tags.status = 'ok'",
                               order_by=["attributes.start_time DESC"]))
        if cls is None:
            cls = only_class({gpu_class(r.data.tags.get("gpu"), r.data.tags.get("cpu_model"))
                              for r in runs if TAG_SUPERSEDED not in r.data.tags},
                             scenario, f"experiment '{scenario}' of {client.tracking_uri}")
        for run in runs:
            tags = run.data.tags
            cid = tags.get(TAG_CELL_ID)
            if not cid or TAG_SUPERSEDED in tags or cid in found:
                continue
            if wanted is not None and cid not in wanted:
                continue
            run_cls = gpu_class(tags.get("gpu"), tags.get("cpu_model"))
            if run_cls != cls:
                other_classes.add(run_cls)
                continue
            result = run_result(client, run)
            sha = tags.get("git.sha")
            found[cid] = side_from_results(
                cid, run.info.run_name or cid, [{**result, "status": "ok"}],
                f"mlflow run {run.info.run_id[:12]} of {tags.get(TAG_RUN_ID, '?')} "
                f"(sha {str(sha)[:8]})", sha)
            found[cid].gpu_class = cls
        if not found:
            hint = (f" (baselines exist for GPU class {', '.join(sorted(other_classes))}; never "
                    f"compared across classes)" if other_classes else "")
            raise InputError(None, None, None,
                             f"no run tagged baseline=true for scenario '{scenario}' on GPU class "
                             f"'{cls}' in {client.tracking_uri}{hint}")
        return found


def mark_mlflow(uri: str | None, run_id: str, scenario: str | None = None) -> tuple[int, int]:
    """Tag the parent and the ok (not superseded) children of run `run_id` baseline=true.
    Returns (children tagged, children left as they are because they failed)."""
    with mlflow_client(uri) as client:
        if scenario:
            exp = client.get_experiment_by_name(scenario)
            experiments = [exp.experiment_id] if exp is not None else []
        else:
            experiments = [e.experiment_id for e in client.search_experiments()]
        runs = list(search_all(client, experiments, f"tags.`{TAG_RUN_ID}` = '{run_id}'")) \
            if experiments else []
        if not runs:
            raise InputError(None, None, None, f"run {run_id} is not in {client.tracking_uri}")
        tagged = skipped = 0
        for run in runs:
            tags = run.data.tags
            child = TAG_PARENT in tags
            if child and (tags.get("status") != "ok" or TAG_SUPERSEDED in tags):
                skipped += child and tags.get("status") != "ok"
                continue
            client.set_tag(run.info.run_id, "baseline", "true")
            tagged += child
        return tagged, skipped
