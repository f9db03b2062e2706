"""Host facts: real reads on this host, the NVML path against a fake pynvml, the throttle-reason
decoder for both constant vintages, CUDA_VISIBLE_DEVICES mapping, summarize and the noise rules
(each on both sides of its threshold)."""

from __future__ import annotations

import ctypes.util
import json
import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from harness.gate.noise import noise_notes
from harness.worker import hostfacts

MIB = 2**20

# The bits as nvml.h defines them; the fake modules below carry them under one or both names.
BITS = {"GpuIdle": 0x1, "ApplicationsClocksSetting": 0x2, "SwPowerCap": 0x4, "HwSlowdown": 0x8,
        "SyncBoost": 0x10, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
        "HwPowerBrakeSlowdown": 0x80, "DisplayClockSetting": 0x100}


def reason_constants(new: bool, old: bool) -> dict:
    out = {}
    for suffix, bit in BITS.items():
        if new:
            out["nvmlClocksEventReason" + suffix] = bit
        if old:
            out["nvmlClocksThrottleReason" + suffix] = bit
    return out


class NvmlError(Exception):
    pass


def fake_nvml(devices, *, fail=(), reasons="new", procs=None, init=None):
    """A pynvml stand-in over `devices` (dicts of raw NVML values, as the real calls return
    them: mW, bytes). `fail`: names of calls that raise. `reasons`: which query and constants
    exist ("new", "old", None). `procs`: index -> list of (pid, used bytes or None)."""
    procs = procs or {}

    def call(name, fn):
        def wrapped(*args):
            if name in fail:
                raise NvmlError("Not Supported")
            return fn(*args)
        return wrapped

    def by_index(i):
        if not 0 <= i < len(devices):
            raise NvmlError("Invalid Argument")
        return i

    def by_uuid(uuid):
        for i, d in enumerate(devices):
            if d["uuid"] == uuid:
                return i
        raise NvmlError("Not Found")

    ns = {
        "NVML_CLOCK_SM": 1, "NVML_CLOCK_MEM": 2, "NVML_TEMPERATURE_GPU": 0,
        "nvmlInit": init or (lambda: None),
        "nvmlDeviceGetCount": lambda: len(devices),
        "nvmlDeviceGetHandleByIndex": by_index,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetIndex": lambda h: h,
        "nvmlDeviceGetName": call("name", lambda h: devices[h]["name"]),
        "nvmlDeviceGetUUID": call("uuid", lambda h: devices[h]["uuid"]),
        "nvmlDeviceGetClockInfo": call("clock", lambda h, which: devices[h]["clocks"][which]),
        "nvmlDeviceGetMaxClockInfo": call("max_clock", lambda h, which: devices[h]["max_sm"]),
        "nvmlDeviceGetTemperature": call("temperature", lambda h, sensor: devices[h]["temp"]),
        "nvmlDeviceGetPowerUsage": call("power", lambda h: devices[h]["power_mw"]),
        "nvmlDeviceGetEnforcedPowerLimit": call("power_limit", lambda h: devices[h]["limit_mw"]),
        "nvmlDeviceGetUtilizationRates": call(
            "utilization", lambda h: SimpleNamespace(gpu=devices[h]["util"], memory=3)),
        "nvmlDeviceGetMemoryInfo": call(
            "memory", lambda h: SimpleNamespace(used=devices[h]["used_bytes"], total=1 << 40)),
        "nvmlDeviceGetCudaComputeCapability": call("capability", lambda h: devices[h]["cc"]),
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlDeviceGetComputeRunningProcesses": call(
            "processes", lambda h: [SimpleNamespace(pid=p, usedGpuMemory=u)
                                    for p, u in procs.get(h, [])]),
    }
    if reasons == "new":
        ns["nvmlDeviceGetCurrentClocksEventReasons"] = call(
            "reasons", lambda h: devices[h]["reasons"])
        ns.update(reason_constants(new=True, old=False))
    elif reasons == "old":
        ns["nvmlDeviceGetCurrentClocksThrottleReasons"] = call(
            "reasons", lambda h: devices[h]["reasons"])
        ns.update(reason_constants(new=False, old=True))
    return SimpleNamespace(**ns)


