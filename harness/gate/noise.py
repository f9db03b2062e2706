"""The noise a gate saw, per cell, side and metric: how much the repeats of one worker run
scatter, how much the worker runs (rounds) differ from each other, and the full range.

Two spreads, because they have different causes and cures: scatter within a run (a noisy
timer, a short window) shrinks with more steps or repeats; a difference between runs (clocks
and thermals, a neighbour on a shared host, a host-bound loop racing other processes) does not,
and only interleaving base and head round by round keeps it out of the comparison. Both are
robust (median absolute deviation over the median), relative for metrics with a relative
threshold and absolute for metrics with an absolute one, so they read against the threshold;
a spread over half of it is a warning: at that noise the gate needs many rounds to decide.

Pure functions over worker results; the host facts each result carries (harness.worker.hostfacts:
load, clocks, throttling, foreign GPU processes) are summarised beside them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from harness.gate.policy import Policy
from harness.gate.samples import repeat_samples


@dataclass(frozen=True)
class Noise:
    metric: str
    side: str
    runs: int                     # ok worker runs
    n: int                        # samples over all runs
    relative: bool                # spreads are fractions of the median (else absolute)
    within: float | None          # median over runs of each run's MAD (of its repeats)
    between: float | None         # MAD of the runs' medians (None with one run)
    lo: float
    hi: float

    def to_dict(self) -> dict:
        return {"metric": self.metric, "side": self.side, "runs": self.runs, "n": self.n,
                "relative": self.relative, "within_runs": self.within,
                "between_runs": self.between, "min": self.lo, "max": self.hi}


def _samples(result: dict, metric: str) -> list[float]:
    """The repeats the comparison tests (samples.repeat_samples), else the single value."""
    listed = repeat_samples(result, metric)
    if listed is not None:
        return listed
    value = (result.get("metrics") or {}).get(metric)
    values = [value] if value is not None else []
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]


def mad(values: list[float]) -> float:
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


def side_noise(results: list[dict], policy: Policy, side: str) -> Noise | None:
    """The spreads of one metric over a side's worker runs (None without a sample)."""
    runs = [s for s in (_samples(r, policy.metric) for r in results if r.get("status") == "ok") if s]
    if not runs:
        return None
    relative = policy.threshold_rel is not None
    every = [v for run in runs for v in run]

    def scaled(spread: float, centre: float) -> float:
        if not relative:
            return spread
        return spread / abs(centre) if centre else math.inf

    within = [scaled(mad(run), statistics.median(run)) for run in runs if len(run) > 1]
    medians = [statistics.median(run) for run in runs]
    between = scaled(mad(medians), statistics.median(medians)) if len(medians) > 1 else None
    return Noise(policy.metric, side, len(runs), len(every), relative,
                 statistics.median(within) if within else None, between, min(every), max(every))


def threshold(policy: Policy, relative: bool) -> float | None:
    return policy.threshold_rel if relative else policy.threshold_abs


def warnings(noises: list[Noise], policies: dict[str, Policy], label: str,
             per_round: bool) -> list[str]:
    """One line per side naming every metric whose spread is over half its threshold. With
    rounds as the samples (`per_round`, an A/B) only the spread between rounds counts: the
    scatter within a run is averaged into each round's median."""
    by_side: dict[str, list[str]] = {}
    for n in noises:
        policy = policies.get(n.metric)
        thr = threshold(policy, n.relative) if policy else None
        if not thr:
            continue
        spreads = (("between rounds", n.between),) if per_round else \
            (("between rounds", n.between), ("within a run", n.within))
        for what, value in spreads:
            if value is not None and value > thr / 2:
                by_side.setdefault(n.side, []).append(
                    f"`{n.metric}` {fmt_spread(value, n.relative)} {what}")
    return [f"{label} ({side}): " + ", ".join(items) + " (MAD/median; over half the threshold)"
            for side, items in by_side.items()]


def fmt_spread(value: float | None, relative: bool) -> str:
    if value is None:
        return "–"
    if relative:
        return "∞" if math.isinf(value) else f"{100 * value:.1f} %"
    return f"{value:.3g}"


def host_notes(results: list[dict]) -> list[str]:
    """What the host facts of one side's runs say about noise (noise_notes), each line once."""
    seen: list[str] = []
    for r in results:
        facts = r.get("host_facts")
        if isinstance(facts, dict):
            seen += [line for line in noise_notes(facts) if line not in seen]
    return seen


