"""Runner of the service workload (harness/protocol/workloads/service.py): a live serving engine
measured by the worker on the engine's own host.

The worker, not the controller, drives the engine: a cell runs where the worker runs and comes
back as one JSON result like every other cell, so the controller's host kinds, journal, retries
and reply checks apply unchanged; the engine's URL may be loopback-only; the profiler's traces
are files on this host, read in place; and latencies are taken next to the engine, not across
the controller's network.

A cell: bring the engine up with the cell's toggles (harness.worker.service_proc: restarted only
when they changed), `warmup_steps` requests unrecorded, then `repeats` batches of
max(steps, concurrency) requests, `concurrency` in flight (harness.worker.service_load); then,
with `service_trace_dir` set and `profile` on, one more batch under the engine's own profiler,
its trace read by the idle meter (harness.worker.engine_trace); the acceptance length from
`/metrics` around the cell (harness.worker.engine_metrics). An engine without a profiler route
gives no idle_fraction (the reason is recorded); NVML's utilisation, read on the engine's GPUs
over the timed batches (harness.worker.nvml_idle), gives `idle_fraction_nvml` in its place: a
coarser figure under its own name, never passed off as the trace's.

The engine's declaration comes from the cell, or from the host's `service:` in hosts.yaml,
which reaches this worker in its environment (harness.protocol.deployment): `deployed` makes
the cell the engine runs with, refusing one that conflicts with its host or names no engine.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from harness.protocol import deployment
from harness.protocol.workloads.service import SPEC
from harness.worker import (
    engine_metrics,
    engine_trace,
    measure,
    nvml_idle,
    service_load,
    service_proc,
)
from harness.worker.service_proc import ServiceError

TRACE_WAIT_S = 120.0       # engines write (and gzip) the trace after the stop route returns


def deployed(cell: dict, declaration: str | None) -> dict:
    """The cell with its host's engine filled in (`declaration`: DEPLOYMENT_ENV's text, None
    for a host without a `service:`), as harness.protocol.deployment rules; one-line
    ServiceError for a cell its host contradicts or one that names no engine at all."""
    try:
        declared = deployment.decode(declaration)
    except ValueError as exc:
        raise ServiceError(f"the host's service declaration is unreadable: {exc}") from None
    if declared:
        problem = deployment.conflict(cell, declared)
        if problem is not None:
            raise ServiceError(f"{problem[1]}: drop {problem[0]} from the scenario or run it on "
                               f"a host without service:")
    cell = deployment.effective(cell, declared)
    if cell["service_manager"] == "setsid" and not cell["service_start"]:
        raise ServiceError("service_manager setsid needs service_start (the command), from the "
                           "scenario or the host's service: in hosts.yaml")
    for check in SPEC.checks:
        found = check(cell)
        if found is not None:
            raise ServiceError(found[1])
    return cell


def api_key(cell: dict) -> str | None:
    """The key named by `service_api_key` (`${VAR}`), from this worker's environment (the
    host's env in hosts.yaml). Only ever placed in a request header."""
    name = deployment.api_key_variable(cell["service_api_key"])
    if name is None:
        return None
    if name not in os.environ:
        raise ServiceError(f"service_api_key refers to ${{{name}}}, which is not set in the "
                           f"worker's environment (give it in the host's env)")
    return os.environ[name]


def _get(session, url: str, headers: dict, timeout: float = 10.0):
    requests = service_load._requests()
    try:
        return session.get(url, headers=headers, timeout=timeout)
    except requests.RequestException:
        return None


def model_name(cell: dict, session, headers: dict) -> str:
    if cell["service_model"]:
        return cell["service_model"]
    url = cell["service_url"].rstrip("/") + "/v1/models"
    response = _get(session, url, headers)
    try:
        return response.json()["data"][0]["id"]
    except (AttributeError, ValueError, KeyError, IndexError, TypeError):
        status = "no answer" if response is None else f"HTTP {response.status_code}"
        raise ServiceError(f"GET {url} ({status}) names no model: set service_model") from None


def scrape(cell: dict, session, headers: dict) -> dict[str, float]:
    response = _get(session, cell["service_url"].rstrip("/") + cell["service_metrics"], headers)
    if response is None or response.status_code != 200:
        return {}
    return engine_metrics.parse(response.text)


