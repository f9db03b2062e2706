"""The service workload: a live OpenAI-compatible serving engine (SGLang, vLLM, `transformers
serve`) measured from the host it runs on.

Runner: harness/worker/workloads/service.py. The worker on the engine's host applies the cell's
toggles (restarting the engine only when they changed since the last cell), waits for it to be
ready, sends streamed `/v1/completions` requests of exactly `context_length` prompt tokens and
`output_tokens` new ones, `concurrency` at a time, and returns per-request TTFT and inter-token
latency and per-repeat tokens/s like any other cell. The engine is declared by the scenario's
`service_*` parameters (usually in `defaults:`): how it is started (`service_start`, a command run
under setsid, or `service_unit`, a systemd unit), its URL, its readiness route and its log; or
by the host's `service:` block in hosts.yaml (harness.protocol.deployment), so that a scenario
says only the toggles and the load and runs against each host's own deployment.

Toggles are `service_env` (`KEY=VALUE ...`: environment variables) and `service_flags`
(command-line flags): both join the cell's id, so cells of different engine settings are never
compared as one configuration. The URL, timeouts and the key's variable are how a cell reaches
its engine, not what it measures: they stay out of the id.
"""

from __future__ import annotations

import shlex

from harness.protocol.workloads import Param, WorkloadSpec, choice, flag, positive_int

MANAGERS = ("setsid", "systemd", "external")
PROMPTS = ("text", "token_ids")

_WORDS = "a string of shell words"
PARAMS = (
    # setsid: `service_start` run in its own process group by the worker; systemd: the toggles
    # go into a drop-in of `service_unit`; external: started elsewhere, only checked for
    # readiness (toggles are refused: nothing would apply them).
    choice("service_manager", "setsid", MANAGERS),
    Param("service_start", None, str, "a command line (shell words, no shell syntax)",
          nullable=True),
    Param("service_unit", None, str, "a systemd unit name like sglang.service", nullable=True,
          pattern=r"[A-Za-z0-9@._:-]+\.service"),
    Param("service_name", "engine", str, "a name of letters, digits, '.', '_' or '-'",
          pattern=r"[A-Za-z0-9._-]{1,64}"),
    Param("service_env", "", str, "space-separated KEY=VALUE words"),
    Param("service_flags", "", str, _WORDS),
    Param("service_model", None, str, "the model name requests carry (null: the engine's first "
          "in /v1/models)", nullable=True),
    choice("prompt", "text", PROMPTS),
    Param("prompt_word", " hello", str, "a non-empty string", pattern=r"(?s).+"),
    positive_int("output_tokens", 64),
    positive_int("concurrency", 1),
    flag("ignore_eos", False),
    # How a cell reaches its engine, not what it measures: out of the id.
    Param("service_url", "http://127.0.0.1:8000", str, "an http:// or https:// URL",
          pattern=r"https?://[^\s/]+(/[^\s]*)?", measurement=True),
    Param("service_ready", "/health", str, "a path starting with /", pattern=r"/\S*",
          measurement=True),
    positive_int("service_ready_timeout_s", 180, "a positive integer (seconds)", measurement=True),
    positive_int("request_timeout_s", 300, "a positive integer (seconds)", measurement=True),
    Param("service_log", None, str, "a path on the host (null: ~/.cache/specdec-harness/"
          "service/<name>.log)", nullable=True, measurement=True),
    Param("service_api_key", None, str, ("${VAR}: a variable of the worker's environment (the "
                                         "host's env), never the key itself"), pattern=r"\$\{[A-Za-z_][A-Za-z0-9_]*\}",
          nullable=True, measurement=True),
    # The engine's torch profiler: POSTed before and after the profiled requests; the traces
    # it writes into `service_trace_dir` are read by the idle meter. SGLang and vLLM both
    # start with /start_profile; the stop route differs by engine and version.
    Param("service_trace_dir", None, str, "the folder the engine writes profiler traces to "
          "(null: no profile)", nullable=True, measurement=True),
    Param("service_profile_start", "/start_profile", str, "a path starting with /",
          pattern=r"/\S*", measurement=True),
    Param("service_profile_stop", "/stop_profile", str, "a path starting with /",
          pattern=r"/\S*", measurement=True),
    Param("service_metrics", "/metrics", str, "a path starting with / (Prometheus text)",
          pattern=r"/\S*", measurement=True),
    # The GPUs the engine computes on, for the NVML idle estimate of an engine without a
    # profiler route (NVML's numbering). Null: the GPU this worker was given, on which an
    # engine it starts computes unless told otherwise.
    Param("service_gpus", None, str, "NVML GPU indices separated by commas, like 0,1,2,3 "
          "(null: the worker's GPU)", pattern=r"[0-9]{1,3}(,[0-9]{1,3}){0,63}", nullable=True,
          measurement=True),
)


def check_manager(cell: dict):
    """A cell's own declaration of its engine. A setsid cell without `service_start` passes:
    its host's `service:` may declare the engine (the scenario cannot know which hosts it will
    meet); `harness run` refuses it for a host that does not (harness.hosts.service), and the
    worker for a cell that reaches it without either."""
    manager = cell["service_manager"]
    if manager == "systemd" and not cell["service_unit"]:
        return ("service_unit", "service_manager"), "service_manager systemd needs service_unit"
    if manager == "external" and (cell["service_env"].strip() or cell["service_flags"].strip()):
        return (("service_env", "service_flags"),
                ("service_manager external applies no toggles: service_env and service_flags "
                 "must be empty"))
    return None


def check_env_words(cell: dict):
    try:
        words = shlex.split(cell["service_env"])
        shlex.split(cell["service_flags"])
        if cell["service_start"]:
            shlex.split(cell["service_start"])
    except ValueError as exc:
        return ("service_env", "service_flags", "service_start"), f"unbalanced quoting ({exc})"
    for word in words:
        key, sep, _ = word.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            return ("service_env",), f"service_env word {word!r} is not KEY=VALUE"
    return None


def label(c: dict) -> str:
    """e.g. `service engine ctx=4096 out=64 c=4 --continuous-batching`."""
    parts = ["service", c["service_name"], f"ctx={c['context_length']}",
             f"out={c['output_tokens']}", f"c={c['concurrency']}"]
    parts += [w for w in (c["service_env"].strip(), c["service_flags"].strip()) if w]
    return " ".join(parts)


SPEC = WorkloadSpec(
    name="service",
    runner="harness.worker.workloads.service:run",
    order=7,
    params=PARAMS,
    checks=(check_manager, check_env_words),
    label=label,
    # tokens/s is gated like every other workload's; the latencies are reported (a scenario's
    # `metrics:` may gate them). The NVML idle estimate is reported, never gated: NVML says
    # whether any kernel ran in each of its sample periods (1/6 s to 1 s), a coarse figure not
    # comparable with the trace-based idle_fraction, and one sample a run.
    policies={"tokens_per_s": {"direction": "higher", "threshold_rel": 0.03},
              "idle_fraction_nvml": {"direction": "lower", "threshold_abs": 0.05, "gate": False,
                                     "per": "run"}},
)
