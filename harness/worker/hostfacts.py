"""Host facts that explain noise: what the host was doing while a cell was measured.

A slow number is only useful if a reader can tell a regression from a busy host. So every
result records, from snapshots taken around the measurement (`Sampler`):

  - the CPU: model, count, load average, current frequency (a host running other work, or a
    CPU clocked down, slows the host side of a decode loop);
  - the GPU the cell ran on, from NVML: SM and memory clocks (and the SM clock's maximum),
    temperature, power draw and limit, utilisation, memory in use, the active clock
    throttle/event reasons (power cap, thermal slowdown, ...), and the compute processes on it
    that are not this one (a foreign process shares the SMs and the memory bandwidth).

`summarize` folds the snapshots into what a result records (min/max of each number, union of
reasons and processes); harness.gate.noise turns that into short lines for the report.

Absent, never invented: a fact that could not be read is left out (its key is missing), with a
short reason where one is known: `nvml: "<why>"` when no GPU facts could be read at all, and
`gpu.unavailable: {field: "<why>"}` for the single queries that failed. Nothing is ever
filled in with a zero or a guess, since a made-up 0 W or 0 MHz would read as a real
measurement.

NVML comes from the `nvidia-ml-py` package (module `pynvml`). The worker runs under a GPU host's
own Python with nothing of ours installed, so this module imports only the standard library at
import time; pynvml is imported on first use, and a host without it (or without a GPU, or
whose NVML fails to initialise) simply records no GPU facts.

Foreign processes are what NVML reports. NVML's pids are those of the host's pid namespace:
inside a container they may not be pids this process can see, and this process's own pid there
differs from `os.getpid()`, so in a container the measuring process itself can be listed as
"foreign". The record keeps what NVML said rather than guess which pid is whose.
"""

from __future__ import annotations

import functools
import glob
import os
import platform
import threading
import time

from harness.protocol.wire import CONTROLLER_PID_ENV

# Numeric GPU fields: summarize records their min and max over the snapshots.
GPU_NUMERIC = ("sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "temperature_c", "power_w",
               "power_limit_w", "utilization_pct", "memory_used_mib")
# Fields that name the GPU: the same in every snapshot, so the first one seen is recorded.
GPU_IDENTITY = ("index", "name", "uuid")

# Throttle/event reasons by the suffix of their pynvml constant. NVML renamed the constants
# from nvmlClocksThrottleReason* to nvmlClocksEventReason* (same bits); the lookup tries the
# new name, then the old one, so either vintage of pynvml decodes the same. The last two exist
# only under the old name in pynvml.
THROTTLE_REASONS = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
    ("board_limit", "BoardLimit"),
    ("reliability", "Reliability"),
)

_CPUINFO = "/proc/cpuinfo"
_CPUFREQ_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"
_MIB = 2**20


def _why(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:160]


# --- NVML, once per process -------------------------------------------------------------------

class _NvmlState:
    """Outcome of the process's one attempt to bring NVML up: the module, or why not."""

    def __init__(self) -> None:
        self.tried = False
        self.module = None
        self.error: str | None = None
        # GPU index -> the facts that cannot change while the process runs, read once (see
        # _gpu_facts).
        self.static: dict[int, dict] = {}


_NVML = _NvmlState()
_NVML_LOCK = threading.Lock()


def _nvml():
    """(pynvml, None) with NVML initialised, or (None, why not).

    Tried once per process, failure included: a host without the library stays without it,
    and retrying a failed dlopen on every snapshot would only cost time. There is no matching
    nvmlShutdown: the driver releases the handle when the process exits, and shutting NVML down
    at exit could pull it from under a sampler thread that is still in a query.
    """
    state = _NVML
    with _NVML_LOCK:
        if not state.tried:
            state.tried = True
            try:
                import pynvml
            except Exception as exc:  # ImportError, or a broken install: no GPU facts either way
                state.error = f"pynvml not importable: {_why(exc)}"
            else:
                try:
                    pynvml.nvmlInit()
                    state.module = pynvml
                except Exception as exc:  # library missing, driver mismatch, no GPU
                    state.error = f"NVML init failed: {_why(exc)}"
        return state.module, state.error


def nvml_ready() -> bool:
    """Whether NVML is up in this process (brought up on the first call)."""
    return _nvml()[0] is not None


def _text(value) -> str:
    # Older pynvml returns bytes for names and UUIDs, newer returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --- CPU --------------------------------------------------------------------------------------