def profiled(cell: dict, load: service_load.Load, session, headers: dict, progress) -> dict:
    """One batch under the engine's profiler: the idle meter on what it wrote, or why not."""
    base = cell["service_url"].rstrip("/")
    folder = Path(os.path.expanduser(cell["service_trace_dir"]))
    requests = service_load._requests()
    since = time.time()
    progress(stage="profile")
    try:
        start = session.post(base + cell["service_profile_start"], headers=headers, timeout=60)
    except requests.RequestException as exc:
        return {"note": f"POST {cell['service_profile_start']}: {type(exc).__name__}"}
    if start.status_code != 200:
        return {"note": f"no profiler: POST {cell['service_profile_start']} gave HTTP "
                        f"{start.status_code} (idle_fraction absent)"}
    try:
        load.batch(cell["concurrency"])
    finally:
        try:
            stop = session.post(base + cell["service_profile_stop"], headers=headers, timeout=300)
        except requests.RequestException as exc:
            stop = None
            why = f"POST {cell['service_profile_stop']}: {type(exc).__name__}"
    if stop is None:
        return {"note": why}
    if stop.status_code != 200:
        return {"note": f"POST {cell['service_profile_stop']} gave HTTP {stop.status_code} "
                        f"(the stop route differs by engine and version: set "
                        f"service_profile_stop)"}
    deadline = time.monotonic() + TRACE_WAIT_S
    while True:
        files = engine_trace.traces_since(folder, since)
        if files or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    if not files:
        return {"note": f"the profiler wrote no trace into {folder} within {TRACE_WAIT_S:.0f} s"}
    time.sleep(2.0)       # a rank's file may still be being written
    per_file = []
    for path in engine_trace.traces_since(folder, since):
        try:
            stats = engine_trace.analyze(engine_trace.load(path))
        except (OSError, ValueError, KeyError) as exc:
            return {"note": f"trace {path.name} is unreadable: {type(exc).__name__}: {exc}"}
        if stats:
            per_file.append({"file": path.name, **stats})
    if not per_file:
        return {"note": "the traces hold no device activity (a CPU-only engine)"}
    return {"traces": per_file}


def run(cell: dict, progress) -> dict:
    requests = service_load._requests()
    cell = deployed(cell, os.environ.get(deployment.DEPLOYMENT_ENV))
    key = api_key(cell)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = service_proc.ensure(cell, progress)
    session = requests.Session()
    load = None
    try:
        model = model_name(cell, session, headers)
        before = scrape(cell, session, headers)
        load = service_load.Load(cell, model, key)
        if cell["warmup_steps"]:
            progress(stage="warmup", requests=cell["warmup_steps"])
            load.batch(cell["warmup_steps"])
        n = max(cell["steps"], cell["concurrency"])
        tps, reqs = [], []
        # NVML over the timed batches only: the estimate for an engine without a profiler.
        with nvml_idle.Window(nvml_idle.engine_gpus(cell["service_gpus"])) as nvml:
            for r in range(cell["repeats"]):
                progress(stage="measure", repeat=r + 1, repeats=cell["repeats"], requests=n)
                results, wall = load.batch(n)
                tps.append(sum(x["tokens"] for x in results) / wall)
                reqs += [service_load.per_request(x) for x in results]
        profile = (profiled(cell, load, session, headers, progress)
                   if cell["profile"] and cell["service_trace_dir"] else None)
        after = scrape(cell, session, headers)
    finally:
        session.close()
        if load is not None:
            load.close()

    ttft = [x["ttft_ms"] for x in reqs]
    itl = [g for x in reqs for g in x["itl_ms"]]
    out_tps = [x["output_tokens_per_s"] for x in reqs if "output_tokens_per_s" in x]
    metrics = {"tokens_per_s": statistics.median(tps), "tokens_per_s_spread": measure.spread(tps),
               "ttft_ms_p50": measure.percentile(ttft, 50),
               "ttft_ms_p90": measure.percentile(ttft, 90)}
    if itl:
        metrics["itl_ms_p50"] = measure.percentile(itl, 50)
        metrics["itl_ms_p90"] = measure.percentile(itl, 90)
    if out_tps:
        metrics["request_tokens_per_s_p50"] = measure.percentile(out_tps, 50)
    accept = engine_metrics.accept_len(before, after)
    if accept is not None:
        metrics["accept_len_mean"] = accept
    if profile and profile.get("traces"):
        idle = [t["idle_fraction"] for t in profile["traces"] if t["idle_fraction"] is not None]
        if idle:
            # One trace per rank: the mean is the engine's; each rank's is kept below.
            metrics["idle_fraction"] = statistics.mean(idle)
    idle_nvml = None
    if "idle_fraction" not in metrics:
        # No trace to measure: NVML's coarse figure, under its own name, with how it was read.
        estimate, idle_nvml = nvml.estimate()
        if estimate is not None:
            metrics["idle_fraction_nvml"] = estimate
    return {"metrics": metrics,
            "samples": {"tokens_per_s": tps, "ttft_ms": ttft,
                        "itl_ms_p50": [statistics.median(x["itl_ms"]) for x in reqs
                                       if x["itl_ms"]]},
            "service": {"model": model, "requests": len(reqs), **started},
            **({"idle": profile} if profile else {}),
            **({"idle_nvml": idle_nvml} if idle_nvml else {})}