def _gpu_env_values(per_side: dict[str, list[dict]], value) -> dict[str, set] | None:
    """Each side's set of `value(env)` over its GPU results; None when all sides agree on one
    (CPU results carry no GPU state and are left out)."""
    found = {side: {value(r.get("env") or {}) for r in results if (r.get("env") or {}).get("gpu")}
             for side, results in per_side.items()}
    seen = set().union(*found.values())
    return found if len(seen) >= 2 else None


def graph_state_notes(per_side: dict[str, list[dict]]) -> list[str]:
    """A line when the sides' GPU results were timed in different CUDA graph states: one side's
    worker settled its process (env.cuda_graphs_settled, harness/worker/graphstate.py) and the
    other's did not, as before that existed. On the H200 that alone moved a graph-replayed decode
    step by ~2 % and its idle from 0.65 to 2.7 %, so such a pair's difference is not all code."""
    states = _gpu_env_values(per_side, lambda env: env.get("cuda_graphs_settled"))
    if states is None:
        return []
    def said(state) -> str:
        return "unsettled" if state is None else f"settled ({state} graphs)"
    words = ", ".join(f"{side} " + " and ".join(sorted(map(said, found)))
                      for side, found in states.items() if found)
    return [f"CUDA graph state differs between the sides ({words}): graph-replayed timings can "
            f"move ~2 % from that alone (harness/worker/graphstate.py)"]


def kernel_build_notes(per_side: dict[str, list[dict]]) -> list[str]:
    """A line when the sides ran different builds of the CUDA kernels (env.kernel_build_flags:
    HARNESS_KERNEL_DEBUG, _TMA or _TRACE, kernels/build.py; older runs: _WS): an A/B of the builds is
    meant, any other comparison is not of the code alone."""
    builds = _gpu_env_values(per_side, lambda env: " ".join(env.get("kernel_build_flags") or ()) or "default")
    if builds is None:
        return []
    words = ", ".join(f"{side} " + " and ".join(sorted(found)) for side, found in builds.items() if found)
    return [f"the sides ran different builds of the CUDA kernels ({words}; kernels/build.py)"]


# Reading a result's host facts (harness/worker/hostfacts.py's summary of what the host was
# doing): reasons that say nothing about measurement noise are an idle GPU (between cells, or
# the host side of a step) and clocks pinned by the operator.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting"})
LOAD_PER_CPU = 0.75
SM_CLOCK_SPREAD = 0.05
HOT_C = 85


def noise_notes(summary: dict) -> list[str]:
    """Short lines for the facts in `summary` that suggest a noisy measurement; [] when none
    do or the facts are absent."""
    notes = []
    cpus = summary.get("cpu_count")
    loads = summary.get("loadavg") or {}
    # The 1-minute load at either end; it counts the measuring process itself too, which is
    # fair: a host with fewer spare CPUs than the cell's threads is a noisy host.
    one_min = [v[0] for v in (loads.get("first"), loads.get("last")) if v]
    if cpus and one_min and max(one_min) > cpus * LOAD_PER_CPU:
        notes.append(f"host load {max(one_min):.1f} on {cpus} CPUs")
    gpu = summary.get("gpu") or {}
    throttled = [r for r in gpu.get("throttle_reasons") or [] if r not in BENIGN_REASONS]
    if throttled:
        notes.append("GPU throttled: " + ", ".join(throttled))
    # Without reasons there is no telling idle snapshots from busy ones: the whole range it is.
    clock = gpu.get("sm_clock_busy_mhz") if "throttle_reasons" in gpu else gpu.get("sm_clock_mhz")
    if clock and clock["max"] > 0:
        spread = (clock["max"] - clock["min"]) / clock["max"]
        if spread > SM_CLOCK_SPREAD:
            notes.append(f"SM clock {clock['min']}-{clock['max']} MHz "
                         f"({spread * 100:.0f} % apart)")
    temp = gpu.get("temperature_c")
    if temp and temp["max"] >= HOT_C:
        notes.append(f"GPU at {temp['max']} °C")
    procs = gpu.get("foreign_processes") or []
    if procs:
        pids = ", ".join(str(p["pid"]) for p in procs)
        notes.append(f"{len(procs)} foreign GPU process{'es' if len(procs) > 1 else ''} "
                     f"(pid{'s' if len(procs) > 1 else ''} {pids})")
    return notes