def _read_cpu_model(path: str = _CPUINFO) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    # ARM's /proc/cpuinfo has no "model name"; platform.processor() is often just the
    # architecture there, which is still better than nothing, and "" means it knows nothing.
    return platform.processor() or None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str | None:
    """The CPU's model name, or None when the host does not say."""
    # Cached: it cannot change under a running process, and platform.processor() may run
    # `uname -p` in a subprocess, which a sampler thread should not pay for every snapshot.
    return _read_cpu_model()


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not Unix, or the kernel does not expose it
        return None


@functools.lru_cache(maxsize=4)
def _cpufreq_files(pattern: str) -> tuple[str, ...]:
    # Globbed once: the set of CPUs does not change under a run, and on a many-core host the
    # glob costs more than reading the files.
    return tuple(glob.glob(pattern))


def _cpu_freq_mhz(pattern: str | None = None) -> float | None:
    """Mean current frequency of the CPUs cpufreq reports, in MHz (sysfs gives kHz)."""
    khz = []
    for path in _cpufreq_files(pattern or _CPUFREQ_GLOB):
        try:
            with open(path) as f:
                khz.append(int(f.read().strip()))
        except (OSError, ValueError):
            continue
    return round(sum(khz) / len(khz) / 1000, 1) if khz else None


# --- GPU --------------------------------------------------------------------------------------

def _decode_reasons(nv, mask: int) -> list[str]:
    """Names of the reasons set in `mask`, from the bit constants that `nv` (pynvml) defines.

    Bits that no known constant covers come out as "unknown_0x..." so a newer driver's reason
    is recorded rather than silently dropped.
    """
    names, covered = [], 0
    for name, suffix in THROTTLE_REASONS:
        bit = getattr(nv, "nvmlClocksEventReason" + suffix, None)
        if bit is None:
            bit = getattr(nv, "nvmlClocksThrottleReason" + suffix, None)
        if not bit:
            continue
        covered |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~covered
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def _reasons_query(nv):
    # The event-reasons call replaced the throttle-reasons one; old pynvml has only the latter.
    return (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))


# The controller that started this worker names itself here, so that its other workers (an A/B
# keeps a base and a head worker on one GPU, taking turns) are not reported as foreign load.
SIBLINGS_ENV = CONTROLLER_PID_ENV


def _foreign(nv, handle) -> list[dict]:
    mine = _own_pids()
    out = []
    for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid in mine or _is_sibling(proc.pid):
            continue
        used = getattr(proc, "usedGpuMemory", None)  # None where the driver cannot tell
        out.append({"pid": proc.pid, "used_mib": round(used / _MIB) if used is not None else None})
    return out


def _is_sibling(pid: int) -> bool:
    """Whether `pid` is another worker of this worker's controller (its parent, as /proc
    shows it; False wherever that cannot be read)."""
    controller = os.environ.get(SIBLINGS_ENV, "")
    if not controller.isdigit():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return False
    return ppid == controller


def _own_pids() -> set[int]:
    # This process's pid in every pid namespace that /proc shows (NSpid): when /proc is the
    # host's that includes the pid NVML reports. Inside a container it usually is not; see the
    # module docstring.
    pids = {os.getpid()}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    pids.update(int(p) for p in line.split()[1:])
    except (OSError, ValueError):
        pass
    return pids


# Queried once per GPU and process: they cannot change under a run, and the maximum clock is
# the one slow NVML query (1.6 ms of a 2 ms snapshot on an H200, the rest are a few µs each).
_STATIC_FIELDS = ("name", "uuid", "sm_clock_max_mhz")


