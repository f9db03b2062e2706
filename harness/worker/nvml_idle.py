"""A coarse idle estimate from NVML, for an engine whose profiler the harness cannot reach.

NVML's GPU utilisation is "percent of time over the past sample period during which one or more
kernels was executing", the period being 1/6 s to 1 s depending on the product. Read every
`interval_s` on each of the engine's GPUs over the load window (hostfacts.Sampler, the snapshots
every result already takes), `idle_fraction_nvml = 1 - mean(utilisation) / 100`, averaged over
the GPUs. It is a different and much coarser measurement than the trace-based idle_fraction (the
union of kernel intervals at microsecond resolution): a period in which any kernel ran counts as
busy, however short the kernel, so it understates the idleness between small kernels. So it has
its own name, says how it was taken, is never gated (harness/protocol/workloads/service.py), and
is absent — with the reason — on a host without NVML or a GPU, never estimated.

The first snapshot is dropped: it is taken as the window opens, so its reading covers NVML's
period before it. A window shorter than NVML's longest period gives no estimate: its readings
would mostly describe time outside it.
"""

from __future__ import annotations

import statistics
import time

from harness.worker import hostfacts

INTERVAL_S = 0.5              # a reading every half second (a hostfacts snapshot per GPU each)
NVML_PERIOD = "1/6 s to 1 s, by product"
LONGEST_PERIOD_S = 1.0


def engine_gpus(service_gpus: str | None) -> list[int | None]:
    """NVML indices of the engine's GPUs: the cell's `service_gpus` ("0,1"), else this worker's
    own GPU (None when it was given none), on which an engine it starts computes."""
    if service_gpus:
        return [int(i) for i in service_gpus.split(",")]
    return [hostfacts.visible_gpu_index()]


class Window:
    """NVML readings on `gpus` while the block runs.

        with nvml_idle.Window(gpus) as window:
            ...the load...
        metric, detail = window.estimate()
    """

    def __init__(self, gpus: list[int | None], interval_s: float = INTERVAL_S):
        self.gpus = gpus
        self.interval_s = interval_s
        self.samplers = [hostfacts.Sampler(gpu_index=g, interval_s=interval_s) for g in gpus]
        self.window_s = 0.0

    def __enter__(self) -> Window:
        self._t0 = time.monotonic()
        for sampler in self.samplers:
            sampler.__enter__()
        return self

    def __exit__(self, *exc_info) -> bool:
        for sampler in self.samplers:
            sampler.__exit__(*exc_info)
        self.window_s = time.monotonic() - self._t0
        return False

    def estimate(self) -> tuple[float | None, dict]:
        """(idle_fraction_nvml or None, what the result records: how it was read, or why not)."""
        how = {"source": "nvml", "gpus": self.gpus, "interval_s": self.interval_s,
               "nvml_period": NVML_PERIOD, "window_s": round(self.window_s, 3)}
        per_gpu, whys = [], []
        for gpu, sampler in zip(self.gpus, self.samplers):
            readings, why = _readings(sampler.samples[1:])
            if not readings:
                name = f"GPU {gpu}" if gpu is not None else "the worker's GPU"
                whys.append(f"{name}: {why}")
                continue
            mean = statistics.mean(readings)
            per_gpu.append({"gpu": gpu, "readings": len(readings),
                            "utilization_pct_mean": round(mean, 2),
                            "idle_fraction": round(1 - mean / 100, 4)})
        if whys:     # a GPU left out would make the engine look like the others alone
            return None, {**how, "note": "no NVML estimate: " + "; ".join(whys)}
        if self.window_s < LONGEST_PERIOD_S:
            return None, {**how, "note": f"no NVML estimate: the load window ({self.window_s:.2f} "
                                         f"s) is shorter than NVML's longest sample period "
                                         f"({LONGEST_PERIOD_S:g} s)"}
        idle = statistics.mean(g["idle_fraction"] for g in per_gpu)
        readings = sum(g["readings"] for g in per_gpu)
        return idle, {**how, "per_gpu": per_gpu, "note": (
            f"idle_fraction_nvml = 1 - NVML utilisation/100, read every {self.interval_s:g} s "
            f"over the {self.window_s:.1f} s load window ({readings} readings on GPU "
            f"{', '.join(str(g) for g in self.gpus)}); NVML's utilisation is the share of its "
            f"sample period ({NVML_PERIOD}) in which any kernel ran: coarse, not comparable "
            f"with the trace-based idle_fraction, not gated")}


def _readings(snapshots: list[dict]) -> tuple[list[float], str]:
    """The utilisation readings of a GPU's snapshots, or none and why."""
    values = [s["gpu"]["utilization_pct"] for s in snapshots
              if isinstance((s.get("gpu") or {}).get("utilization_pct"), (int, float))]
    if values:
        return [float(v) for v in values], ""
    for s in snapshots:
        if s.get("nvml"):
            return [], s["nvml"]
        missing = ((s.get("gpu") or {}).get("unavailable") or {}).get("utilization_pct")
        if missing:
            return [], f"utilisation unavailable ({missing})"
    return [], "no NVML readings"