def device(**over):
    d = {"name": "NVIDIA H200", "uuid": "GPU-0000aaaa-1111", "clocks": {1: 1980, 2: 3201},
         "max_sm": 1980, "temp": 41, "power_mw": 123456, "limit_mw": 700000, "util": 97,
         "used_bytes": 1536 * MIB, "reasons": 0x4 | 0x1, "cc": (9, 0)}
    d.update(over)
    return d


def use(monkeypatch, module):
    """Make `module` the process's NVML, as if pynvml had been imported and initialised."""
    state = hostfacts._NvmlState()
    state.tried, state.module = True, module
    monkeypatch.setattr(hostfacts, "_NVML", state)


@pytest.fixture
def fresh_nvml(monkeypatch):
    """A process that has not tried NVML yet."""
    monkeypatch.setattr(hostfacts, "_NVML", hostfacts._NvmlState())


def nvml_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None or os.path.exists("/dev/nvidiactl")


# --- real reads on this host ------------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/cpuinfo is Linux's")
def test_real_cpu_facts():
    model = hostfacts.cpu_model()
    assert isinstance(model, str) and model.strip()
    snap = hostfacts.sample()
    assert isinstance(snap["loadavg"], list) and len(snap["loadavg"]) == 3
    assert all(isinstance(x, float) and x >= 0 for x in snap["loadavg"])
    assert snap["cpu_count"] == os.cpu_count()
    assert snap["cpu_model"] == model
    assert abs(snap["time"] - time.time()) < 60
    if "cpu_freq_mhz" in snap:  # only where cpufreq is exposed (not in most VMs)
        assert snap["cpu_freq_mhz"] > 0
    # Either real GPU facts or a reason why none; never both missing, never both present.
    assert ("gpu" in snap) != ("nvml" in snap)
    json.dumps(snap)


@pytest.mark.skipif(nvml_present(), reason="this host has NVML")
def test_real_sample_without_gpu_is_absent_with_a_note(fresh_nvml):
    snap = hostfacts.sample(0)
    assert "gpu" not in snap
    assert isinstance(snap["nvml"], str) and snap["nvml"]
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "pynvml" in snap["nvml"]
    else:  # the real pynvml, failing to find the library: no exception, just the note
        assert "NVML init failed" in snap["nvml"]
        assert "Library Not Found" in snap["nvml"]
    summary = hostfacts.summarize([snap, hostfacts.sample(0)])
    assert "gpu" not in summary and summary["nvml"] == snap["nvml"]


def test_pynvml_not_importable(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    snap = hostfacts.sample(0)
    assert "gpu" not in snap
    assert snap["nvml"].startswith("pynvml not importable")


def test_nvml_initialised_once_per_process_success_or_failure(fresh_nvml, monkeypatch):
    calls = []
    module = fake_nvml([device()], init=lambda: calls.append(1))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    hostfacts.sample(0)
    hostfacts.sample(0)
    assert len(calls) == 1
    monkeypatch.setattr(hostfacts, "_NVML", hostfacts._NvmlState())

    def broken():
        calls.append(1)
        raise NvmlError("Driver/library version mismatch")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([device()], init=broken))
    calls.clear()
    a, b = hostfacts.sample(0), hostfacts.sample(0)
    assert len(calls) == 1
    assert a["nvml"] == b["nvml"] == "NVML init failed: Driver/library version mismatch"


def test_no_gpu_index_means_no_gpu_and_no_nvml(monkeypatch):
    def untouchable():
        raise AssertionError("NVML must not be brought up without a GPU")
    monkeypatch.setattr(hostfacts, "_nvml", untouchable)
    snap = hostfacts.sample(None)
    assert "gpu" not in snap and snap["nvml"]


# --- the GPU snapshot, against a fake pynvml --------------------------------------------------