def _gpu_facts(nv, index: int, static: dict | None = None) -> dict:
    """One snapshot of GPU `index` (NVML's numbering). Raises only if the device has no handle;
    every other query that fails leaves its field out and its reason in `unavailable`.

    `static` (GPU index -> fields) keeps the _STATIC_FIELDS between snapshots, failures
    included: a query the board does not support will not start supporting it.
    """
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    known = static.get(index) if static is not None else None
    clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
    clock_mem = getattr(nv, "NVML_CLOCK_MEM", 2)
    temp_gpu = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
    reasons = _reasons_query(nv)
    queries = {
        "name": lambda: _text(nv.nvmlDeviceGetName(handle)),
        "uuid": lambda: _text(nv.nvmlDeviceGetUUID(handle)),
        "sm_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, clock_sm),
        "mem_clock_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, clock_mem),
        "sm_clock_max_mhz": lambda: nv.nvmlDeviceGetMaxClockInfo(handle, clock_sm),
        "temperature_c": lambda: nv.nvmlDeviceGetTemperature(handle, temp_gpu),
        "power_w": lambda: round(nv.nvmlDeviceGetPowerUsage(handle) / 1000, 1),  # mW
        "power_limit_w": lambda: round(nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000, 1),
        "utilization_pct": lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu,
        "memory_used_mib": lambda: round(nv.nvmlDeviceGetMemoryInfo(handle).used / _MIB),
        "throttle_reasons": lambda: _decode_reasons(nv, reasons(handle)),
        "foreign_processes": lambda: _foreign(nv, handle),
    }
    gpu: dict = {"index": index}
    unavailable = {}
    for field, query in queries.items():
        if known is not None and field in _STATIC_FIELDS:
            if field in known["values"]:
                gpu[field] = known["values"][field]
            else:
                unavailable[field] = known["unavailable"][field]
            continue
        if field == "throttle_reasons" and reasons is None:
            unavailable[field] = "this pynvml has no clock reasons query"
            continue
        try:
            gpu[field] = query()
        except Exception as exc:  # "Not Supported" on some boards, a driver hiccup: just this one
            unavailable[field] = _why(exc)
    if known is None and static is not None:
        static[index] = {
            "values": {f: gpu[f] for f in _STATIC_FIELDS if f in gpu},
            "unavailable": {f: unavailable[f] for f in _STATIC_FIELDS if f in unavailable}}
    if unavailable:
        gpu["unavailable"] = unavailable
    return gpu


def visible_gpu_index() -> int | None:
    """NVML's index of the GPU this process computes on, from CUDA_VISIBLE_DEVICES.

    Unset: 0. Set but empty (or starting with an invalid entry, which CUDA reads as the end of
    the list): None, no GPU. An integer: that integer; CUDA numbers GPUs fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, which on a host of mixed GPUs can differ from NVML's (PCI)
    order, but on a host of identical GPUs the two agree. A UUID (GPU-..., or a unique prefix
    of one, as CUDA accepts; MIG-... resolves to its parent GPU): looked up in NVML, None when
    NVML is unavailable or knows no such GPU. A list: its first entry, the one CUDA calls 0.
    """
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return 0
    first = value.split(",")[0].strip()
    if not first:
        return None
    try:
        index = int(first)
    except ValueError:
        return _index_of_uuid(first) if first.startswith(("GPU-", "MIG-")) else None
    return index if index >= 0 else None


def gpu_identity() -> dict:
    """The GPU this process computes on, named as the environment fingerprint names it (gpu,
    gpu_count, sm, driver), from NVML: for a worker that has not imported torch. {} without
    NVML or a visible GPU. The memory size is left to torch, whose figure differs from NVML's."""
    index = visible_gpu_index()
    nv, _ = _nvml()
    if nv is None or index is None:
        return {}
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        count = (nv.nvmlDeviceGetCount() if visible is None
                 else sum(1 for entry in visible.split(",") if entry.strip()))
        return {"gpu": _text(nv.nvmlDeviceGetName(handle)), "gpu_count": count,
                "sm": f"{major}.{minor}", "driver": _text(nv.nvmlSystemGetDriverVersion())}
    except Exception:   # a query this board or driver refuses: no half-named GPU
        return {}


def _index_of_uuid(uuid: str) -> int | None:
    nv, _ = _nvml()
    if nv is None:
        return None
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        is_mig = getattr(nv, "nvmlDeviceIsMigDeviceHandle", None)
        if is_mig is not None and is_mig(handle):
            handle = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return nv.nvmlDeviceGetIndex(handle)
    except Exception:
        pass  # not a full UUID: CUDA also takes a unique prefix
    try:
        matches = []
        for i in range(nv.nvmlDeviceGetCount()):
            if _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))).startswith(uuid):
                matches.append(i)
    except Exception:
        return None
    return matches[0] if len(matches) == 1 else None


# --- snapshots --------------------------------------------------------------------------------

def sample(gpu_index: int | None = 0) -> dict:
    """One snapshot of the host and of GPU `gpu_index` (NVML's numbering; None: no GPU).

    Never raises: whatever cannot be read is absent (see the module docstring).
    """
    snap: dict = {"time": time.time(), "cpu_count": os.cpu_count(), "cpu_model": cpu_model()}
    load = _loadavg()
    if load is not None:
        snap["loadavg"] = load
    freq = _cpu_freq_mhz()
    if freq is not None:
        snap["cpu_freq_mhz"] = freq
    if gpu_index is None:
        snap["nvml"] = "no GPU visible to this process"
        return snap
    nv, why = _nvml()
    if nv is None:
        snap["nvml"] = why
        return snap
    try:
        snap["gpu"] = _gpu_facts(nv, gpu_index, _NVML.static)
    except Exception as exc:
        snap["nvml"] = f"GPU {gpu_index}: {_why(exc)}"
    return snap


def _range(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    return {"min": min(values), "max": max(values)} if values else None


def summarize(samples: list[dict]) -> dict:
    """What a result records from the snapshots of one measurement; absent stays absent."""
    out: dict = {"samples": len(samples)}
    if not samples:
        return out
    for key in ("cpu_model", "cpu_count"):
        value = next((s[key] for s in samples if s.get(key) is not None), None)
        if value is not None:
            out[key] = value
    times = [s["time"] for s in samples if "time" in s]
    if times:
        out["time"] = {"first": times[0], "last": times[-1]}
    loads = [s["loadavg"] for s in samples if s.get("loadavg") is not None]
    if loads:
        out["loadavg"] = {"first": loads[0], "last": loads[-1]}
    freq = _range([s.get("cpu_freq_mhz") for s in samples])
    if freq:
        out["cpu_freq_mhz"] = freq
    notes = list(dict.fromkeys(s["nvml"] for s in samples if s.get("nvml")))
    if notes:
        out["nvml"] = "; ".join(notes)
    gpus = [s["gpu"] for s in samples if s.get("gpu")]
    if gpus:
        out["gpu"] = _summarize_gpu(gpus)
    return out


def _summarize_gpu(gpus: list[dict]) -> dict:
    out: dict = {}
    for key in GPU_IDENTITY:
        value = next((g[key] for g in gpus if g.get(key) is not None), None)
        if value is not None:
            out[key] = value
    for key in GPU_NUMERIC:
        span = _range([g.get(key) for g in gpus])
        if span:
            out[key] = span
    # The SM clock of an idle GPU drops far below its working clock, and the start snapshot is
    # usually taken before the workload has woken it: the spread that says the clock moved
    # *under load* is the one over the snapshots NVML did not flag idle.
    busy = _range([g.get("sm_clock_mhz") for g in gpus
                   if g.get("throttle_reasons") is not None
                   and "gpu_idle" not in g["throttle_reasons"]])
    if busy:
        out["sm_clock_busy_mhz"] = busy
    seen = [g["throttle_reasons"] for g in gpus if g.get("throttle_reasons") is not None]
    if seen:
        union = set().union(*seen)
        known = [name for name, _ in THROTTLE_REASONS if name in union]
        out["throttle_reasons"] = known + sorted(union.difference(known))
    lists = [g["foreign_processes"] for g in gpus if g.get("foreign_processes") is not None]
    if lists:
        procs: dict[int, int | None] = {}
        for proc in (p for plist in lists for p in plist):
            used = [u for u in (procs.get(proc["pid"]), proc.get("used_mib")) if u is not None]
            procs[proc["pid"]] = max(used) if used else None
        out["foreign_processes"] = [{"pid": pid, "used_mib": used}
                                    for pid, used in sorted(procs.items())]
    unavailable: dict = {}
    for g in gpus:
        for key, why in (g.get("unavailable") or {}).items():
            unavailable.setdefault(key, why)
    if unavailable:
        out["unavailable"] = unavailable
    return out


class Sampler:
    """Snapshots around a measurement: one on enter, one on exit, and with `interval_s` one
    every `interval_s` seconds in between from a daemon thread (no thread unless asked).

        with hostfacts.Sampler() as facts:
            ...measure...
        result["host"] = facts.summary()

    `gpu_index` is NVML's index; by default the GPU CUDA_VISIBLE_DEVICES gives this process
    (`visible_gpu_index`), resolved on enter.
    """

    _VISIBLE = object()

    def __init__(self, gpu_index=_VISIBLE, interval_s: float | None = None):
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"interval_s must be positive or None, not {interval_s!r}")
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _take(self) -> None:
        snap = sample(self.gpu_index)
        with self._lock:
            self.samples.append(snap)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> Sampler:
        if self.gpu_index is Sampler._VISIBLE:
            self.gpu_index = visible_gpu_index()
        self._take()
        if self.interval_s is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="hostfacts-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> bool:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._take()
        return False

    def summary(self) -> dict:
        with self._lock:
            return summarize(list(self.samples))