def test_gpu_fields_and_units(monkeypatch):
    use(monkeypatch, fake_nvml([device(), device(name=b"NVIDIA H100", uuid=b"GPU-bbbb")],
                               procs={1: [(4242, 900 * MIB), (os.getpid(), 10 * MIB),
                                          (77, None)]}))
    gpu = hostfacts.sample(1)["gpu"]
    assert gpu == {"index": 1, "name": "NVIDIA H100", "uuid": "GPU-bbbb", "sm_clock_mhz": 1980,
                   "mem_clock_mhz": 3201, "sm_clock_max_mhz": 1980, "temperature_c": 41,
                   "power_w": 123.5, "power_limit_w": 700.0, "utilization_pct": 97,
                   "memory_used_mib": 1536, "throttle_reasons": ["gpu_idle", "sw_power_cap"],
                   # our own pid is left out; an unknown size stays unknown
                   "foreign_processes": [{"pid": 4242, "used_mib": 900},
                                         {"pid": 77, "used_mib": None}]}


def test_gpu_identity_names_the_visible_gpu_as_the_fingerprint_does(monkeypatch):
    use(monkeypatch, fake_nvml([device(), device(name=b"NVIDIA RTX PRO 6000", cc=(12, 0))]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hostfacts.gpu_identity() == {"gpu": "NVIDIA H200", "gpu_count": 2, "sm": "9.0",
                                        "driver": "580.159.04"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")          # what CUDA calls 0 is NVML's 1
    assert hostfacts.gpu_identity() == {"gpu": "NVIDIA RTX PRO 6000", "gpu_count": 1,
                                        "sm": "12.0", "driver": "580.159.04"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")           # no GPU for this process
    assert hostfacts.gpu_identity() == {}


def test_gpu_identity_is_absent_rather_than_half_read(monkeypatch, fresh_nvml):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    use(monkeypatch, fake_nvml([device()], fail={"capability"}))
    assert hostfacts.gpu_identity() == {}
    monkeypatch.setattr(hostfacts, "_NVML", hostfacts._NvmlState())
    monkeypatch.setitem(sys.modules, "pynvml", None)         # no pynvml: nothing to say
    assert hostfacts.gpu_identity() == {}


def test_one_failing_query_leaves_only_its_field_absent(monkeypatch):
    use(monkeypatch, fake_nvml([device()], fail={"power", "processes"}))
    gpu = hostfacts.sample(0)["gpu"]
    assert "power_w" not in gpu and "foreign_processes" not in gpu
    assert gpu["unavailable"] == {"power_w": "Not Supported",
                                  "foreign_processes": "Not Supported"}
    assert gpu["power_limit_w"] == 700.0 and gpu["sm_clock_mhz"] == 1980
    assert gpu["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]


def test_every_query_failing_still_gives_the_gpu_and_no_numbers(monkeypatch):
    everything = {"name", "uuid", "clock", "max_clock", "temperature", "power", "power_limit",
                  "utilization", "memory", "processes", "reasons"}
    use(monkeypatch, fake_nvml([device()], fail=everything))
    gpu = hostfacts.sample(0)["gpu"]
    assert set(gpu) == {"index", "unavailable"}
    assert set(gpu["unavailable"]) == set(hostfacts.GPU_NUMERIC) | {
        "name", "uuid", "throttle_reasons", "foreign_processes"}


def test_fixed_facts_are_read_once_per_gpu_live_ones_every_time(monkeypatch):
    calls = {"max": 0, "clock": 0}
    module = fake_nvml([device(), device(uuid="GPU-other")], fail={"name"})

    def counted(name, fn):
        def wrapped(*args):
            calls[name] += 1
            return fn(*args)
        return wrapped
    module.nvmlDeviceGetMaxClockInfo = counted("max", module.nvmlDeviceGetMaxClockInfo)
    module.nvmlDeviceGetClockInfo = counted("clock", module.nvmlDeviceGetClockInfo)
    use(monkeypatch, module)
    first, second = hostfacts.sample(0)["gpu"], hostfacts.sample(0)["gpu"]
    assert first == second
    assert second["sm_clock_max_mhz"] == 1980 and second["uuid"] == "GPU-0000aaaa-1111"
    assert "name" not in second and second["unavailable"] == {"name": "Not Supported"}
    assert calls == {"max": 1, "clock": 4}  # SM + memory clock, twice
    assert hostfacts.sample(1)["gpu"]["uuid"] == "GPU-other"
    assert calls["max"] == 2


def test_gpu_without_a_handle_is_absent_with_a_note(monkeypatch):
    use(monkeypatch, fake_nvml([device()]))
    snap = hostfacts.sample(5)
    assert "gpu" not in snap and snap["nvml"] == "GPU 5: Invalid Argument"


def test_old_pynvml_reasons_query_and_none_at_all(monkeypatch):
    use(monkeypatch, fake_nvml([device(reasons=0x40)], reasons="old"))
    assert hostfacts.sample(0)["gpu"]["throttle_reasons"] == ["hw_thermal_slowdown"]
    use(monkeypatch, fake_nvml([device()], reasons=None))
    gpu = hostfacts.sample(0)["gpu"]
    assert "throttle_reasons" not in gpu and "throttle_reasons" in gpu["unavailable"]


def test_new_reasons_query_preferred_over_the_old(monkeypatch):
    module = fake_nvml([device(reasons=0x4)], reasons="new")
    module.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x8  # stale old answer
    use(monkeypatch, module)
    assert hostfacts.sample(0)["gpu"]["throttle_reasons"] == ["sw_power_cap"]


# --- the throttle-reason decoder --------------------------------------------------------------

@pytest.mark.parametrize("new, old", [(True, False), (False, True), (True, True)],
                         ids=["new-names-only", "old-names-only", "both"])
def test_decoder_reads_either_constant_vintage(new, old):
    nv = SimpleNamespace(**reason_constants(new=new, old=old))
    assert hostfacts._decode_reasons(nv, 0) == []
    assert hostfacts._decode_reasons(nv, 0x1) == ["gpu_idle"]
    assert hostfacts._decode_reasons(nv, 0x4 | 0x8 | 0x40) == [
        "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown"]
    assert hostfacts._decode_reasons(nv, 0x1FF) == [
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
        "display_clock_setting"]


def test_decoder_keeps_bits_it_has_no_name_for():
    nv = SimpleNamespace(nvmlClocksEventReasonSwPowerCap=0x4,
                         nvmlClocksThrottleReasonBoardLimit=0x200)  # old-only name
    assert hostfacts._decode_reasons(nv, 0x4 | 0x200 | 0x800) == [
        "sw_power_cap", "board_limit", "unknown_0x800"]
    # A constant the module lacks is not guessed: its bit comes out unnamed.
    assert hostfacts._decode_reasons(SimpleNamespace(), 0x8) == ["unknown_0x8"]


def test_decoder_against_the_real_pynvml_constants():
    pynvml = pytest.importorskip("pynvml")
    mask = (pynvml.nvmlClocksThrottleReasonSwPowerCap
            | pynvml.nvmlClocksThrottleReasonHwSlowdown)
    assert hostfacts._decode_reasons(pynvml, mask) == ["sw_power_cap", "hw_slowdown"]
    assert not [r for r in hostfacts._decode_reasons(pynvml, pynvml.nvmlClocksThrottleReasonAll)
                if r.startswith("unknown")]


# --- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------

def test_visible_gpu_index_integers_and_empties(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert hostfacts.visible_gpu_index() == 0
    for value, want in [("3", 3), (" 3 ", 3), ("3,1", 3), ("", None), ("-1", None),
                        ("nonsense", None)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert hostfacts.visible_gpu_index() == want, value


def test_visible_gpu_index_by_uuid(monkeypatch):
    use(monkeypatch, fake_nvml([device(uuid="GPU-0f0f-0000"), device(uuid="GPU-abc12345-6789"),
                                device(uuid="GPU-abd00000-0000")]))
    for value, want in [("GPU-abc12345-6789", 1),  # full UUID
                        ("GPU-abc", 1),            # unique prefix, as CUDA accepts
                        ("GPU-ab", None),          # ambiguous
                        ("GPU-ffff", None),        # no such GPU
                        ("GPU-0f0f-0000,GPU-abc", 0)]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert hostfacts.visible_gpu_index() == want, value


def test_visible_gpu_index_by_uuid_without_nvml(fresh_nvml, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert hostfacts.visible_gpu_index() is None


# --- CPU facts from files ---------------------------------------------------------------------

def test_cpu_model_from_cpuinfo_and_fallbacks(tmp_path, monkeypatch):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Intel Xeon Gold\n\n"
                   "processor\t: 1\nmodel name\t: Something Else\n")
    assert hostfacts._read_cpu_model(str(x86)) == "Intel Xeon Gold"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd40\n")
    monkeypatch.setattr(hostfacts.platform, "processor", lambda: "aarch64")
    assert hostfacts._read_cpu_model(str(arm)) == "aarch64"
    monkeypatch.setattr(hostfacts.platform, "processor", lambda: "")
    assert hostfacts._read_cpu_model(str(arm)) is None
    assert hostfacts._read_cpu_model(str(tmp_path / "missing")) is None


def test_cpu_freq_is_the_mean_of_what_is_readable(tmp_path):
    for i, khz in enumerate(["2000000", "3000000", "garbage"]):
        d = tmp_path / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(khz + "\n")
    pattern = str(tmp_path / "cpu[0-9]*" / "cpufreq" / "scaling_cur_freq")
    assert hostfacts._cpu_freq_mhz(pattern) == 2500.0
    assert hostfacts._cpu_freq_mhz(str(tmp_path / "nothing*")) is None


def test_unreadable_loadavg_and_cpufreq_are_absent(monkeypatch, tmp_path):
    def no_load():
        raise OSError("no load average here")
    monkeypatch.setattr(hostfacts.os, "getloadavg", no_load)
    monkeypatch.setattr(hostfacts, "_CPUFREQ_GLOB", str(tmp_path / "none*"))
    snap = hostfacts.sample(None)
    assert "loadavg" not in snap and "cpu_freq_mhz" not in snap
    assert "loadavg" not in hostfacts.summarize([snap, snap])


# --- summarize --------------------------------------------------------------------------------

def snap(t, load, gpu=None, **extra):
    s = {"time": t, "cpu_count": 8, "cpu_model": "AMD EPYC", "loadavg": load, **extra}
    if gpu is not None:
        s["gpu"] = gpu
    return s


def gpu(**fields):
    return {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-x", **fields}


def test_summarize_ranges_unions_and_ends():
    start = snap(100.0, [0.5, 0.4, 0.3], cpu_freq_mhz=2400.0, gpu=gpu(
        sm_clock_mhz=345, temperature_c=30, power_w=75.0, throttle_reasons=["gpu_idle"],
        foreign_processes=[{"pid": 11, "used_mib": 100}]))
    middle = snap(101.0, [0.9, 0.5, 0.3], cpu_freq_mhz=3100.0, gpu=gpu(
        sm_clock_mhz=1980, temperature_c=62, power_w=610.5, throttle_reasons=["sw_power_cap"],
        foreign_processes=[{"pid": 11, "used_mib": 300}, {"pid": 12, "used_mib": None}]))
    end = snap(102.0, [1.2, 0.6, 0.3], cpu_freq_mhz=2900.0, gpu=gpu(
        sm_clock_mhz=1900, temperature_c=58, power_w=500.0,
        throttle_reasons=["sw_power_cap", "gpu_idle"],
        foreign_processes=[{"pid": 11, "used_mib": 200}]))
    s = hostfacts.summarize([start, middle, end])
    assert s["samples"] == 3
    assert s["cpu_model"] == "AMD EPYC" and s["cpu_count"] == 8
    assert s["time"] == {"first": 100.0, "last": 102.0}
    assert s["loadavg"] == {"first": [0.5, 0.4, 0.3], "last": [1.2, 0.6, 0.3]}
    assert s["cpu_freq_mhz"] == {"min": 2400.0, "max": 3100.0}
    g = s["gpu"]
    assert (g["index"], g["name"], g["uuid"]) == (0, "NVIDIA H200", "GPU-x")
    assert g["sm_clock_mhz"] == {"min": 345, "max": 1980}
    assert g["sm_clock_busy_mhz"] == {"min": 1980, "max": 1980}  # the only non-idle snapshot
    assert g["temperature_c"] == {"min": 30, "max": 62}
    assert g["power_w"] == {"min": 75.0, "max": 610.5}
    assert g["throttle_reasons"] == ["gpu_idle", "sw_power_cap"]
    assert g["foreign_processes"] == [{"pid": 11, "used_mib": 300}, {"pid": 12, "used_mib": None}]
    json.dumps(s)


def test_summarize_absent_stays_absent():
    bare = {"time": 1.0, "cpu_count": 4, "cpu_model": None,
            "nvml": "NVML init failed: NVML Shared Library Not Found"}
    s = hostfacts.summarize([bare, dict(bare, time=2.0)])
    assert "gpu" not in s and "loadavg" not in s and "cpu_freq_mhz" not in s
    assert "cpu_model" not in s
    assert s["nvml"] == "NVML init failed: NVML Shared Library Not Found"
    # A field that one snapshot lacks comes from the others; one that all lack stays out,
    # as do reasons and processes that were never read (not turned into empty lists).
    s = hostfacts.summarize([snap(1.0, [0.1, 0.1, 0.1], gpu=gpu(sm_clock_mhz=1500)),
                             snap(2.0, [0.1, 0.1, 0.1], gpu=gpu(
                                 power_w=300.0, unavailable={"sm_clock_mhz": "Not Supported"}))])
    g = s["gpu"]
    assert g["sm_clock_mhz"] == {"min": 1500, "max": 1500}
    assert g["power_w"] == {"min": 300.0, "max": 300.0}
    for absent in ("temperature_c", "throttle_reasons", "foreign_processes",
                   "sm_clock_busy_mhz"):
        assert absent not in g
    assert g["unavailable"] == {"sm_clock_mhz": "Not Supported"}
    # Read but empty is a fact, and kept.
    g = hostfacts.summarize([snap(1.0, None, gpu=gpu(throttle_reasons=[],
                                                     foreign_processes=[]))])["gpu"]
    assert g["throttle_reasons"] == [] and g["foreign_processes"] == []
    assert hostfacts.summarize([]) == {"samples": 0}


# --- noise notes ------------------------------------------------------------------------------

def summary(cpu_count=8, load=(0.5, 0.5), **gpu_fields):
    s = {"cpu_count": cpu_count,
         "loadavg": {"first": [load[0], 0.0, 0.0], "last": [load[1], 0.0, 0.0]}}
    if gpu_fields:
        s["gpu"] = gpu_fields
    return s


def test_quiet_host_has_no_notes():
    assert noise_notes(summary(
        sm_clock_mhz={"min": 1980, "max": 1980}, temperature_c={"min": 40, "max": 70},
        throttle_reasons=["gpu_idle", "applications_clocks_setting"],
        foreign_processes=[])) == []
    assert noise_notes({}) == []
    assert noise_notes({"samples": 2, "nvml": "pynvml not importable"}) == []


def test_load_note_on_both_sides_of_the_threshold():
    assert noise_notes(summary(cpu_count=2, load=(1.5, 1.5))) == []  # = 0.75 x 2
    assert noise_notes(summary(cpu_count=2, load=(0.2, 3.2))) == [
        "host load 3.2 on 2 CPUs"]
    assert noise_notes(summary(cpu_count=2, load=(1.6, 0.1))) == [
        "host load 1.6 on 2 CPUs"]
    assert noise_notes({"loadavg": {"first": [9.0, 0, 0], "last": [9.0, 0, 0]}}) == []


def test_throttle_note():
    assert noise_notes(summary(throttle_reasons=["gpu_idle"])) == []
    assert noise_notes(summary(
        throttle_reasons=["gpu_idle", "sw_power_cap", "hw_slowdown"])) == [
        "GPU throttled: sw_power_cap, hw_slowdown"]


def test_sm_clock_spread_note_on_both_sides_of_five_percent():
    reasons = ["sw_power_cap"]  # busy snapshots only; the throttle note is not under test
    def notes(lo, hi):
        return [n for n in noise_notes(summary(
            throttle_reasons=reasons, sm_clock_busy_mhz={"min": lo, "max": hi}))
            if n.startswith("SM clock")]
    assert notes(1900, 2000) == []                             # exactly 5 %
    assert notes(1880, 2000) == ["SM clock 1880-2000 MHz (6 % apart)"]
    # Without throttle reasons the whole range is all there is.
    assert noise_notes(summary(sm_clock_mhz={"min": 1900, "max": 1980})) == []
    assert noise_notes(summary(sm_clock_mhz={"min": 1500, "max": 1980})) == [
        "SM clock 1500-1980 MHz (24 % apart)"]


def test_an_idle_start_snapshot_is_not_a_clock_swing():
    idle = gpu(sm_clock_mhz=345, throttle_reasons=["gpu_idle"])
    busy = gpu(sm_clock_mhz=1980, throttle_reasons=[])
    steady = hostfacts.summarize([snap(1, [0.1] * 3, gpu=idle), snap(2, [0.1] * 3, gpu=busy)])
    assert noise_notes(steady) == []
    sagging = hostfacts.summarize([snap(1, [0.1] * 3, gpu=idle), snap(2, [0.1] * 3, gpu=busy),
                                   snap(3, [0.1] * 3, gpu=dict(busy, sm_clock_mhz=1600))])
    assert noise_notes(sagging) == ["SM clock 1600-1980 MHz (19 % apart)"]


def test_temperature_note_at_85():
    assert noise_notes(summary(temperature_c={"min": 60, "max": 84})) == []
    assert noise_notes(summary(temperature_c={"min": 60, "max": 85})) == [
        "GPU at 85 °C"]


def test_foreign_process_note():
    assert noise_notes(summary(foreign_processes=[])) == []
    assert noise_notes(summary(
        foreign_processes=[{"pid": 4242, "used_mib": 900}])) == [
        "1 foreign GPU process (pid 4242)"]
    assert noise_notes(summary(
        foreign_processes=[{"pid": 11, "used_mib": 1}, {"pid": 12, "used_mib": None}])) == [
        "2 foreign GPU processes (pids 11, 12)"]


# --- Sampler ----------------------------------------------------------------------------------

def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "hostfacts-sampler"]


def test_sampler_start_and_end_only_without_a_thread(monkeypatch):
    use(monkeypatch, fake_nvml([device(), device(uuid="GPU-second", temp=88)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with hostfacts.Sampler() as facts:
        assert len(facts.samples) == 1 and sampler_threads() == []
    assert len(facts.samples) == 2
    s = facts.summary()
    assert s["samples"] == 2 and s["gpu"]["uuid"] == "GPU-second"
    assert "GPU at 88 °C" in noise_notes(s)


def test_sampler_thread_samples_in_between_and_stops(monkeypatch):
    use(monkeypatch, fake_nvml([device()]))
    with hostfacts.Sampler(gpu_index=0, interval_s=0.01) as facts:
        deadline = time.monotonic() + 5
        while len(facts.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sampler_threads()) == 1
        assert sampler_threads()[0].daemon
    assert sampler_threads() == []
    n = len(facts.samples)
    assert n >= 5  # enter, at least three ticks, exit
    time.sleep(0.05)
    assert len(facts.samples) == n
    times = [s["time"] for s in facts.samples]
    assert times == sorted(times)


def test_sampler_rejects_a_nonsense_interval():
    for bad in (0, -1.0):
        with pytest.raises(ValueError):
            hostfacts.Sampler(gpu_index=None, interval_s=bad)


def test_sampler_without_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with hostfacts.Sampler() as facts:
        pass
    s = facts.summary()
    assert s["samples"] == 2 and "gpu" not in s and s["nvml"]
